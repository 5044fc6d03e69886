"""The attention kernels' tables: SDPA against the explicit path, the sliding window,
the efficient kernels by length and their tasks (bench_attention, bench_efficient)."""

from __future__ import annotations

from benchmarks import report
from benchmarks.report import number, source, table


def attention(name: str = "attention") -> str:
    data = report.load(name)
    rows = []
    for r in data["results"]:
        skipped = "explicit_ms" not in r or r["explicit_ms"] is None
        rows.append(
            [
                f"{r['length']:,}",
                number(r["sdpa_ms"]),
                number(r["sdpa_peak_mib"]),
                "skipped" if skipped else number(r["explicit_ms"]),
                "skipped" if skipped else number(r["explicit_peak_mib"]),
            ]
        )
    headers = ["length", "SDPA ms", "SDPA peak MiB", "explicit ms", "explicit peak MiB"]
    return table(headers, rows, left=1) + "\n\n" + source(name, data)


def sliding_window(name: str = "attention") -> str:
    data = report.load(name)["sliding_window"]
    rows, notes = [], []
    for r in data["results"]:
        skipped = r.get("skipped", {})

        def cell(kind: str, field: str, r=r) -> str:
            value = r.get(f"{kind}_{field}")
            return "skipped" if value is None else number(value)

        notes += [f"{r['length']:,}, {kind}: {why}" for kind, why in skipped.items()]

        rows.append(
            [
                f"{r['length']:,}",
                number(r["sliding_ms"]),
                number(r["sliding_train_ms"]),
                number(r["sliding_peak_mib"]),
                cell("band", "ms"),
                cell("band", "peak_mib"),
                cell("full", "ms"),
                cell("full", "peak_mib"),
            ]
        )
    headers = ["length", "sliding ms", "sliding fwd+bwd ms", "sliding peak MiB"]
    headers += ["band-mask SDPA ms", "band-mask peak MiB", "full SDPA ms", "full SDPA peak MiB"]
    line = source(name, data, record="sliding_window")
    skipped = "Skipped: " + "; ".join(notes) + "." if notes else ""
    return "\n\n".join(part for part in (table(headers, rows, left=1), skipped, line) if part)


def efficient_attention(name: str = "attention") -> str:
    """bench_attention --only efficient: each kernel's training pass by length, the
    crossover against SDPA, and the causal kernels' decoding step by position."""
    data = report.load(name)["efficient"]
    kernels = ("sdpa", "sliding_window", "bigbird", "linear", "performer")
    causal = ("sdpa", "sliding_window", "linear", "performer")

    def cell(value: float | None) -> str:
        return "skipped" if value is None else number(value)

    rows = [
        [r["device"], f"{r['length']:,}"]
        + [cell(r[f"{k}_train{field}"]) for k in kernels for field in ("_ms", "_peak_mib")]
        for r in data["results"]
    ]
    headers = ["device", "length"]
    headers += [f"{k} {what}" for k in kernels for what in ("fwd+bwd ms", "peak MiB")]
    crossing = "; ".join(
        f"{device}: "
        + ", ".join(f"{k} {'none' if n is None else f'{n:,}'}" for k, n in found.items())
        for device, found in data["crossover"].items()
    )
    decode_rows = [
        [r["device"], f"{r['position']:,}"]
        + [number(r[f"{k}_{field}"]) for k in causal for field in ("step_ms", "cache_mib")]
        for r in data["decoding"]
    ]
    decode_headers = ["device", "position"]
    decode_headers += [f"{k} {what}" for k in causal for what in ("step ms", "cache MiB")]
    return "\n\n".join(
        [
            table(headers, rows),
            f"First length at which a kernel's forward + backward beats SDPA's: {crossing}.",
            table(decode_headers, decode_rows),
            source(name, data, record="efficient"),
        ]
    )


def sdpa_backends(name: str = "attention-gpu") -> str:
    """bench_attention --only backends: SDPA's CUDA backends, each forced, by length."""
    data = report.load(name)["backends"]
    kinds = {"flash": "FlashAttention", "efficient": "memory-efficient", "math": "math"}

    def cell(value: float | None) -> str:
        return "—" if value is None else number(value)

    rows = [
        [f"{r['length']:,}"]
        + [cell(r[f"{k}_{field}"]) for k in kinds for field in ("train_ms", "peak_mib")]
        for r in data["results"]
    ]
    headers = ["length"] + [f"{label} {what}" for label in kinds.values() for what in ("ms", "MiB")]
    notes = [
        f"{r['length']:,}, {kinds[k]}: {why}"
        for r in data["results"]
        for k, why in r.get("skipped", {}).items()
    ]
    skipped = "Not run: " + "; ".join(notes) + "." if notes else ""
    parts = (table(headers, rows, left=1), skipped, source(name, data, record="backends"))
    return "\n\n".join(part for part in parts if part)


