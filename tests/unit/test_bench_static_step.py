"""benchmarks/bench_static_step.py: the rounds of each system combined, by hand."""

from __future__ import annotations

from benchmarks.bench_static_step import combine


def test_each_system_and_slot_count_keeps_the_median_of_its_rounds():
    measured = [
        dict(system="cache", slots=1, compile_s=0.5, ms_per_step=2.0, outside_gemm_ms=0.4),
        dict(system="ct2-fp32", slots=1, ms_per_step=1.5),
        dict(system="cache", slots=1, compile_s=0.1, ms_per_step=3.0, outside_gemm_ms=1.4),
        dict(system="ct2-fp32", slots=1, ms_per_step=1.2),
        dict(system="cache", slots=1, compile_s=0.1, ms_per_step=2.5, outside_gemm_ms=1.0),
        dict(system="ct2-fp32", slots=1, ms_per_step=2.3),
    ]
    cache, ct2 = combine(measured)
    assert (cache["system"], cache["rounds"]) == ("cache", 3)
    assert cache["ms_per_step"] == 2.5 and cache["outside_gemm_ms"] == 1.0  # the middle ones
    assert cache["outside_gemm_ms_rounds"] == [0.4, 1.4, 1.0]
    assert cache["compile_s"] == 0.5  # the first round's: later ones reuse its work
    assert ct2["ms_per_step"] == 1.5 and "outside_gemm_ms" not in ct2


def test_a_system_that_failed_in_a_round_is_reported_by_its_error():
    measured = [
        dict(system="aoti", slots=1, ms_per_step=2.0),
        dict(system="aoti", slots=1, error="RuntimeError('no compiler')"),
    ]
    assert combine(measured) == [measured[1]]
