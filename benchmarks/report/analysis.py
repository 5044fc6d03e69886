"""The tables of what a model learns and what it costs to look: positions, pruning,
the model shapes, induction heads, alignment, export and the hook points."""

from __future__ import annotations

import statistics

from benchmarks import report
from benchmarks.report import number, source, table

SCHEMES = {"sinusoidal": "sinusoidal (the paper)", "relative": "relative (T5 bias)"}


def positions_extrapolation() -> str:
    data = report.load("positions")["extrapolation"]
    rows = []
    for r in data["results"]:
        exact, agree = r["exact_match"], r["token_agreement"]
        rows.append(
            [SCHEMES.get(r["scheme"], r["scheme"])]
            + [f"{exact[k]:.1f}%" for k in ("in", "64", "128")]
            + [f"{agree[k]:.1f}%" for k in ("in", "64", "128")]
        )
    headers = ["scheme", "exact, 1-32", "exact, 64", "exact, 128"]
    headers += ["agreement, 1-32", "agreement, 64", "agreement, 128"]
    line = source("positions", data, record="extrapolation")
    return table(headers, rows, left=1) + "\n\n" + line


def positions_bible() -> str:
    data = report.load("positions")["bible"]
    best = max(r["bleu"] for r in data["results"])
    rows = []
    for r in data["results"]:
        bold = "**{}**" if r["bleu"] == best else "{}"
        rows.append(
            [
                SCHEMES.get(r["scheme"], r["scheme"]),
                bold.format(f"{r['bleu']:.2f}"),
                bold.format(f"{r['chrf']:.2f}"),
                f"{r['steps']:,}",
                f"{r['epochs']:.2f}",
            ]
        )
    headers = ["scheme", "test BLEU", "chrF", "steps in 15 min", "epochs"]
    line = source("positions", data, record="bible")
    return table(headers, rows, left=1) + "\n\n" + line


PRUNED_KINDS = {"encoder.self": "encoder self", "decoder.self": "decoder self"}


PRUNED_KINDS["decoder.cross"] = "encoder-decoder"


def pruning() -> str:
    data = report.load("pruning")
    results = data["results"]
    (unpruned,) = [r for r in results if r["kind"] is None]
    heads = {round(r["heads_removed"] / r["fraction"]) for r in results if r["kind"]}
    (total,) = heads
    bleu = f"{unpruned['bleu']:.2f}"
    rows = [["(none)", f"0 of {total}", bleu, bleu]]
    for kind, label in PRUNED_KINDS.items():
        for fraction in sorted({r["fraction"] for r in results if r["kind"] == kind}):
            same = [r for r in results if r["kind"] == kind and r["fraction"] == fraction]
            (ranked,) = [r for r in same if r["order"] == "importance"]
            random = statistics.mean(r["bleu"] for r in same if r["order"].startswith("random"))
            rows.append(
                [
                    label,
                    f"{ranked['heads_removed']} of {total}",
                    f"{ranked['bleu']:.2f}",
                    f"{random:.2f}",
                ]
            )
    headers = ["attention", "pruned", "BLEU, least important first", "BLEU, random order"]
    return table(headers, rows) + "\n\n" + source("pruning", data)


SHAPE_FILES = ("shapes", "shapes-prefix-lm")  # bench_shapes.py --name: runs added later


SHAPE_NAMES = {
    "encdec": ("encoder-decoder (the paper)", "`bible-en-es-cpu`"),
    "gpt-translate": ("decoder-only translator", "`gpt-translate-bible-en-es-cpu`"),
    "prefix-lm": ("prefix-LM translator", "`prefix-lm-translate-bible-en-es-cpu`"),
    "gpt": ("GPT (decoder-only LM)", "`gpt-bible-en-cpu`"),
    "bert": ("BERT (encoder-only MLM)", "`bert-bible-en-cpu`"),
    "bert-prenorm": ("BERT, pre-norm", "`bert-bible-en-cpu` `model.norm_first=true`"),
}