def efficient_task(name: str) -> str:
    """bench_efficient: a task's test score per kernel over seeds (accuracy, or bits per
    character), beside the baselines that read no context. LRA's ListOps figures, which
    the file keeps, are not a column: its data, updates and pooling differ from ours."""
    data = report.load(name)
    metric = data.get("metric", "accuracy")
    digits = 1 if metric == "accuracy" else 2  # accuracy in %, bits per character
    rows = []
    for kernel, s in data["kernels"].items():
        best = s.get(f"best_valid_{metric}")
        row = [
            kernel,
            f"{s[f'test_{metric}']:.{digits}f} ± {s[f'test_{metric}_std']:.{digits}f}",
            "—" if best is None else f"{best:.{digits}f}",
            number(s["steps"]),
            number(s["tokens_per_s"]) if "tokens_per_s" in s else "—",
            number(s["peak_mib"]),
        ]
        rows.append(row)
    what = "accuracy %" if metric == "accuracy" else "bits per character"
    headers = ["kernel", f"test {what} (mean ± std)", "best valid", "updates", "tokens/s"]
    headers += ["peak MiB"]
    # results before the baselines were grouped kept the majority class on its own
    baselines = data.get("baselines") or {"majority_accuracy": data["majority_accuracy"]}
    named = {
        "majority_accuracy": "Always answering the most common class scores {test:.1f}% on "
        "the test split and {valid:.1f}% on the validation split.",
        "first_token_accuracy": "Answering the class most common in training after the "
        "first token (the root operator) scores {test:.1f}% on test and {valid:.1f}% on "
        "validation.",
        "naive_bayes_accuracy": "A naive Bayes classifier of character 4-grams, which "
        "reads the whole text without attention or training steps, scores {test:.1f}% on "
        "test and {valid:.1f}% on validation.",
        "unigram_bpc": "The training text's character frequencies, reading no context, "
        "score {test:.2f} bits per character on test and {valid:.2f} on validation.",
    }
    said_baselines = " ".join(named[key].format(**value) for key, value in baselines.items())
    per_kernel = {k: ", ".join(map(str, sorted(s["seeds"]))) for k, s in data["kernels"].items()}
    if len(set(per_kernel.values())) == 1:
        seeds = f"seeds {next(iter(per_kernel.values()))} per kernel"
    else:  # a sweep cut short: say which kernel has which seeds
        seeds = "seeds " + "; ".join(f"{k} {v}" for k, v in per_kernel.items())
    device = data.get("gpu", data["args"].get("device", ""))
    where = "on the CPU, one thread each" if device == "cpu" else f"on one {device}"
    task = data.get("task", "listops")
    if data["metric"] == "bpc":
        context = data.get("context", 2048)  # the first file (charlm-gpu) did not say
        about = f"the English Bible (WEB), one piece per character, blocks of {context:,}."
    else:
        sizes = data["data"]["sizes"]
        what, unit = (
            (f"ListOps at scale {data['data']['settings']['scale']:g}", "expressions")
            if task == "listops"
            else (f"the Bible's {len(data['data']['classes'])} genres", "passages, by chapter")
        )
        about = (
            f"{what}: {sizes['train']:,} / {sizes['valid']:,} / {sizes['test']:,} train / "
            f"valid / test {unit}, mean {data['mean_train_tokens']:,.0f} tokens."
        )
    said = (
        f"{len(data['runs'])} runs, {seeds}, "
        f"{min(int(data['args']['parallel']), len(data['runs']))} at a time {where}; "
        f"{about} {said_baselines}"
    )
    return "\n\n".join([table(headers, rows, left=1), said, source(name, data)])


def efficient_positions(name: str) -> str:
    """bench_efficient, a language model: test bits per character by position in the
    block (buckets that double in reach), per kernel over its seeds; a kernel that reads
    far context still gains in the last buckets."""
    from benchmarks.bench_efficient import bucket_names

    data = report.load(name)
    edges = next(iter(data["kernels"].values()))["test_bpc_by_position"]["edges"]
    names = bucket_names(edges)
    rows = [
        [kernel, *(f"{b:.2f}" for b in s["test_bpc_by_position"]["bpc"])]
        for kernel, s in data["kernels"].items()
    ]
    said = (
        "Test bits per character at each position t of the block (the prediction of "
        "character t + 1 from the t + 1 read so far; 0: from one character), the mean of "
        "each bucket of positions and of the kernel's seeds."
    )
    return "\n\n".join([table(["kernel", *names], rows, left=1), said, source(name, data)])


RECALL_TASKS = {
    "mqar": "MQAR (N key-value pairs in L positions)",
    "selective-copy": "selective copying (N tokens at random positions among L - N, then N markers)",
    "distance-copy": "copying over a distance (N tokens, L - 2N blanks, then N markers)",
}


