"""Decoding speed on CPU: aiayn vs Hugging Face `generate` vs CTranslate2, same weights.

    PYTHONPATH=src python benchmarks/bench_decode.py [--quick]

One random-weight MarianMTModel per shape is saved with `save_pretrained` into a
work directory, loaded into aiayn (`load_marian_model`) and Hugging Face, and
converted to CTranslate2 fp32 and int8 with its `TransformersConverter`. Every
system decodes the same 32 sources of 30 tokens and runs exactly 30 decoder steps
per sentence (eos is forbidden until the last step), greedy and beam 4, with the
same number of threads. Metric: target tokens/s = batch x 30 / wall time of one
call, the encoder included. Systems take turns call by call (see `common`); the
tables show medians and the median of the per-round ratios. Batch-1 rows give the
latency of one sentence. "aiayn, 1-thread steps" runs the encoder with the same
threads and each decoding step with one (`aiayn.threads.StepThreads`).

On CPUs that multiply bfloat16 natively (AMX or AVX512-BF16) aiayn and Hugging
Face also run with their weights cast to bfloat16 ("-bf16" systems; CTranslate2
has no bfloat16 on the CPU); their "vs HF" ratio is against HF in bfloat16.

`--against COMMIT` also runs aiayn as of that commit (its own script and library,
from a git worktree in the work directory) and adds a "vs COMMIT" column: the
median per-round ratio of its time to today's, so > 1 means faster now.

    PYTHONPATH=src python benchmarks/bench_decode.py --systems aiayn --against 2d41774

`--device cuda` runs aiayn, HF and CTranslate2 on a GPU (bf16 rows where the card
supports bf16); the rest is the same. The issue's GPU comparison, beam 4:

    PYTHONPATH=src python benchmarks/bench_decode.py --device cuda --beams 4 \
        --systems aiayn,hf,ct2-fp32,aiayn-bf16,hf-bf16
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch

import common

SYSTEMS = ("aiayn", "aiayn-steps1", "hf", "ct2-fp32", "ct2-int8", "aiayn-bf16", "hf-bf16")
BF16_SYSTEMS = ("aiayn-bf16", "hf-bf16")
LABELS = {
    "aiayn": "aiayn",
    "aiayn-steps1": "aiayn, 1-thread steps",
    "hf": "HF generate",
    "ct2-fp32": "CTranslate2 fp32",
    "ct2-int8": "CTranslate2 int8",
    "aiayn-bf16": "aiayn bf16",
    "hf-bf16": "HF generate bf16",
}


# ----- workers: one call of one system -----------------------------------------------


class FixedLength:
    """aiayn's model, with eos forbidden until the output is `length` tokens long.

    The benchmark's way to make aiayn generate exactly as many tokens as the peers
    (their min/max-length options); the search itself is unchanged.
    """

    def __init__(self, model, length: int) -> None:
        self.model, self.cfg, self.length = model, model.cfg, length

    def start(self, src, beam=1):
        decoding = self.model.start(src, beam)
        step, eos, taken = decoding.step, self.cfg.eos_id, [0]

        def step_without_early_eos(last):
            logits = step(last)
            taken[0] += 1
            if taken[0] < self.length:
                logits[..., eos] = float("-inf")
            return logits

        decoding.step = step_without_early_eos
        return decoding


def aiayn_runner(
    directory: Path, threads: int, step_threads: int | None, bf16: bool = False, device: str = "cpu"
):
    """aiayn's searches; with `step_threads`, the decoding steps use that many threads."""

    from aiayn.inference import freeze
    from aiayn.marian import load_marian_model
    from aiayn.search import beam_search, greedy_search
    from aiayn.threads import StepThreads

    common.set_threads(threads)
    model = freeze(load_marian_model(directory).to(device), torch.bfloat16 if bf16 else None)
    if step_threads is not None:
        model = StepThreads(model, step_threads)

    def run(src: list[list[int]], beam: int, tgt_len: int) -> list[list[int]]:
        ids = torch.tensor(src, device=device)
        fixed = FixedLength(model, tgt_len)
        extra_len = tgt_len - len(src[0])  # the length limit is source + extra_len
        with torch.inference_mode():
            if beam == 1:
                hyps = greedy_search(fixed, ids, extra_len=extra_len)
            else:
                hyps = beam_search(fixed, ids, beam=beam, alpha=0.0, extra_len=extra_len)
        return [[*h[0].tokens, common.EOS] for h in hyps]

    return run


