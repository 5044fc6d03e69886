"""The systems the decoding benchmark races, each as one call in a worker process of its own.

`bench_decode` (the parent) starts one `common.Worker` per system, running
`python -m benchmarks.bench_decode --worker SYSTEM ...`, whose `worker` (here) loads the
system's model once and answers one timed call per request: aiayn (`aiayn_runner`: fp32,
bf16, int8, with a shortlist, on the static or compiled step), Hugging Face `generate`
(`hf_runner`) and CTranslate2 (`ct2_runner`). Each call generates exactly `tgt_len`
tokens per sentence (aiayn through `FixedLength`, the peers through their min/max-length
options). The system names and their labels are here too; the parent's arithmetic and
tables are in `bench_decode`.
"""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks import common  # torch is imported where used: CTranslate2's workers go without it

SYSTEMS = (
    "aiayn",
    "aiayn-int8",
    "aiayn-int8-fp32out",
    "aiayn-shortlist",
    "aiayn-int8-shortlist",
    "aiayn-steps1",
    "hf",
    "ct2-fp32",
    "ct2-int8",
    "aiayn-bf16",
    "hf-bf16",
    "ct2-fp32-vmap",
    "ct2-int8-vmap",
    "aiayn-static",
    "aiayn-compiled",
    "aiayn-int8-compiled",
    "aiayn-cudagraph",
)
DEFAULT_SYSTEMS = (*SYSTEMS[:5], "hf", "ct2-fp32", "ct2-int8", "ct2-int8-vmap", "aiayn-static")
BF16_SYSTEMS = ("aiayn-bf16", "hf-bf16")
SHORTLIST_SYSTEMS = ("aiayn-shortlist", "aiayn-int8-shortlist")
VMAP_SYSTEMS = ("ct2-fp32-vmap", "ct2-int8-vmap")
STATIC_SYSTEMS = ("aiayn-static", "aiayn-compiled", "aiayn-int8-compiled", "aiayn-cudagraph")
# Fixed in advance, not chosen by this run's times: aiayn's int8 setting as `--dtype int8`
# ships it (fp32 output projection), the one bench_quality.py keeps within 0.3 BLEU of fp32.
BEST_OF = "aiayn-int8-fp32out"
SHORTLIST_FILE = "shortlist.safetensors"
VMAP_FILE = "vmap.txt"
LABELS = {
    "aiayn": "aiayn",
    "aiayn-int8": "aiayn int8",
    "aiayn-int8-fp32out": "aiayn int8, fp32 output",
    "aiayn-shortlist": "aiayn + shortlist",
    "aiayn-int8-shortlist": "aiayn int8 + shortlist",
    "aiayn-steps1": "aiayn, 1-thread steps",
    "hf": "HF generate",
    "ct2-fp32": "CTranslate2 fp32",
    "ct2-int8": "CTranslate2 int8",
    "aiayn-bf16": "aiayn bf16",
    "hf-bf16": "HF generate bf16",
    "ct2-fp32-vmap": "CTranslate2 fp32 + vmap",
    "ct2-int8-vmap": "CTranslate2 int8 + vmap",
    "aiayn-static": "aiayn static step",
    "aiayn-compiled": "aiayn compiled step",
    "aiayn-int8-compiled": "aiayn int8 compiled step",
    "aiayn-cudagraph": "aiayn step as a CUDA graph",
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
        from aiayn.inference.decoding import start as start_decoding

        decoding = start_decoding(self.model, src, beam)
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
    directory: Path,
    threads: int,
    step_threads: int | None,
    precision: str = "fp32",
    device: str = "cpu",
    shortlist: Path | None = None,
    int8_output: bool = True,
    static: bool = False,
    compiled: bool = False,
    compile_mode: str | None = None,
):
    """aiayn's searches; with `step_threads`, the decoding steps use that many threads.

    `precision`: fp32, bf16 or int8 (`frozen`); `shortlist`: a saved `aiayn.inference.shortlist.Shortlist` whose
    candidates alone the output projection scores; `static`: decode on the step of fixed
    shapes (`aiayn.inference.static_step.StaticDecoder`, batch x beam slots), `compiled`:
    compiled by `torch.compile` in the setting's first (untimed) call; `compile_mode`:
    by `torch.compile` in that mode ("reduce-overhead": replayed as a CUDA graph).
    """
    import torch

    from aiayn.inference.search import beam_search, greedy_search
    from aiayn.inference.threads import StepThreads
    from aiayn.io.marian import load_marian_model

    common.set_threads(threads)
    model = frozen(load_marian_model(directory).to(device), precision, int8_output)
    if shortlist is not None:
        from aiayn.inference.shortlist import Shortlist, Shortlisted

        model = Shortlisted(model, Shortlist.load(shortlist, common.VOCAB))
    if step_threads is not None:
        model = StepThreads(model, step_threads)
    static_models = {}  # (slots, positions) -> StaticDecoder: one compilation each

    def run(src: list[list[int]], beam: int, tgt_len: int) -> list[list[int]]:
        ids = torch.tensor(src, device=device)
        decoded = model
        if static:
            from aiayn.inference.static_step import StaticDecoder

            key = (len(src) * beam, tgt_len, len(src[0]))
            if key not in static_models:
                static_models[key] = StaticDecoder(
                    model,
                    key[0],
                    max_target=tgt_len,
                    max_source=len(src[0]),
                    compile=compiled,
                    compile_mode=compile_mode,
                )
            decoded = static_models[key]
        fixed = FixedLength(decoded, tgt_len)
        extra_len = tgt_len - len(src[0])  # the length limit is source + extra_len
        with torch.inference_mode():
            if beam == 1:
                hyps = greedy_search(fixed, ids, extra_len=extra_len)
            else:
                hyps = beam_search(fixed, ids, beam=beam, alpha=0.0, extra_len=extra_len)
        return [[*h[0].tokens, common.EOS] for h in hyps]

    return run


