"""Text generation speed on CPU: aiayn's frozen GPT against Hugging Face `generate`, same weights.

    python -m benchmarks.bench_generate [--quick]

One random-weight GPT2LMHeadModel per shape ("gpt2-small": GPT-2 small's 12 layers,
d_model 768, 12 heads, 50,257 tokens; "tiny": 3 layers, d_model 128, 4 heads,
8,000 tokens) is saved with `save_pretrained` into a work directory; aiayn loads it
with `aiayn.io.hf_models.load_gpt2` and decodes with the model `Generator` runs: its
`aiayn.inference.frozen.freeze` copy, through the search's greedy loop (KV cache filled
by the prompt in one pass). Hugging Face runs `generate` (greedy, its KV cache).

Both continue the same prompts (random ids, `--prompt-len` tokens, no padding)
by exactly `--new-tokens` tokens: Hugging Face with min_new_tokens = max_new_tokens,
aiayn with eos forbidden until the last token (which the search then forces). Token
0, which aiayn's search never generates (GPT-2's stand-in pad and start token), is
suppressed in Hugging Face too, so that both produce the same tokens. Metric: new
tokens/s = batch x new tokens / wall time of one call, the prompt's pass included.

Each system runs in a worker process of its own with the same threads; systems
take turns call by call, the order rotating every round (`common`), and the
tables give medians and the median of the per-round ratios. bf16 rows ("-bf16":
weights cast to bfloat16) run where the CPU multiplies bfloat16 natively; their
"vs HF" is against Hugging Face in bfloat16, "vs HF fp32" against it in float32.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.decode_systems import FixedLength  # eos forbidden until the fixed length

SHAPES = {
    "gpt2-small": dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024),
    "tiny": dict(n_embd=128, n_layer=3, n_head=4, vocab_size=8000, n_positions=256),
}
SYSTEMS = ("aiayn", "hf", "aiayn-bf16", "hf-bf16", "aiayn-static")
BF16_SYSTEMS = ("aiayn-bf16", "hf-bf16")
LABELS = {
    "aiayn": "aiayn",
    "hf": "HF generate",
    "aiayn-bf16": "aiayn bf16",
    "hf-bf16": "HF generate bf16",
    "aiayn-static": "aiayn static step",
}
SUPPRESSED = 0  # aiayn's pad and start token for GPT-2: never generated


def save_random_gpt2(size: str, directory: Path, seed: int = 1234) -> Path:
    """A random-weight GPT2LMHeadModel of one shape, saved with `save_pretrained`."""
    from transformers import GPT2Config, GPT2LMHeadModel

    shape = SHAPES[size]
    eos = shape["vocab_size"] - 1  # GPT-2's <|endoftext|> is its last id
    config = GPT2Config(**shape, bos_token_id=eos, eos_token_id=eos)
    torch.manual_seed(seed)
    GPT2LMHeadModel(config).eval().save_pretrained(directory)
    return directory


def prompts(batch: int, length: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """`batch` prompts of `length` random ids (neither 0 nor eos)."""
    rng = random.Random(seed)
    return [[rng.randint(1, vocab_size - 2) for _ in range(length)] for _ in range(batch)]


# ----- workers: one call of one system -----------------------------------------------


def aiayn_runner(directory: Path, threads: int, bf16: bool, static: bool = False):
    """aiayn's greedy search on the frozen model; with `static`, on the decoding step of
    fixed shapes (`StaticDecoder`, one slot per prompt: what `aiayn generate --static`
    runs), eager."""
    from aiayn.inference.frozen import freeze
    from aiayn.inference.search import greedy_search
    from aiayn.inference.static_step import StaticDecoder
    from aiayn.io.hf_models import load_gpt2

    common.set_threads(threads)
    model, _ = load_gpt2(directory)
    engine = freeze(model.eval(), torch.bfloat16 if bf16 else None)  # as Generator does
    steps = {}  # (prompts, positions) -> StaticDecoder

    def run(ids: list[list[int]], new_tokens: int) -> list[list[int]]:
        decoded = engine
        if static:
            key = (len(ids), len(ids[0]) + new_tokens + 1)
            if key not in steps:
                steps[key] = StaticDecoder(engine, key[0], max_target=key[1])
            decoded = steps[key]
        fixed = FixedLength(decoded, new_tokens)
        with torch.inference_mode():
            hyps = greedy_search(fixed, torch.tensor(ids), None, max_output_len=new_tokens)
        return [[*h[0].tokens, engine.cfg.eos_id] for h in hyps]  # the forced last token

    return run


def hf_runner(directory: Path, threads: int, bf16: bool):
    from transformers import GenerationConfig, GPT2LMHeadModel

    common.set_threads(threads)
    model = GPT2LMHeadModel.from_pretrained(directory).eval()
    if bf16:
        model = model.to(torch.bfloat16)
    eos = model.config.eos_token_id

    def run(ids: list[list[int]], new_tokens: int) -> list[list[int]]:
        config = GenerationConfig(
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            use_cache=True,
            eos_token_id=eos,
            pad_token_id=eos,
            suppress_tokens=[SUPPRESSED],
        )
        prompt = torch.tensor(ids)
        with torch.inference_mode():
            out = model.generate(
                input_ids=prompt, attention_mask=torch.ones_like(prompt), generation_config=config
            )
        return out[:, prompt.size(1) :].tolist()

    return run


def worker(system: str, workdir: Path, size: str, threads: int) -> None:
    directory = workdir / f"gpt2-{size}"
    bf16 = system in BF16_SYSTEMS
    if system == "aiayn-static":
        run = aiayn_runner(directory, threads, bf16, static=True)
    else:
        run = (aiayn_runner if system.startswith("aiayn") else hf_runner)(directory, threads, bf16)
    vocab_size = SHAPES[size]["vocab_size"]

    def handle(request):
        ids = prompts(request["batch"], request["prompt_len"], vocab_size)
        start = time.perf_counter()
        tokens = run(ids, request["new_tokens"])
        seconds = time.perf_counter() - start
        lengths = {len(row) for row in tokens}
        if lengths != {request["new_tokens"]}:
            raise RuntimeError(f"{system} generated lengths {lengths}, not {request['new_tokens']}")
        return {"seconds": seconds, "tokens": tokens if request.get("tokens") else None}

    common.serve(handle)


# ----- parent --------------------------------------------------------------------------


def agreement(a: list[list[int]], b: list[list[int]], n: int) -> int:
    """Prompts whose first n new tokens agree (aiayn's last token is the forced eos)."""
    return sum(x[:n] == y[:n] for x, y in zip(a, b, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,gpt2-small")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="timed calls per system")
    parser.add_argument("--quick", action="store_true", help="3 rounds, tiny, fp32 only")
    parser.add_argument("--workdir", type=Path, help="keep the models here (default: temp)")
    parser.add_argument("--results", default="generate", help="results file name")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.workdir, args.size, args.threads)
    systems = args.systems.split(",")
    if args.quick:
        args.rounds, args.sizes = 3, "tiny"
        systems = [s for s in systems if s not in BF16_SYSTEMS]
    systems = common.without_unsupported_bf16(systems, BF16_SYSTEMS, "cpu")
    workdir = args.workdir or common.default_workdir()
    workdir.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    request = {"prompt_len": args.prompt_len, "new_tokens": args.new_tokens}

    rows, records = [], []
    for size in args.sizes.split(","):
        if not (workdir / f"gpt2-{size}" / "config.json").exists():
            save_random_gpt2(size, workdir / f"gpt2-{size}")
        worker_args = ["--workdir", str(workdir), "--size", size, "--threads", str(args.threads)]
        workers = {s: common.Worker(__spec__.name, s, worker_args, args.threads) for s in systems}
        try:
            times = {(s, b): [] for s in systems for b in batches}
            outputs = {}
            for batch in batches:  # warm-up call, keeping the outputs for a check
                for s in systems:
                    reply = workers[s].ask(batch=batch, tokens=True, **request)
                    outputs[s, batch] = reply["tokens"]
            for r in range(args.rounds):
                for batch in batches:
                    order = systems[r % len(systems) :] + systems[: r % len(systems)]
                    for s in order:
                        reply = workers[s].ask(batch=batch, **request)
                        times[s, batch].append(reply["seconds"])
        finally:
            for w in workers.values():
                w.close()

        for batch in batches:
            for s in systems:
                seconds = common.median(times[s, batch])
                bf16 = s in BF16_SYSTEMS
                peers = {"hf": "hf-bf16" if bf16 else "hf", "hf_fp32": "hf"}
                vs = {
                    column: common.median(
                        [a / b for a, b in zip(times[peer, batch], times[s, batch], strict=True)]
                    )
                    for column, peer in peers.items()
                    if peer in systems
                }
                same_as = "aiayn-bf16" if bf16 else "aiayn"
                same = None
                if s.startswith("hf") and same_as in systems:
                    same = agreement(
                        outputs[same_as, batch], outputs[s, batch], args.new_tokens - 1
                    )
                record = dict(
                    size=size,
                    batch=batch,
                    system=s,
                    tokens_per_s=batch * args.new_tokens / seconds,
                    ms_per_call=1000 * seconds,
                    times_s=times[s, batch],
                    speedup_vs_hf=vs.get("hf"),
                    speedup_vs_hf_fp32=vs.get("hf_fp32"),
                    same_outputs_as_aiayn=same,
                )
                records.append(record)
                rows.append(
                    [
                        size,
                        batch,
                        LABELS[s],
                        record["tokens_per_s"],
                        record["ms_per_call"],
                        "" if vs.get("hf") is None else f"{vs['hf']:.2f}x",
                        "" if vs.get("hf_fp32") is None else f"{vs['hf_fp32']:.2f}x",
                        "" if same is None else f"{same}/{batch}",
                    ]
                )

    print(
        f"\nGreedy generation, {args.prompt_len}-token prompts -> exactly {args.new_tokens} new "
        f"tokens, {args.threads} threads, median of {args.rounds} interleaved calls; "
        f"{common.machine()}\n"
    )
    print(
        common.table(
            [
                "shape",
                "batch",
                "system",
                "new tok/s",
                "ms/call",
                "vs HF",
                "vs HF fp32",
                "same tokens as aiayn*",
            ],
            rows,
        )
    )
    path = common.write_json(
        args.results,
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "method": (
                f"{len(systems)} systems in worker processes of their own, one warm-up call "
                f"and {args.rounds} timed calls per setting, taking turns call by call (the "
                "order rotated every round); ratios are medians of the per-round ratios, so "
                "that load from other processes on the machine falls on every system alike"
            ),
            "results": records,
        },
    )
    print(
        "\n*prompts whose new tokens (all but the last) equal aiayn's at the same precision; "
        'bf16 rows\' "vs HF" is against HF bf16.'
    )
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
