"""Which decoder `aiayn translate` and `aiayn serve` run by default: the one measured faster.

Each has two: a file is translated in sorted batches (`Translator.translate_ids`) or
streamed through the continuous-batching engine (`Translator.stream_ids`); requests are
served by the dynamic batcher or by the engine (`aiayn.apps.serve`). Neither is the
faster everywhere, so the default is read from measurements, never fixed:

    choice = choose_decoder(Use.FILE, beam=4, threads=2)
    choice.continuous        # 0: sorted batches (or the dynamic batcher); N: the engine, N at once
    choice.reason            # what was measured, where: the line `log.info` writes

The measurements are the benchmarks' results files, as `benchmarks/bench_translate.py`
and `benchmarks/bench_serve.py` write them (`speeds_from_results`): by default
`MEASURED`, what the committed ones in benchmarks/results say (a test keeps the two
alike), or those a user measured on their own machine, named by the environment
variable `AIAYN_DECODER_SPEEDS` (paths separated by os.pathsep). The setting nearest the
one asked for decides: the same beam if it was measured, then the same threads, then,
for a server, the most clients (its throughput under load). The engine is the default
only where it was measured at least `ENGINE_MARGIN` times as fast as the plain path in
that setting: it gives the plain path's outputs, line for line, so a smaller gain,
within the spread of a few rounds of the same code, is no reason to leave the simpler
path.
"""

from __future__ import annotations

import enum
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SPEEDS_VARIABLE = "AIAYN_DECODER_SPEEDS"
"""The environment variable naming results files to choose from instead of `MEASURED`."""

ENGINE_MARGIN = 1.05
"""How much faster than the plain path the engine must be measured to be the default (on
the developers' 2-core machine, three rounds of one system spread by a few percent)."""


class Use(enum.Enum):
    """What the decoder serves: a whole file at once, or requests as they come."""

    FILE = "file"
    SERVE = "serve"


_PLAIN = {Use.FILE: "sorted batches", Use.SERVE: "the dynamic batcher"}


@dataclass(frozen=True)
class DecoderSpeed:
    """One measured throughput of one decoder in one setting.

    Attributes:
        use: a file or a server.
        continuous: sentences decoded at once by the engine; 0: the plain path (sorted
            batches for a file, the dynamic batcher for a server).
        beam: the beam width measured.
        threads: torch threads.
        sentences_per_s: the throughput.
        clients: a server's concurrent clients (0 for a file).
        source: the results file it was read from.
    """

    use: Use
    continuous: int
    beam: int
    threads: int
    sentences_per_s: float
    clients: int = 0
    source: str = ""

    @property
    def name(self) -> str:
        if self.continuous == 0:
            return _PLAIN[self.use]
        return f"the continuous engine ({self.continuous} at once)"


@dataclass(frozen=True)
class DecoderChoice:
    """The default decoder: `continuous` as the CLI's --continuous takes it, and why."""

    continuous: int
    reason: str


def _file_speeds(path: Path, data: dict) -> list[DecoderSpeed]:
    speeds = []
    for cell in data["cells"]:
        system = cell["system"]
        slots = system.removeprefix("continuous-")
        if system != "batches" and not (system.startswith("continuous-") and slots.isdigit()):
            continue  # another system of the race: compiled, another dtype, a baseline
        continuous = 0 if system == "batches" else int(slots)
        speeds.append(
            DecoderSpeed(
                Use.FILE,
                continuous,
                int(data["beam"]),
                int(cell["threads"]),
                float(cell["sentences_per_s"]),
                source=path.name,
            )
        )
    return speeds


def _serve_speeds(path: Path, data: dict) -> list[DecoderSpeed]:
    continuous = int(data.get("continuous") or 0)
    return [
        DecoderSpeed(
            Use.SERVE,
            continuous,
            int(data["beam"]),
            int(data["threads"]),
            float(cell["sentences_per_s"]),
            int(cell["clients"]),
            path.name,
        )
        for cell in data["cells"]
        if cell["server"] == "batching"  # "one at a time" is the benchmark's baseline
    ]


