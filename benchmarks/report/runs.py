"""The recorded training runs: the quickstart's seeds and packaged reference, the
valid-split sweeps and the training step's profile."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from aiayn.apps.quickstart import REFERENCE_DTYPE, recipe_digest
from benchmarks import report
from benchmarks.report import median_range, number, source, table

ValidGroup = tuple[str, tuple[str, ...]]  # (the recipe file's digest, its overrides)


def valid_runs(data: dict[str, Any]) -> dict[ValidGroup, list[dict[str, Any]]]:
    """The runs of a valid sweep, grouped by the recipe's version (its file's digest) and
    overrides; a run with no overrides is that version of the recipe itself."""
    groups: dict[ValidGroup, list[dict[str, Any]]] = {}
    for run in data["runs"]:
        key = (run.get("recipe_sha256") or "", tuple(run["overrides"]))
        groups.setdefault(key, []).append(run)
    return groups


def group_label(group: ValidGroup, versions: int) -> str:
    """'the recipe', or its overrides; with the version's digest where a sweep compares
    several versions of the recipe file."""
    digest, overrides = group
    label = "the recipe" if not overrides else ", ".join(f"`{o}`" for o in overrides)
    return f"{label}, version {digest[:8]}" if versions > 1 else label


def valid_bleu(run: dict[str, Any], beam: int, alpha: float) -> float | None:
    found = [s["bleu"] for s in run["searches"] if s["beam"] == beam and s["alpha"] == alpha]
    return found[0] if found else None


def median_span(values: list[float]) -> str:
    """'21.40' for one value, `median_range`'s '21.40 (20.95-22.10)' for several."""
    return f"{values[0]:.2f}" if len(values) == 1 else median_range(values)


def valid_variants(name: str = "valid-sweep") -> str:
    """Recipe variants against the recipe, on the valid split, at the quickstart's decoding."""
    data = report.load(name)
    groups = valid_runs(data)
    versions = len({digest for digest, _ in groups})
    lines = []
    for group, runs in sorted(groups.items(), key=lambda item: len(item[0][1])):
        lines.append(
            [
                group_label(group, versions),
                ", ".join(str(r["seed"]) for r in runs),
                f"{statistics.median(r['parameters'] for r in runs) / 1e6:.1f}M",
                f"{statistics.median(r['steps'] for r in runs):,.0f}",
                median_span([r["best_valid_loss"] for r in runs]),
                median_span([valid_bleu(r, 1, 0.0) for r in runs]),
                median_span([valid_bleu(r, 8, 1.0) for r in runs]),
            ]
        )
    headers = [
        "recipe",
        "seeds",
        "parameters",
        "updates",
        "best valid loss",
        "valid BLEU, greedy",
        "valid BLEU, beam 8 alpha 1",
    ]
    runs = data["runs"]
    notes = (
        f"Valid split ({runs[0]['sentences']} verses), the weights the quickstart scores: "
        f"{weights_label(runs[0]['weights_rule'])}; sacreBLEU {runs[0]['bleu_signature']}; "
        "median (range) over the seeds where there are several. "
        f"{runs[0]['minutes']:g} minutes of training each. " + data.get("note", "")
    )
    return "\n\n".join([table(headers, lines, left=2), notes, source(name, data, timed=False)])


def valid_searches(name: str = "valid-sweep", overrides: tuple[str, ...] = ()) -> str:
    """Valid BLEU under each beam and length penalty of the runs with `overrides` (none:
    the recipe's runs as the file's recipe version had it)."""
    data = report.load(name)
    runs = [run for run in data["runs"] if tuple(run["overrides"]) == overrides]
    searches = [(s["beam"], s["alpha"]) for s in runs[0]["searches"]] if runs else []
    lines = []
    for beam, alpha in searches:
        scores = [valid_bleu(r, beam, alpha) for r in runs]
        search = "greedy" if beam == 1 else f"beam {beam}, alpha {alpha:g}"
        mark = " (the quickstart's)" if (beam, alpha) == (8, 1.0) else ""
        lines.append(
            [search + mark, *[f"{v:.2f}" for v in scores], f"{statistics.median(scores):.2f}"]
        )
    headers = ["search", *[f"seed {r['seed']}" for r in runs], "median"]
    which = f"The runs with {', '.join(overrides)}" if overrides else "The recipe's runs"
    notes = f"{which} of the table above, valid split, the same weights."
    return "\n\n".join([table(headers, lines, left=1), notes, source(name, data, timed=False)])


# `benchmarks/record_quickstart.py` writes these; the release step (`benchmarks/release.py`)
# renders the packaged reference that `aiayn quickstart` prints next to its BLEU from them.
QUICKSTART_PREFIX = "quickstart-"


