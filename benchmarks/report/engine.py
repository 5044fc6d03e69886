"""The serving and decoding-engine tables: the batching server, GPT-2 generation,
one decoding step, and a whole file through `aiayn translate`."""

from __future__ import annotations

from typing import Any

from benchmarks import report
from benchmarks.report import number, ratio, source, table


def serve(name: str) -> str:
    """bench_serve.py: the batching server against one at a time, per number of clients."""
    data = report.load(name)
    rows = []
    for c in data["cells"]:
        # an offline cell (--offline) has a rate only: no clients, latencies or batches
        shown = [number(c[k]) if k in c else "" for k in ("p50_ms", "p95_ms", "p99_ms")]
        shown += [number(c["mean_batch"]) if "mean_batch" in c else ""]
        shown += [str(c.get("refused_429", "")), ratio(c["speedup"]) if c["speedup"] else ""]
        clients = str(c["clients"]) if c["clients"] else "offline"
        rows.append([clients, c["server"], number(c["sentences_per_s"]), *shown])
    headers = ["clients", "server", "sentences/s", "p50 ms", "p95 ms", "p99 ms", "mean batch"]
    headers += ["429s", "vs one at a time"]
    batching = (
        f"the batching server with --continuous {data['continuous']}"
        if data.get("continuous")
        else f"--max-wait-ms {data['max_wait_ms']:g}"
    )
    settings = f"Beam {data['beam']}, {batching}, "
    settings += f"{data['threads']} torch thread per server, {data['rounds']} rounds per cell."
    return settings + "\n\n" + table(headers, rows) + "\n\n" + source(name, data, needs_quiet=True)


def generate(name: str) -> str:
    """bench_generate.py: aiayn's tokens/s against transformers' generate, same weights."""
    data = report.load(name)
    cells: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for r in data["results"]:
        cells.setdefault((r["size"], r["batch"]), {})[r["system"]] = r
    rows = []
    for (size, batch), by in cells.items():
        ours, ours16 = by["aiayn"], by["aiayn-bf16"]  # ratios: medians over rounds
        rows.append(
            [
                "GPT-2 small" if size == "gpt2-small" else size,
                str(batch),
                number(ours["tokens_per_s"]),
                number(ours16["tokens_per_s"]),
                f"**{ratio(ours['speedup_vs_hf_fp32'])}**",
                ratio(ours16["speedup_vs_hf_fp32"], "†"),
                ratio(ours16["speedup_vs_hf"]),
            ]
        )
    headers = ["shape", "batch", "aiayn fp32 tok/s", "aiayn bf16 tok/s"]
    headers += ["aiayn / HF, fp32", "aiayn bf16 / HF fp32", "aiayn / HF, bf16"]
    notes = "† across precisions."
    return "\n\n".join([table(headers, rows), notes, source(name, data, needs_quiet=True)])


def step_overhead(name: str = "step-overhead") -> str:
    """bench_static_step --marian: one decoding step per system and slot count, with
    aiayn's time outside matrix products, beside CTranslate2's whole step."""
    data = report.load(name)
    labels = {
        "cache": "aiayn, cached step (today's)",
        "static": "aiayn, static step, eager",
        "compiled": "aiayn, static step, torch.compile",
        "aoti": "aiayn, static step, AOTInductor",
        "ct2-fp32": "CTranslate2 fp32",
        "ct2-int8": "CTranslate2 int8",
    }

    def cell(value: float | None) -> str:
        return "" if value is None else number(value)

    rows = [
        [
            str(r["slots"]),
            labels.get(r["system"], r["system"]),
            cell(r.get("ms_per_step")),
            cell(r.get("outside_gemm_ms")),
            "" if r["system"].startswith("ct2") else cell(r.get("compile_s")),
        ]
        for r in data["results"]
    ]
    headers = ["slots", "system", "ms/step", "outside GEMM ms", "compile s"]
    said = (
        f"Greedy steps of the `{data['args']['size']}` shape (a random Marian, the same "
        f"weights in both), median of {data['args']['steps']}"
        + (
            f" steps, then the median over {rounds} rounds, the systems taking turns."
            if (rounds := data["args"].get("rounds", 1)) > 1
            else "."
        )
    )
    return "\n\n".join([said, table(headers, rows, left=2), source(name, data, needs_quiet=True)])


def generate_engine(name: str = "generate-engine") -> str:
    """bench_generate.py --systems aiayn,hf,aiayn-static: per shape and batch, each
    system's tokens/s and its ratio to HF generate (fp32)."""
    data = report.load(name)
    labels = {"aiayn": "aiayn", "hf": "HF generate", "aiayn-static": "aiayn, static step"}
    rows = [
        [
            "GPT-2 small" if r["size"] == "gpt2-small" else r["size"],
            str(r["batch"]),
            labels.get(r["system"], r["system"]),
            number(r["tokens_per_s"]),
            number(r["ms_per_call"]),
            ratio(r["speedup_vs_hf"]),
        ]
        for r in data["results"]
    ]
    headers = ["shape", "batch", "system", "new tok/s", "ms/call", "vs HF"]
    return table(headers, rows) + "\n\n" + source(name, data, needs_quiet=True)


def translate_file(name: str = "translate") -> str:
    """bench_translate.py: a whole file through `aiayn translate`, batches against the
    continuous engine: sentences/s, the ratio, BLEU and the lines equal to batches'; and,
    where the run timed them, each system's start-up (start, loading and one sentence)
    and the rate of its decoding alone."""
    data = report.load(name)
    rows = [
        [
            str(c["threads"]),
            f"`{c['system']}`",
            number(c["sentences_per_s"]),
            number(c["seconds"]),
            ratio(c["speedup_vs_batches"]),
            f"{c['bleu']:.2f}",
            "" if c["same_as_batches"] is None else f"{c['same_as_batches']}/{c['sentences']}",
            number(c["start_s"]) if "start_s" in c else "",
            number(c["decoding_sentences_per_s"]) if "decoding_sentences_per_s" in c else "",
        ]
        for c in data["cells"]
    ]
    headers = ["threads", "system", "sentences/s", "seconds", "vs batches", "BLEU"]
    headers += ["lines equal to batches'", "start s", "decoding alone, sentences/s"]
    said = (
        f"{data['cells'][0]['sentences']} test sentences, beam {data['beam']}, alpha "
        f"{data['alpha']:g}, median of {data['rounds']} rounds."
    )
    return "\n\n".join([said, table(headers, rows), source(name, data, needs_quiet=True)])


def batch_order(name: str = "batch-order-xeon") -> str:
    """bench_batch_order.py: the test verses in batches of B in arrival order and sorted by
    length, against the whole file as `aiayn translate` batches it (sentences/s, ratio)."""
    data = report.load(name)
    rows = [
        [c["order"], str(c["batch"]), number(c["sentences_per_s"]), ratio(c["vs_file"])]
        for c in data["cells"]
    ]
    said = (
        f"{data['sentences']} test verses, beam {data['beam']}, {data['threads']} thread(s), "
        f"one process, median of {data['rounds']} rounds. `file`: all of them in one call, "
        "sorted into batches of 4096 source tokens (the scheduling limit without start and "
        "loading); `arrival`: shuffled, then cut into batches of B; `sorted`: sorted by "
        "length, then cut into batches of B."
    )
    headers = ["order", "batch", "sentences/s", "vs file"]
    return "\n\n".join([said, table(headers, rows), source(name, data, needs_quiet=True)])
