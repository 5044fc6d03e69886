"""Record the induction-head runs: the in-context loss over training, and the heads.

    aiayn train gpt-induction-attn-only-bible-en-cpu data.corpus=DIR --run runs/ind-attn
    aiayn train gpt-induction-bible-en-cpu data.corpus=DIR --run runs/ind-full
    python -m benchmarks.record_induction runs/ind-attn runs/ind-full --note "how they ran"
    python -m benchmarks.report --write

    aiayn prepare lm repeated data/repeated
    aiayn train gpt-induction-repeated-cpu --run runs/rep-s0      (and train.seed=1, 2)
    python -m benchmarks.record_induction runs/rep-s0 runs/rep-s1 runs/rep-s2 \
        --symbols --checkpoints --name induction-repeated --note "how they ran"

For each run it reads the validation records of metrics.jsonl (loss, and the `lm`
task's in-context loss: the late window's loss minus the early window's, Olsson et al.
2022), and scores the heads of its last checkpoint on repeated random tokens
(`aiayn.analysis.induction`: prefix matching, previous token, copying). It writes
`benchmarks/results/NAME.json` (default `induction`) and NAME.png: the in-context loss
against the update, one line per run.

With `--symbols` the test sequences are the word marker "▁" (what begins every line,
and so every block of a recipe with one line per block: `aiayn.data.repeated.
line_start_id`) then T symbols of the corpus's alphabet twice (`aiayn.data.repeated.
symbol_ids`: a corpus of `aiayn prepare lm repeated`), not every ordinary id. With `--checkpoints`
every step checkpoint of the run is scored too: the loss on the first and the
repeated half (`repeat_losses`) and the three grids, so the heads can be followed
through training; the phase change is the first checkpoint whose repeated half is
`PHASE_CHANGE_NATS` below its first half, and the figure gets a second panel (the best
layer-1 prefix-matching and layer-0 previous-token score). For the last checkpoint it
records the composition scores between layer 0 and 1 (`composition_scores`) and
ablations (`repeat_losses`): the best induction head, its best K-composition partner in
layer 0, both, and every layer-1 head scoring at least `INDUCTION_HEAD` on prefix
matching, each ablated two ways. Zero ablation sets the heads' output to 0; mean
ablation sets it to its mean over `REFERENCE_BATCH` other test sequences (seed + 1),
position by position. Issue 50's ablation goal is judged on mean ablation (`GOAL_ABLATION`):
zeroing a head also takes away its average output, which the first half's predictions
use whatever the sequence, so the first half rises for a reason that is not induction
(Wang et al. 2022 mean-ablate for this reason).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from aiayn.analysis.induction import (
    composition_scores,
    copying_scores,
    induction_scores,
    previous_token_scores,
    repeat_losses,
    repeated_random_tokens,
)
from aiayn.data.repeated import line_start_id, symbol_ids
from aiayn.data.tokenizer import TOKENIZER_FILE, SentencePieceTokenizer
from aiayn.io.checkpoint import (
    WEIGHTS_FILE,
    load_model,
    resolve_weights,
    step_checkpoints,
    step_of,
)
from aiayn.training.metrics import validation_records
from benchmarks import common

PHASE_CHANGE_NATS = 1.0  # the repeated half this far below the first: induction works
INDUCTION_HEAD = 0.3  # a layer-1 head with this prefix-matching score counts as one
REFERENCE_BATCH = 64  # test sequences whose mean output a mean-ablated head gives
ABLATIONS = ("zero", "mean")
GOAL_ABLATION = "mean"  # the ablation issue 50's goal is judged on (see the docstring)


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


def test_ids(
    cfg, tokenizer: SentencePieceTokenizer, length: int, batch: int, seed: int, symbols: bool
) -> torch.Tensor:
    """The repeated random tokens the heads are scored on: bos and every ordinary id, or
    with `symbols` the line's word marker and the corpus alphabet's ids."""
    if symbols:
        ordinary = set(symbol_ids(tokenizer))
        if not ordinary:
            raise SystemExit(f"{tokenizer.path}: no single-symbol pieces (not a repeated corpus)")
        specials = [i for i in range(cfg.vocab_size) if i not in ordinary]
        start = line_start_id(tokenizer)
        return repeated_random_tokens(cfg.vocab_size, length, batch, seed, specials, start)
    specials = [cfg.pad_id, cfg.bos_id, cfg.eos_id, getattr(tokenizer, "unk_id", cfg.pad_id)]
    return repeated_random_tokens(cfg.vocab_size, length, batch, seed, specials, cfg.bos_id)


def _grid(scores: torch.Tensor) -> list[list[float]]:
    return [[round(float(v), 4) for v in row] for row in scores]


def score_checkpoint(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, Any]:
    """Losses on both halves and the three grids of one model."""
    first, repeated = repeat_losses(model, ids)
    return {
        "first_half": round(first, 4),
        "repeated_half": round(repeated, 4),
        "induction": _grid(induction_scores(model, ids)),
        "previous_token": _grid(previous_token_scores(model, ids)),
        "copying": _grid(copying_scores(model)),
    }


def phase_change(checkpoints: list[dict[str, Any]]) -> int | None:
    """The first checkpoint's step whose repeated half is PHASE_CHANGE_NATS below its first."""
    for point in checkpoints:
        if point["first_half"] - point["repeated_half"] >= PHASE_CHANGE_NATS:
            return point["step"]
    return None


