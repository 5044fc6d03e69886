"""A fair race of decoding systems: one system at a time, each at threads chosen in advance.

Every system runs in a worker process of its own (`common.Worker`), and only one worker
is alive at any moment: the previous system's process has exited before the next one
starts. So no system's OpenMP threads spin on the cores while another is timed, and no
system needs a wait policy forced on it (passive waiting slowed CTranslate2 from 16 ms
to 41 ms a sentence and torch's small operations with it; issue 44). Each system keeps
its own defaults; the environment the parent passes on is recorded (`stated_settings`).

The race has two phases:

1. Calibration (untimed, its times are not results): each system at each thread count
   in its own process, one warm-up call and `calibration_calls` calls per cell. Each
   system's best thread count per cell is fixed here (`best_threads`).
2. The timed race: `passes` passes; in each, every system in turn (the order reversed
   on every other pass, so that a drift of the machine's speed falls on both ends
   alike), at every thread count, in a fresh process: one warm-up call per cell, then
   `rounds` rounds of one call per cell. The load average is recorded before and after
   each process's timed calls.

"Same threads" compares the systems at one thread count; "each at its best" compares
each system at the thread count its calibration chose, with the timed run's times.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from benchmarks import common

Cell = tuple[int, int]  # (beam, batch)
# The variables that change how OpenMP threads wait; the race sets none of them, and
# records those the parent's environment holds (then every system runs with them).
WAIT_SETTINGS = ("OMP_WAIT_POLICY", "KMP_BLOCKTIME", "GOMP_SPINCOUNT", "KMP_LIBRARY")


class RaceWorker(Protocol):
    def ask(self, **request: Any) -> dict[str, Any]: ...

    def close(self) -> None: ...


@dataclass
class Race:
    """What a race measured for one shape.

    Attributes:
        times: (system, threads, cell) -> seconds of each timed call, pass by pass,
            round by round (the same index is the same pass and round for every system).
        outputs: (system, cell) -> the first warm-up call's tokens (first thread count).
        memory: (system, threads) -> {"loaded", "peak"}: VmHWM in MiB after loading and
            after the last call (None where the worker cannot tell).
        shortlist_sizes: cell -> the shortlist's candidates for the cell's sources.
        calibration: (system, threads, cell) -> median seconds of the calibration calls.
        best_threads: (system, cell) -> the thread count its calibration chose.
        load: one record per timed process: system, threads, pass, load_before/after.
    """

    times: dict[tuple[str, int, Cell], list[float]] = field(default_factory=dict)
    outputs: dict[tuple[str, Cell], list[list[int]]] = field(default_factory=dict)
    memory: dict[tuple[str, int], dict[str, float | None]] = field(default_factory=dict)
    shortlist_sizes: dict[Cell, int] = field(default_factory=dict)
    calibration: dict[tuple[str, int, Cell], float] = field(default_factory=dict)
    best_threads: dict[tuple[str, Cell], int] = field(default_factory=dict)
    load: list[dict[str, Any]] = field(default_factory=list)

    def at_best(self, system: str, cell: Cell) -> list[float]:
        """The timed calls of `system` in `cell` at the thread count chosen in advance."""
        return self.times[system, self.best_threads[system, cell], cell]


def stated_settings() -> dict[str, str]:
    """The OpenMP wait settings of this environment, which every worker inherits."""
    return {name: os.environ[name] for name in WAIT_SETTINGS if name in os.environ}


def choose_threads(calibration: dict[tuple[str, int, Cell], float]) -> dict[tuple[str, Cell], int]:
    """Per (system, cell): the thread count of the shortest calibration time (the fewer
    threads on a tie)."""
    best: dict[tuple[str, Cell], int] = {}
    for (system, threads, cell), seconds in sorted(calibration.items(), key=lambda kv: kv[0][1]):
        chosen = best.get((system, cell))
        if chosen is None or seconds < calibration[system, chosen, cell]:
            best[system, cell] = threads
    return best


def run_race(
    start: Callable[[str, int], RaceWorker],
    systems: list[str],
    thread_counts: list[int],
    cells: list[Cell],
    request: Callable[[Cell], dict[str, Any]],
    rounds: int,
    passes: int = 2,
    calibration_calls: int = 2,
) -> Race:
    """Calibrate, then race `systems` one process at a time (see the module).

    Args:
        start: (system, threads) -> a started worker; the race closes each before it
            starts the next.
        systems: the systems, in the first pass's order.
        thread_counts: the thread counts each system runs at (and chooses among).
        cells: (beam, batch) settings; each call decodes one.
        request: cell -> the worker request of one call in it (without `tokens`).
        rounds: timed rounds per process (one call per cell each).
        passes: processes per system and thread count in the timed race.
        calibration_calls: calls per cell after the warm-up, in the calibration.

    Returns:
        The `Race`.

    Raises:
        ValueError: no systems, thread counts or cells, or rounds, passes or
            calibration_calls below 1.
    """
    if not systems or not thread_counts or not cells:
        raise ValueError(
            f"a race needs systems, thread counts and cells; got {systems}, "
            f"{thread_counts}, {cells}"
        )
    if min(rounds, passes, calibration_calls) < 1:
        raise ValueError(
            f"rounds ({rounds}), passes ({passes}) and calibration_calls "
            f"({calibration_calls}) must be 1 or more"
        )
    race = Race()
    for system in systems:  # 1. calibration: untimed, fixes each system's threads
        for threads in thread_counts:
            worker = start(system, threads)
            try:
                for cell in cells:
                    worker.ask(**request(cell))  # warm-up
                    seconds = [
                        worker.ask(**request(cell))["seconds"] for _ in range(calibration_calls)
                    ]
                    race.calibration[system, threads, cell] = common.median(seconds)
            finally:
                worker.close()
    race.best_threads = choose_threads(race.calibration)
    for number in range(passes):  # 2. the timed race
        order = systems if number % 2 == 0 else systems[::-1]
        for system in order:
            for threads in thread_counts:
                _timed_process(race, start, system, threads, cells, request, rounds, number)
    return race


def _timed_process(
    race: Race,
    start: Callable[[str, int], RaceWorker],
    system: str,
    threads: int,
    cells: list[Cell],
    request: Callable[[Cell], dict[str, Any]],
    rounds: int,
    number: int,
) -> None:
    """One worker's part of the timed race: loaded memory, warm-up, timed rounds, peak."""
    worker = start(system, threads)
    try:
        loaded = (worker.ask(memory=True).get("memory_mb") or {}).get("peak")
        for cell in cells:  # warm-up; the system's first process's tokens are kept
            reply = worker.ask(**request(cell), tokens=True)
            race.outputs.setdefault((system, cell), reply["tokens"])
            if reply.get("shortlist_size") is not None:
                race.shortlist_sizes[cell] = reply["shortlist_size"]
        before = common.load_average()
        for _ in range(rounds):
            for cell in cells:
                seconds = worker.ask(**request(cell))["seconds"]
                race.times.setdefault((system, threads, cell), []).append(seconds)
        after = common.load_average()
        peak = (worker.ask(memory=True).get("memory_mb") or {}).get("peak")
    finally:
        worker.close()
    race.memory.setdefault((system, threads), {"loaded": loaded, "peak": peak})
    race.load.append(
        dict(
            system=system, threads=threads, pass_number=number, load_before=before, load_after=after
        )
    )
