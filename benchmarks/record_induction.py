"""Record the induction-head runs: the in-context loss over training, and the final heads.

    aiayn train gpt-induction-attn-only-bible-en-cpu data.corpus=DIR --run runs/ind-attn
    aiayn train gpt-induction-bible-en-cpu data.corpus=DIR --run runs/ind-full
    python -m benchmarks.record_induction runs/ind-attn runs/ind-full --note "how they ran"
    python -m benchmarks.report --write

For each run it reads the validation records of metrics.jsonl (loss, and the `lm`
task's in-context loss: the late window's loss minus the early window's, Olsson et al.
2022), and scores the heads of its last checkpoint on repeated random tokens
(`aiayn.analysis.induction`: prefix matching, previous token, copying). It writes
`benchmarks/results/NAME.json` (default `induction`) and NAME.png: the in-context loss
against the update, one line per run.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from aiayn.analysis.induction import (
    copying_scores,
    induction_scores,
    previous_token_scores,
    repeated_random_tokens,
)
from aiayn.data.tokenizer import TOKENIZER_FILE, SentencePieceTokenizer
from aiayn.io.checkpoint import load_model, resolve_weights
from aiayn.training.metrics import validation_records
from benchmarks import common


def validation_curve(run: Path) -> list[dict[str, Any]]:
    """The run's validation records in order: step, loss and the in-context losses.

    Raises:
        SystemExit: no metrics.jsonl, or no validation with an in-context loss in it.
    """
    records = validation_records(run)
    if records is None:
        raise SystemExit(f"{run}: no metrics.jsonl (not a training run directory)")
    curve = [
        {
            "step": r["step"],
            "loss": round(r["loss"], 4),
            "in_context_loss": round(r["in_context_loss"], 4),
            "early_loss": round(r["early_loss"], 4),
            "late_loss": round(r["late_loss"], 4),
        }
        for r in records
        if "in_context_loss" in r
    ]
    if not curve:
        raise SystemExit(f"{run}: no validation with an in-context loss (an lm run?)")
    return curve


def top_heads(scores: torch.Tensor, k: int = 3) -> list[dict[str, Any]]:
    """The k highest (layer, head, score) of a layers x heads grid, NaN left out."""
    flat = torch.nan_to_num(scores, nan=float("-inf")).flatten()
    best = flat.topk(min(k, flat.numel()))
    heads = scores.size(1)
    return [
        {"layer": int(i) // heads, "head": int(i) % heads, "score": round(float(v), 4)}
        for v, i in zip(best.values, best.indices, strict=True)
    ]


def record_run(run: Path, length: int, batch: int, seed: int) -> dict[str, Any]:
    weights = resolve_weights(run)
    model = load_model(weights, device="cpu").eval()
    tokenizer = SentencePieceTokenizer.load(run / TOKENIZER_FILE)
    cfg = model.cfg
    specials = [cfg.pad_id, cfg.bos_id, cfg.eos_id, getattr(tokenizer, "unk_id", cfg.pad_id)]
    ids = repeated_random_tokens(cfg.vocab_size, length, batch, seed, specials, cfg.bos_id)
    induction = induction_scores(model, ids)
    previous = previous_token_scores(model, ids)
    copying = copying_scores(model)
    curve = validation_curve(run)
    print(
        f"{run.name}: {len(curve)} validations, in-context loss {curve[0]['in_context_loss']:+.3f} "
        f"-> {curve[-1]['in_context_loss']:+.3f}; best induction head "
        f"{top_heads(induction, 1)[0]}",
        flush=True,
    )
    return {
        "run": str(run),
        "weights": str(weights),
        "model": {
            "n_layers": cfg.n_decoder_layers,
            "n_heads": cfg.n_heads,
            "d_model": cfg.d_model,
            "d_ff": cfg.d_ff,
            "max_len": cfg.max_len,
        },
        "curve": curve,
        "induction": [[round(float(v), 4) for v in row] for row in induction],
        "previous_token": [[round(float(v), 4) for v in row] for row in previous],
        "copying": [[round(float(v), 4) for v in row] for row in copying],
        "top_induction": top_heads(induction),
    }


def plot_curves(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for run in runs:
        label = "attention-only" if run["model"]["d_ff"] == 0 else "with FFN"
        steps = [r["step"] for r in run["curve"]]
        axis.plot(steps, [r["in_context_loss"] for r in run["curve"]], marker=".", label=label)
    axis.axhline(0, color="grey", linewidth=0.5)
    axis.set_xlabel("update")
    axis.set_ylabel("in-context loss (late - early), nats")
    axis.set_title("2-layer GPTs on the English Bible: in-context loss over training")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="`aiayn train --run` directories")
    parser.add_argument("--length", type=int, default=50, help="repeated random tokens")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="induction", help="results file name")
    parser.add_argument("--note", default="", help="how the runs were trained, for the report")
    args = parser.parse_args()
    common.set_threads(args.threads)
    runs = [record_run(run, args.length, args.batch, args.seed) for run in args.runs]
    path = common.write_json(
        args.name,
        {
            "args": {**vars(args), "runs": [str(r) for r in args.runs]},
            "note": args.note,
            "runs": runs,
        },
    )
    plot_curves(runs, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")


if __name__ == "__main__":
    main()
