"""Record how well a translation model's cross-attention aligns words: AER per layer.

    aiayn quickstart --out runs/quickstart          # or any encoder-decoder run
    python -m benchmarks.record_alignment runs/quickstart/run --note "how it was trained"
    python -m benchmarks.report --write

It runs what `aiayn align` runs (`aiayn.analysis.alignment.align_pairs`) on the run's
test split: each decoder layer's cross-attention averaged over heads, attention rollout
(Abnar & Zuidema 2020) and the diagonal baseline that reads no model, each scored in
AER against IBM Model 1's alignment of the same sentences (Model 1 trained on
`--model1-pairs` pairs of the train split plus the test pairs). It writes
`benchmarks/results/NAME.json` (default `alignment`): the AER table, the run's test
BLEU where its results.json records one, and a few sentences with every alignment.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from aiayn.analysis.alignment import align_pairs
from aiayn.apps.translate import Translator
from aiayn.data.corpus import PreparedCorpus, read_parallel
from aiayn.training.recipe import load_recipe
from benchmarks import common


def run_results(run: Path) -> dict[str, Any]:
    """The quickstart's results.json beside RUN (its BLEU, steps, minutes), if any."""
    path = run.parent / "results.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return {key: data[key] for key in ("bleu", "steps", "minutes", "parameters") if key in data}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="an encoder-decoder `aiayn train --run` directory")
    parser.add_argument("--pairs", type=int, default=296, help="test pairs to align")
    parser.add_argument("--model1-pairs", type=int, default=20000, help="train pairs for Model 1")
    parser.add_argument("--samples", type=int, default=3, help="sentences kept in the file")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="alignment", help="results file name")
    parser.add_argument("--note", default="", help="how the run was trained, for the report")
    args = parser.parse_args()
    common.set_threads(args.threads)
    corpus = PreparedCorpus.load(load_recipe(args.run / "config.yaml").corpus)
    test = read_parallel(*corpus.files("test"))[: args.pairs]
    train = read_parallel(*corpus.files("train"))[: args.model1_pairs]
    translator = Translator.load(args.run, device="cpu")
    report = align_pairs(translator.model, translator.tokenizer, test, train)
    print(report.table(), end="")
    summary = report.to_dict()
    summary["sentences"] = summary["sentences"][: args.samples]
    cfg = translator.model.cfg
    path = common.write_json(
        args.name,
        {
            "args": {**vars(args), "run": str(args.run)},
            "note": args.note,
            "run": str(args.run),
            "model": {
                "n_decoder_layers": cfg.n_decoder_layers,
                "n_heads": cfg.n_heads,
                "d_model": cfg.d_model,
                "norm_first": cfg.norm_first,
            },
            "run_results": run_results(args.run),
            **summary,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
