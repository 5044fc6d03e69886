"""int8 quality with error bars: each precision against fp32 on several quickstart runs.

    for seed in 0 1 2; do aiayn quickstart --out runs/qs-seed$seed --seed $seed; done
    python -m benchmarks.bench_quality_seeds runs/qs-seed0 runs/qs-seed1 runs/qs-seed2

For each run it takes the weights the quickstart scores (the lowest validation loss,
`evaluated_weights`) and translates the test split with the quickstart's decoding (beam
8, alpha 1.0 unless given) in fp32 and in each other setting of `bench_quality.py`.
For each setting against fp32 on the same run: the difference in sacreBLEU, its 95%
interval and sacreBLEU's paired bootstrap p-value (`aiayn.training.evaluate.
paired_bootstrap`, 1,000 resamples), and the share of sentences whose greedy output is
identical to fp32's. A single model's difference is one draw: the seeds show how much
of it is the model, the interval how much is the choice of test sentences.

Writes `benchmarks/results/quality-seeds.json`; `report.py --write` renders its table in docs/explanation/results/cpu-inference.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import aiayn.inference.frozen
import aiayn.io.int8_weights
from aiayn.apps.quickstart import evaluated_weights
from aiayn.data.corpus import PreparedCorpus
from aiayn.data.tokenizer import TOKENIZER_FILE, SentencePieceTokenizer
from aiayn.inference import shortlist as shortlists
from aiayn.io.checkpoint import read_config
from aiayn.training.evaluate import paired_bootstrap, score
from benchmarks import common
from benchmarks.bench_quality import SETTINGS, translate_both, translator

DEFAULT_SETTINGS = ("fp32", "bf16", "int8", "int8-layers", "int8-all")


def seeds(runs: list[dict]) -> str:
    """The runs' seeds for the measures record: "0 to 2", or "0, 3"."""
    numbers = sorted(r["seed"] for r in runs if r.get("seed") is not None)
    if len(numbers) > 2 and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{numbers[0]} to {numbers[-1]}"
    return ", ".join(map(str, numbers)) or "not recorded"


def run_seed(run: Path) -> int | None:
    """The training seed a quickstart run recorded (None when it did not finish)."""
    results = run / "results.json"
    return json.loads(results.read_text()).get("seed") if results.is_file() else None


def measure_run(run: Path, settings: list[str], args: argparse.Namespace) -> dict:
    """Every setting of one run against its fp32, as one results record."""
    corpus = PreparedCorpus.load(run / "data")
    weights, rule = evaluated_weights(run / "run", 1, lambda line: None)
    tokenizer = SentencePieceTokenizer.load(run / "run" / TOKENIZER_FILE)
    shortlist = shortlists.Shortlist.load(
        corpus.root / shortlists.SHORTLIST_FILE, tokenizer.vocab_size
    )
    pairs = corpus.read(args.split)[: args.limit]
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    rows = []
    for setting in settings:  # fp32 first (main checks it)
        made = translator(weights, tokenizer, setting, shortlist)
        beam, greedy, seconds = translate_both(made, sources, args.beam, args.alpha)
        if setting == "fp32":
            fp32_beam, fp32_greedy = beam, greedy
        scores = score(beam, references)
        difference = paired_bootstrap(fp32_beam, beam, references, resamples=args.resamples)
        same = sum(a == b for a, b in zip(greedy, fp32_greedy, strict=True))
        rows.append(
            {
                "setting": setting,
                "bleu": round(scores.bleu, 2),
                "chrf": round(scores.chrf, 2),
                "vs_fp32": round(difference.difference, 2),
                "vs_fp32_low": round(difference.low, 2),
                "vs_fp32_high": round(difference.high, 2),
                "p_value": round(difference.p_value, 4),
                "beam_same_as_fp32": sum(a == b for a, b in zip(beam, fp32_beam, strict=True)),
                "greedy_same_as_fp32": same,
                "seconds": round(seconds, 2),
            }
        )
        print(
            f"{run.name} {setting:>15}: BLEU {scores.bleu:.2f}  vs fp32 "
            f"{difference.difference:+.2f} [{difference.low:+.2f}, {difference.high:+.2f}] "
            f"p={difference.p_value:.3f}  greedy same {same}/{len(sources)}",
            flush=True,
        )
    config = read_config(weights)
    return {
        "run": str(run),
        "seed": run_seed(run),
        "weights": str(weights),
        "weights_rule": rule,
        "model": {"d_model": config.d_model, "n_layers": config.n_layers},
        "sentences": len(sources),
        "bleu_signature": scores.bleu_signature,
        "results": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="`aiayn quickstart --out` directories")
    parser.add_argument(
        "--settings", default=",".join(DEFAULT_SETTINGS), help=f"of {list(SETTINGS)}"
    )
    parser.add_argument("--beam", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--split", default="test")
    parser.add_argument("--name", default="quality-seeds", help="results file name")
    parser.add_argument("--limit", type=int, help="the first N sentences only (a quick check)")
    parser.add_argument("--note", default="", help="how the runs were trained, for the report")
    args = parser.parse_args()
    settings = args.settings.split(",")
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown or settings[0] != "fp32":
        parser.error(f"--settings: fp32 first, then any of {list(SETTINGS)}; unknown: {unknown}")
    common.set_threads(args.threads)
    runs = [measure_run(run, settings, args) for run in args.runs]
    path = common.write_json(
        args.name,
        {
            "measures": [
                {
                    "system": "each inference precision's BLEU against fp32, paired bootstrap",
                    "cell": f"the quickstart recipe's seeds {seeds(runs)}, {args.split} verses",
                    "harness": "bench_quality_seeds",
                }
            ],
            "args": {**vars(args), "runs": [str(r) for r in args.runs]},
            "split": args.split,
            "beam": args.beam,
            "alpha": args.alpha,
            "resamples": args.resamples,
            "int8_min_elements": aiayn.io.int8_weights.INT8_MIN_ELEMENTS,
            "note": args.note,
            "runs": runs,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
