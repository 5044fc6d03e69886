"""Training speed on CPU: aiayn vs Hugging Face MarianMTModel vs torch.nn.Transformer.

    python -m benchmarks.bench_train [--quick]

The same work for each system, fp32, train mode: 32 sources of 30 tokens, 30
target tokens, forward, cross-entropy, backward, one AdamW step and zero_grad.

Dropout (`--dropout`, default 0.1) sits where the paper puts it (section 5.4) and
nowhere else, in every system: on each sub-layer's output before the residual sum
and on embeddings + positions. Not on attention weights, not on the FFN's inner
activation. aiayn and HF Marian do that by configuration (`attention_dropout` and
`activation_dropout` 0); `torch.nn.Transformer(dropout=p)` also drops attention
weights and the FFN's inner activation (4x the residual's size), so the benchmark
sets those two to 0 and keeps its residual dropouts. It also removes the final
LayerNorm `nn.Transformer` adds after each stack (a post-norm stack has none in the
paper, aiayn or Marian), so the three systems compute the same function. Every system gets PyTorch's fused AdamW (`fused=True`, the fastest it
has on the CPU and the kind aiayn's trainer uses). The three models have the same shape (small: d_model 256, 3+3 layers,
4 heads, d_ff 1024; base: 512, 6+6, 8, 2048; vocabulary 8000, one tied embedding
matrix). Metric: target tokens/s = 32 x 30 / step time. Systems take turns step by
step (see `common`); tables show medians and the median of the per-round ratios.

On CPUs that multiply bfloat16 natively (AMX or AVX512-BF16) each system also runs
its forward pass and loss under `torch.autocast("cpu", torch.bfloat16)` ("-bf16"
systems, weights and optimizer in fp32); their ratios are against the peers in
bf16.

`--systems aiayn,aiayn-compiled` adds aiayn with its forward pass and loss through
`torch.compile` (the model has no graph breaks; the first, warm-up step compiles),
e.g. on the quickstart's shape (d_model 128, 3+3 layers, 4 heads, d_ff 512):

    python -m benchmarks.bench_train --sizes quickstart,small \
        --systems aiayn,aiayn-compiled,hf

On a GPU (`--device cuda`; the shapes include "big") the same steps run on the card,
timed between `torch.cuda.synchronize()` calls. Every worker counts its step's
FLOPs once (`torch.utils.flop_counter`, forward and backward) and the table gives
model TFLOP/s and, for known cards, MFU against the dense bf16 peak. The issue's
GPU setting, ~25k target tokens per step in bf16:

    python -m benchmarks.bench_train --device cuda --sizes base,big \
        --systems aiayn-bf16,hf-bf16,torch-nn-bf16 --batch 800 --src-len 32 --tgt-len 32
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from benchmarks import common

FP32_SYSTEMS = ("aiayn", "hf", "torch-nn")
BF16_SYSTEMS = tuple(f"{s}-bf16" for s in FP32_SYSTEMS)
SYSTEMS = FP32_SYSTEMS + BF16_SYSTEMS
LABELS = {"aiayn": "aiayn", "hf": "HF MarianMTModel", "torch-nn": "torch.nn.Transformer"}
LABELS.update({f"{s}-bf16": f"{label}, bf16 autocast" for s, label in LABELS.items()})
COMPILED = "aiayn-compiled"  # not in the defaults: --systems aiayn,aiayn-compiled
LABELS[COMPILED] = "aiayn, torch.compile"
COMPILED_BF16 = f"{COMPILED}-bf16"  # and its bf16 autocast form (a GPU's setting)
LABELS[COMPILED_BF16] = "aiayn, torch.compile, bf16 autocast"


def build(system: str, size: str, dropout: float):
    """(model, loss(src, tgt)) for one system; tgt ends with eos, the decoder starts from pad.

    Every system drops (with probability `dropout`) sub-layer outputs and the embedding
    sums only: see the module docstring.
    """
    import torch.nn.functional as F
    from torch import nn

    shape = common.SHAPES[size]
    d, n_layers, heads, d_ff = shape["d_model"], shape["layers"], shape["heads"], shape["ffn"]

    def shift(tgt):  # decoder input: pad (Marian's start token), then tgt without its last
        return torch.cat([torch.full_like(tgt[:, :1], common.PAD), tgt[:, :-1]], dim=1)

    if system == "aiayn":
        from aiayn import ModelConfig, Transformer

        cfg = ModelConfig(
            vocab_size=common.VOCAB,
            d_model=d,
            n_heads=heads,
            d_ff=d_ff,
            n_layers=n_layers,
            dropout=dropout,
            attention_dropout=0.0,
            max_len=512,
            pad_id=common.PAD,
            bos_id=common.PAD,
            eos_id=common.EOS,
        )
        model = Transformer(cfg)

        def loss(src, tgt):
            logits = model(src, shift(tgt))
            return F.cross_entropy(logits.view(-1, common.VOCAB), tgt.view(-1))

        return model, loss

    if system == "hf":
        from transformers import MarianMTModel

        model = MarianMTModel(common.marian_config(size, dropout=dropout))

        def loss(src, tgt):
            return model(input_ids=src, labels=tgt).loss

        return model, loss

    class TorchTransformer(nn.Module):
        """nn.Transformer with a tied embedding x sqrt(d), sinusoids and output projection,
        its dropout sites and final LayerNorms made those of aiayn and Marian."""

        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.Embedding(common.VOCAB, d, padding_idx=common.PAD)
            nn.init.normal_(self.embedding.weight, std=d**-0.5)
            position = torch.arange(512)[:, None].float()
            div = torch.exp(torch.arange(0, d, 2).float() * (-math.log(10000.0) / d))
            table = torch.zeros(512, d)
            table[:, 0::2], table[:, 1::2] = torch.sin(position * div), torch.cos(position * div)
            self.register_buffer("positions", table, persistent=False)
            self.dropout = nn.Dropout(dropout)
            self.transformer = nn.Transformer(
                d, heads, n_layers, n_layers, d_ff, dropout=dropout, batch_first=True
            )
            # Residual dropout (dropout1/2/3) stays; attention-weight dropout and the
            # FFN's inner dropout go, as in aiayn and Marian.
            for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
                layer.dropout = nn.Identity()  # inside the FFN: linear2(dropout(relu(...)))
                layer.self_attn.dropout = 0.0
                if hasattr(layer, "multihead_attn"):
                    layer.multihead_attn.dropout = 0.0
            # nn.Transformer ends each stack with a LayerNorm; a post-norm stack needs none.
            self.transformer.encoder.norm = None
            self.transformer.decoder.norm = None

        def embed(self, ids):
            return self.dropout(self.embedding(ids) * math.sqrt(d) + self.positions[: ids.size(1)])

        def forward(self, src, tgt_in):
            length = tgt_in.size(1)
            causal = nn.Transformer.generate_square_subsequent_mask(length, device=src.device)
            hidden = self.transformer(
                self.embed(src), self.embed(tgt_in), tgt_mask=causal, tgt_is_causal=True
            )
            return F.linear(hidden, self.embedding.weight)

    model = TorchTransformer()

    def loss(src, tgt):
        logits = model(src, shift(tgt))
        return F.cross_entropy(logits.view(-1, common.VOCAB), tgt.view(-1))

    return model, loss


def worker(
    system: str,
    size: str,
    threads: int,
    batch: int,
    src_len: int,
    tgt_len: int,
    device: str,
    dropout: float,
) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    common.set_threads(threads)
    torch.manual_seed(1234)
    model, fp32_loss = build(system.removesuffix("-bf16").removesuffix("-compiled"), size, dropout)
    model.to(device).train()
    device_type = torch.device(device).type
    # The forward pass and loss through torch.compile (the backward through AOTAutograd);
    # the first (warm-up) step compiles. FLOPs are counted on the eager function.
    timed_loss = torch.compile(fp32_loss) if system.startswith(COMPILED) else fp32_loss

    def loss_fn(src, tgt, compute=timed_loss):
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=system.endswith("-bf16")):
            return compute(src, tgt)

    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01, fused=True
    )
    batches = [
        (
            torch.tensor(common.source_ids(batch, src_len, seed=2 * i), device=device),
            torch.tensor(common.source_ids(batch, tgt_len, seed=2 * i + 1), device=device),
        )
        for i in range(4)
    ]
    state = {"step": 0, "flops": None}

    def sync() -> None:
        if device_type == "cuda":
            torch.cuda.synchronize(device)

    def handle(request):
        src, tgt = batches[state["step"] % len(batches)]
        state["step"] += 1
        if state["flops"] is None:  # forward and backward, counted once (not timed)
            with FlopCounterMode(display=False) as counter:
                loss_fn(src, tgt, fp32_loss).backward()
            optimizer.zero_grad(set_to_none=True)
            state["flops"] = counter.get_total_flops()
        sync()
        start = time.perf_counter()
        loss = loss_fn(src, tgt)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.item()
        sync()
        return {
            "seconds": time.perf_counter() - start,
            "loss": value,
            "params": sum(p.numel() for p in model.parameters()),
            "flops": state["flops"],
        }

    common.serve(handle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="small,base")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--src-len", type=int, default=30)
    parser.add_argument("--tgt-len", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--dropout", type=float, default=0.1, help="residual and embedding dropout, all systems"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=8, help="timed steps per system")
    parser.add_argument("--quick", action="store_true", help="2 warm-up and 4 timed steps")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--peak-tflops", type=float, help="dense bf16 peak for MFU (default: known cards)"
    )
    parser.add_argument("--results", help="results file name (default: train, train-compile)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape_args = [
        "--threads",
        str(args.threads),
        "--batch",
        str(args.batch),
        "--src-len",
        str(args.src_len),
        "--tgt-len",
        str(args.tgt_len),
        "--device",
        args.device,
        "--dropout",
        str(args.dropout),
    ]
    if args.worker:
        return worker(
            args.worker,
            args.size,
            args.threads,
            args.batch,
            args.src_len,
            args.tgt_len,
            args.device,
            args.dropout,
        )
    peak = args.peak_tflops or common.peak_bf16_tflops(args.device)
    systems = args.systems.split(",")
    if args.quick:
        args.warmup, args.rounds = 2, 4
        systems = [s for s in systems if s not in (*BF16_SYSTEMS, COMPILED_BF16)]
    systems = common.without_unsupported_bf16(systems, (*BF16_SYSTEMS, COMPILED_BF16), args.device)
    if not systems:  # --quick drops the bf16 systems
        parser.error(f"no system left to time of --systems {args.systems} (--quick: fp32 only)")
    rows, records = [], []
    for size in args.sizes.split(","):
        workers = {
            s: common.Worker(__spec__.name, s, ["--size", size, *shape_args], args.threads)
            for s in systems
        }
        try:
            times = {s: [] for s in systems}
            replies = {}
            for _ in range(args.warmup):
                for s in systems:
                    replies[s] = workers[s].ask()
            for r in range(args.rounds):
                for s in systems[r % len(systems) :] + systems[: r % len(systems)]:
                    replies[s] = workers[s].ask()
                    times[s].append(replies[s]["seconds"])
        finally:
            for w in workers.values():
                w.close()
        n_tokens = args.batch * args.tgt_len
        for s in systems:
            seconds = common.median(times[s])
            suffix = "-bf16" if s.endswith("-bf16") else ""  # peers of the same precision
            vs = {
                peer: common.median(
                    [a / b for a, b in zip(times[peer + suffix], times[s], strict=True)]
                )
                for peer in ("hf", "torch-nn")
                if peer + suffix in systems
            }
            tflops = replies[s]["flops"] / seconds / 1e12  # model FLOPs (fwd + bwd) per second
            record = dict(
                size=size,
                system=s,
                device=args.device,
                params=replies[s]["params"],
                tokens_per_s=n_tokens / seconds,
                ms_per_step=1000 * seconds,
                times_s=times[s],
                last_loss=replies[s]["loss"],
                flops_per_step=replies[s]["flops"],
                model_tflops=tflops,
                mfu=None if peak is None else tflops / peak,
                speedup_vs_hf=vs.get("hf"),
                speedup_vs_torch_nn=vs.get("torch-nn"),
            )
            records.append(record)
            rows.append(
                [
                    size,
                    LABELS[s],
                    f"{record['params'] / 1e6:.2f}M",
                    record["tokens_per_s"],
                    record["ms_per_step"],
                    f"{tflops:.3g}",
                    "" if peak is None else f"{100 * tflops / peak:.1f}%",
                    "" if vs.get("hf") is None else f"{vs['hf']:.2f}x",
                    "" if vs.get("torch-nn") is None else f"{vs['torch-nn']:.2f}x",
                ]
            )
    print(
        f"\nTraining step (fp32 or bf16 autocast, fwd + bwd + fused AdamW), batch "
        f"{args.batch} x {args.src_len} source / {args.tgt_len} target tokens, "
        f"{args.threads} threads, median of {args.rounds} interleaved steps; "
        f"{common.device_name(args.device)}"
        + ("" if peak is None else f", MFU against {peak:g} dense bf16 TFLOP/s")
        + "\n"
    )
    headers = ["shape", "system", "params", "tgt tok/s", "ms/step", "TFLOP/s", "MFU"]
    print(common.table([*headers, "vs HF", "vs torch.nn"], rows))
    # One file per kind of run, so that a compile or dropout-0 run keeps the peer table's.
    compiled = COMPILED in systems or COMPILED_BF16 in systems
    name = args.results or ("train-compile" if compiled else "train")
    if args.dropout != 0.1 and not args.results:
        name += f"-dropout{args.dropout:g}"
    method = (
        f"{len(systems)} systems in worker processes of their own, {args.warmup} warm-up "
        f"and {args.rounds} timed steps each, taking turns step by step (the order rotated "
        "every round); ratios are medians of the per-round ratios, so that load from other "
        "processes on the machine falls on every system alike"
    )
    path = common.write_json(
        name,
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "method": method,
            "dropout_sites": "sub-layer outputs and embedding sums only, every system; "
            "torch.nn.Transformer without attention-weight and FFN-inner dropout and "
            "without its final LayerNorm per stack",
            "results": records,
        },
    )
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
