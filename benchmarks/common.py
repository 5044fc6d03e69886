"""What the benchmarks share: the two shapes, random Marian checkpoints, worker processes, tables.

Every system under test runs in a worker process of its own (its own OpenMP pool and
thread settings), kept alive for the whole run. The parent asks the workers in turn
for one timed call at a time, so that all systems see the same machine load: on a
shared machine absolute numbers drift, ratios measured this way much less.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VOCAB = 8000
PAD = VOCAB - 1  # Marian's layout: the pad id is last and is the decoder start
EOS = 0
SHAPES = {
    "quickstart": dict(d_model=128, layers=3, heads=4, ffn=512),  # configs/bible-en-es-cpu.yaml
    "small": dict(d_model=256, layers=3, heads=4, ffn=1024),
    "base": dict(d_model=512, layers=6, heads=8, ffn=2048),
    "big": dict(d_model=1024, layers=6, heads=16, ffn=4096),
}
# Dense bf16 peak of the GPUs we may be lent, TFLOP/s (vendor data sheets), for MFU.
PEAK_BF16_TFLOPS = {"H100 80GB HBM3": 989.4, "H100 PCIe": 756.0, "H200": 989.4, "A100": 312.0}
ROOT = Path(__file__).resolve().parents[1]  # the repository: benchmarks run from here
RESULTS = ROOT / "benchmarks" / "results"


def test_files(run: Path) -> tuple[Path, Path]:
    """The source and reference files of the test split of the corpus RUN/config.yaml
    names (the quickstart's: 296 verses)."""
    from aiayn.data.corpus import PreparedCorpus
    from aiayn.training.recipe import load_recipe

    source, reference = PreparedCorpus.load(load_recipe(run / "config.yaml").corpus).files("test")
    return source, reference


def source_ids(batch: int, length: int, seed: int = 0) -> list[list[int]]:
    """Sentences of `length` ids: random ids, then eos (no pad, eos or unk inside)."""
    import random

    rng = random.Random(seed)
    return [[rng.randint(2, VOCAB - 2) for _ in range(length - 1)] + [EOS] for _ in range(batch)]


def marian_config(size: str, dropout: float = 0.1):
    """The `MarianConfig` of one benchmark shape: tied embeddings, decoder starting from pad,
    `dropout` on sub-layer outputs and embeddings only (none on attention or the FFN inside)."""
    from transformers import MarianConfig

    shape = SHAPES[size]
    return MarianConfig(
        vocab_size=VOCAB,
        decoder_vocab_size=VOCAB,
        d_model=shape["d_model"],
        encoder_layers=shape["layers"],
        decoder_layers=shape["layers"],
        encoder_attention_heads=shape["heads"],
        decoder_attention_heads=shape["heads"],
        encoder_ffn_dim=shape["ffn"],
        decoder_ffn_dim=shape["ffn"],
        max_position_embeddings=512,
        activation_function="relu",
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=PAD,
        decoder_start_token_id=PAD,
        eos_token_id=EOS,
        forced_eos_token_id=EOS,
        dropout=dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
    )


def save_random_marian(size: str, directory: Path, seed: int = 1234) -> Path:
    """A random-weight MarianMTModel of one shape, saved with `save_pretrained`."""
    import torch
    from transformers import MarianMTModel

    config = marian_config(size)
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():  # random biases, so that a mapping error cannot hide behind zeros
        model.final_logits_bias.normal_(std=0.1)
    model.save_pretrained(directory)
    return directory


class _SyntheticVocabulary:
    """What CTranslate2's Marian loader asks of a tokenizer: the vocabulary and two tokens."""

    eos_token = "</s>"
    unk_token = "<unk>"

    def get_vocab(self) -> dict[str, int]:
        vocab = {"</s>": 0, "<unk>": 1, "<pad>": PAD}
        vocab.update({f"w{i}": i for i in range(2, PAD)})
        return vocab


def ct2_token(i: int) -> str:
    return {0: "</s>", 1: "<unk>"}.get(i, f"w{i}")


def convert_ct2(marian_dir: Path, out: Path, quantization: str | None) -> Path:
    """Convert with CTranslate2's TransformersConverter (a synthetic vocabulary, no tokenizer)."""
    from ctranslate2.converters import TransformersConverter

    class Converter(TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return _SyntheticVocabulary()

    Converter(str(marian_dir)).convert(str(out), quantization=quantization, force=True)
    return out


def default_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="aiayn-bench-"))