def circuit(model: torch.nn.Module, ids: torch.Tensor, reference: torch.Tensor) -> dict[str, Any]:
    """Composition scores between layers 0 and 1, and the losses with heads ablated, zeroed
    and replaced by their mean over the `reference` sequences (as long as `ids`)."""
    induction = induction_scores(model, ids)
    composition = composition_scores(model)
    head = int(induction[1].nan_to_num(-1.0).argmax())
    partner = int(composition.k[:, head].argmax())
    pair_k = float(composition.k[partner, head])
    strong = [(1, h) for h in range(induction.size(1)) if induction[1, h] >= INDUCTION_HEAD]
    base_first, base_repeated = repeat_losses(model, ids)
    ablations = []
    for name, heads in [
        ("induction head", [(1, head)]),
        ("previous-token partner", [(0, partner)]),
        ("both", [(1, head), (0, partner)]),
        (f"every layer-1 head with prefix matching >= {INDUCTION_HEAD}", strong),
    ]:
        entry: dict[str, Any] = {"ablated": name, "heads": [list(h) for h in heads]}
        for how in ABLATIONS:
            first, repeated = repeat_losses(
                model, ids, ablate=heads, reference=reference if how == "mean" else None
            )
            entry[how] = {
                "first_half": round(first, 4),
                "repeated_half": round(repeated, 4),
                "first_half_rise": round(first - base_first, 4),
                "repeated_half_rise": round(repeated - base_repeated, 4),
            }
        ablations.append(entry)
    return {
        "induction_head": [1, head],
        "previous_token_partner": [0, partner],
        # the named pair's K-composition, and whether no other pair of heads scores higher
        "pair_k_composition": round(pair_k, 4),
        "pair_k_composition_highest": pair_k >= float(composition.k.max()),
        "reference": {"batch": len(reference), "seed": "the test sequences' seed + 1"},
        "composition": {name: _grid(getattr(composition, name)) for name in ("q", "k", "v")},
        "first_half": round(base_first, 4),
        "repeated_half": round(base_repeated, 4),
        "ablations": ablations,
    }