QuickstartKey = tuple[str, str, float, str, str, tuple[str, ...], Any, Any, str]


def weights_rule(run: dict[str, Any]) -> str:
    """The rule that picked a recorded run's weights (`aiayn.apps.quickstart.evaluated_weights`):
    its "weights_rule", or, in files written before that field, read from the weights
    path (RUN/checkpoints/best, average-last-K or step-N); "?" where neither says."""
    if run.get("weights_rule"):
        return run["weights_rule"]
    folder = Path(run.get("weights", "")).parent.name
    if folder == "best" or folder.startswith("average-last-"):
        return folder
    return "last" if folder.startswith("step-") else "?"


def quickstart_groups() -> dict[QuickstartKey, list[tuple[str, dict[str, Any]]]]:
    """The recorded quickstart runs by (recipe, recipe version, minutes, device kind,
    machine, overrides, beam, alpha, weights rule), as (name, data). The version is the
    recipe file's digest (`aiayn.apps.quickstart.recipe_digest`), "" where a run did not
    record one; beam and alpha are "?" where it did not record them."""
    groups: dict[QuickstartKey, list[tuple[str, dict[str, Any]]]] = {}
    for path in sorted(report.RESULTS.glob(f"{QUICKSTART_PREFIX}*.json")):
        data = report.load(path.stem)
        run = data["results"]
        key = (
            Path(run["recipe"]).name,
            run.get("recipe_sha256") or "",
            run["minutes"],
            run["device"].split(":")[0],
            data.get("machine", "machine not recorded"),
            tuple(run.get("overrides", [])),
            run.get("beam", "?"),
            run.get("alpha", "?"),
            weights_rule(run),
        )
        groups.setdefault(key, []).append((path.stem, data))

    def order(item):
        (name, digest, minutes, device, _, overrides, beam, alpha, rule) = item[0]
        current = digest != packaged_digest(name)
        return (current, overrides, name, digest, minutes, device, str(beam), str(alpha), rule)

    return dict(sorted(groups.items(), key=order))


def packaged_digest(name: str) -> str | None:
    """The packaged recipe NAME's version now (`aiayn.apps.quickstart.recipe_digest`: the
    first 12 hex digits of the file's SHA-256); None if no such recipe is packaged."""
    return recipe_digest(report.ROOT / "src" / "aiayn" / "config" / "recipes" / name)


def version_label(name: str, digest: str) -> str:
    """`1a2b3c4d (current)` for the packaged recipe's own version, `not recorded` without one."""
    if not digest:
        return "not recorded"
    return f"`{digest[:8]}`" + (" (current)" if digest == packaged_digest(name) else "")


WEIGHTS_LABELS = {"best": "best (valid loss)", "last": "last"}


def weights_label(rule: str) -> str:
    """ "best (valid loss)", "average of last 3", "last" or "?"."""
    if rule.startswith("average-last-"):
        return f"average of last {rule.removeprefix('average-last-')}"
    return WEIGHTS_LABELS.get(rule, rule)


def quickstart() -> str:
    """Per recipe, training minutes and scoring (beam, alpha, weights): test BLEU and
    chrF over seeds, and the budget."""
    groups = quickstart_groups()
    if not groups:
        return "No quickstart run is recorded yet (see `benchmarks/record_quickstart.py`)."
    rows, sources = [], []
    for key, recorded in groups.items():
        (recipe, digest, minutes, device, machine, overrides, beam, alpha, rule) = key
        runs = [data["results"] for _, data in recorded]
        speeds = [r["budget"]["tokens_per_s"] for r in runs if r.get("budget")]
        rows.append(
            [
                " ".join([recipe, *(f"`{o}`" for o in overrides)]),
                version_label(recipe, digest),
                f"{device} ({machine})" if machine else device,
                f"{minutes:g}",
                ", ".join(str(r["seed"]) for r in sorted(runs, key=lambda r: r["seed"])),
                str(beam),
                str(alpha),
                weights_label(rule),
                median_range([r["bleu"] for r in runs]),
                median_range([r["chrf"] for r in runs]),
                number(statistics.median(r["steps"] for r in runs)),
                f"{statistics.median(r['epochs'] for r in runs):.2f}",
                number(statistics.median(speeds)) if speeds else "not recorded",
            ]
        )
        sources += [source(name, data) for name, data in recorded]
    headers = ["recipe", "version", "device (machine)", "minutes", "seeds", "beam", "alpha"]
    headers += ["weights", "test BLEU median (range)", "chrF median (range)", "steps", "epochs"]
    headers += ["tok/s (src+tgt)"]
    return table(headers, rows, left=8) + "\n\n" + "\n\n".join(sources)