def shapes() -> str:
    """bench_shapes.py: one row per model shape, each trained with its recipe; the runs of
    the files in `SHAPE_FILES` after shapes.json's own (each file keeps its provenance)."""
    files = {
        name: report.load(name)
        for name in SHAPE_FILES
        if (report.RESULTS / f"{name}.json").exists()
    }
    runs = {r["shape"]: r for data in files.values() for r in data["runs"]}
    rows = []
    for key, (label, recipe) in SHAPE_NAMES.items():
        if key not in runs:
            continue
        r, test = runs[key], runs[key]["test"]
        if "greedy_bleu" in test:
            score = f"{test['greedy_bleu']:.2f} BLEU (greedy, en→es)"
        elif "masked_accuracy" in test:
            score = f"masked-token accuracy {100 * test['masked_accuracy']:.1f}%"
        else:
            score = f"perplexity {test['ppl']:.1f}"
        rows.append(
            [
                label,
                recipe,
                f"{r['parameters']:,}",
                f"{r['steps']:,}",
                f"{r['epochs']:.2f}",
                f"{number(r['tokens_per_s'])} ({number(r['target_tokens_per_s'])})",
                score,
            ]
        )
    headers = ["shape", "recipe", "parameters", "updates", "epochs"]
    headers += ["training tokens/s (target tokens/s)", "test"]
    notes = [
        f"Conditions of `{name}.json`: {data['conditions']}.\n\n" + source(name, data)
        for name, data in files.items()
    ]
    return table(headers, rows) + "\n\n" + "\n\n".join(notes)


def induction() -> str:
    """The induction-head runs: in-context loss over training and the final best heads."""
    data = report.load("induction")
    lines = []
    for run in data["runs"]:
        curve, model = run["curve"], run["model"]
        lowest = min(curve, key=lambda r: r["in_context_loss"])
        heads = ", ".join(
            f"L{h['layer']}H{h['head']} {h['score']:.2f}" for h in run["top_induction"]
        )
        lines.append(
            [
                "attention-only" if model["d_ff"] == 0 else f"with FFN (d_ff {model['d_ff']})",
                f"{curve[-1]['step']:,}",
                f"{curve[-1]['loss']:.2f}",
                f"{curve[0]['in_context_loss']:+.2f} (update {curve[0]['step']:,})",
                f"{lowest['in_context_loss']:+.2f} (update {lowest['step']:,})",
                f"{curve[-1]['in_context_loss']:+.2f}",
                heads,
            ]
        )
    headers = [
        "model",
        "updates",
        "valid loss",
        "in-context loss, first",
        "lowest",
        "last",
        "best induction heads (prefix matching)",
    ]
    first = data["runs"][0]["model"]
    notes = (
        f"2 layers, d_model {first['d_model']}, {first['n_heads']} heads, blocks of "
        f"{first['max_len']} tokens. In-context loss: the validation loss in the block's last "
        "tenth minus around its first tenth (nats; below 0: later tokens are predicted "
        "better, from the context). Prefix matching: on repeated random tokens, a head's "
        "attention from a token of the second repeat to the token after its first "
        "occurrence (1 is a perfect induction head). "
        + data.get("note", "")
        + " The curve: `benchmarks/results/induction.png`."
    )
    return "\n\n".join(
        [table(headers, lines, left=1), notes, source("induction", data, timed=False)]
    )


# Issue 50's goals for the induction recipe, as record_induction.goals judges them per seed.
INDUCTION_GOALS = {
    "phase_change_every_seed": "the phase change (repeated half 1 nat below the first)",
    "heads_every_seed": "a layer-1 head with prefix matching and copying >= 0.5, and a "
    "layer-0 head with previous token >= 0.5",
    "ablation_every_seed": "mean-ablating the named induction head raises the repeated half "
    "by >= 1 nat and the first half by < 0.1",
    "pair_k_composition_every_seed": "the named pair (induction head, previous-token partner) "
    "the highest on K-composition",
}


