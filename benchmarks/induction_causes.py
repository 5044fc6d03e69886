"""Why aiayn's trainer met no phase change where a plain loop did: one candidate at a time.

    python -m benchmarks.induction_causes --updates 1500 --variants recipe,constant_lr

Issue 50: on repeated random tokens, aiayn's GPT module in a plain PyTorch loop (AdamW
at a constant 1e-3, batches of 32 rows) escaped the unigram plateau within a few
thousand updates, while `aiayn train` with the recipe configs/gpt-induction-attn-only-
bible-en-cpu.yaml stayed on it. Each variant here is the recipe's training with one
setting changed to the plain loop's (or the plain loop itself), built from aiayn's own
pieces: the corpus of `aiayn.data.repeated`, packed and batched by the `lm` task
(`LanguageModelTask.build_data`) or cut into rows of one line each, the model of
`build_model`, the loss of the task, the optimiser and schedule of
`aiayn.training.optim` (or AdamW at a constant rate), the trainer's update (the summed
loss over all target tokens). Every `--every` updates it measures, on held-out
repeated random symbols (eos, T symbols, the same T again), the loss on the first and
on the repeated half (`aiayn.analysis.induction.repeat_losses`). The phase change is
the first measurement where the repeated half is 1 nat per token below the first.
Writes benchmarks/results/NAME.json (default induction-causes).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from aiayn.analysis.induction import repeat_losses, repeated_random_tokens
from aiayn.config import LRSchedule, ModelConfig, TrainConfig
from aiayn.data.lm import SequenceBatches, read_documents
from aiayn.data.repeated import RepeatedConfig, prepare_lm_repeated, symbol_ids
from aiayn.models import build_model
from aiayn.training.distributed import DistEnv
from aiayn.training.optim import build_optimizer, build_scheduler
from aiayn.training.tasks.lm import LanguageModelTask
from benchmarks import common

# The recipe's settings (configs/gpt-induction-attn-only-bible-en-cpu.yaml) ...
RECIPE: dict[str, Any] = dict(
    data="blocks",  # packed blocks of max_len, as `aiayn train` cuts them
    max_len=256,
    max_tokens=2048,  # 7 blocks of 256 per batch
    optimizer="adam",  # Adam, the paper's betas and eps
    betas=(0.9, 0.98),
    eps=1e-9,
    schedule="inverse_sqrt",
    warmup=200,
    lr_scale=1.0,  # peak d_model^-0.5 * warmup^-0.5 = 6.25e-3 at d_model 128
    lr=1e-3,  # the constant rate (schedule "constant" only)
    dropout=0.0,
    label_smoothing=0.0,
    positional="learned",  # the recipe's (GPT's); --positional rotary for faster runs
    d_model=128,
    n_heads=8,
    corpus="repeated",  # `aiayn prepare lm repeated` with its defaults
    row_tokens=98,  # the longest line with its marker and eos (data "lines": 32 rows a batch)
    decay_steps=None,  # linear decay reaches 0 here (None: at --updates)
)
# configs/gpt-induction-repeated-cpu.yaml's settings (`--recipe repeated`): one line of 62
# symbols (a repeated pair inside random filler) per block of 64, linear decay.
REPEATED_RECIPE: dict[str, Any] = dict(
    RECIPE,
    max_len=64,
    schedule="linear_decay",
    warmup=100,
    lr_scale=0.12,  # peak 1.5e-3 at d_model 64
    positional="rotary",
    d_model=64,
    n_heads=4,
    corpus="filler",  # --line-length 62 --max-length 31
    row_tokens=64,
    decay_steps=2000,  # the recipe's max_steps
)
RECIPES = {"bible": RECIPE, "repeated": REPEATED_RECIPE}
# ... and each variant's changes. "plain" is the plain loop: AdamW (PyTorch's
# defaults: betas 0.9, 0.999, eps 1e-8, weight decay 0.01) at a constant 1e-3, 32 rows.
VARIANTS: dict[str, dict[str, Any]] = {
    "recipe": {},
    "plain": dict(
        data="lines", optimizer="adamw", betas=(0.9, 0.999), eps=1e-8, schedule="constant"
    ),
    "adam_defaults": dict(betas=(0.9, 0.999), eps=1e-8),
    "lr_scale_0.16": dict(lr_scale=0.16),
    "constant_lr": dict(schedule="constant"),
    "linear_decay": dict(schedule="linear_decay", lr_scale=0.32),
    "lines": dict(data="lines"),
    "blocks_128": dict(max_len=128, max_tokens=4224),
    "pure_lines": dict(data="lines", corpus="pure"),  # lines of the pair alone, no filler
    "constant_pure_lines": dict(schedule="constant", data="lines", corpus="pure"),
    "constant_lr_2e-3": dict(schedule="constant", lr=2e-3),
    "heads_8": dict(n_heads=8),  # d_model 64 in 8 heads of 8 (`--recipe repeated`)
    "heads_8_constant_lr": dict(n_heads=8, schedule="constant"),
    "heads_8_decay_4000": dict(n_heads=8, decay_steps=4000),  # the decay of max_steps 4000
    "heads_8_pure_lines": dict(n_heads=8, data="lines", corpus="pure"),
    "repeat_to_fill": dict(corpus="repeat_to_fill"),  # the T symbols repeated, no filler
    "heads_8_repeat_to_fill": dict(n_heads=8, corpus="repeat_to_fill"),
    "heads_8_decay_4000_long_pairs": dict(n_heads=8, decay_steps=4000, corpus="long_pairs"),
    "dropout_0.1": dict(dropout=0.1),
    "label_smoothing_0.1": dict(label_smoothing=0.1),
}


# The corpora a variant may train on, as `aiayn prepare lm repeated` draws them.
CORPORA = {
    "repeated": RepeatedConfig(),
    "filler": RepeatedConfig(max_length=31, line_length=62),
    "pure": RepeatedConfig(max_length=31),
    "long_pairs": RepeatedConfig(min_length=24, max_length=31, line_length=62),
    "repeat_to_fill": RepeatedConfig(max_length=31, line_length=62, repeat_to_fill=True),
}


class Lines:
    """Each document (one line, eos after it) its own row, 32 rows a batch, padded."""

    def __init__(
        self, documents: list[list[int]], eos_id: int, task: LanguageModelTask, row_tokens: int
    ) -> None:
        rows = [[*doc, eos_id] for doc in documents]
        self.batches = SequenceBatches(
            rows, task.make_batch, 32 * row_tokens, task.cfg.pad_id, seed=0
        )

    def epoch(self, epoch: int):
        return self.batches.epoch(epoch)


def train_variant(
    name: str,
    corpora: dict[str, Path],
    updates: int,
    every: int,
    seed: int,
    test_ids: torch.Tensor,
    recipe: dict[str, Any],
) -> dict[str, Any]:
    """Train one variant of `recipe`; its curve of (update, first-half loss, repeated-half
    loss). `corpora` maps the names of `CORPORA` to prepared corpus directories."""
    settings = {**recipe, **VARIANTS[name]}
    from aiayn.data.corpus import PreparedCorpus

    corpus = PreparedCorpus.load(corpora[settings["corpus"]])
    tokenizer = corpus.tokenizer()
    cfg = ModelConfig.gpt(
        tokenizer.vocab_size, positional=settings["positional"], d_model=settings["d_model"],
        n_heads=settings["n_heads"], d_ff=0,
        n_layers=2,
        max_len=settings["max_len"], dropout=settings["dropout"],
        attention_dropout=settings["dropout"], pad_id=tokenizer.pad_id,
        bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id,
    )  # fmt: skip
    schedule = (
        LRSchedule.LINEAR_DECAY
        if settings["schedule"] == "linear_decay"
        else LRSchedule.INVERSE_SQRT
    )
    config = TrainConfig(
        max_tokens=settings["max_tokens"], warmup=settings["warmup"],
        lr_scale=settings["lr_scale"], lr_schedule=schedule, betas=settings["betas"],
        eps=settings["eps"], label_smoothing=settings["label_smoothing"], max_steps=updates,
        seed=seed,
    )  # fmt: skip
    task = LanguageModelTask(cfg)
    decay_steps = settings["decay_steps"] or updates
    done = 0  # updates made (the linear decay's schedule asks for it from its start)
    if settings["data"] == "blocks":
        batches = task.build_data(corpus, tokenizer, config, DistEnv()).train
    else:
        documents = tokenizer.encode_batch(read_documents(corpus, "train"))
        batches = Lines(documents, tokenizer.eos_id, task, settings["row_tokens"])
    torch.manual_seed(seed)
    model = build_model(cfg)
    if settings["optimizer"] == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=settings["lr"])
        scheduler = None
    else:
        optimizer = build_optimizer(model, config)
        if settings["schedule"] == "constant":
            for group in optimizer.param_groups:
                group["lr"] = settings["lr"]
            scheduler = None
        else:
            scheduler = build_scheduler(
                optimizer, cfg.d_model, config, fraction_done=lambda: done / decay_steps
            )
    curve, epoch, started = [], 0, time.perf_counter()

    def measure() -> None:
        first, repeated = repeat_losses(model, test_ids)
        curve.append(
            {
                "update": done,
                "first_half": round(first, 4),
                "repeated_half": round(repeated, 4),
                "lr": float(optimizer.param_groups[0]["lr"]),
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
        print(f"{name} {done:5d}: first {first:.3f} repeated {repeated:.3f}", flush=True)

    measure()
    while done < updates:
        for batch in batches.epoch(epoch):
            model.train()
            out = task.loss(model, batch, settings["label_smoothing"])
            (out.loss / batch.n_targets).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if scheduler is not None:
                scheduler.step()
            if done % every == 0:
                measure()
            if done >= updates:
                break
        epoch += 1
    phase = next((p["update"] for p in curve if p["first_half"] - p["repeated_half"] >= 1.0), None)
    rows_per_batch = (
        32 if settings["data"] == "lines" else settings["max_tokens"] // (cfg.max_len + 1)
    )
    return {
        "variant": name,
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
        "rows_per_batch": rows_per_batch,
        "phase_change_update": phase,
        "curve": curve,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--updates", type=int, default=1500)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--corpus", type=Path, help="the recipe's corpus (default: draw it)")
    parser.add_argument("--name", default="induction-causes")
    parser.add_argument("--recipe", choices=list(RECIPES), default="bible")
    parser.add_argument("--positional", help="the model's positions (default: the recipe's)")
    parser.add_argument("--length", type=int, default=40, help="T of the test sequences")
    args = parser.parse_args()
    common.set_threads(args.threads)
    recipe = dict(RECIPES[args.recipe])
    if args.positional:
        recipe["positional"] = args.positional
    names = args.variants.split(",")
    needed = {recipe["corpus"]} | {VARIANTS[n].get("corpus", recipe["corpus"]) for n in names}
    with tempfile.TemporaryDirectory() as scratch:
        corpora = {
            kind: args.corpus
            if args.corpus and kind == recipe["corpus"]
            else prepare_lm_repeated(Path(scratch) / kind, CORPORA[kind]).root
            for kind in sorted(needed)
        }
        from aiayn.data.corpus import PreparedCorpus

        tokenizer = PreparedCorpus.load(corpora[recipe["corpus"]]).tokenizer()
        ordinary = set(symbol_ids(tokenizer))
        specials = [i for i in range(tokenizer.vocab_size) if i not in ordinary]
        test_ids = repeated_random_tokens(
            tokenizer.vocab_size, args.length, 32, 1234, specials, tokenizer.eos_id
        )
        runs = [
            train_variant(name, corpora, args.updates, args.every, args.seed, test_ids, recipe)
            for name in names
        ]
    path = common.write_json(args.name, {"args": {**vars(args), "corpus": None}, "runs": runs})
    for run in runs:
        print(f"{run['variant']}: phase change at update {run['phase_change_update']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
