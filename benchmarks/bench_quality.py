"""Translation quality of each inference precision and of the output shortlist, on a trained model.

    aiayn quickstart --out runs/qs30 --minutes 30
    python -m benchmarks.bench_quality runs/qs30

On the quickstart's test split (the Bible, English to Spanish) it translates with the
run's averaged weights in each setting: fp32, bf16, int8 (`freeze(model, torch.int8)`,
the default: products of `INT8_MIN_ELEMENTS` weights and up, which in the quickstart's
d_model-128 model is the FFN alone, the output projection in fp32), int8 in every layer
product (as int8 runs the small and base shapes and opus-mt, where every layer product
is large enough), the same with one activation scale per product instead of one per
token (`Int8Linear`'s `per_token`; faster), the same with the output projection in int8
too, int8 in every layer
product + shortlist, and fp32 + shortlist (the corpus's `shortlist.safetensors`,
written by `aiayn prepare`). For each:
sacreBLEU and chrF with beam 4 (the paper's search), and the share of test sentences
whose greedy output is identical to fp32's. It also gives the shortlist's recall (the
share of reference pieces in their sentence's candidate set) and the mean number of
candidates per sentence. Seconds are the whole translation of the split, for
orientation only: speed is measured by `bench_decode.py`.

Writes `benchmarks/results/quality.json`; `report.py --write` renders its table in docs/explanation/results/cpu-inference.md.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import torch

import aiayn.inference.frozen
import aiayn.io.int8_weights
from aiayn.apps.translate import Translator
from aiayn.data.corpus import PreparedCorpus
from aiayn.data.tokenizer import TOKENIZER_FILE, SentencePieceTokenizer
from aiayn.inference import shortlist as shortlists
from aiayn.io.checkpoint import load_model, resolve_weights
from aiayn.training.evaluate import score
from benchmarks import common

# name -> (dtype, with the shortlist, every layer product in int8, the output in int8,
# activations quantized per token)
SETTINGS = {
    "fp32": (torch.float32, False, False, False, True),
    "bf16": (torch.bfloat16, False, False, False, True),
    "int8": (torch.int8, False, False, False, True),
    "int8-layers": (torch.int8, False, True, False, True),
    "int8-layers-per-tensor": (torch.int8, False, True, False, False),
    "int8-all": (torch.int8, False, True, True, True),
    "int8-shortlist": (torch.int8, True, True, False, True),
    "fp32-shortlist": (torch.float32, True, False, False, True),
}


@contextlib.contextmanager
def every_product_int8() -> Iterator[None]:
    """`freeze` quantizes every product while this lasts, the output projection included
    (a benchmark-only setting: the library keeps small products and the output in fp32)."""
    saved = aiayn.io.int8_weights.INT8_MIN_ELEMENTS
    aiayn.io.int8_weights.INT8_MIN_ELEMENTS = 0
    try:
        yield
    finally:
        aiayn.io.int8_weights.INT8_MIN_ELEMENTS = saved


def translator(weights: Path, tokenizer: SentencePieceTokenizer, setting: str, shortlist):
    dtype, with_shortlist, every, int8_output, per_token = SETTINGS[setting]
    model = load_model(weights, device="cpu")
    chosen = shortlist if with_shortlist else None
    with every_product_int8() if every else contextlib.nullcontext():
        made = Translator(model, tokenizer, "cpu", dtype, shortlist=chosen)
        if int8_output or not per_token:  # settings Translator does not take
            made.engine = aiayn.inference.frozen.freeze(
                made.model, torch.int8, int8_output=int8_output, int8_per_token=per_token
            )
    return made


def translate_both(made: Translator, sources: list[str], beam: int, alpha: float):
    """`made`'s beam-search outputs (timed, with a progress bar), its greedy outputs, and
    the seconds the beam search took."""
    started = time.perf_counter()
    searched = made.translate(sources, beam=beam, alpha=alpha, progress=True)
    seconds = time.perf_counter() - started
    return searched, made.translate(sources, beam=1), seconds


def run_weights(run: Path) -> Path:
    """The quickstart's averaged weights if present, else the run's own."""
    averaged = sorted((run / "run" / "checkpoints").glob("average-last-*/model.safetensors"))
    return averaged[-1] if averaged else resolve_weights(run / "run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("quickstart", type=Path, help="an `aiayn quickstart --out` directory")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"of {list(SETTINGS)}")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--split", default="test")
    parser.add_argument("--name", default="quality", help="results file name")
    parser.add_argument("--limit", type=int, help="the first N sentences only (a quick check)")
    args = parser.parse_args()
    settings = args.settings.split(",")
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown or "fp32" not in settings:
        parser.error(f"--settings: fp32 and any of {list(SETTINGS)}; unknown: {unknown}")
    common.set_threads(args.threads)

    corpus = PreparedCorpus.load(args.quickstart / "data")
    weights = run_weights(args.quickstart)
    tokenizer = SentencePieceTokenizer.load(args.quickstart / "run" / TOKENIZER_FILE)
    shortlist = shortlists.Shortlist.load(
        corpus.root / shortlists.SHORTLIST_FILE, tokenizer.vocab_size
    )
    pairs = corpus.read(args.split)[: args.limit]
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    source_ids = tokenizer.encode_batch(sources)
    candidates = [
        len(shortlist.candidates([*ids, tokenizer.eos_id])) for ids in source_ids
    ]  # one sentence at a time: a batch's union is larger
    recall = shortlists.recall(shortlist, source_ids, tokenizer.encode_batch(references))

    rows, greedy_fp32 = [], None
    for setting in settings:
        made = translator(weights, tokenizer, setting, shortlist)
        beam, greedy, seconds = translate_both(made, sources, args.beam, args.alpha)
        greedy_fp32 = greedy if setting == "fp32" else greedy_fp32
        scores = score(beam, references)
        same = sum(a == b for a, b in zip(greedy, greedy_fp32, strict=True))
        rows.append(
            {
                "setting": setting,
                "bleu": round(scores.bleu, 2),
                "chrf": round(scores.chrf, 2),
                "greedy_same_as_fp32": same,
                "seconds": round(seconds, 2),
            }
        )
        print(
            f"{setting:>15}: BLEU {scores.bleu:.2f}  chrF {scores.chrf:.2f}  greedy same as "
            f"fp32 {same}/{len(sources)}  beam {seconds:.1f} s",
            flush=True,
        )
    path = common.write_json(
        args.name,
        {
            "args": {**vars(args), "quickstart": str(args.quickstart)},
            "weights": str(weights),
            "split": args.split,
            "sentences": len(sources),
            "bleu_signature": scores.bleu_signature,
            "shortlist": {
                "frequent": int(shortlist.frequent.numel()),
                "per_source": shortlist.per_source,
                "recall": round(recall, 4),
                "mean_candidates": round(statistics.mean(candidates), 1),
                "vocab_size": shortlist.vocab_size,
            },
            "int8_min_elements": aiayn.io.int8_weights.INT8_MIN_ELEMENTS,
            "results": rows,
        },
    )
    print(f"shortlist recall {recall:.4f}, {statistics.mean(candidates):.0f} candidates/sentence")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