def induction_repeated(name: str = "induction-repeated") -> str:
    """The induction recipe's seeds against issue 50's goals (`record_induction.goals`);
    for a file of runs with several shapes (attempts at other settings), a column of
    heads and their size, and no verdict over them all."""
    data = report.load(name)
    goals = data["goals"]
    shapes = [(run["model"]["n_heads"], run["model"]["d_model"]) for run in data["runs"]]
    several = len(set(shapes)) > 1
    rows = []
    for run, seed, (heads, d_model) in zip(data["runs"], goals["per_seed"], shapes, strict=True):
        phase = seed["phase_change_step"]
        rows.append(
            [f"{heads} × {d_model // heads}"] * several
            + [
                str(seed["seed"]),
                f"{run['checkpoints'][-1]['step']:,}",
                f"{run['train_seconds'] / 60:.1f}",
                f"{phase:,}" if phase is not None else "none",
                f"{seed['layer1_head_prefix_and_copying']:.2f}",
                f"{seed['layer0_previous_token']:.2f}",
                _pair(seed),
                _rises(seed, "mean_ablation"),
                _rises(seed, "zero_ablation"),
                _rises(seed, "mean_partner"),
                f"{_rises(seed, 'mean_all')} ({seed['induction_heads']})",
            ]
        )
    headers = ["heads × size"] * several + [
        "seed",
        "updates",
        "training minutes",
        "phase change at update",
        "layer 1: min(prefix matching, copying)",
        "layer 0: previous token",
        "induction head ← partner: K-composition",
        "mean-ablate the induction head: repeated / first half (nats)",
        "zero it",
        "mean-ablate its partner",
        "mean-ablate every layer-1 induction head (how many)",
    ]
    seeds = len(goals["per_seed"])
    verdicts = [] if several else [
        f"- {what}, in every seed ({seeds}): **{'met' if goals[key] else 'not met'}**"
        for key, what in INDUCTION_GOALS.items()
    ]  # fmt: skip
    notes = (
        "Scores on repeated random symbols as `aiayn induction` gives them for the last "
        "checkpoint. The named induction head is the best layer-1 prefix-matching head; its "
        "previous-token partner is the layer-0 head that K-composes with it most (✓: no other "
        "pair scores higher). Ablations (the rise of each half's loss): mean ablation, the "
        "goal's, replaces a head's output by its mean over 64 other test sequences, position "
        "by position; zero ablation sets it to 0, which also takes away the average output "
        "that the first half's predictions use. An induction head scores prefix matching "
        ">= 0.3. " + data.get("note", "")
    )
    return "\n\n".join(
        [table(headers, rows, left=1 + several)]
        + (["\n".join(verdicts)] if verdicts else [])
        + [notes, source(name, data, timed=False)]
    )


def _rises(seed: dict, key: str) -> str:
    """ "repeated / first" rise of one ablation of a per-seed record, in nats."""
    return f"{seed[f'{key}_repeated_rise']:+.2f} / {seed[f'{key}_first_rise']:+.2f}"


def _pair(seed: dict) -> str:
    """The named pair, "L1H0 ← L0H1 0.32 ✓" (✓: the highest K-composition of any pair)."""
    (_, head), (_, partner) = seed["induction_head"], seed["previous_token_partner"]
    mark = " ✓" if seed["pair_k_composition_highest"] else ""
    return f"L1H{head} ← L0H{partner} {seed['pair_k_composition']:.2f}{mark}"


# What each variant of `benchmarks.induction_causes --recipe repeated` changes.
REPEATED_CAUSES = {
    "recipe": "none: random filler around one pair per line, 4 heads, linear decay",
    "constant_lr": "a constant rate of 1e-3",
    "heads_8": "8 heads of 8",
    "heads_8_decay_4000": "8 heads, the decay of 4,000 updates (a higher rate throughout)",
    "heads_8_decay_4000_long_pairs": "8 heads, decay of 4,000, T 24-31 (less filler)",
    "heads_8_pure_lines": "8 heads, each line the pair alone, one per padded row",
    "repeat_to_fill": "the half repeated to fill the line (no filler)",
    "heads_8_repeat_to_fill": "8 heads, the half repeated to fill the line",
}