def hf_runner(directory: Path, threads: int, bf16: bool = False, device: str = "cpu"):
    from transformers import GenerationConfig, MarianMTModel

    common.set_threads(threads)
    model = MarianMTModel.from_pretrained(directory).eval().to(device)
    if bf16:
        model = model.to(torch.bfloat16)
    # generate() fills unset fields from model.generation_config, whose forced eos
    # would end every output one token early: clear it there.
    model.generation_config.forced_eos_token_id = None

    def run(src: list[list[int]], beam: int, tgt_len: int) -> list[list[int]]:
        config = GenerationConfig(
            do_sample=False,
            num_beams=beam,
            max_new_tokens=tgt_len,
            min_new_tokens=tgt_len,
            use_cache=True,
            decoder_start_token_id=common.PAD,
            eos_token_id=common.EOS,
            pad_token_id=common.PAD,
            forced_eos_token_id=None,
            suppress_tokens=[common.PAD],  # CTranslate2 drops <pad>; aiayn never generates it
            length_penalty=1.0,
            early_stopping=False,
        )
        ids = torch.tensor(src)
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config
            )
        return out[:, 1:].tolist()

    return run


def ct2_runner(directory: Path, threads: int, quantization: str, device: str = "cpu"):
    import ctranslate2

    translator = ctranslate2.Translator(
        str(directory),
        device="cuda" if device.startswith("cuda") else "cpu",
        device_index=int(device.partition(":")[2] or 0),
        compute_type="int8" if quantization == "int8" else "float32",
        inter_threads=1,
        intra_threads=threads,
    )
    ids = {common.ct2_token(i): i for i in range(common.PAD)}

    def run(src: list[list[int]], beam: int, tgt_len: int) -> list[list[int]]:
        results = translator.translate_batch(
            [[common.ct2_token(i) for i in row] for row in src],
            beam_size=beam,
            max_decoding_length=tgt_len,
            min_decoding_length=tgt_len,
            length_penalty=1.0,
            max_batch_size=0,
        )
        return [[ids[t] for t in r.hypotheses[0]] for r in results]

    return run


def worker(system: str, workdir: Path, size: str, threads: int, device: str) -> None:
    if system.startswith("aiayn"):
        step_threads = 1 if system == "aiayn-steps1" else None
        run = aiayn_runner(
            workdir / f"marian-{size}", threads, step_threads, system == "aiayn-bf16", device
        )
    elif system.startswith("hf"):
        run = hf_runner(workdir / f"marian-{size}", threads, system == "hf-bf16", device)
    else:
        quantization = system.split("-")[1]
        run = ct2_runner(workdir / f"ct2-{size}-{quantization}", threads, quantization, device)

    def handle(request):
        src = common.source_ids(request["batch"], request["src_len"])
        start = time.perf_counter()
        tokens = run(src, request["beam"], request["tgt_len"])
        seconds = time.perf_counter() - start
        lengths = {len(row) for row in tokens}
        if lengths != {request["tgt_len"]}:
            raise RuntimeError(f"{system} generated lengths {lengths}, not {request['tgt_len']}")
        return {"seconds": seconds, "tokens": tokens if request.get("tokens") else None}

    common.serve(handle)


# ----- parent --------------------------------------------------------------------------


def prepare(workdir: Path, size: str, systems: list[str]) -> None:
    marian = workdir / f"marian-{size}"
    if not (marian / "config.json").exists():
        common.save_random_marian(size, marian)
    for quantization in ("fp32", "int8"):
        out = workdir / f"ct2-{size}-{quantization}"
        if f"ct2-{quantization}" in systems and not (out / "model.bin").exists():
            common.convert_ct2(marian, out, None if quantization == "fp32" else "int8")


