"""What a training run computed, and how fast: its budget at the Python level.

`aiayn quickstart` writes `training_budget` to results.json as `budget`, so that a
run on another machine compares: optimizer steps, epochs, minutes, tokens per
second, the model's matrix-multiply FLOPs per training token, the rate achieved, and
its share of this machine's matrix-multiply peak, measured by a short timing.

FLOPs count a multiply-add as 2 and only the matrix products (the linear layers and
the two attention products); embeddings, softmax, layer norms and the loss are not
counted. For one batch of B pairs padded to S source and T target positions (eos /
bos included), with D = d_model, H heads of size Dk (queries, keys) and Dv (values),
Hkv key/value heads, F = d_ff (0 for attention-only layers: no FFN products) and V the
vocabulary, the forward pass is

    per encoder layer   2*B*S*D*(H*Dk + Hkv*Dk + Hkv*Dv + H*Dv + 2*F)    projections, FFN
                        + 2*B*H*S*S*(Dk + Dv)                            Q K^T and A V
    per decoder layer   2*B*T*D*(H*Dk + Hkv*Dk + Hkv*Dv + H*Dv + 2*F)    self-attn, FFN
                        + 2*B*H*T*T*(Dk + Dv)                            causal, as computed
                        + 2*B*T*D*(H*Dk + H*Dv) + 2*B*S*D*Hkv*(Dk + Dv)  cross-attn projections
                        + 2*B*H*T*S*(Dk + Dv)                            cross-attn products
    output projection   2*B*T*D*V

and a training step costs 3 times its forward pass: the backward pass computes the
gradient of each product's input and of its weight, two products of the same size.
The causal self-attention is counted in full because the kernels compute the whole
T x T square. Padded positions are counted: they are computed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import asdict, astuple, dataclass

import torch

from aiayn.config import ModelConfig
from aiayn.data.batching import TokenBatcher
from aiayn.nn.kernels import kernel_class
from aiayn.training.precision import has_native_bf16, measure_matmul_peak

log = logging.getLogger(__name__)

# Forward + backward: the backward pass of each matrix product is two products of its size.
TRAINING_FACTOR = 3


def forward_matmul_flops(cfg: ModelConfig, batch: int, src_len: int, tgt_len: int) -> int:
    """Matrix-multiply FLOPs of one forward pass of the encoder-decoder (formula above).

    Args:
        cfg: the model (an encoder-decoder without pruned heads).
        batch: pairs in the batch (B).
        src_len, tgt_len: padded source and target lengths (S, T), specials included.

    Returns:
        The FLOPs, a multiply-add counted as 2.

    Raises:
        ValueError: another architecture, pruned heads or sliding-window attention
            (their products differ from the formula), or a length below 1.
    """
    if cfg.architecture != "encoder_decoder":
        raise ValueError(
            f"matmul FLOPs are counted for the encoder_decoder architecture, "
            f"not {cfg.architecture!r}"
        )
    if cfg.kept_heads or not kernel_class(cfg.attention).full_scores:
        raise ValueError(
            "matmul FLOPs are counted for unpruned full attention; this model has "
            + ("pruned heads" if cfg.kept_heads else f"{cfg.attention} attention")
        )
    if min(batch, src_len, tgt_len) < 1:
        raise ValueError(
            f"batch, src_len and tgt_len must be >= 1, got {batch}, {src_len}, {tgt_len}"
        )
    d, h, hkv, dk, dv, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_k, cfg.d_v, cfg.d_ff
    b, s, t = batch, src_len, tgt_len
    self_proj = d * (h * dk + hkv * dk + hkv * dv + h * dv)  # MACs per position
    ffn = 2 * d * f
    encoder = 2 * b * s * (self_proj + ffn) + 2 * b * h * s * s * (dk + dv)
    decoder = (
        2 * b * t * (self_proj + ffn)
        + 2 * b * h * t * t * (dk + dv)
        + 2 * b * t * d * (h * dk + h * dv)
        + 2 * b * s * d * hkv * (dk + dv)
        + 2 * b * h * t * s * (dk + dv)
    )
    output = 2 * b * t * d * cfg.vocab_size
    return cfg.n_encoder_layers * encoder + cfg.n_decoder_layers * decoder + output


def training_matmul_flops(cfg: ModelConfig, batch: int, src_len: int, tgt_len: int) -> int:
    """`forward_matmul_flops` times 3: one training step (forward and backward) on a batch."""
    return TRAINING_FACTOR * forward_matmul_flops(cfg, batch, src_len, tgt_len)


@dataclass(frozen=True)
class TrainedWork:
    """What a run's batches held: real tokens (eos included) and training matmul FLOPs."""

    batches: int = 0
    src_tokens: int = 0
    tgt_tokens: int = 0
    flops: int = 0

    def __add__(self, other: TrainedWork) -> TrainedWork:
        return TrainedWork(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def times(self, n: int) -> TrainedWork:
        return TrainedWork(*(n * x for x in astuple(self)))


def batches_work(
    cfg: ModelConfig, batcher: TokenBatcher, batches: Iterable[list[int]]
) -> TrainedWork:
    """The tokens and training FLOPs of `batches` (lists of pair indices of `batcher`)."""
    total = TrainedWork()
    for indices in batches:
        src = [len(batcher.pairs[i][0]) + 1 for i in indices]  # + eos
        tgt = [len(batcher.pairs[i][1]) + 1 for i in indices]  # + eos (tgt_out) / bos (tgt_in)
        flops = training_matmul_flops(cfg, len(indices), max(src), max(tgt))
        total = total + TrainedWork(1, sum(src), sum(tgt), flops)
    return total


def trained_work(cfg: ModelConfig, batcher: TokenBatcher, epochs: float) -> TrainedWork:
    """The work of a run that read `epochs` passes of `batcher` (one process).

    Whole epochs read every batch once; the last, partial epoch read the first
    batches of its shuffled order, which `batcher.batch_indices(epoch)` replays.

    Raises:
        ValueError: `epochs` is negative.
    """
    if epochs < 0:
        raise ValueError(f"epochs must be >= 0, got {epochs}")
    whole = math.floor(epochs)
    position = round((epochs - whole) * len(batcher))
    work = TrainedWork()
    if whole:
        per_epoch = batches_work(cfg, batcher, batcher.batch_indices(0))
        work = per_epoch.times(whole)
    if position:
        work = work + batches_work(cfg, batcher, batcher.batch_indices(whole)[:position])
    return work


def peaks_reached(achieved_gflops: float, device: str | torch.device = "cpu") -> dict:
    """The matmul peaks of `device`, measured now (fp32, and bf16 where it multiplies bf16
    natively), each as `MatmulPeak`'s fields plus the percentage `achieved_gflops` is of it.
    """
    dtypes = [torch.float32]
    if has_native_bf16(torch.device(device)):
        dtypes.append(torch.bfloat16)
    peaks = {}
    for dtype in dtypes:
        peak = measure_matmul_peak(dtype, device=device)
        peaks[peak.dtype] = {
            **asdict(peak),
            "shape": list(peak.shape),
            "gflops": round(peak.gflops, 1),
            "percent_reached": round(100 * achieved_gflops / peak.gflops, 1),
        }
    return peaks


def training_budget(
    cfg: ModelConfig,
    batcher: TokenBatcher,
    steps: int,
    epochs: float,
    train_minutes: float,
    device: str | torch.device = "cpu",
) -> dict[str, object]:
    """The budget of a run, for results.json (see the module docstring for the FLOPs).

    Args:
        cfg: the model trained.
        batcher: the run's training batches (same corpus, budget and seed).
        steps: optimizer steps made.
        epochs: passes over the data (fractional).
        train_minutes: training time over all resumes (checkpoint writes included).
        device: where it trained; the peak is measured there.

    Returns:
        steps, epochs, train_minutes (and seconds), batches, src/tgt tokens, tokens per second
        (source + target, and target alone), training matmul FLOPs per target token
        and per token (source + target), the achieved GFLOP/s, and `peak`: for fp32
        (and bf16 where the device multiplies it natively) the measured GFLOP/s with
        its shape and threads, and the percentage of it the run reached.

    Raises:
        ValueError: a model whose FLOPs are not counted (see `forward_matmul_flops`).
    """
    work = trained_work(cfg, batcher, epochs)
    seconds = max(train_minutes * 60, 1e-9)
    achieved = work.flops / seconds / 1e9
    tokens = work.src_tokens + work.tgt_tokens
    return {
        "steps": steps,
        "epochs": round(epochs, 3),
        "train_minutes": round(train_minutes, 2),
        "train_seconds": round(seconds, 3),
        "batches": work.batches,
        "src_tokens": work.src_tokens,
        "tgt_tokens": work.tgt_tokens,
        "tokens_per_s": round(tokens / seconds, 1),
        "tgt_tokens_per_s": round(work.tgt_tokens / seconds, 1),
        "matmul_flops_per_tgt_token": round(work.flops / max(work.tgt_tokens, 1)),
        "matmul_flops_per_token": round(work.flops / max(tokens, 1)),
        "matmul_flops": work.flops,
        "achieved_gflops": round(achieved, 1),
        "peak": peaks_reached(achieved, device),
    }


def budget_line(budget: dict[str, object]) -> str:
    """One line for people: steps, epochs, tokens/s, GFLOP/s and the share of peak."""
    peaks = budget["peak"]
    shares = ", ".join(
        f"{p['percent_reached']:g}% of the {name} peak {p['gflops']:g}" for name, p in peaks.items()
    )
    return (
        f"budget: {budget['steps']:,} steps, {budget['epochs']:g} epochs, "
        f"{budget['train_minutes']:g} min, {budget['tokens_per_s']:,.0f} tok/s "
        f"({budget['tgt_tokens_per_s']:,.0f} target), "
        f"{budget['matmul_flops_per_tgt_token'] / 1e6:.1f} MFLOP per target token, "
        f"{budget['achieved_gflops']:g} GFLOP/s ({shares} GFLOP/s)"
    )
