"""Record choices made on the valid split: recipe variants and beam x alpha, as a results file.

    aiayn quickstart --out runs/v-seed0 --seed 0                      # the recipe
    aiayn quickstart --out runs/v-d256 --seed 0 --set model.d_model=256 --set model.d_ff=1024
    python -m benchmarks.record_valid runs/v-seed0 runs/v-d256 ... --note "how they ran"
    python -m benchmarks.report --write                                # the docs' tables

For each quickstart directory it takes the weights the quickstart scores (the lowest
validation loss, `evaluated_weights`), reads the run's recipe overrides, seed, steps
and best validation loss, and translates the valid split (never the test split) with
every search of `--searches` (greedy, and beam B with length penalty alpha A). A run
with no overrides is the recipe itself; the report compares each variant with the
recipe's runs at the quickstart's decoding, and gives the beam x alpha grid over the
recipe's runs. The runs must have been trained under the same conditions (threads,
cores, minutes, nothing else running): the note says which.

Writes `benchmarks/results/NAME.json` (default `valid-sweep`). Nothing here reads or
prints a test-split figure, so nothing chosen from it has seen the test split.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from aiayn.apps.quickstart import evaluated_weights
from aiayn.apps.translate import Translator
from aiayn.data.corpus import PreparedCorpus
from aiayn.data.tokenizer import TOKENIZER_FILE
from aiayn.training.evaluate import score
from aiayn.training.metrics import validation_records
from benchmarks import common

# (beam, alpha): greedy, the paper's beam 4 / alpha 0.6, and around the quickstart's 8 / 1.0
DEFAULT_SEARCHES = "1:0,4:0.6,4:1.0,8:0.6,8:1.0,8:1.4,12:1.0"


def parse_searches(text: str) -> list[tuple[int, float]]:
    """'1:0,4:0.6' -> [(1, 0.0), (4, 0.6)].

    Raises:
        ValueError: a part that is not BEAM:ALPHA with BEAM >= 1 and ALPHA >= 0.
    """
    searches = []
    for part in text.split(","):
        beam, sep, alpha = part.partition(":")
        if not sep or not beam.strip().isdigit() or int(beam) < 1:
            raise ValueError(f"--searches: {part!r} is not BEAM:ALPHA (e.g. 8:1.0)")
        if float(alpha) < 0:
            raise ValueError(f"--searches: {part!r} has a negative alpha")
        searches.append((int(beam), float(alpha)))
    return searches


def best_valid_loss(run_dir: Path) -> float | None:
    """The lowest validation loss a run logged (metrics.jsonl), or None."""
    losses = [record["loss"] for record in validation_records(run_dir) or []]
    return round(min(losses), 4) if losses else None


def record_run(run: Path, searches: list[tuple[int, float]], limit: int | None) -> dict[str, Any]:
    """One quickstart directory: what it trained and its valid BLEU under each search."""
    results_file = run / "results.json"
    if not results_file.is_file():
        raise SystemExit(f"{run}: no results.json (not a finished `aiayn quickstart --out`)")
    trained = json.loads(results_file.read_text())
    weights, rule = evaluated_weights(run / "run", 1, lambda line: None)
    translator = Translator.load(weights, device="cpu", tokenizer=run / "run" / TOKENIZER_FILE)
    pairs = PreparedCorpus.load(run / "data").read("valid")[:limit]
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    rows = []
    for beam, alpha in searches:
        started = time.perf_counter()
        hypotheses = translator.translate(sources, beam=beam, alpha=alpha)
        seconds = time.perf_counter() - started
        scores = score(hypotheses, references)
        rows.append(
            {
                "beam": beam,
                "alpha": alpha,
                "bleu": round(scores.bleu, 2),
                "chrf": round(scores.chrf, 2),
                "seconds": round(seconds, 2),
            }
        )
        print(f"{run.name}: beam {beam} alpha {alpha:g}: valid BLEU {scores.bleu:.2f}", flush=True)
    return {
        "run": str(run),
        "seed": trained["seed"],
        "overrides": [o for o in trained.get("overrides", []) if not o.startswith("train.seed=")],
        "recipe": Path(trained["recipe"]).name,
        "recipe_sha256": trained.get("recipe_sha256"),
        "minutes": trained["minutes"],
        "steps": trained["steps"],
        "epochs": trained["epochs"],
        "parameters": trained["parameters"],
        "best_valid_loss": best_valid_loss(run / "run"),
        "weights": str(weights),
        "weights_rule": rule,
        "sentences": len(sources),
        "bleu_signature": scores.bleu_signature,
        "searches": rows,
    }


def minutes(runs: list[dict[str, Any]]) -> str:
    """The runs' training minutes for the measures record: "15 minutes", "15 to 30 minutes"."""
    low, high = min(r["minutes"] for r in runs), max(r["minutes"] for r in runs)
    return f"{low:g} minutes" if low == high else f"{low:g} to {high:g} minutes"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="`aiayn quickstart --out` directories")
    parser.add_argument("--searches", default=DEFAULT_SEARCHES, help="BEAM:ALPHA,... (1:0 greedy)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="valid-sweep", help="results file name")
    parser.add_argument("--limit", type=int, help="the first N valid pairs only (a quick check)")
    parser.add_argument("--note", default="", help="how the runs were trained, for the report")
    args = parser.parse_args()
    try:
        searches = parse_searches(args.searches)
    except ValueError as err:
        parser.error(str(err))
    common.set_threads(args.threads)
    runs = [record_run(run, searches, args.limit) for run in args.runs]
    path = common.write_json(
        args.name,
        {
            "measures": [
                {
                    "system": "the quickstart recipe and its variants: valid loss and BLEU per search",
                    "cell": f"seeds and variants of {minutes(runs)} each, valid split",
                    "harness": "record_valid",
                }
            ],
            "args": {**vars(args), "runs": [str(r) for r in args.runs]},
            "split": "valid",
            "note": args.note,
            "runs": runs,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