# ----- workers ------------------------------------------------------------------

_PREFIX = "@@ "


def serve(handle) -> None:
    """Worker side: answer one JSON request per stdin line with one JSON line."""
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("stop"):
            break
        try:
            reply = handle(request)
        except Exception as err:  # report, keep serving
            reply = {"error": f"{type(err).__name__}: {err}"}
        sys.stdout.write(_PREFIX + json.dumps(reply) + "\n")
        sys.stdout.flush()


class Worker:
    """Parent side: one long-lived process running `python -m MODULE --worker system ...`
    from a repository's root (this one's, or with `root` and `pythonpath` another
    checkout's, whose `benchmarks` folder the module is then imported from); `env`: more
    environment variables for it (e.g. passive OpenMP waiting)."""

    def __init__(
        self,
        module: str,
        system: str,
        args: list[str],
        threads: int,
        pythonpath: str | None = None,
        root: Path = ROOT,
        env: dict[str, str] | None = None,
    ) -> None:
        env = dict(
            os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), **(env or {})
        )
        if pythonpath is not None:  # another checkout's aiayn (benchmarks against a commit)
            env["PYTHONPATH"] = pythonpath
        self.system = system
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (lives as long as the worker)
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, "--worker", system, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
            cwd=root,
        )

    def ask(self, **request: Any) -> dict[str, Any]:
        time.sleep(0.05)  # let the previous worker's OpenMP threads stop spinning
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        for line in self.process.stdout:
            if line.startswith(_PREFIX):
                reply = json.loads(line[len(_PREFIX) :])
                if "error" in reply:
                    raise RuntimeError(f"{self.system}: {reply['error']}\n{self.stderr()}")
                return reply
        raise RuntimeError(f"worker {self.system} died:\n{self.stderr()}")

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read()[-3000:]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.write(json.dumps({"stop": True}) + "\n")
            self.process.stdin.close()
            self.process.wait(timeout=60)


def time_translate(
    run: Path, source: Path, out: Path, options: list[str], env: dict[str, str]
) -> float:
    """Seconds one `aiayn translate RUN -i SOURCE -o OUT OPTIONS` process took, from its
    start to its exit (its log discarded), in the environment `env`."""
    command = [sys.executable, "-m", "aiayn", "translate", str(run), "-i", str(source)]
    command += ["-o", str(out), *options]
    began = time.perf_counter()
    subprocess.run(command, env=env, check=True, stderr=subprocess.DEVNULL)
    return time.perf_counter() - began


def decoding_rate(sentences: int, whole_s: float, one_s: float) -> float:
    """Sentences a second of the decoding alone: `sentences` took `whole_s` from start to
    exit, one sentence `one_s` (start, loading and that sentence)."""
    if whole_s <= one_s:
        raise ValueError(f"{sentences} sentences took {whole_s:.2f} s, one took {one_s:.2f} s")
    return (sentences - 1) / (whole_s - one_s)


def set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


# ----- reporting -------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine() -> str:
    from aiayn.config.devices import machine as this_machine

    return this_machine()


def without_unsupported_bf16(
    systems: list[str], bf16_systems: tuple[str, ...], device: str
) -> list[str]:
    """`systems` less its bf16 ones where `device` has no native bf16 (said on stderr)."""
    import torch

    from aiayn.training.precision import has_native_bf16

    if has_native_bf16(torch.device(device)) or not set(systems) & set(bf16_systems):
        return systems
    print(f"no bf16 rows: {device} does not multiply bf16 natively", file=sys.stderr)
    return [s for s in systems if s not in bf16_systems]