def speeds_from_results(path: str | Path) -> list[DecoderSpeed]:
    """The decoders' throughputs in a results file of `benchmarks/bench_translate.py`
    (cells of a "system": "batches" or "continuous-N") or `benchmarks/bench_serve.py`
    (cells of a "server", the file's "continuous" its engine).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not such a results file (naming it and what is missing).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        cells = data["cells"]
        is_file = bool(cells) and "system" in cells[0]
        return _file_speeds(path, data) if is_file else _serve_speeds(path, data)
    except FileNotFoundError:
        raise FileNotFoundError(f"{SPEEDS_VARIABLE} names {path}, which does not exist") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(
            f"{path} is no results file of bench_translate or bench_serve ({err!r}); "
            f"fix or drop it from {SPEEDS_VARIABLE}"
        ) from None


_F, _S = Use.FILE, Use.SERVE
MEASURED: tuple[DecoderSpeed, ...] = (
    # benchmarks/results/translate.json: the 296 test verses, beam 8, 2 threads (the Xeon)
    DecoderSpeed(_F, 0, 8, 2, 56.12465297408894, 0, "translate.json"),
    DecoderSpeed(_F, 8, 8, 2, 41.13261343043538, 0, "translate.json"),
    DecoderSpeed(_F, 32, 8, 2, 56.84423428713693, 0, "translate.json"),
    # the same at beam 4, 1 thread
    DecoderSpeed(_F, 0, 4, 1, 52.90326946812332, 0, "translate-beam4-1thread.json"),
    DecoderSpeed(_F, 32, 4, 1, 48.717337257970264, 0, "translate-beam4-1thread.json"),
    # the servers at beam 4, 1 thread, 1 to 64 clients
    DecoderSpeed(_S, 0, 4, 1, 11.349917839455937, 1, "serve-dynamic.json"),
    DecoderSpeed(_S, 0, 4, 1, 20.322937716521924, 4, "serve-dynamic.json"),
    DecoderSpeed(_S, 0, 4, 1, 41.59202890923364, 16, "serve-dynamic.json"),
    DecoderSpeed(_S, 0, 4, 1, 59.16079054255036, 64, "serve-dynamic.json"),
    DecoderSpeed(_S, 32, 4, 1, 9.175609859080307, 1, "serve-continuous-groups.json"),
    DecoderSpeed(_S, 32, 4, 1, 25.270830918666547, 4, "serve-continuous-groups.json"),
    DecoderSpeed(_S, 32, 4, 1, 43.295166660787444, 16, "serve-continuous-groups.json"),
    DecoderSpeed(_S, 32, 4, 1, 47.82680675981716, 64, "serve-continuous-groups.json"),
)
"""What the committed results files say (tests/unit/test_decoder_choice.py reads them)."""


def measured_speeds() -> list[DecoderSpeed]:
    """The files `AIAYN_DECODER_SPEEDS` names (see `speeds_from_results`), else `MEASURED`."""
    named = os.environ.get(SPEEDS_VARIABLE, "")
    paths = [p for p in named.split(os.pathsep) if p]
    if not paths:
        return list(MEASURED)
    return [speed for path in paths for speed in speeds_from_results(path)]


def choose_decoder(
    use: Use, beam: int, threads: int, speeds: Sequence[DecoderSpeed] | None = None
) -> DecoderChoice:
    """The decoder measured faster in the setting nearest (`use`, `beam`, `threads`).

    Args:
        use: a file or a server.
        beam: the beam width to be decoded (a server: its default one).
        threads: torch threads.
        speeds: the measurements; default: `measured_speeds()`.

    Returns:
        The engine's sentences at once where it was measured at least `ENGINE_MARGIN`
        times as fast there; else 0 (the plain path: also where nothing, or only one
        decoder, was measured).

    Raises:
        FileNotFoundError, ValueError: a file `AIAYN_DECODER_SPEEDS` names is missing or
            not a results file.
    """
    speeds = measured_speeds() if speeds is None else speeds
    mine = [s for s in speeds if s.use is use]
    if not mine:
        return DecoderChoice(0, f"{_PLAIN[use]}: no decoder measured for a {use.value}")

    def distance(s: DecoderSpeed) -> tuple[int, int, int]:
        return abs(s.beam - beam), abs(s.threads - threads), -s.clients

    nearest = min(map(distance, mine))
    setting = [s for s in mine if distance(s) == nearest]
    at = setting[0]
    where = f"beam {at.beam}, {at.threads} thread{'s' if at.threads > 1 else ''}"
    if use is Use.SERVE:
        where += f", {at.clients} clients"
    sources = ", ".join(sorted({s.source for s in setting}))
    plain = [s for s in setting if s.continuous == 0]
    engines = [s for s in setting if s.continuous > 0]
    if not plain or not engines:
        return DecoderChoice(0, f"{_PLAIN[use]}: only {setting[0].name} measured at {where}")
    best_plain = max(plain, key=lambda s: s.sentences_per_s)
    best_engine = max(engines, key=lambda s: s.sentences_per_s)
    if best_engine.sentences_per_s >= ENGINE_MARGIN * best_plain.sentences_per_s:
        won, lost = best_engine, best_plain
    else:  # a tie, or a gain within the margin, keeps the plain path
        won, lost = best_plain, best_engine
    close = won is best_plain and best_engine.sentences_per_s > best_plain.sentences_per_s
    margin = f" (within {ENGINE_MARGIN - 1:.0%}: the same outputs)" if close else ""
    return DecoderChoice(
        won.continuous,
        f"{won.name}, {won.sentences_per_s:.1f} sentences/s against "
        f"{lost.sentences_per_s:.1f} for {lost.name}{margin} at {where} ({sources})",
    )


def default_decoder(
    use: Use, beam: int, threads: int, device: str = "cpu", shortlist: bool = False
) -> DecoderChoice:
    """`choose_decoder` where the engine can run, logged in one line; the plain path
    with an output shortlist (the engine projects onto the whole vocabulary) or off the
    CPU (where the decoders were not measured).

    Raises:
        FileNotFoundError, ValueError: as `choose_decoder`.
    """
    if shortlist:
        choice = DecoderChoice(0, f"{_PLAIN[use]}: the engine takes no output shortlist")
    elif str(device).split(":")[0] != "cpu":
        choice = DecoderChoice(0, f"{_PLAIN[use]}: the decoders were measured on the CPU only")
    else:
        choice = choose_decoder(use, beam, threads)
    log.info("decoder for a %s: %s", use.value, choice.reason)
    return choice
