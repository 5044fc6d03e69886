"""What the hook points cost when nothing listens: the model as shipped against the same
model with every hook point call removed, in one run.

    python -m benchmarks.bench_hooks [--rounds 20] [--threads 1]

Each hook point (`aiayn.nn.hooks`) is passed through `hooked(point, x)`, which calls
the point only while a hook is registered on it. "Without hook points" replaces that
function, in every module that calls it, by `lambda point, x: x`: the code as it was
before hook points, to within the attribute look-ups of the modules' constructors.

Two workloads on the quickstart's shape (d_model 128, 4 heads, d_ff 512, 3+3
layers, pre-norm, 8,000 pieces), fp32:
- a training step: forward and backward of a batch of 32 sentences of 30 tokens;
- greedy decoding of 8 sentences of 20 tokens, 30 forced steps (eos banned).

The two variants take turns call by call (the order swapped every round, after a
warm-up of each: `bench_kernels.measure`); ratio =
shipped time / time without hook points, the median of the per-round ratios (1.00:
no cost). Writes benchmarks/results/hooks.json.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections.abc import Callable, Iterator

import torch

from benchmarks import common
from benchmarks.bench_kernels import measure  # the two take turns, call by call

CALLERS = ("aiayn.nn.attention", "aiayn.nn.layers", "aiayn.models.encoder_decoder")


@contextlib.contextmanager
def without_hook_points() -> Iterator[None]:
    """Every `hooked(point, x)` call of the model's modules returns x, unlooked at."""
    import importlib

    modules = [importlib.import_module(name) for name in CALLERS]
    saved = [module.hooked for module in modules]
    try:
        for module in modules:
            module.hooked = lambda point, x: x
        yield
    finally:
        for module, function in zip(modules, saved, strict=True):
            module.hooked = function


def workloads() -> dict[str, Callable[[], object]]:
    from aiayn import ModelConfig, Transformer
    from aiayn.inference.search import DecodeConfig, search

    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=8000, d_model=128, n_heads=4, d_ff=512, n_layers=3, dropout=0.0,
        norm_first=True, max_len=128,
    )  # fmt: skip
    model = Transformer(cfg)
    src = torch.randint(4, 8000, (32, 30))
    tgt = torch.randint(4, 8000, (32, 30))

    def train_step() -> None:
        model.train()
        model.zero_grad(set_to_none=True)
        model(src, tgt).float().logsumexp(-1).mean().backward()

    config = DecodeConfig(beam=1, max_output_len=31, extra_len=None, banned_ids=(cfg.eos_id,))

    def decode() -> None:
        model.eval()
        with torch.inference_mode():
            search(model, src[:8, :20], config)

    return {"train step": train_step, "greedy decoding": decode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="hooks", help="results file name")
    args = parser.parse_args()
    common.set_threads(args.threads)
    rows, results = [], {}
    for name, work in workloads().items():

        def bare(work: Callable[[], object] = work) -> None:
            with without_hook_points():
                work()

        shipped, bare_times = measure(work, bare, args.rounds, args.repeats)
        ratio = statistics.median(a / b for a, b in zip(shipped, bare_times, strict=True))
        results[name] = {"shipped_s": shipped, "without_hook_points_s": bare_times, "ratio": ratio}
        rows.append(
            [name, f"{common.median(shipped) * 1e3:.1f}", f"{common.median(bare_times) * 1e3:.1f}",
             f"{ratio:.3f}"]
        )  # fmt: skip
    print(common.table(["workload", "shipped ms", "without hook points ms", "ratio"], rows))
    path = common.write_json(args.name, {"args": vars(args), "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
