"""Pruning curves: test BLEU against the share of heads pruned, by importance and at random.

    python -m benchmarks.bench_pruning RUN [--fractions 0.25,0.5,0.75]

RUN is a trained run (the quickstart's `RUN/run`, or any `aiayn train --run`), with
`aiayn heads RUN` already run (its `heads/heads.json` gives the importance order).
For each kind of attention (encoder self-, decoder self-, encoder-decoder) on its
own, the given fractions of that kind's heads are removed (`aiayn.analysis.pruning`, never a
sub-layer's last head), in increasing order of importance and in a random order
(`--seeds` of them), and the pruned model translates the run's test split (beam 4,
alpha 0.6, as the quickstart scores it). Reported: sacreBLEU, and decoding speed
as target tokens per second of the whole test split (one thread count for all).

Writes `benchmarks/results/pruning.json` and `benchmarks/results/pruning.png`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from aiayn.config import SUBLAYER_KINDS as KINDS
from benchmarks import common

TITLES = {
    "encoder.self": "encoder self-attention",
    "decoder.self": "decoder self-attention",
    "decoder.cross": "encoder-decoder attention",
}


def test_pairs(run: Path, limit: int | None) -> list[tuple[str, str]]:
    from aiayn.data.corpus import PreparedCorpus
    from aiayn.training.recipe import load_recipe

    pairs = PreparedCorpus.load(load_recipe(run / "config.yaml").corpus).read("test")
    return pairs[:limit] if limit else pairs


def score(model, tokenizer, pairs, beam: int) -> tuple[float, float]:
    """(BLEU, target tokens per second) of `model` translating `pairs`."""
    from aiayn.apps.translate import Translator
    from aiayn.training.evaluate import score as bleu

    translator = Translator(model, tokenizer)
    start = time.perf_counter()
    outputs = translator.translate([s for s, _ in pairs], beam=beam, alpha=0.6)
    seconds = time.perf_counter() - start
    tokens = sum(len(ids) for ids in tokenizer.encode_batch(outputs)) + len(outputs)
    return bleu(outputs, [t for _, t in pairs]).bleu, tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--scores", type=Path, help="default: RUN/heads/heads.json")
    parser.add_argument("--measure", default="ablation", help="ablation or gradient")
    parser.add_argument("--fractions", default="0.25,0.5,0.75")
    parser.add_argument("--seeds", type=int, default=2, help="random orders per point")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--pairs", type=int, help="only the first N test pairs")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from aiayn.analysis.pruning import (
        heads_by_fraction,
        prune_heads,
        random_heads,
        read_head_scores,
    )
    from aiayn.apps.translate import Translator

    torch.set_num_threads(args.threads)
    base = Translator.load(args.run)
    model, tokenizer = base.model, base.tokenizer
    scores = read_head_scores(args.scores or args.run / "heads" / "heads.json", args.measure)
    pairs = test_pairs(args.run, args.pairs)
    fractions = [float(f) for f in args.fractions.split(",")]

    full_bleu, full_speed = score(model, tokenizer, pairs, args.beam)
    print(f"unpruned: BLEU {full_bleu:.2f}, {full_speed:,.0f} tgt tok/s", flush=True)
    records = [dict(kind=None, order=None, fraction=0.0, bleu=full_bleu, tok_s=full_speed)]
    for kind in KINDS:
        for fraction in fractions:
            choices = [("importance", heads_by_fraction(scores, fraction, [kind]))]
            choices += [
                (f"random-{seed}", random_heads(model, fraction, seed, [kind]))
                for seed in range(args.seeds)
            ]
            for order, heads in choices:
                pruned = prune_heads(model, heads)
                bleu, speed = score(pruned, tokenizer, pairs, args.beam)
                removed = sum(len(h) for h in heads.values())
                records.append(
                    dict(
                        kind=kind,
                        order=order,
                        fraction=fraction,
                        heads_removed=removed,
                        parameters=pruned.num_parameters(),
                        bleu=bleu,
                        tok_s=speed,
                    )
                )
                print(
                    f"{kind} {order} {fraction:.2f} ({removed} heads): BLEU {bleu:.2f}, "
                    f"{speed:,.0f} tgt tok/s",
                    flush=True,
                )

    rows = []
    for kind in KINDS:
        for fraction in fractions:
            here = [r for r in records if r["kind"] == kind and r["fraction"] == fraction]
            best = next(r for r in here if r["order"] == "importance")
            random_bleu = [r["bleu"] for r in here if r["order"].startswith("random")]
            rows.append(
                [
                    TITLES[kind],
                    f"{fraction:.0%}",
                    best["heads_removed"],
                    f"{best['bleu']:.2f}",
                    f"{sum(random_bleu) / len(random_bleu):.2f}",
                    f"{best['tok_s']:,.0f}",
                ]
            )
    headers = ["attention", "pruned", "heads", "BLEU, least important first", "BLEU, random"]
    print(f"\nunpruned: BLEU {full_bleu:.2f}, {full_speed:,.0f} tgt tok/s\n")
    print(common.table([*headers, "tgt tok/s"], rows))
    path = common.write_json(
        "pruning",
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "test_pairs": len(pairs),
            "results": records,
        },
    )
    plot(records, fractions, full_bleu, path.with_suffix(".png"))
    print(f"\nwritten {path} and {path.with_suffix('.png')}")


def plot(records: list[dict], fractions: list[float], full_bleu: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(KINDS), figsize=(12, 3.6), sharey=True)
    xs = [0.0, *fractions]
    for ax, kind in zip(axes, KINDS, strict=True):
        here = [r for r in records if r["kind"] == kind]
        best = [full_bleu] + [
            next(r["bleu"] for r in here if r["fraction"] == f and r["order"] == "importance")
            for f in fractions
        ]
        rand = [full_bleu] + [
            sum(r["bleu"] for r in here if r["fraction"] == f and r["order"] != "importance")
            / max(1, sum(1 for r in here if r["fraction"] == f and r["order"] != "importance"))
            for f in fractions
        ]
        ax.plot(xs, best, "o-", label="least important first")
        ax.plot(xs, rand, "s--", label="random order")
        ax.set_title(TITLES[kind])
        ax.set_xlabel("share of its heads pruned")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test BLEU")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main()