def baseline_checkout(workdir: Path, commit: str) -> Path:
    """A git worktree of this repository at `commit` (made once, in the workdir)."""
    checkout = workdir / f"aiayn-{commit}"
    if not checkout.exists():
        root = Path(__file__).resolve().parents[1]
        subprocess.run(
            ["git", "-C", str(root), "worktree", "add", "--detach", str(checkout), commit],
            check=True,
        )
    return checkout


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def agreement(a: list[list[int]], b: list[list[int]], n: int) -> int:
    """Sentences whose first n tokens agree (aiayn's last token is the forced eos)."""
    return sum(x[:n] == y[:n] for x, y in zip(a, b, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="small,base")
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--src-len", type=int, default=30)
    parser.add_argument("--tgt-len", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--rounds", type=int, default=5, help="timed calls per system")
    parser.add_argument("--no-latency", action="store_true", help="skip the batch-1 rows")
    parser.add_argument("--quick", action="store_true", help="3 rounds, fp32 peers only")
    parser.add_argument("--workdir", type=Path, help="keep the models here (default: temp)")
    parser.add_argument(
        "--against",
        metavar="COMMIT",
        help="also run aiayn as of COMMIT (a git worktree in the workdir), for a 'vs COMMIT' ratio",
    )
    parser.add_argument("--results", help="results file name (default: decode[-vs-COMMIT])")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.workdir, args.size, args.threads, args.device)
    if args.tgt_len < args.src_len:
        parser.error("--tgt-len must be >= --src-len (aiayn's limit is source + extra_len)")
    systems = args.systems.split(",")
    if args.quick:
        args.rounds = 3
        systems = [s for s in systems if s != "ct2-int8" and s not in BF16_SYSTEMS]
    systems = common.without_unsupported_bf16(systems, BF16_SYSTEMS, args.device)
    workdir = args.workdir or common.default_workdir()
    workdir.mkdir(parents=True, exist_ok=True)
    baseline = None
    if args.against:
        baseline = f"aiayn@{args.against}"
        LABELS[baseline] = f"aiayn {args.against}"
        systems.append(baseline)
        checkout = baseline_checkout(workdir, args.against)
    configs = [(beam, args.batch) for beam in map(int, args.beams.split(","))]
    if not args.no_latency:
        configs += [(beam, 1) for beam in map(int, args.beams.split(","))]

    rows, records = [], []
    for size in args.sizes.split(","):
        prepare(workdir, size, systems)
        worker_args = [
            *("--workdir", str(workdir), "--size", size),
            *("--threads", str(args.threads), "--device", args.device),
        ]
        workers = {
            s: common.Worker(__file__, s, worker_args, args.threads)
            for s in systems
            if s != baseline
        }
        if baseline:  # the commit's own script and library, as its system "aiayn"
            script = str(checkout / "benchmarks" / Path(__file__).name)
            workers[baseline] = common.Worker(
                script, "aiayn", worker_args, args.threads, str(checkout / "src")
            )
        try:
            times = {(s, c): [] for s in systems for c in configs}
            outputs = {}
            for beam, batch in configs:  # warm-up call, keeping the outputs for a check
                for s in systems:
                    reply = workers[s].ask(
                        beam=beam,
                        batch=batch,
                        src_len=args.src_len,
                        tgt_len=args.tgt_len,
                        tokens=True,
                    )
                    outputs[s, beam, batch] = reply["tokens"]
            for r in range(args.rounds):
                for beam, batch in configs:
                    order = systems[r % len(systems) :] + systems[: r % len(systems)]
                    for s in order:
                        reply = workers[s].ask(
                            beam=beam, batch=batch, src_len=args.src_len, tgt_len=args.tgt_len
                        )
                        times[s, (beam, batch)].append(reply["seconds"])
        finally:
            for w in workers.values():
                w.close()

        for beam, batch in configs:
            config = (beam, batch)
            n_tokens = batch * args.tgt_len
            for s in systems:
                seconds = common.median(times[s, config])
                bf16 = s in BF16_SYSTEMS
                # HF of the same precision; CTranslate2 in fp32 (it has no CPU bf16).
                peers = {"hf": "hf-bf16" if bf16 else "hf", "ct2-fp32": "ct2-fp32"}
                if baseline and s == "aiayn":
                    peers["baseline"] = baseline
                vs = {
                    column: common.median(
                        [a / b for a, b in zip(times[peer, config], times[s, config], strict=True)]
                    )
                    for column, peer in peers.items()
                    if peer in systems
                }
                # Outputs compared with aiayn of the same precision (aiayn bf16: with fp32).
                same_as = "aiayn" if s == "aiayn-bf16" else "aiayn-bf16" if bf16 else "aiayn"
                same = None
                if s not in ("aiayn", "aiayn-steps1") and same_as in systems:
                    same = agreement(
                        outputs[same_as, beam, batch], outputs[s, beam, batch], args.tgt_len - 1
                    )
                record = dict(
                    size=size,
                    search="greedy" if beam == 1 else f"beam {beam}",
                    batch=batch,
                    system=s,
                    tokens_per_s=n_tokens / seconds,
                    ms_per_call=1000 * seconds,
                    times_s=times[s, config],
                    speedup_vs_hf=vs.get("hf"),
                    speedup_vs_ct2_fp32=vs.get("ct2-fp32"),
                    speedup_vs_baseline=vs.get("baseline"),
                    same_outputs_as_aiayn=same,
                )
                records.append(record)
                rows.append(
                    [
                        size,
                        record["search"],
                        batch,
                        LABELS[s],
                        record["tokens_per_s"],
                        record["ms_per_call"],
                        "" if vs.get("hf") is None else f"{vs['hf']:.2f}x",
                        "" if vs.get("ct2-fp32") is None else f"{vs['ct2-fp32']:.2f}x",
                        "" if same is None else f"{same}/{batch}",
                        *([] if not baseline else [_ratio(vs.get("baseline"))]),
                    ]
                )

    print(
        f"\nDecoding, {args.src_len} source tokens -> exactly {args.tgt_len} target tokens, "
        f"{args.threads} threads, median of {args.rounds} interleaved calls; "
        f"{common.device_name(args.device)}\n"
    )
    print(
        common.table(
            [
                "shape",
                "search",
                "batch",
                "system",
                "tgt tok/s",
                "ms/call",
                "vs HF",
                "vs CT2 fp32",
                "same output as aiayn*",
                *([] if not baseline else [f"vs {args.against}"]),
            ],
            rows,
        )
    )
    path = common.write_json(
        args.results or (f"decode-vs-{args.against}" if args.against else "decode"),
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
        "\n*sentences whose tokens equal aiayn's at the same precision (aiayn bf16: "
        "aiayn fp32's); bf16 rows' \"vs HF\" is against HF bf16."
    )
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
