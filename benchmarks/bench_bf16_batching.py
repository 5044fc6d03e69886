"""How often a translation depends on the sentences batched with it, in fp32 and in bf16.

    python -m benchmarks.bench_bf16_batching                   # trains a tiny run first
    python -m benchmarks.bench_bf16_batching --run runs/bible  # or measures a run you have

The same sentences are translated three ways, each as `aiayn translate` does it: batches
of at most 4096 source tokens (the default), batches of at most 60 (a handful of
sentences each), and the continuous-batching engine with 16 sentences at once
(`--continuous 16`). A line "differs" where its translation is not the same string as
the default path's. In fp32 none should (tests/unit/test_translate.py checks it); in
bf16 a matrix product's rounding depends on the other rows it is computed with (the
kernel's blocking follows the batch's shape), and a near tie between two tokens can
then go either way, so some lines change.

Without --run, a tiny model (d_model 64, 2 layers) is trained for --steps updates on a
synthetic corpus (1 to 10 words translated word for word, in reverse order), in a
temporary directory; the sentences translated are --sentences of that corpus's kind.

Writes `benchmarks/results/NAME.json` (default `bf16-batching`): per run (the tiny
model after each of --steps updates) and dtype, the lines that differ from the default
path at --max-tokens 60 and at --continuous 16.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks import common

EN = ["house", "garden", "river", "tree", "stone", "bridge", "light", "water", "night", "summer"]
DE = ["haus", "garten", "fluss", "baum", "stein", "bruecke", "licht", "wasser", "nacht", "sommer"]
WAYS = {"max-tokens-4096": (4096, 0), "max-tokens-60": (60, 0), "continuous-16": (4096, 16)}
DEFAULT_WAY = "max-tokens-4096"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def word_pairs(n: int, rng: random.Random) -> list[tuple[str, str]]:
    """`n` pairs of 1 to 10 words translated word for word, the German in reverse order."""
    pairs = []
    for _ in range(n):
        idx = [rng.randrange(len(EN)) for _ in range(rng.randint(1, 10))]
        pairs.append((" ".join(EN[i] for i in idx), " ".join(DE[i] for i in reversed(idx))))
    return pairs


def train_tiny_runs(root: Path, steps: list[int]) -> dict[int, tuple[Path, float]]:
    """A tiny model trained with Adam on the synthetic corpus (batches of 32 pairs, as the
    parity tests train theirs), saved as a run after each of `steps` updates:
    {updates: (ROOT/run-UPDATES, the last training loss)}."""
    from aiayn import ModelConfig, Transformer
    from aiayn.data.batch import Batch
    from aiayn.data.tokenizer import TOKENIZER_FILE, train_tokenizer
    from aiayn.io.checkpoint import save_model

    rng = random.Random(0)
    pairs = word_pairs(4000, rng)
    spm = root / TOKENIZER_FILE
    texts = [text for pair in pairs for text in pair]
    tokenizer = train_tokenizer(texts, spm, vocab_size=48)
    corpus = [(tokenizer.encode(en), tokenizer.encode(de)) for en, de in pairs]
    torch.manual_seed(0)
    cfg = ModelConfig.tiny(
        tokenizer.vocab_size, d_model=64, n_heads=4, d_ff=128, n_layers=2, dropout=0.0
    )
    model = Transformer(cfg).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    runs = {}
    for step in range(1, max(steps) + 1):
        batch = Batch.from_pairs(rng.sample(corpus, 32), cfg.pad_id, cfg.bos_id, cfg.eos_id)
        logits = model(batch.src, batch.tgt_in)
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=cfg.pad_id
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step in steps:
            run = root / f"run-{step}"
            save_model(model, run / "checkpoints" / f"step-{step:08d}" / "model.safetensors")
            shutil.copy(spm, run / TOKENIZER_FILE)
            runs[step] = (run, loss.item())
    return runs


def translations(run: Path, dtype: torch.dtype, sentences: list[str]) -> dict[str, list[str]]:
    """way -> the best translation of each sentence, as `aiayn translate` gives it."""
    from aiayn.apps.translate import Translator

    translator = Translator.load(run, dtype=dtype)
    found = {}
    for way, (max_tokens, continuous) in WAYS.items():
        nbest = translator.translate_nbest(sentences, max_tokens=max_tokens, continuous=continuous)
        found[way] = [candidates[0].text if candidates else "" for candidates in nbest]
    return found


def differing(found: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The lines whose translation differs from the default path's, per other way."""
    default = found[DEFAULT_WAY]
    records = []
    for way, lines in found.items():
        if way == DEFAULT_WAY:
            continue
        n = sum(a != b for a, b in zip(default, lines, strict=True))
        records.append(
            {"way": way, "lines": n, "of": len(lines), "share": round(n / len(lines), 4)}
        )
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="A translation run (default: train a tiny one).")
    parser.add_argument(
        "--steps", default="60,300", help="Updates of the tiny run measured, comma-separated."
    )
    parser.add_argument("--sentences", type=int, default=300, help="Sentences translated.")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results", default="bf16-batching", help="Results file name.")
    args = parser.parse_args()
    common.set_threads(args.threads)
    sentences = [en for en, _ in word_pairs(args.sentences, random.Random(1))]
    results = []
    with tempfile.TemporaryDirectory(prefix="bf16-batching-") as tmp:
        if args.run:
            runs = {None: (args.run, None)}
        else:
            runs = train_tiny_runs(Path(tmp), [int(s) for s in args.steps.split(",")])
        for steps, (run, loss) in runs.items():
            for name, dtype in DTYPES.items():
                for record in differing(translations(run, dtype, sentences)):
                    results.append({"steps": steps, "train_loss": loss, "dtype": name, **record})
    rows = [
        [r["steps"], r["dtype"], r["way"], f"{r['lines']}/{r['of']}", f"{100 * r['share']:.1f}%"]
        for r in results
    ]
    headers = ["updates", "dtype", f"against {DEFAULT_WAY}", "lines differing", "share"]
    print(common.table(headers, rows))
    model = args.run or f"a tiny Transformer trained {args.steps} updates on a synthetic corpus"
    measures = {
        "system": "aiayn translate in float32 and bfloat16 (--dtype), batched three ways",
        "cell": f"{model}, {args.sentences} sentences, {args.threads} thread(s), {common.machine()}",
        "harness": "bench_bf16_batching",
    }
    payload = {
        "args": {"run": str(args.run) if args.run else None, "steps": args.steps,
                 "sentences": args.sentences, "threads": args.threads},
        "measures": [measures],
        "default": DEFAULT_WAY,
        "results": results,  # steps, train_loss: the tiny run's (None with --run)
    }  # fmt: skip
    print(common.write_json(args.results, payload))


if __name__ == "__main__":
    main()