def induction_causes_repeated() -> str:
    """What held the induction recipe on the plateau: one change at a time."""
    data = report.load("induction-causes-repeated")
    rows = []
    for run in data["runs"]:
        curve = {point["update"]: point for point in run["curve"]}
        lowest = min(run["curve"], key=lambda point: point["repeated_half"])
        phase = run["phase_change_update"]
        rows.append(
            [
                f"`{run['variant']}`",
                REPEATED_CAUSES.get(run["variant"], ""),
                f"{phase:,}" if phase is not None else f"none by {run['curve'][-1]['update']:,}",
                f"{curve[1200]['repeated_half']:.2f}",
                f"{lowest['repeated_half']:.2f} ({lowest['update']:,})",
                f"{curve[1200]['first_half']:.2f}",
            ]
        )
    headers = [
        "variant",
        "change to the recipe",
        "phase change at update",
        "repeated half, update 1,200",
        "lowest (update)",
        "first half, update 1,200",
    ]
    return "\n\n".join(
        [
            table(headers, rows),
            data["measure"] + ". " + data["note"],
            source("induction-causes-repeated", data, timed=False),
        ]
    )


def alignment() -> str:
    """Cross-attention word alignment of the quickstart model: AER against IBM Model 1."""
    data = report.load("alignment")
    aer = data["aer"]
    best = f"layer {data['best_layer']}"
    described = {"rollout": "attention rollout", "diagonal": "diagonal (reads no model)"}
    rows = [
        [described.get(name, name) + (" (best layer)" if name == best else ""), f"{value:.3f}"]
        for name, value in aer.items()
    ]
    model, results = data["model"], data.get("run_results", {})
    bleu = f", test BLEU {results['bleu']}" if "bleu" in results else ""
    notes = (
        f"{data['pairs']} test verses ({data['skipped']} left out), {model['n_decoder_layers']} "
        f"decoder layers of {model['n_heads']} heads{bleu}. Reference: IBM Model 1 ("
        f"{data['model1_iterations']} EM iterations on {data['model1_pairs']:,} pairs: the "
        "train split and the aligned verses); AER = 1 - 2|A∩R|/(|A|+|R|), summed over the "
        "verses, 0 where attention links as Model 1 does. It measures agreement with "
        "Model 1, which is itself often wrong. Run: " + data.get("note", "")
    )
    return "\n\n".join(
        [
            table(["alignment", "AER vs Model 1"], rows, left=1),
            notes,
            source("alignment", data, timed=False),
        ]
    )


def export() -> str:
    """The quickstart model exported to CTranslate2: each quantization's test BLEU."""
    data = report.load("export")
    rows = [
        [
            q["quantization"],
            f"{q['bleu']:.2f}",
            f"{q['chrf']:.2f}",
            f"{q['bleu_against_float32']:.2f}",
            f"{q['same_as_float32']:.0%}",
        ]
        for q in data["quantizations"]
    ]
    headers = [
        "CTranslate2 compute type",
        "test BLEU",
        "chrF",
        "BLEU vs float32",
        "same as float32",
    ]
    notes = (
        f"{data['sentences']} test verses, beam {data['beam']}, alpha {data['alpha']} "
        "(CTranslate2's length penalty |Y|^alpha, not aiayn's GNMT form); aiayn's own test "
        f"BLEU of the same weights: {data['quickstart_bleu']}. Run: " + data["args"].get("note", "")
    )
    return "\n\n".join([table(headers, rows, left=1), notes, source("export", data, timed=False)])


def hooks() -> str:
    """What the hook points cost when nothing listens (bench_hooks)."""
    data = report.load("hooks")
    rows = []
    for name, r in data["results"].items():
        ratios = [a / b for a, b in zip(r["shipped_s"], r["without_hook_points_s"], strict=True)]
        rows.append(
            [
                name,
                f"{statistics.median(r['shipped_s']) * 1e3:.1f}",
                f"{statistics.median(r['without_hook_points_s']) * 1e3:.1f}",
                f"{r['ratio']:.3f}",
                f"{min(ratios):.2f}-{max(ratios):.2f}",
            ]
        )
    headers = ["workload", "shipped ms", "without hook points ms", "ratio", "per-round range"]
    notes = (
        "The quickstart's shape (d_model 128, 3+3 layers, 8,000 pieces), fp32: a training "
        "step of 32 x 30 tokens, forward and backward; greedy decoding of 8 sentences, 30 "
        "steps. Ratio: shipped over without, the median of per-round ratios, the two "
        "taking turns call by call (1.00: no cost)."
    )
    return "\n\n".join([table(headers, rows, left=1), notes, source("hooks", data)])
