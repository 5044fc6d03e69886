"""aiayn.training.budget: the FLOPs formula against torch's FlopCounterMode, the replay of the
batches a run read, and the matmul peak timing."""

from __future__ import annotations

import random

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from aiayn import ModelConfig, Transformer
from aiayn.data.batching import TokenBatcher
from aiayn.training.budget import (
    TrainedWork,
    batches_work,
    forward_matmul_flops,
    measure_matmul_peak,
    trained_work,
    training_matmul_flops,
)
from train_helpers import copy_pairs


def counted(cfg: ModelConfig, batch: int, src_len: int, tgt_len: int, backward: bool) -> int:
    """FlopCounterMode's count of the model's forward (and backward) pass.

    The math backend of SDPA, written with bmm, is counted: the fused CPU kernel is not.
    """
    model = Transformer(cfg)
    src = torch.randint(3, cfg.vocab_size, (batch, src_len))
    src[0, src_len - 2 :] = cfg.pad_id  # padded positions are computed all the same
    tgt = torch.randint(3, cfg.vocab_size, (batch, tgt_len))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        logits = model(src, tgt)
        if backward:
            logits.sum().backward()
    return counter.get_total_flops()


# fmt: off
CONFIGS = {
    "paper": dict(d_model=16, n_heads=2, d_ff=24, n_layers=2),
    "grouped-query, d_k != d_v, 3+1 layers, own output projection": dict(
        d_model=24, n_heads=4, n_kv_heads=2, d_k=5, d_v=7, d_ff=40,
        n_encoder_layers=3, n_decoder_layers=1, tie_output=False,
    ),
    "pre-norm, explicit attention": dict(
        d_model=16, n_heads=4, d_ff=32, n_layers=1, norm_first=True, attention="explicit"
    ),
}
# fmt: on


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize(("batch", "src_len", "tgt_len"), [(3, 7, 5), (1, 4, 9)])
def test_forward_flops_equal_the_flop_counter(name, batch, src_len, tgt_len):
    cfg = ModelConfig.tiny(vocab_size=50, dropout=0.0, **CONFIGS[name])
    expected = counted(cfg, batch, src_len, tgt_len, backward=False)
    assert forward_matmul_flops(cfg, batch, src_len, tgt_len) == expected


def test_training_flops_are_forward_and_backward():
    cfg = ModelConfig.tiny(vocab_size=50, dropout=0.0, **CONFIGS["paper"])
    expected = counted(cfg, 3, 7, 5, backward=True)
    assert training_matmul_flops(cfg, 3, 7, 5) == expected


def test_flops_refuse_what_the_formula_does_not_cover():
    gpt = ModelConfig.tiny(vocab_size=50, architecture="decoder_only")
    with pytest.raises(ValueError, match="decoder_only"):
        forward_matmul_flops(gpt, 1, 4, 4)
    cfg = ModelConfig.tiny(vocab_size=50)
    with pytest.raises(ValueError, match="src_len"):
        forward_matmul_flops(cfg, 1, 0, 4)


@pytest.fixture
def batcher() -> TokenBatcher:
    pairs = copy_pairs(120, random.Random(0), vocab=20)
    return TokenBatcher(pairs, 64, pad_id=0, bos_id=1, eos_id=2, seed=3)


def test_trained_work_replays_whole_and_partial_epochs(batcher):
    cfg = ModelConfig.tiny(vocab_size=20, pad_id=0, bos_id=1, eos_id=2)
    n = len(batcher)
    assert n >= 4
    # The reference: the batches themselves, as the trainer reads them.
    read = list(batcher.epoch(0)) + list(batcher.epoch(1))[: n // 2]
    work = trained_work(cfg, batcher, 1 + (n // 2) / n)
    assert work.batches == len(read)
    assert work.tgt_tokens == sum(b.n_tgt_tokens for b in read)
    assert work.src_tokens == sum(int((b.src != 0).sum()) for b in read)
    assert work.flops == sum(
        training_matmul_flops(cfg, b.src.shape[0], b.src.shape[1], b.tgt_in.shape[1]) for b in read
    )
    assert trained_work(cfg, batcher, 0) == TrainedWork()
    assert trained_work(cfg, batcher, 2) == batches_work(cfg, batcher, batcher.batches).times(2)
    with pytest.raises(ValueError, match="epochs"):
        trained_work(cfg, batcher, -1)


def test_matmul_peak_records_what_it_timed():
    peak = measure_matmul_peak(torch.float32, size=64, repeats=2)
    assert peak.dtype == "float32" and peak.shape == (64, 64, 64) and peak.repeats == 2
    assert peak.threads == torch.get_num_threads() and peak.gflops > 0
    with pytest.raises(ValueError, match="size"):
        measure_matmul_peak(size=0)


def test_peaks_reached_measure_fp32_and_native_bf16():
    from aiayn.training.budget import peaks_reached
    from aiayn.training.precision import has_native_bf16

    peaks = peaks_reached(10.0)
    expected = {"float32", "bfloat16"} if has_native_bf16(torch.device("cpu")) else {"float32"}
    assert set(peaks) == expected
    for peak in peaks.values():
        assert peak["percent_reached"] == pytest.approx(1000 / peak["gflops"], abs=0.1)