def frozen(model, precision: str, int8_output: bool):
    """`model` frozen in `precision` (fp32, bf16 or int8); in int8 with `int8_output`,
    every product in int8, the output projection included (CTranslate2's int8), else
    as `--dtype int8` ships it (the output projection in float32)."""
    import torch

    from aiayn.inference.frozen import freeze

    if precision == "int8" and int8_output:
        return freeze(model, torch.int8, int8_output=True, int8_min_elements=0)
    return freeze(model, {"fp32": None, "bf16": torch.bfloat16, "int8": torch.int8}[precision])


def hf_runner(directory: Path, threads: int, bf16: bool = False, device: str = "cpu"):
    import torch
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
        ids = torch.tensor(src, device=device)
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config
            )
        return out[:, 1:].tolist()

    return run


def ct2_runner(
    directory: Path, threads: int, quantization: str, device: str = "cpu", vmap: bool = False
):
    """CTranslate2's `translate_batch`, with its own latency settings (one replica,
    `max_batch_size=0`, no scores computed) and, with `vmap`, the vocabulary map in the
    model directory (`vmap.txt`: the same candidates as aiayn's shortlist)."""
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
            return_scores=False,
            use_vmap=vmap,
        )
        return [[ids[t] for t in r.hypotheses[0]] for r in results]

    return run


def shortlist_size(path: Path, src: list[list[int]]) -> int:
    """The number of candidates the shortlist at `path` gives the sources `src` (eos must be one)."""
    import torch

    from aiayn.inference.shortlist import Shortlist

    candidates = Shortlist.load(path, common.VOCAB).candidates(torch.tensor(src))
    if common.EOS not in candidates.tolist():  # FixedLength forces eos at the last step
        raise RuntimeError(f"{path}: the shortlist's candidates lack eos ({common.EOS})")
    return int(candidates.numel())


def worker(
    system: str, workdir: Path, size: str, threads: int, device: str, shortlist_output: str
) -> None:
    shortlist = workdir / SHORTLIST_FILE if system in SHORTLIST_SYSTEMS else None
    if system in STATIC_SYSTEMS:
        run = aiayn_runner(
            workdir / f"marian-{size}",
            threads,
            None,
            "int8" if "int8" in system else "fp32",
            device,
            int8_output=False,
            static=True,
            compiled=system.endswith("compiled"),
            compile_mode="reduce-overhead" if system == "aiayn-cudagraph" else None,
        )
    elif system.startswith("aiayn"):
        step_threads = 1 if system == "aiayn-steps1" else None
        precision = next((p for p in ("bf16", "int8") if f"-{p}" in system), "fp32")
        # aiayn-int8 quantizes the output projection too; aiayn-int8-fp32out keeps it
        # float32, as `--dtype int8` does (the shortlist rows: --int8-shortlist-output)
        int8_output = system != "aiayn-int8-fp32out" and (
            shortlist is None or shortlist_output == "int8"
        )
        run = aiayn_runner(
            workdir / f"marian-{size}",
            threads,
            step_threads,
            precision,
            device,
            shortlist,
            int8_output,
        )
    elif system.startswith("hf"):
        run = hf_runner(workdir / f"marian-{size}", threads, system == "hf-bf16", device)
    else:
        quantization = system.split("-")[1]
        vmap = system in VMAP_SYSTEMS
        model_dir = workdir / f"ct2-{size}-{quantization}{'-vmap' if vmap else ''}"
        run = ct2_runner(model_dir, threads, quantization, device, vmap)

    def handle(request):
        if request.get("memory"):
            return {"memory_mb": common.memory_mb()}
        src = common.source_ids(request["batch"], request["src_len"])
        start = time.perf_counter()
        tokens = run(src, request["beam"], request["tgt_len"])
        seconds = time.perf_counter() - start
        lengths = {len(row) for row in tokens}
        if lengths != {request["tgt_len"]}:
            raise RuntimeError(f"{system} generated lengths {lengths}, not {request['tgt_len']}")
        reply = {"seconds": seconds, "tokens": tokens if request.get("tokens") else None}
        if request.get("tokens") and shortlist is not None:
            reply["shortlist_size"] = shortlist_size(shortlist, src)
        return reply

    common.serve(handle)
