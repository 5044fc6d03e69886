"""int8 matrix products on the CPU, against float32, at decoding's and the encoder's row counts.

    python -m benchmarks.bench_int8_kernels [--threads 2] [--rounds 20]

One product y = x W^T + b of each weight shape of the benchmark models (small: d_model
256, d_ff 1024; base: 512, 2048; the output projection: vocabulary 8000), x of R rows:
R = 1, 4 (greedy and beam-4 decoding of one sentence), 32 and 128 (a batch of 32
sentences, greedy and beam 4) and 960 (the encoder: 32 sentences of 30 tokens).
Candidates, each timed in the same process, taking turns call by call:

- fp32: `aiayn.inference.frozen.FrozenLinear` (what `freeze` builds in float32: oneDNN's packed
  weight from 512 x 512 up, a contiguous W^T below).
- int8 fbgemm / int8 onednn / int8 x86: `aiayn.inference.frozen_products.Int8Linear` with that engine
  (per-channel int8 weights, activations quantized per token, dynamic quantization kernels;
  "x86" is PyTorch's engine that picks fbgemm or oneDNN per product).
- int8 fbgemm, per tensor: the same without per-token scales (one scale per call).
- torch._int_mm: the raw int8 GEMM (int32 accumulation) with per-token quantization of x
  and the rescale done in PyTorch ops around it.
- quantize_dynamic: `torch.ao.quantization.quantize_dynamic` of an `nn.Linear` (x86
  engine; torch.ao is deprecated, so a failure is reported, not raised).

torchao's `Int8DynamicActivationInt8WeightConfig` is not measured: torchao is not
installed with the project (its releases pin torch versions, and pip must not replace
the pinned CPU build). A call times `--repeats` products; the table gives microseconds
per product (median over rounds) and each candidate's speed relative to fp32 (> 1:
faster than fp32). Writes benchmarks/results/int8-kernels.json, with the engine
`Int8Linear` should use by default (`chosen_engine`, `choose_engine`): the one of
highest geometric-mean speed over every shape at decoding's row counts (1 to 128).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn

from aiayn.inference.frozen import FrozenLinear, Int8Linear
from benchmarks import common

SHAPES = {  # name -> (out, in)
    "small qkv": (768, 256),
    "small ffn1": (1024, 256),
    "small ffn2": (256, 1024),
    "base qkv": (1536, 512),
    "base ffn1": (2048, 512),
    "base ffn2": (512, 2048),
    "output (base)": (8000, 512),
}
ROWS = (1, 4, 32, 128, 960)
DECODING_ROWS = (1, 4, 32, 128)  # the rows a decoding step multiplies; 960 is the encoder's
ENGINES = ("fbgemm", "onednn", "x86")


def int_mm_product(weight: torch.Tensor, bias: torch.Tensor) -> Callable[[torch.Tensor], object]:
    """y = x W^T + b through `torch._int_mm`: W per channel, x per token, both symmetric."""
    w_scale = weight.abs().amax(dim=1) / 127
    w_int8_t = (weight / w_scale[:, None]).round().clamp(-127, 127).to(torch.int8).t().contiguous()

    def run(x: torch.Tensor) -> torch.Tensor:
        x_scale = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / 127
        x_int8 = (x / x_scale).round_().to(torch.int8)
        if x_int8.size(0) <= 16:  # _int_mm needs more than 16 rows: pad them
            x_int8 = torch.cat([x_int8, x_int8.new_zeros(17 - x_int8.size(0), x_int8.size(1))])
        out = torch._int_mm(x_int8, w_int8_t)[: x.size(0)]
        return torch.addcmul(bias, out.float(), x_scale * w_scale)

    return run


def quantize_dynamic_product(weight: torch.Tensor, bias: torch.Tensor):
    linear = nn.Linear(weight.size(1), weight.size(0))
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(bias)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.backends.quantized.engine = "x86"
        quantized = torch.ao.quantization.quantize_dynamic(
            nn.Sequential(linear), {nn.Linear}, dtype=torch.qint8
        )
    return quantized


def candidates(weight: torch.Tensor, bias: torch.Tensor) -> dict[str, Callable]:
    made: dict[str, Callable] = {"fp32": FrozenLinear(weight, bias)}
    for engine in ENGINES:
        if engine in torch.backends.quantized.supported_engines:
            made[f"int8 {engine}"] = Int8Linear(weight, bias, engine=engine)
    made["int8 fbgemm, per tensor"] = Int8Linear(weight, bias, per_token=False)
    made["torch._int_mm"] = int_mm_product(weight, bias)
    try:
        made["quantize_dynamic"] = quantize_dynamic_product(weight, bias)
    except Exception as err:  # deprecated API: report, measure the rest
        print(f"quantize_dynamic unavailable: {type(err).__name__}: {err}", file=sys.stderr)
    return made


def choose_engine(records: list[dict]) -> tuple[str | None, dict[str, float]]:
    """The int8 engine of highest geometric-mean speed over fp32 at decoding's row counts.

    Args:
        records: the results' records (shape, rows, system, vs_fp32); the engines'
            systems are "int8 ENGINE" (per-token scales, as `Int8Linear` runs).

    Returns:
        (the engine, or None where none was measured; each engine's geometric mean).
    """
    speeds: dict[str, list[float]] = {}
    for r in records:
        engine = r["system"].removeprefix("int8 ")
        if engine in ENGINES and r["rows"] in DECODING_ROWS:
            speeds.setdefault(engine, []).append(r["vs_fp32"])
    means = {e: statistics.geometric_mean(v) for e, v in speeds.items()}
    return (max(means, key=means.get) if means else None), means


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=20, help="products per timed call")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--results", default="int8-kernels", help="results file name")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    records, rows = [], []
    with torch.inference_mode():
        for shape in args.shapes.split(","):
            out_features, in_features = SHAPES[shape]
            weight = torch.randn(out_features, in_features) / in_features**0.5
            bias = torch.randn(out_features) * 0.1
            products = candidates(weight, bias)
            for n_rows in ROWS:
                x = torch.randn(n_rows, in_features)
                times: dict[str, list[float]] = {name: [] for name in products}
                for product in products.values():  # warm-up
                    product(x)
                names = list(products)
                for r in range(args.rounds):
                    for name in names[r % len(names) :] + names[: r % len(names)]:
                        started = time.perf_counter()
                        for _ in range(args.repeats):
                            products[name](x)
                        times[name].append((time.perf_counter() - started) / args.repeats)
                fp32 = times["fp32"]
                for name, seconds in times.items():
                    speed = common.median([a / b for a, b in zip(fp32, seconds, strict=True)])
                    us = 1e6 * common.median(seconds)
                    records.append(
                        dict(shape=shape, out=out_features, inp=in_features, rows=n_rows,
                             system=name, us=us, vs_fp32=speed)
                    )  # fmt: skip
                    rows.append([shape, n_rows, name, f"{us:,.1f}", f"{speed:.2f}x"])
    print(common.table(["shape", "rows", "product", "us", "vs fp32"], rows))
    chosen, means = choose_engine(records)
    print(f"int8 engines, geometric-mean speed over fp32 at {DECODING_ROWS} rows: {means}")
    print(f"chosen: {chosen} (aiayn.inference.frozen_products.INT8_ENGINE must say the same)")
    measures = {
        "system": "int8 matrix product candidates against aiayn's float32 product",
        "cell": f"Marian small and base weight shapes, rows {', '.join(map(str, ROWS))}, "
        f"{args.threads} thread(s), {common.machine()}",
        "harness": "bench_int8_kernels",
    }
    payload = {"measures": [measures], "args": vars(args), "results": records}
    path = common.write_json(
        args.results, {**payload, "chosen_engine": chosen, "engine_speed": means}
    )
    print(f"written {path}")


if __name__ == "__main__":
    main()
