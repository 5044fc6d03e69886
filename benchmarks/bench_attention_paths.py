"""attend()'s two paths in a CPU training step: the explicit formula against SDPA's kernels.

    python -m benchmarks.bench_attention_paths [--rounds 15] [--threads 2]

`aiayn.nn.kernels.sdpa.attend` has two paths with one meaning: PyTorch's fused
`scaled_dot_product_attention` and the formula written out (Q K^T, mask, softmax, times
V). This times both, forward and backward, as a training step calls them: queries, keys
and values that want gradients, a padding mask and a causal one, under bfloat16 autocast
(the quickstart's `precision: auto` on a CPU with bf16 products; the fused path then
attends in float32, `_float32_under_cpu_autocast`) and in float32. Heads of 32 (the
quickstart) and 64 (the paper's base), lengths 16 to 512 at about 2,048 tokens a batch.

Each pair runs in the same process, taking turns call by call (bench_kernels.measure);
speed-up = the median of the per-round ratios SDPA time / explicit time. For each dtype
it prints the most scores per head (T x S) up to which the explicit path won every
shape: `aiayn.nn.kernels.sdpa.EXPLICIT_MAX_SCORES` is set from it. Writes
benchmarks/results/attention-paths.json.
"""

from __future__ import annotations

import argparse

import torch

from aiayn.nn.kernels import sdpa
from aiayn.nn.masks import causal_mask
from benchmarks import common
from benchmarks.bench_kernels import measure

LENGTHS = (16, 32, 64, 128, 256, 512)
HEADS = ((4, 32), (8, 64))  # (heads, head size)
TOKENS = 2048  # per batch, as the quickstart's max_tokens


def step(heads: int, size: int, length: int, dtype: torch.dtype, explicit: bool):
    """A function that runs attend() forward and backward on one batch, by one path."""
    g = torch.Generator().manual_seed(0)
    batch = max(1, TOKENS // length)
    q, k, v = (
        torch.randn(batch, heads, length, size, generator=g).to(dtype).requires_grad_()
        for _ in range(3)
    )
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=g)
    padding = torch.arange(length)[None, :] < lengths[:, None]  # (B, S)
    mask = padding[:, None, None, :] & causal_mask(length, length)  # (B, 1, T, S)
    grad = torch.randn(batch, heads, length, size, generator=g).to(dtype)
    limits = {dtype: length * length} if explicit else {}
    autocast = dtype == torch.bfloat16

    def run() -> None:
        saved = sdpa.EXPLICIT_MAX_SCORES
        sdpa.EXPLICIT_MAX_SCORES = limits
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out, _ = sdpa.attend(q, k, v, mask)
            torch.autograd.grad(out, (q, k, v), grad)
        finally:
            sdpa.EXPLICIT_MAX_SCORES = saved

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    common.set_threads(args.threads)
    records, rows, limits = [], [], {}
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).removeprefix("torch.")
        winning = True
        for length in LENGTHS:
            for heads, size in HEADS:
                explicit_s, fused_s = measure(
                    step(heads, size, length, dtype, True),
                    step(heads, size, length, dtype, False),
                    args.rounds,
                    repeats=3,
                )
                ratio = common.median([f / e for e, f in zip(explicit_s, fused_s, strict=True)])
                winning = winning and ratio > 1.0
                records.append(
                    dict(
                        dtype=name,
                        length=length,
                        heads=heads,
                        head_size=size,
                        batch=max(1, TOKENS // length),
                        explicit_ms=1000 * common.median(explicit_s),
                        sdpa_ms=1000 * common.median(fused_s),
                        speedup=ratio,
                    )
                )
                rows.append(
                    [name, length, f"{heads} x {size}", f"{records[-1]['explicit_ms']:.3g}",
                     f"{records[-1]['sdpa_ms']:.3g}", f"{ratio:.2f}x"]
                )  # fmt: skip
            if winning:
                limits[name] = length * length
    print(f"\nattend() forward + backward, {args.threads} threads, {args.rounds} rounds\n")
    print(common.table(["dtype", "T = S", "heads", "explicit ms", "SDPA ms", "speed-up"], rows))
    for name, limit in limits.items():
        print(f"{name}: the explicit path won every shape up to {limit} scores per head")
    path = common.write_json(
        "attention-paths",
        {
            "measures": [
                {
                    "system": "aiayn.nn.kernels.sdpa.attend's explicit path against SDPA's",
                    "cell": "a CPU training step's shapes, forward + backward",
                    "harness": "bench_attention_paths",
                }
            ],
            "args": {k: str(v) for k, v in vars(args).items()},
            "method": (
                "both paths of aiayn.nn.kernels.sdpa.attend in one process, taking turns call "
                "by call; forward + backward with padding and causal masks; bfloat16 under CPU "
                "autocast, float32 without; speed-up = median of per-round SDPA / explicit"
            ),
            "explicit_wins_up_to_scores": limits,
            "results": records,
        },
    )
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
