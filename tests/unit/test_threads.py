"""aiayn.inference.threads: the same outputs, the thread count restored."""

import pytest
import torch

from aiayn import ModelConfig, Transformer
from aiayn.inference.search import beam_search, greedy_search
from aiayn.inference.threads import StepThreads, intra_op_threads


def test_step_threads_change_no_output_and_restore_the_thread_count():
    torch.manual_seed(0)
    model = Transformer(ModelConfig.tiny(vocab_size=30)).eval()
    src = torch.randint(3, 30, (3, 7))
    before = torch.get_num_threads()
    wrapped = StepThreads(model, threads=1)
    for search in (greedy_search, beam_search):
        expected, got = search(model, src, extra_len=4), search(wrapped, src, extra_len=4)
        assert [[h.tokens for h in r] for r in got] == [[h.tokens for h in r] for r in expected]
    assert torch.get_num_threads() == before


def test_intra_op_threads_restores_after_an_error_and_rejects_zero():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError), intra_op_threads(1):
        assert torch.get_num_threads() == 1
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads"), intra_op_threads(0):
        pass