def device_name(device: str) -> str:
    """The machine's CPU, or the CUDA device's name."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return machine()


def peak_bf16_tflops(device: str) -> float | None:
    """The dense bf16 peak of a known CUDA device (None for the CPU or an unknown card)."""
    if not device.startswith("cuda"):
        return None
    name = device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "ctranslate2"):
        with contextlib.suppress(ImportError):
            out[name] = __import__(name).__version__
    return out


def table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.2f}" if value < 10 else f"{value:,.0f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |"]
    lines.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(headers))) + "|")
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def cpu_flags() -> list[str]:
    """The CPU's vector and matrix-unit flags the figures depend on (AVX*, AMX*, FMA, F16C)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    return sorted({f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c")})


def commit() -> str | None:
    """The checkout's commit, with "+changes" when its tracked files (results files aside)
    differ from it; or AIAYN_BENCH_COMMIT where set (a copy of the tree whose .git lags
    behind it, as on the lent GPU machine: benchmarks/gpu/run.sh)."""
    if os.environ.get("AIAYN_BENCH_COMMIT"):
        return os.environ["AIAYN_BENCH_COMMIT"]
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        # results files are what runs write, not what they measure
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", ".", ":!benchmarks/results"]
        ).returncode
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+changes" if dirty else "")


def load_average() -> list[float] | None:
    """The machine's 1, 5 and 15-minute load averages (other work running beside the run)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# A benchmark imports this module before it builds or times anything, so the run's own
# start and the load average before its timed part are taken here, once per run.
STARTED = time.strftime("%Y-%m-%d %H:%M")
LOAD_BEFORE = load_average()
# Above this 1-minute load average per core, other work beside the run can skew its
# timings: 1.5 on a 2-core machine.
QUIET_LOAD_PER_CORE = 0.75
_WARNED = False  # the warning is said once per run


def load_record(
    before: list[float] | None,
    after: list[float] | None,
    threads: int | None,
    cores: int | None,
) -> dict[str, Any]:
    """The load a run was measured under, and whether it was too high (`noisy`).

    The 1-minute load average after the timed part counts the run's own `threads` too, so
    they are taken off it; a run is noisy when the other work, before or after, came above
    QUIET_LOAD_PER_CORE x `cores`.

    Args:
        before: the 1, 5 and 15-minute load averages when the run started (None: unknown).
        after: the same when the timed part ended.
        threads: the threads the timed part ran (None: unknown, taken as 0).
        cores: the machine's cores (None: unknown).

    Returns:
        {"before", "after", "threads", "cores", "limit", "noisy"}; `limit` and `noisy` are
        None where the cores or either load average are unknown.
    """
    limit = None if cores is None else round(QUIET_LOAD_PER_CORE * cores, 2)
    noisy = None
    if limit is not None and before is not None and after is not None:
        others = max(before[0], after[0] - (threads or 0))
        noisy = others > limit
    return {
        "before": before,
        "after": after,
        "threads": threads,
        "cores": cores,
        "limit": limit,
        "noisy": noisy,
    }


def recorded_threads(payload: dict[str, Any]) -> int | None:
    """The most threads a results payload says its timed part ran ("threads" in its args or
    at its top; "2,1" gives 2), or None."""
    args = payload.get("args")
    value = args.get("threads") if isinstance(args, dict) else None
    value = payload.get("threads") if value is None else value
    counts = [int(part) for part in str(value).split(",") if part.strip().isdigit()]
    return max(counts) if value is not None and counts else None


def provenance(threads: int | None = None) -> dict[str, Any]:
    """What a results file records about its run: its start, machine, CPU flags, versions,
    the commit measured, the command line, the load average at its end, and the load
    before and after its timed part (`load_record`). A noisy load is said on stderr.

    Args:
        threads: the threads the timed part ran, taken off the load after it.
    """
    global _WARNED
    after = load_average()
    load = load_record(LOAD_BEFORE, after, threads, os.cpu_count())
    if load["noisy"] and not _WARNED:
        _WARNED = True
        print(
            f"warning: load average {LOAD_BEFORE[0]} before and {after[0]} after the timed "
            f"part ({threads or 0} thread(s) of its own), above {load['limit']} for "
            f"{load['cores']} cores: the results file is marked as measured under load",
            file=sys.stderr,
        )
    return {
        "date": STARTED,
        "load_average": after,
        "load": load,
        "machine": machine(),
        "cpu_flags": cpu_flags(),
        **({"gpu": gpu} if (gpu := gpu_name()) else {}),
        "versions": versions(),
        "commit": commit(),
        "command": command_line(),
    }


def gpu_name() -> str | None:
    """The CUDA device's name where this process has imported torch and sees one, else None
    (never imports torch itself: CTranslate2's workers go without it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name()


def command_line() -> str:
    """The command that started this process: `python -m benchmarks.NAME ARGS` for a module
    run with `-m` (as the benchmarks are), else the script's file name and its arguments."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    program = Path(sys.argv[0]).name if spec is None else f"python -m {spec.name}"
    return " ".join([program.removesuffix(".__main__"), *sys.argv[1:]])


def baseline_checkout(workdir: Path, commit: str) -> Path:
    """A git worktree of this repository at `commit` (made once, in the workdir)."""
    checkout = workdir / f"aiayn-{commit}"
    if not checkout.exists():
        root = Path(__file__).resolve().parents[1]
        subprocess.run(
            ["git", "-C", str(root), "worktree", "add", "--detach", str(checkout), commit],
            check=True,
        )
    return checkout


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """RESULTS/NAME.json: `provenance()` (its load less the payload's threads) and `payload`."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    record = {**provenance(recorded_threads(payload)), **payload}
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


# ----- decoding benchmark: memory, synthetic parallel text -------------------------------


def memory_mb() -> dict[str, float] | None:
    """This process's resident memory from /proc/self/status, in MiB: its high-water mark
    (`peak`, VmHWM) and now (`now`, VmRSS); None where /proc is absent (not Linux)."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    names = {"peak": "VmHWM", "now": "VmRSS"}
    try:
        return {key: int(fields[name].split()[0]) / 1024 for key, name in names.items()}
    except (KeyError, ValueError, IndexError):
        return None


def synthetic_parallel(
    pairs: int = 20000,
    length: int = 29,
    translations: int = 3,
    function_share: float = 0.5,
    seed: int = 0,
) -> tuple[list[list[int]], list[list[int]]]:
    """A random parallel corpus of ids with word-level structure, for a shortlist on random
    weights: no real translation table exists for them, but the shortlist's candidate set
    should have the size it has on text.

    Source sentences are uniform random ids (as `source_ids`). Each source id `s` is
    translated, token for token, either (share `function_share`) by a "function word" drawn
    from a Zipf distribution over the whole vocabulary (the frequent pieces of real text),
    or by one of `translations` ids of its own (fixed per `s`). So `s`'s top translations
    are its own few ids and frequent pieces, as with words of real text.

    Returns:
        (source lines, target lines): `pairs` lists of `length` ids each, no eos.
    """
    import random

    rng = random.Random(seed)
    ids = list(range(2, VOCAB - 1))  # no eos, unk or pad
    zipf_order = ids[:]
    rng.shuffle(zipf_order)
    cumulative, total = [], 0.0
    for rank in range(len(zipf_order)):
        total += 1.0 / (rank + 1)
        cumulative.append(total)
    own = {s: rng.sample(ids, translations) for s in ids}
    sources, targets = [], []
    for _ in range(pairs):
        src = [rng.choice(ids) for _ in range(length)]
        tgt = [
            rng.choices(zipf_order, cum_weights=cumulative)[0]
            if rng.random() < function_share
            else rng.choice(own[s])
            for s in src
        ]
        sources.append(src)
        targets.append(tgt)
    return sources, targets
