"""benchmarks/bench_recall.py: the per-cell summary and the goal checks on hand-written runs,
the set-weight circuits (MQAR and both copying tasks) through kernels on small cells, and
the tasks' cells."""

from __future__ import annotations

import pytest

from aiayn.data.recall import IGNORE, MARKER
from benchmarks.bench_recall import (
    GRIDS,
    TASKS,
    gaps,
    kernel_variants,
    make_task,
    run_circuit,
    summarise,
)


def runs(variant, scores, length=64, pairs=16, width=16):
    return [
        {"variant": variant, "length": length, "pairs": pairs, "width": width, "accuracy": a}
        for a in scores
    ]


def test_a_kernel_breaks_only_20_points_below_sdpa_and_beyond_the_seed_spread():
    cells = summarise(
        runs("sdpa", [99.0, 100.0, 98.0])
        + runs("linear", [60.0, 70.0, 80.0])  # 29 below, best seed under sdpa's worst
        + runs("window-8", [70.0, 75.0, 99.0])  # 17.67 below: not 20
        + runs("performer-16", [20.0, 30.0, 98.5])  # 49.5 below, but one seed reaches sdpa
    )
    sdpa = next(c for c in cells if c["variant"] == "sdpa")
    assert (sdpa["mean"], sdpa["min"], sdpa["max"], sdpa["seeds"]) == (99.0, 98.0, 100.0, 3)
    verdicts = {g["variant"]: (g["below_sdpa"], g["breaks"]) for g in gaps(cells)}
    assert verdicts == {
        "linear": (29.0, True),
        "window-8": (17.67, False),
        "performer-16": (49.5, False),
    }


def test_the_circuit_recalls_through_sdpa_and_not_through_a_short_window():
    grid = GRIDS["circuit"]
    variants = kernel_variants(grid)
    scores = {}
    for name in ("sdpa", "window-8"):
        kernel, options = variants[name]
        job = dict(variant=name, kernel=kernel, options=options, length=64, pairs=16)
        scores[name] = run_circuit({**job, "width": 16, "seed": 0})["accuracy"]
    # 16 pairs span 32 positions: a window of 8 a side reaches only the nearest few
    assert scores["sdpa"] == 100.0
    assert scores["window-8"] < 30


def circuit(task, name, length=64, n=16, width=16, seed=0):
    kernel, options = kernel_variants(GRIDS["circuit"])[name]
    job = dict(task=task, variant=name, kernel=kernel, options=options, length=length, pairs=n)
    return run_circuit({**job, "width": width, "seed": seed})["accuracy"]


@pytest.mark.parametrize("task", ["distance-copy", "selective-copy"])
def test_the_copying_circuits_copy_through_sdpa_and_a_wide_window_only(task):
    # 16 tokens from a context of 48: the first sits 48 positions before its marker
    assert circuit(task, "sdpa") == 100.0
    assert circuit(task, "window-64") == 100.0  # 64 a side covers the whole sequence
    # a window of 8 a side sees no data token from any marker: chance among 14 tokens
    assert abs(circuit(task, "window-8") - 100 / 14) < 3


def test_a_fixed_state_kernel_cannot_tell_the_two_copying_tasks_apart():
    """Linear attention's output at a query is S q / z q: the blanks' keys carry zero
    values, so they change only z q, a positive factor that leaves the argmax alone; the
    data tokens' keys are the same codes (positions 0 ... N-1 and ranks 0 ... N-1) with
    the same tokens (the generator draws the tokens first). So the scores are equal,
    and far from sdpa's."""
    distance = circuit("distance-copy", "linear")
    assert distance == circuit("selective-copy", "linear")
    assert distance < 50


@pytest.mark.parametrize("task", TASKS)
def test_a_cells_task_has_length_l_and_answers_in_its_answer_range(task):
    length, n = 64, 8
    made = make_task(task, length, n)
    inputs, targets = made.draw(20, seed=3)
    assert inputs.shape == targets.shape == (20, length)
    answers = targets[targets != IGNORE]
    assert answers.numel() == 20 * n  # every pair queried once, every token copied
    assert made.first_answer <= answers.min() and answers.max() < made.vocab
    if task != "mqar":  # N markers close the sequence: the context is L - N
        assert (inputs[:, length - n :] == MARKER).all()
        assert (inputs[:, : length - n] != MARKER).all()


def test_an_unknown_task_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown task 'copy'"):
        make_task("copy", 64, 8)