def recall(name: str) -> str:
    """bench_recall: each kernel variant's accuracy per cell (L, N) and width: the mean
    over seeds, with the worst and best seed where they differ; which kernels fall 20
    points below sdpa beyond the seed spread somewhere."""
    data = report.load(name)
    grid, cells = data["grid"], data["cells"]
    order = sorted({(c["length"], c["pairs"]) for c in cells})
    found = {(c["variant"], c["width"], c["length"], c["pairs"]): c for c in cells}

    def cell(c: dict | None) -> str:
        if c is None:
            return "—"
        low, high = f"{c['min']:.1f}", f"{c['max']:.1f}"
        return f"{c['mean']:.1f}" if low == high else f"{c['mean']:.1f} ({low}–{high})"

    rows = [
        [variant, str(width)] + [cell(found.get((variant, width, *key))) for key in order]
        for width in grid["widths"]
        for variant in grid["kernels"]
        if any((variant, width, *key) in found for key in order)
    ]
    headers = ["kernel", "width"] + [f"L {length}, N {n}" for length, n in order]
    task = data.get("task", "mqar")
    complete = data.get("complete", True)
    seeds = len(grid["seeds"]) if complete else min(c["seeds"] for c in cells)
    if data["mode"] == "circuit":
        how = (
            "the set-weight circuit through one bidirectional attention layer (no training), "
            "each kernel at the best of its score scales"
        )
    else:
        shape = data["shape"].replace("_", "-")
        how = (
            f"two attention-only layers ({shape}, rotary positions), each kernel trained "
            f"{grid['steps']:,} updates of {grid['batch']} sequences from the same seeds"
        )
    broken = sorted({g["variant"] for g in data["below_sdpa"] if g["breaks"]})
    planned = len(grid["cells"]) * len(grid["widths"]) * len(grid["kernels"]) * len(grid["seeds"])
    falls = (
        f"Partial: {len(data['runs'])} of its {planned} runs, so no gap is judged."
        if not complete
        else f"Variants 20 points or more below sdpa in some cell, beyond the seed spread: "
        f"{', '.join(broken)}."
        if broken and seeds > 1
        else "With one seed the spread is not measured."
        if seeds == 1
        else "No variant falls 20 points below sdpa beyond the seed spread."
    )
    said = (
        f"Accuracy % over every answer of {data['eval_sequences']} held-out sequences: "
        f"{RECALL_TASKS[task]}, {how}; {seeds} seed{'s' if seeds > 1 else ''} per cell"
        f"{'' if complete else ' so far, at least'} (the mean, and in brackets the worst "
        f"and best seed where they differ). {falls}"
    )
    return "\n\n".join([table(headers, rows), said, source(name, data, timed=False)])


def cost_and_loss(length: int = 16384, width: int = 64) -> str:
    """Each kernel's cost at one length (bench_attention --only efficient, CPU) beside
    what it loses: its variants' mean accuracy over every cell of each set-weight
    circuit at one width (bench_recall --mode circuit)."""
    speed = report.load("attention")["efficient"]
    row = next(r for r in speed["results"] if r["device"] == "cpu" and r["length"] == length)
    steps = {r["position"]: r for r in speed["decoding"] if r["device"] == "cpu"}
    step = steps.get(length)
    variants = {
        "sdpa": ("sdpa",),
        "sliding_window": ("window-8", "window-64"),
        "bigbird": ("bigbird",),
        "linear": ("linear",),
        "performer": ("performer-16", "performer-128"),
    }
    circuits = {
        "MQAR": "recall-mqar-circuit",
        "copying over a distance": "recall-distance-copy-circuit",
        "selective copying": "recall-selective-copy-circuit",
    }
    means = {}
    for task, name in circuits.items():
        cells = [c for c in report.load(name)["cells"] if c["width"] == width]
        for variant in {v for vs in variants.values() for v in vs}:
            scores = [c["mean"] for c in cells if c["variant"] == variant]
            means[task, variant] = sum(scores) / len(scores) if scores else None

    def cost(value: float | None) -> str:
        return "—" if value is None else number(value)

    rows = []
    for kernel, names in variants.items():
        cache = step.get(f"{kernel}_cache_mib") if step else None
        rows.append(
            [
                kernel,
                " / ".join(names),
                cost(row[f"{kernel}_train_ms"]),
                cost(row[f"{kernel}_train_peak_mib"]),
                cost(cache),
            ]
            + [
                " / ".join(f"{means[task, v]:.0f}" for v in names if means[task, v] is not None)
                or "—"
                for task in circuits
            ]
        )
    headers = [
        "kernel",
        "recall variants",
        f"fwd+bwd ms at {length:,}",
        f"peak MiB at {length:,}",
        f"decoding cache MiB at {length:,}",
    ] + [f"{task} % (mean over cells)" for task in circuits]
    files = ", ".join(f"`benchmarks/results/{n}.json`" for n in circuits.values())
    said = (
        f"Cost: one layer on the CPU (d_model 256, 4 heads, batch 1; each kernel at "
        f"bench_attention's settings, not the recall variants'), from "
        f"`benchmarks/results/attention.json` record `efficient` (its Source line is under "
        f"the speed tables above); SDPA's fwd+bwd at {length:,} is quadratic, the others "
        f"linear. Loss: each variant's accuracy at width {width}, the mean over the six "
        f"cells (L 64 to 256, N 4 to 64) and three seeds of each circuit, from {files} "
        "(their tables and Source lines are above); BigBird has no causal form, so no "
        "decoding cache."
    )
    return table(headers, rows) + "\n\n" + said
