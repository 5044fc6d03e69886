"""Three of aiayn's CPU kernels against the PyTorch operation they replace, in one run.

    python -m benchmarks.bench_kernels [--rounds 30] [--threads 2]

- Adam: `aiayn.training.optim.build_optimizer` (fused Adam) against `torch.optim.Adam` as
  PyTorch runs it on the CPU by default (a for-loop over the parameters), one step
  over every parameter of a model (the quickstart's and the base shape, vocabulary
  8000), gradients random.
- Dropout: `aiayn.nn.dropout.dropout` (three 16-bit uniforms per random word) against
  `torch.nn.functional.dropout` (a `bernoulli_` draw per element), p = 0.1, training,
  on a (32, 30, 256) activation: one sub-layer output of the small training shape.
- Loss: `aiayn.training.loss.label_smoothed_cross_entropy` (a hand-written backward) against
  `F.cross_entropy(label_smoothing=0.1, ignore_index=pad)` with autograd, forward and
  backward over bf16 logits cast to float32, (64, 32, 8000): one quickstart batch's
  output (2,048 target positions, the 8,000-piece vocabulary) under bf16 autocast.
- Top-k: `aiayn.inference.search.top_candidates` (chunk maxima first) against
  `Tensor.topk`, the 2K = 8 best of each of 32 rows of beam 4 x 8000 scores: one
  step of beam search over the decoding benchmark's batch.

Each pair runs in the same process, the two taking turns call by call (the order
swapped every round); a call times `--repeats` invocations. Ratio = the peer's time
over aiayn's, the median of the per-round ratios, so that load from other processes
falls on both alike. Writes benchmarks/results/kernels.json.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks import common


def adam_pair(size: str) -> tuple[Callable[[], object], Callable[[], object], int]:
    """(aiayn's step, PyTorch's default step, parameter count) over one shape's model."""
    from aiayn import ModelConfig, Transformer
    from aiayn.config import TrainConfig
    from aiayn.training.optim import build_optimizer

    shape = common.SHAPES[size]
    cfg = ModelConfig(
        vocab_size=common.VOCAB,
        d_model=shape["d_model"],
        n_heads=shape["heads"],
        d_ff=shape["ffn"],
        n_layers=shape["layers"],
    )
    torch.manual_seed(0)
    steps = []
    for build in (
        lambda model: build_optimizer(model, TrainConfig(max_steps=1)),
        lambda model: torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9),
    ):
        model = Transformer(cfg)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        steps.append(build(model).step)
    return steps[0], steps[1], sum(p.numel() for p in model.parameters())


def measure(
    first: Callable[[], object], second: Callable[[], object], rounds: int, repeats: int
) -> tuple[list[float], list[float]]:
    """Seconds per invocation of each, `rounds` times, the two taking turns."""
    times: tuple[list[float], list[float]] = ([], [])
    for fn in (first, second):  # warm-up
        for _ in range(repeats):
            fn()
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for i in order:
            fn = (first, second)[i]
            start = time.perf_counter()
            for _ in range(repeats):
                fn()
            times[i].append((time.perf_counter() - start) / repeats)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    common.set_threads(args.threads)

    from aiayn.inference.search import top_candidates
    from aiayn.nn.dropout import dropout
    from aiayn.training.loss import label_smoothed_cross_entropy

    torch.manual_seed(0)
    activation = torch.randn(32, 30, 256)
    scores = torch.randn(32, 4 * common.VOCAB)
    cases = []
    for size in ("quickstart", "base"):
        fused, plain, n_params = adam_pair(size)
        cases.append(
            (
                "adam",
                f"one step over the {size} shape's {n_params / 1e6:.1f}M parameters",
                "aiayn.training.optim.build_optimizer (fused Adam)",
                "torch.optim.Adam (CPU default, for-loop)",
                fused,
                plain,
                2 if size == "base" else 10,
            )
        )
    cases.append(
        (
            "dropout",
            "p = 0.1 on a (32, 30, 256) activation",
            "aiayn.nn.dropout.dropout",
            "F.dropout (bernoulli_)",
            lambda: dropout(activation, 0.1),
            lambda: F.dropout(activation, 0.1, training=True),
            20,
        )
    )
    logits = torch.randn(64, 32, common.VOCAB).bfloat16().requires_grad_(True)
    target = torch.randint(1, common.VOCAB - 1, (64, 32))
    target[:, 28:] = common.PAD

    def ours_loss() -> None:
        label_smoothed_cross_entropy(logits, target, common.PAD, 0.1).loss.backward()

    def torch_loss() -> None:
        flat = logits.float().reshape(-1, common.VOCAB)
        F.cross_entropy(
            flat, target.reshape(-1), ignore_index=common.PAD, label_smoothing=0.1, reduction="sum"
        ).backward()

    cases.append(
        (
            "loss",
            "forward + backward, (64, 32, 8000) bf16 logits, label smoothing 0.1",
            "aiayn.training.loss.label_smoothed_cross_entropy",
            "F.cross_entropy + autograd",
            ours_loss,
            torch_loss,
            3,
        )
    )
    cases.append(
        (
            "topk",
            "8 best of 32 rows of 4 x 8000 scores (one beam-4 step)",
            "aiayn.inference.search.top_candidates",
            "Tensor.topk",
            lambda: top_candidates(scores, 8),
            lambda: scores.topk(8, dim=1),
            50,
        )
    )
    records, rows = [], []
    for kernel, work, ours, peer, ours_fn, peer_fn, repeats in cases:
        ours_s, peer_s = measure(ours_fn, peer_fn, args.rounds, repeats)
        ratio = common.median([b / a for a, b in zip(ours_s, peer_s, strict=True)])
        record = dict(
            kernel=kernel,
            work=work,
            aiayn=ours,
            peer=peer,
            aiayn_ms=1000 * common.median(ours_s),
            peer_ms=1000 * common.median(peer_s),
            speedup=ratio,
            repeats_per_call=repeats,
            aiayn_times_s=ours_s,
            peer_times_s=peer_s,
        )
        records.append(record)
        rows.append(
            [
                kernel,
                work,
                f"{record['aiayn_ms']:.3g}",
                f"{record['peer_ms']:.3g}",
                f"{ratio:.2f}x",
            ]
        )
    print(f"\nKernels, {args.threads} threads, median of {args.rounds} alternating calls\n")
    print(common.table(["kernel", "work", "aiayn ms", "peer ms", "speedup"], rows))
    path = common.write_json(
        "kernels",
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "method": (
                "each pair in one process, taking turns call by call (order swapped every "
                "round); speedup = the median of the per-round ratios peer time / aiayn time"
            ),
            "results": records,
        },
    )
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