def quickstart_reference() -> dict[str, Any]:
    """The packaged reference: per recipe, minutes, device kind, machine, overrides and
    scoring (beam, alpha, weights rule), the seeds' BLEU and chrF (the quickstart prints
    their median and range next to its own, for a run scored the same way)."""
    references = []
    groups = quickstart_groups().items()
    for key, recorded in groups:
        (recipe, digest, minutes, device, machine, overrides, beam, alpha, rule) = key
        runs = sorted(
            ((data["results"], name) for name, data in recorded), key=lambda x: x[0]["seed"]
        )
        references.append(
            {
                "recipe": recipe,
                "recipe_sha256": digest or None,
                "minutes": minutes,
                "device": device,
                "machine": machine,
                "overrides": list(overrides),
                "beam": None if beam == "?" else beam,
                "alpha": None if alpha == "?" else alpha,
                "weights": None if rule == "?" else rule,
                "seeds": [r["seed"] for r, _ in runs],
                "bleu": [r["bleu"] for r, _ in runs],
                "chrf": [r["chrf"] for r, _ in runs],
                "decode_dtypes": [
                    r.get("decode_precision", {}).get("chosen", REFERENCE_DTYPE) for r, _ in runs
                ],  # the type each run's test set was decoded in (float32 before --dtype auto)
                "files": [f"benchmarks/results/{name}.json" for _, name in runs],
            }
        )
    note = "written by `python -m benchmarks.release` from benchmarks/results/quickstart-*.json"
    return {"note": note, "references": references}


def has_quickstart_runs() -> bool:
    return any(report.RESULTS.glob(f"{QUICKSTART_PREFIX}*.json"))


def train_profile(name: str = "train-profile") -> str:
    """Where a quickstart training step's time goes, by op kind, and the share of peak."""
    data = report.load(name)
    rows = [
        [kind["kind"], f"{kind['ms_per_step']:.2f}", f"{kind['percent']:.1f}%"]
        for kind in data["kinds"]
    ]
    rows.append(["**a step**", f"**{data['ms_per_step']:.2f}**", "100%"])
    text = table(["op kind", "ms per step", "share"], rows, left=1)
    peaks = "; ".join(
        f"{p['percent_reached']:.1f}% of the {dtype} peak ({number(p['gflops'])} GFLOP/s on "
        f"{'x'.join(map(str, p['shape']))}, {p['threads']} threads)"
        for dtype, p in data["peak"].items()
    )
    text += (
        f"\n\n{data['steps']} steps of `{data['recipe']}` ({data.get('precision', 'fp32')}) "
        f"after {data['warmup']} warm-up, "
        f"{number(data['tgt_tokens_per_step'])} target tokens a step: "
        f"{number(data['tgt_tokens_per_s'])} target tok/s, "
        f"{number(data['achieved_gflops'])} GFLOP/s of matrix products "
        f"({number(data['matmul_flops_per_step'] / 1e9)} GFLOP a step, `aiayn.training.budget`): {peaks}."
    )
    return text + "\n\n" + source(name, data)


HOST_MEMORY_SIDES = {
    "shipped": "as `aiayn train` runs",
    "glibc": "`AIAYN_HOST_MEMORY=glibc`",
    "defaults": "`AIAYN_HOST_MEMORY=default`",
}


def host_memory(name: str = "host-memory") -> str:
    """A long training run as shipped, with glibc's malloc tuned, and with the defaults
    (`benchmarks/bench_host_memory.py`): per process, minutes, memory and the rate's trace."""
    data = report.load(name)
    rows = []
    for side, record in data["sides"].items():
        for run in record["runs"]:
            trace = run["tgt_tokens_per_s_by_span"]
            rows.append(
                [
                    f"{side}: {HOST_MEMORY_SIDES.get(side, side)}",
                    run.get("host_memory") or "",
                    f"{run['train_minutes']:.2f}",
                    f"{run['peak_rss_gb']:.2f}",
                    f"{number(trace[0])} → {number(trace[-1])}",
                ]
            )
    text = table(
        [
            "side",
            "host memory (train.log)",
            "training minutes",
            "peak GB",
            "tgt tok/s, first → last span",
        ],
        rows,
        left=2,
    )
    speedups = "; ".join(
        f"{side} {ratio:.2f}x" for side, ratio in data["speedup_vs_defaults"].items()
    )
    text += (
        f"\n\n{data['steps']:,} updates of `{data['recipe']}` per process, one process at a time, "
        f"in the order {', '.join(data['order'])}. Updates per training minute against the "
        f"defaults (medians): {speedups}. The losses at the end were "
        f"{'identical on every side' if data['losses_identical'] else 'not identical'}."
    )
    return text + "\n\n" + source(name, data, needs_quiet=True)
