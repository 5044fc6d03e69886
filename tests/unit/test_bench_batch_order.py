"""benchmarks/bench_batch_order.py: the verses cut into batches in arrival order (shuffled by
the round's seed) and sorted by length, each order holding every verse once."""

from __future__ import annotations

import pytest

from benchmarks import report as bench_report
from benchmarks.bench_batch_order import batches_of
from benchmarks.report import engine

VERSES = ["a b c", "a", "a b c d e", "a b", "a b c d", "x y z", "q"]


@pytest.mark.parametrize("order", ["arrival", "sorted"])
def test_every_verse_is_in_exactly_one_batch_of_at_most_b(order):
    batches = batches_of(VERSES, 3, order, seed=1)
    assert [len(b) for b in batches] == [3, 3, 1]
    assert sorted(v for b in batches for v in b) == sorted(VERSES)


def test_sorted_batches_hold_neighbours_in_length_and_keep_ties_in_file_order():
    assert batches_of(VERSES, 3, "sorted", seed=0) == [
        ["a", "q", "a b"], ["a b c", "x y z", "a b c d"], ["a b c d e"]
    ]  # fmt: skip


def test_arrival_order_is_the_seeds_shuffle():
    first, again = batches_of(VERSES, 7, "arrival", 3), batches_of(VERSES, 7, "arrival", 3)
    assert first == again and first != batches_of(VERSES, 7, "arrival", 4)
    assert first != [VERSES] or batches_of(VERSES, 7, "arrival", 5) != [VERSES]


def test_a_bad_size_or_order_is_refused():
    with pytest.raises(ValueError, match="at least one"):
        batches_of(VERSES, 0, "sorted", 0)
    with pytest.raises(ValueError, match="unknown order"):
        batches_of(VERSES, 2, "random", 0)


def test_the_report_table_gives_each_order_and_size_against_the_file(monkeypatch):
    cells = [
        dict(order="file", batch=10, sentences_per_s=50.0, vs_file=1.0),
        dict(order="arrival", batch=4, sentences_per_s=30.0, vs_file=0.6),
    ]
    data = dict(date="2026-12-03 12:00", machine="test cpu", cpu_flags=["avx2"],
                versions={"torch": "2.13"}, commit="abc1234", command="bench",
                sentences=10, beam=4, threads=1, rounds=3, cells=cells)  # fmt: skip
    monkeypatch.setattr(bench_report, "load", lambda name: data)
    text = engine.batch_order()
    assert "10 test verses, beam 4, 1 thread(s)" in text and "median of 3 rounds" in text
    assert "| file | 10 | 50.0 | 1.00x |" in text
    assert "| arrival | 4 | 30.0 | 0.60x |" in text
