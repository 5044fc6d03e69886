"""bench_serve's offline limit: the decoding alone, without the process's start."""

import pytest

from benchmarks.bench_serve import OFFLINE
from benchmarks.common import decoding_rate as offline_rate


def test_the_offline_rate_leaves_out_start_and_loading():
    # 296 sentences in 9 s from start to exit, one sentence in 3 s: 295 in 6 s
    assert offline_rate(296, 9.0, 3.0) == pytest.approx(295 / 6)


def test_an_offline_time_no_longer_than_one_sentences_is_refused():
    with pytest.raises(ValueError, match=r"296 sentences took 3\.00 s, one took 3\.50 s"):
        offline_rate(296, 3.0, 3.5)


def test_both_offline_decoders_are_named_explicitly():
    # not the default path's choice: sorted batches and the engine, each by its option
    assert OFFLINE["offline, sorted batches"] == ["--continuous", "0"]
    assert OFFLINE["offline, continuous 32"] == ["--continuous", "32"]
