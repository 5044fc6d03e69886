"""One attention computation: the training model's attention, the frozen modules and the
static decoding step all run the kernel's, and differ only in projections and stores."""

from __future__ import annotations

import pytest
import torch

from aiayn import ModelConfig, build_model, freeze
from aiayn.inference.static_step import StaticStep
from aiayn.models.encoder_decoder import normal_initialisation
from aiayn.nn.kernels import Kernel
from aiayn.nn.kernels.sdpa import SdpaKernel, attend

VOCAB = 40
SETTINGS = dict(d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=16, dropout=0.0)


def small(architecture: str = "encoder_decoder", **overrides) -> torch.nn.Module:
    preset = ModelConfig.tiny if architecture == "encoder_decoder" else ModelConfig.gpt
    cfg = preset(VOCAB, **{**SETTINGS, "architecture": architecture, **overrides})
    model = build_model(cfg).eval()
    normal_initialisation(model, std=0.3)
    return model


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(2, 6) sources ending in eos, one padded, and (2, 5) decoder inputs from bos."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(3, VOCAB, (2, 6), generator=generator)
    src[:, -1] = 2
    src[1, 3], src[1, 4:] = 2, 0
    tgt = torch.randint(3, VOCAB, (2, 5), generator=generator)
    tgt[:, 0] = 1
    return src, tgt


def stepped(model: torch.nn.Module, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """(B, T, V): the static step's logits, one position at a time."""
    step = StaticStep(model, slots=src.size(0))
    step.load_source(torch.arange(src.size(0)), src)
    rows = [
        step.logits(tgt[:, t], torch.full((src.size(0),), t)) for t in range(tgt.size(1))
    ]  # fmt: skip
    return torch.stack(rows, dim=1)


def test_every_path_calls_the_kernels_method_for_the_attention(monkeypatch):
    calls: list[tuple[int, ...]] = []
    original = Kernel.attend_projected

    def spy(self, q, *args, **kwargs):
        calls.append(tuple(q.shape))
        return original(self, q, *args, **kwargs)

    monkeypatch.setattr(SdpaKernel, "attend_projected", spy)
    model, (src, tgt) = small(), batch()
    attentions = 2 * 2 + 2  # encoder self; decoder self and cross, in each of 2 layers
    with torch.no_grad():
        model(src, tgt)
        assert len(calls) == attentions
        calls.clear()
        freeze(model)(src, tgt)
        assert len(calls) == attentions
        calls.clear()
        stepped(model, src, tgt)
    # the sources' pass through the encoder (2), then per step the decoder's 2 x 2
    assert len(calls) == 2 + tgt.size(1) * 2 * 2
    assert calls[-1] == (2, 4, 1, 8)  # the last layer's cross-attention: (N, H, 1, Dk)


def halved_queries(self, q, k, v, mask=None, causal=False, dropout_p=0.0, need_weights=False,
                   bias=None):  # fmt: skip
    """Another attention: softmax(Q K^T / (2 sqrt(d_k))) V, a softer temperature."""
    return attend(q / 2, k, v, mask, causal, dropout_p, need_weights, bias)


@pytest.mark.parametrize("positional", ["sinusoidal", "relative"])
def test_a_changed_kernel_changes_every_path_alike(monkeypatch, positional):
    model, (src, tgt) = small(positional=positional, n_kv_heads=2), batch()
    with torch.no_grad():
        before = model(src, tgt)
        monkeypatch.setattr(SdpaKernel, "__call__", halved_queries)
        literal = model(src, tgt)
        frozen = freeze(model)(src, tgt)
        static = stepped(model, src, tgt)
        static_frozen = stepped(freeze(model), src, tgt)
    assert (literal - before).abs().max() > 1e-2  # the kernel is what attends
    for other in (frozen, static, static_frozen):
        torch.testing.assert_close(other, literal, atol=1e-5, rtol=1e-5)