def record_run(
    run: Path, length: int, batch: int, seed: int, symbols: bool = False, checkpoints: bool = False
) -> dict[str, Any]:
    weights = resolve_weights(run)
    model = load_model(weights, device="cpu").eval()
    tokenizer = SentencePieceTokenizer.load(run / TOKENIZER_FILE)
    cfg = model.cfg
    ids = test_ids(cfg, tokenizer, length, batch, seed, symbols)
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
    record = {
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
        "induction": _grid(induction),
        "previous_token": _grid(previous),
        "copying": _grid(copying),
        "top_induction": top_heads(induction),
    }
    if checkpoints:
        points = []
        for directory in step_checkpoints(run):
            scored = score_checkpoint(load_model(directory / WEIGHTS_FILE, device="cpu"), ids)
            points.append({"step": step_of(directory), **scored})
        record["checkpoints"] = points
        record["phase_change_step"] = phase_change(points)
        reference = test_ids(cfg, tokenizer, length, REFERENCE_BATCH, seed + 1, symbols)
        record["circuit"] = circuit(model, ids, reference)
        # as `aiayn induction RUN` scores it: bos, then every ordinary id of the vocabulary
        cli_ids = test_ids(cfg, tokenizer, length, batch, seed, symbols=False)
        record["aiayn_induction"] = {
            "induction": _grid(induction_scores(model, cli_ids)),
            "previous_token": _grid(previous_token_scores(model, cli_ids)),
        }
    return record


