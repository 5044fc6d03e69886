"""The three shapes side by side: what each trained run is worth, from its run directory.

    python -m benchmarks.bench_shapes \
        --run gpt=runs/gpt --run bert=runs/bert \
        --run gpt-translate=runs/gpt-translate --run encdec=runs/bible

Each run was trained with `aiayn train` from its recipe (configs/gpt-bible-en-cpu.yaml,
bert-bible-en-cpu.yaml, gpt-translate-bible-en-es-cpu.yaml, bible-en-es-cpu.yaml).
For each, from the weights `aiayn translate` would use (`resolve_weights`: an
average, else the best validation checkpoint, else the newest):

    parameters       ModelConfig / num_parameters of the run's model
    tokens/s         training throughput: the positions an epoch's batches hold (padding
                     excluded; source + target for the encoder-decoder), times the
                     epochs trained, over the cumulative training seconds (trainer.pt)
    target tokens/s  the same for the positions the loss is on (masked ones for BERT)
    test             on the corpus's test split, by the run's own task:
                     lm: perplexity of packed blocks; mlm: masked-token accuracy with
                     the task's seeded masking (and the masked-token perplexity);
                     translation (both shapes): greedy-search sacreBLEU

The runs' throughput depends on what else the machine ran; the results file records the
load average. Writes benchmarks/results/shapes.json.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch
import yaml

from aiayn.data.corpus import PreparedCorpus
from aiayn.data.lm import SequenceBatches, pack, read_documents
from aiayn.io.checkpoint import latest_checkpoint, load_model, load_trainer_state, resolve_weights
from aiayn.training.distributed import DistEnv
from aiayn.training.recipe import recipe_from_dict
from aiayn.training.tasks import BleuSet, build_task, evaluate_task
from aiayn.training.tasks.lm_translation import greedy_bleu as decoder_only_bleu
from aiayn.training.tasks.translation import greedy_bleu as encoder_decoder_bleu
from benchmarks.common import table, write_json

NO_AUTOCAST = contextlib.nullcontext


def throughput(task, data, run: Path) -> tuple[float, float, float]:
    """(tokens/s, target tokens/s, epochs) of a run's training."""
    state = load_trainer_state(latest_checkpoint(run))["state"]
    batches = data.train
    tokens = targets = 0
    for batch in batches.epoch(0):
        targets += task.target_tokens(batch)
        if hasattr(batch, "inputs"):
            tokens += int((batch.inputs != task.cfg.pad_id).sum())
        else:  # the encoder-decoder's Batch
            tokens += batch.n_src_tokens + batch.n_tgt_tokens
    epochs = state["epoch"] + state["position"] / len(batches)
    seconds = state["train_seconds"]
    return tokens * epochs / seconds, targets * epochs / seconds, epochs


def test_score(task, corpus, tokenizer, model) -> dict[str, float]:
    """The run's task on the test split."""
    cfg = task.cfg
    if task.name in ("lm", "mlm"):
        documents = tokenizer.encode_batch(read_documents(corpus, "test"))
        length, overlap = (cfg.max_len + 1, 1) if task.name == "lm" else (cfg.max_len - 2, 0)
        blocks = pack(documents, tokenizer.eos_id, length, overlap).blocks
        test = SequenceBatches(blocks, task.make_batch, 4096, cfg.pad_id, shuffle=False)
        task.valid = test  # the MLM's accuracy reads it
        metrics = evaluate_task(task, model, test, torch.device("cpu"), NO_AUTOCAST)
        return {k: metrics[k] for k in ("loss", "ppl", "masked_accuracy") if k in metrics}
    pairs = corpus.read("test")
    sources = tokenizer.encode_batch([s for s, _ in pairs])
    data = BleuSet(sources, [t for _, t in pairs], tokenizer.decode)
    model.eval()
    with torch.no_grad():
        if task.name == "lm_translation":
            bleu = decoder_only_bleu(model, data, task.separator, NO_AUTOCAST)
        else:
            bleu = encoder_decoder_bleu(model, data, NO_AUTOCAST)
    return {"greedy_bleu": bleu}


def measure(name: str, run: Path) -> dict:
    resolved = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    recipe = recipe_from_dict(resolved)
    corpus = PreparedCorpus.load(recipe.corpus)
    tokenizer = corpus.tokenizer()
    weights = resolve_weights(run)
    model = load_model(weights).eval()
    task = build_task(recipe.task, model.cfg)
    data = task.build_data(corpus, tokenizer, recipe.train, DistEnv())
    tokens_per_s, targets_per_s, epochs = throughput(task, data, run)
    state = load_trainer_state(latest_checkpoint(run))["state"]
    return {
        "shape": name,
        "task": recipe.task,
        "architecture": model.cfg.architecture,
        "parameters": model.num_parameters(),
        "train_minutes": round(state["train_seconds"] / 60, 2),
        "steps": state["step"],
        "epochs": round(epochs, 3),
        "tokens_per_s": round(tokens_per_s, 1),
        "target_tokens_per_s": round(targets_per_s, 1),
        "weights": str(weights.relative_to(run)),
        "test": test_score(task, corpus, tokenizer, model),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="NAME=RUN_DIR")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--conditions", default="", help="how the runs were trained (recorded)")
    parser.add_argument(
        "--name", default="shapes", help="results file benchmarks/results/NAME.json (to add runs)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for item in args.run:
        name, _, run = item.partition("=")
        rows.append(measure(name, Path(run)))
        print(f"{name}: {rows[-1]}", file=sys.stderr)
    headers = ["shape", "task", "parameters", "minutes", "tokens/s", "target tokens/s", "test"]
    cells = [
        [r["shape"], r["task"], f"{r['parameters']:,}", r["train_minutes"],
         f"{r['tokens_per_s']:,.0f}", f"{r['target_tokens_per_s']:,.0f}",
         ", ".join(f"{k} {v:.4g}" for k, v in r["test"].items())]
        for r in rows
    ]  # fmt: skip
    print(table(headers, cells))
    path = write_json(args.name, {"conditions": args.conditions, "runs": rows})
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