def goals(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 50's goals, per seed: the phase change; a layer-1 head with prefix matching
    and copying >= 0.5 and a layer-0 head with previous token >= 0.5 (scored as
    `aiayn induction` does); ablating the named induction head raises the repeated half
    by >= 1 nat per token and the first half by < 0.1 (judged on `GOAL_ABLATION`, both
    recorded); and, as the issue asks, the named pair highest on K-composition."""
    per_seed = []
    for run in runs:
        scored = run["aiayn_induction"]
        best_copying_head = max(
            (min(m, c), h)
            for h, (m, c) in enumerate(zip(scored["induction"][1], run["copying"][1], strict=True))
        )
        # the named induction head (the goal's), its previous-token partner, and every
        # layer-1 head scoring INDUCTION_HEAD (`circuit`'s order), for comparison
        ablation, partner, _both, strong = run["circuit"]["ablations"]
        rises = {}
        for how in ABLATIONS:
            for key, entry in (("ablation", ablation), ("partner", partner), ("all", strong)):
                rises[f"{how}_{key}_repeated_rise"] = entry[how]["repeated_half_rise"]
                rises[f"{how}_{key}_first_rise"] = entry[how]["first_half_rise"]
        per_seed.append(
            {
                "seed": run.get("seed"),
                "phase_change_step": run["phase_change_step"],
                "layer1_head_prefix_and_copying": round(best_copying_head[0], 4),
                "layer0_previous_token": round(max(scored["previous_token"][0]), 4),
                "induction_head": run["circuit"]["induction_head"],
                "previous_token_partner": run["circuit"]["previous_token_partner"],
                "pair_k_composition": run["circuit"]["pair_k_composition"],
                "pair_k_composition_highest": run["circuit"]["pair_k_composition_highest"],
                # the goal's ablation, then both kinds for the head, its partner and
                # every layer-1 head scoring INDUCTION_HEAD (`circuit`'s order)
                "ablation_repeated_rise": rises[f"{GOAL_ABLATION}_ablation_repeated_rise"],
                "ablation_first_rise": rises[f"{GOAL_ABLATION}_ablation_first_rise"],
                **rises,
                "induction_heads": len(strong["heads"]),
            }
        )
    return {
        "ablation": GOAL_ABLATION,
        "per_seed": per_seed,
        "phase_change_every_seed": all(s["phase_change_step"] is not None for s in per_seed),
        "heads_every_seed": all(
            s["layer1_head_prefix_and_copying"] >= 0.5 and s["layer0_previous_token"] >= 0.5
            for s in per_seed
        ),
        "ablation_every_seed": all(
            s["ablation_repeated_rise"] >= 1.0 and s["ablation_first_rise"] < 0.1 for s in per_seed
        ),
        "pair_k_composition_every_seed": all(s["pair_k_composition_highest"] for s in per_seed),
    }


def _label(run: dict[str, Any]) -> str:
    if "seed" in run:
        return f"seed {run['seed']}"
    return "attention-only" if run["model"]["d_ff"] == 0 else "with FFN"


def plot_curves(runs: list[dict[str, Any]], path: Path, title: str) -> None:
    """The in-context loss against the update, one line per run; with checkpoints scored,
    a second panel with the best layer-1 prefix-matching and layer-0 previous-token
    scores, and the phase change of each run as a dotted line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = [run for run in runs if run.get("checkpoints")]
    figure, axes = plt.subplots(1, 2 if scored else 1, figsize=(12 if scored else 7, 4))
    axes = list(axes) if scored else [axes]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(runs):
        colour = colours[i % len(colours)]
        steps = [r["step"] for r in run["curve"]]
        axes[0].plot(
            steps, [r["in_context_loss"] for r in run["curve"]], marker=".", color=colour,
            label=_label(run),
        )  # fmt: skip
        if run.get("phase_change_step") is not None:
            for axis in axes:
                axis.axvline(run["phase_change_step"], color=colour, linestyle=":", linewidth=1)
    axes[0].axhline(0, color="grey", linewidth=0.5)
    axes[0].set_xlabel("update")
    axes[0].set_ylabel("in-context loss (late - early), nats")
    axes[0].set_title(title)
    axes[0].legend()
    if scored:
        for run in scored:
            colour = colours[runs.index(run) % len(colours)]
            steps = [c["step"] for c in run["checkpoints"]]
            best = [max(c["induction"][1]) for c in run["checkpoints"]]
            previous = [max(c["previous_token"][0]) for c in run["checkpoints"]]
            axes[1].plot(steps, best, color=colour, label=f"{_label(run)}: layer-1 prefix matching")
            axes[1].plot(
                steps, previous, color=colour, linestyle="--",
                label=f"{_label(run)}: layer-0 previous token",
            )  # fmt: skip
        axes[1].set_ylim(0, 1)
        axes[1].set_xlabel("update")
        axes[1].set_ylabel("best head's score")
        axes[1].set_title("the heads (dotted: phase change)")
        axes[1].legend(fontsize=7)
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
    parser.add_argument(
        "--symbols", action="store_true", help="test on the alphabet of a repeated corpus"
    )
    parser.add_argument(
        "--checkpoints", action="store_true", help="score every step checkpoint, and ablate"
    )
    parser.add_argument(
        "--title", default="2-layer GPTs on the English Bible: in-context loss over training"
    )
    args = parser.parse_args()
    common.set_threads(args.threads)
    runs = []
    for run in args.runs:
        record = record_run(run, args.length, args.batch, args.seed, args.symbols, args.checkpoints)
        if args.checkpoints:
            record = {"seed": run_seed(run), **record, **training_time(run)}
        runs.append(record)
    path = common.write_json(
        args.name,
        {
            "args": {**vars(args), "runs": [str(r) for r in args.runs]},
            "measures": [
                {
                    "system": args.title,
                    "cell": f"{len(runs)} runs ({', '.join(_label(r) for r in runs)}), "
                    f"test sequences of {args.length}"
                    + (", every checkpoint, composition and ablations" if args.checkpoints else ""),
                    "harness": "record_induction",
                }
            ],
            "note": args.note,
            "runs": runs,
            **({"goals": goals(runs)} if args.checkpoints else {}),
        },
    )
    plot_curves(runs, path.with_suffix(".png"), args.title)
    print(f"wrote {path} and {path.with_suffix('.png')}")


def run_seed(run: Path) -> int:
    """train.seed of the run's config.yaml."""
    from aiayn.training.recipe import load_recipe

    return load_recipe(run / "config.yaml").train.seed


def training_time(run: Path) -> dict[str, Any]:
    """The updates and training seconds (train_minutes) of the last "train" record of
    metrics.jsonl."""
    import json

    last: dict[str, Any] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("kind") == "train":
            last = record
    minutes = last.get("train_minutes")
    return {
        "updates": last.get("step"),
        "train_seconds": None if minutes is None else round(60 * minutes, 1),
    }


if __name__ == "__main__":
    main()
