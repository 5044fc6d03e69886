"""The training loop of section 5: from a recipe to a run directory of checkpoints.

`train_from_recipe(recipe, run_dir)` reads a YAML recipe, prepares the data and the
model, and hands them to a `Trainer`, whose `fit` loop reads top to bottom:

    resume from the latest checkpoint (if any)
    until a limit (steps, epochs, cumulative minutes) or a signal:
        one update: `accumulation` batches, forward, label-smoothed loss, backward,
            (clip), Adam step, schedule step; a non-finite loss skips the update
        log, validate (loss, perplexity, greedy BLEU), checkpoint, as scheduled
    validate and checkpoint at the end

A run directory holds (see also `aiayn.checkpoint`):

    RUN/config.yaml      the resolved recipe (every model and train field; corpus absolute)
    RUN/spm.model        the subword model, copied from the corpus
    RUN/checkpoints/     step-NNNNNNNN/ (model.safetensors + trainer.pt), best/
    RUN/metrics.jsonl    one JSON object per log line: {"kind": "train" | "valid" | ...}
    RUN/tb/              TensorBoard events (when tensorboard is installed)
    RUN/train.log        the library's log lines

Running again with the same run directory resumes exactly: weights, optimizer,
schedule, data position and every RNG state come back from the checkpoint, so on
CPU the parameters after update n are bit-identical to an uninterrupted run.

Several processes (`torchrun --nproc_per_node N -m aiayn.cli train ...`) run the
same code: each takes every N-th batch, DDP averages gradients, rank 0 writes.
Losses are normalised by the target tokens of the whole update (all batches of all
processes), so N processes with accumulation a equal one with accumulation N * a.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from aiayn import distributed
from aiayn.checkpoint import (
    TOKENIZER_FILE,
    latest_checkpoint,
    load_trainer_state,
    load_weights,
    save_best,
    save_checkpoint,
)
from aiayn.config import ModelConfig, Precision, TrainConfig, config_fields
from aiayn.data.batch import Batch
from aiayn.data.batching import TokenBatcher
from aiayn.loss import label_smoothed_cross_entropy
from aiayn.model import Transformer
from aiayn.optim import build_optimizer, build_scheduler

log = logging.getLogger(__name__)

STOP_REASONS = ("max_steps", "max_epochs", "max_minutes", "signal", "non_finite")
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class TrainResult:
    """How a call to `fit` / `train_from_recipe` ended.

    Attributes:
        run_dir: the run directory.
        steps: updates made so far, over all resumes.
        epochs: passes over the training data so far (fractional).
        train_minutes: cumulative training time over all resumes.
        stopped: why it stopped: 'max_steps', 'max_epochs', 'max_minutes',
            'signal' or 'non_finite'.
        last_valid_loss: the latest validation cross-entropy (nats per target
            token, without label smoothing), or None if never validated.
        last_valid_bleu: the latest greedy-search sacreBLEU on the validation
            subset, or None.
    """

    run_dir: Path
    steps: int
    epochs: float
    train_minutes: float
    stopped: str
    last_valid_loss: float | None
    last_valid_bleu: float | None


@dataclass
class TrainState:
    """Counters saved in every checkpoint (with the optimizer, schedule and RNG states)."""

    step: int = 0  # updates made
    epoch: int = 0  # the epoch being read, from 0
    position: int = 0  # batches of that epoch already read (by this rank)
    train_seconds: float = 0.0  # cumulative over resumes
    best_valid_loss: float | None = None
    last_valid_loss: float | None = None
    last_valid_bleu: float | None = None
    last_valid_step: int | None = None
    non_finite_total: int = 0
    non_finite_in_row: int = 0


@dataclass(frozen=True)
class BleuSet:
    """Validation sentences for BLEU during training.

    Attributes:
        sources: source ids (without specials), one list per sentence.
        references: reference translations, as text.
        detokenize: ids to text (the tokenizer's `decode`).
    """

    sources: list[list[int]]
    references: list[str]
    detokenize: Callable[[list[int]], str]


# ----- the trainer ----------------------------------------------------------------------


def has_native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bfloat16 in hardware (CUDA that supports it, AMX or
    AVX512-BF16 CPUs); elsewhere bfloat16 is emulated and slower than float32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()


def resolve_precision(precision: Precision, device: torch.device) -> Precision:
    """`Precision.AUTO` made concrete for `device`; other precisions stay as they are.

    AUTO is bf16 on CUDA devices that support it and on CPUs with native bf16
    matrix units (AMX or AVX512-BF16: measured 1.6x the fp32 training speed of a
    d_model-256 model on this project's CPU machine), and fp32 elsewhere, where
    bf16 would be emulated and slower.
    """
    if precision is not Precision.AUTO:
        return precision
    chosen = Precision.BF16 if has_native_bf16(device) else Precision.FP32
    log.info("precision auto -> %s on %s", chosen.value, device)
    return chosen


class Trainer:
    """Trains a `Transformer` on token-budget batches, with checkpoints in `run_dir`.

    Args:
        model: the bare model (not yet on `device`, not wrapped).
        config: the training recipe.
        train_data: this process's training batches (sharded by rank).
        run_dir: where checkpoints, metrics and logs go (rank 0 writes).
        valid_data: validation batches (unsharded; only rank 0 validates), or None.
        bleu_data: sentences for greedy BLEU at each validation, or None.
        device: where to train.
        progress: show a tqdm progress bar (rank 0).
    """

    def __init__(
        self,
        model: Transformer,
        config: TrainConfig,
        train_data: TokenBatcher,
        run_dir: str | Path,
        valid_data: TokenBatcher | None = None,
        bleu_data: BleuSet | None = None,
        device: str | torch.device = "cpu",
        progress: bool = True,
    ) -> None:
        self.device = torch.device(device)
        self.precision = resolve_precision(config.precision, self.device)
        if self.precision is Precision.FP16 and self.device.type != "cuda":
            raise ValueError("TrainConfig.precision fp16 needs a CUDA device; use bf16 or fp32")
        self.config = config
        self.env = distributed.from_environment() if distributed.active() else distributed.DistEnv()
        self.model = model.to(self.device)
        self.train_data, self.valid_data, self.bleu_data = train_data, valid_data, bleu_data
        self.run_dir = Path(run_dir)
        self.progress = progress and self.env.is_main
        self.optimizer = build_optimizer(self.model, config)
        self.scheduler = build_scheduler(self.optimizer, model.cfg.d_model, config)
        self.scaler = torch.amp.GradScaler(
            self.device.type, enabled=self.precision is Precision.FP16
        )
        self.state = TrainState()
        self._batches: Iterator[Batch] | None = None
        self._signal: int | None = None
        self._metrics: MetricsLog | None = None

    # ----- the loop ---------------------------------------------------------------

    def fit(self) -> TrainResult:
        """Train until a limit, a signal or repeated non-finite losses; return how it ended."""
        self.resume()
        start_step = self.state.step
        if start_step == 0:  # dropout draws; a resumed run restores its RNG states instead
            torch.manual_seed(self.config.seed + self.env.rank)
        network = self._network()
        self._metrics = MetricsLog(self.run_dir, self.state.step) if self.env.is_main else None
        bar = tqdm(
            total=self.config.max_steps,
            initial=self.state.step,
            unit="step",
            disable=not self.progress,
            dynamic_ncols=True,
        )
        window = Window()
        clock = time.monotonic()
        last_save = clock
        with self._signals_caught(), self._log_file():
            while True:
                now = time.monotonic()
                self.state.train_seconds += now - clock
                clock = now
                stopped = self._limit_reached(now - last_save, start_step)
                if stopped == "save":
                    self.save()
                    last_save = time.monotonic()
                elif stopped is not None:
                    break

                stats = self._update(network)
                if stats is None:
                    if self.state.non_finite_in_row >= self.config.max_non_finite:
                        stopped = "non_finite"
                        log.error(
                            "stopping: %d non-finite losses in a row at update %d; the last "
                            "checkpoint is intact (lower lr_scale, enable clip_norm, or use bf16 "
                            "instead of fp16)",
                            self.state.non_finite_in_row,
                            self.state.step + 1,
                        )
                        break
                    continue
                window.add(stats)
                step = self.state.step
                bar.update(1)
                if step % self.config.log_every_steps == 0:
                    self._log_train(window.flush())
                if self.progress:
                    bar.set_postfix_str(self._postfix(stats, start_step), refresh=False)
                paused = time.monotonic()  # evaluation and saving do not count in tok/s
                every = self.config.valid_every_steps
                if every and step % every == 0:
                    self.validate()
                every = self.config.checkpoint_every_steps
                if every and step % every == 0:
                    self.save()
                    last_save = time.monotonic()
                window.started += time.monotonic() - paused
            bar.close()
            self._finish(stopped, start_step)
        return self.result(stopped)

    def _limit_reached(self, since_save: float, start_step: int) -> str | None:
        """The stop reason, 'save' when a timed checkpoint is due, or None (same on all ranks)."""
        config, state = self.config, self.state
        if config.max_steps is not None and state.step >= config.max_steps:
            return "max_steps"
        if config.max_epochs is not None and self.epochs() >= config.max_epochs:
            return "max_epochs"
        minutes = config.checkpoint_every_minutes
        flags = [
            float(self._signal is not None),
            float(
                config.max_minutes is not None and state.train_seconds >= config.max_minutes * 60
            ),
            float(minutes is not None and since_save >= minutes * 60 and state.step > start_step),
        ]
        signalled, out_of_time, save_due = distributed.all_reduce(flags, self.device, op="max")
        if signalled:
            return "signal"
        if out_of_time:
            return "max_minutes"
        return "save" if save_due else None

    def _update(self, network: torch.nn.Module) -> dict[str, float] | None:
        """One optimizer update over `accumulation` batches; None if the loss was not finite."""
        config, cfg = self.config, self.model.cfg
        batches = [self._next_batch() for _ in range(config.accumulation)]
        (tokens,) = distributed.all_reduce([sum(b.n_tgt_tokens for b in batches)], self.device)
        # Gradients of (summed loss / all target tokens of the update); DDP divides by
        # the number of processes when it averages, so multiply that back.
        scale = self.env.world_size / tokens
        lr = self.optimizer.param_groups[0]["lr"]
        network.train()
        loss_sum = nll_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            batch = batch.to(self.device)
            last = i == len(batches) - 1
            sync = (
                contextlib.nullcontext() if last or not distributed.active() else network.no_sync()
            )
            with sync:
                with self._autocast():
                    logits = network(batch.src, batch.tgt_in)  # (B, T, V)
                out = label_smoothed_cross_entropy(
                    logits, batch.tgt_out, cfg.pad_id, config.label_smoothing
                )
                self.scaler.scale(out.loss * scale).backward()
            loss_sum = loss_sum + out.loss.detach()
            nll_sum = nll_sum + out.nll.detach()
        loss_sum, nll_sum = distributed.all_reduce([loss_sum.item(), nll_sum.item()], self.device)

        if not math.isfinite(loss_sum):
            self.optimizer.zero_grad(set_to_none=True)
            self.state.non_finite_total += 1
            self.state.non_finite_in_row += 1
            log.warning(
                "non-finite loss at update %d: update skipped (%d in a row, %d in all)",
                self.state.step + 1,
                self.state.non_finite_in_row,
                self.state.non_finite_total,
            )
            if self._metrics:
                self._metrics.write(
                    "non_finite", self.state.step + 1, {"in_row": self.state.non_finite_in_row}
                )
            return None
        if config.clip_norm is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        self.state.non_finite_in_row = 0
        return {"loss": loss_sum, "nll": nll_sum, "tokens": tokens, "lr": lr}

    def _next_batch(self) -> Batch:
        """The next training batch of this rank, moving to the next epoch when one ends."""
        while True:
            if self._batches is None:
                self._batches = self.train_data.epoch(self.state.epoch, skip=self.state.position)
            batch = next(self._batches, None)
            if batch is not None:
                self.state.position += 1
                return batch
            self.state.epoch += 1
            self.state.position = 0
            self._batches = None

    def _finish(self, stopped: str, start_step: int) -> None:
        """Validate and checkpoint at a clean stop (not after non-finite losses)."""
        if stopped == "non_finite" or self.state.step == start_step:
            return  # nothing new to save; the latest checkpoint stays as it is
        if stopped != "signal" and self.state.last_valid_step != self.state.step:
            self.validate()
        path = self.save()
        log.info("stopped (%s) after update %d; checkpoint %s", stopped, self.state.step, path)

    # ----- validation ---------------------------------------------------------------

    @torch.no_grad()
    def validate(self) -> dict[str, float] | None:
        """Validation loss, perplexity and (optionally) BLEU, logged; rank 0 only.

        Returns:
            The metrics (None on other ranks or without validation data).
        """
        if not self.env.is_main or self.valid_data is None:
            return None
        model, cfg = self.model, self.model.cfg
        model.eval()
        nll = tokens = 0.0
        for batch in self.valid_data.epoch(0):
            batch = batch.to(self.device)
            with self._autocast():
                logits = model(batch.src, batch.tgt_in)
            out = label_smoothed_cross_entropy(logits, batch.tgt_out, cfg.pad_id, 0.0)
            nll += out.nll.item()
            tokens += out.n_tokens
        metrics = {"loss": nll / tokens, "ppl": math.exp(min(nll / tokens, 50.0))}
        if self.bleu_data is not None and self.bleu_data.sources:
            metrics["bleu"] = self._bleu()
        model.train()
        state = self.state
        state.last_valid_loss, state.last_valid_step = metrics["loss"], state.step
        state.last_valid_bleu = metrics.get("bleu")
        if state.best_valid_loss is None or metrics["loss"] < state.best_valid_loss:
            state.best_valid_loss = metrics["loss"]
            save_best(self.run_dir, self.model, {"step": state.step, **metrics})
        log.info(
            "valid at update %d: loss %.4f, ppl %.2f%s",
            state.step,
            metrics["loss"],
            metrics["ppl"],
            f", BLEU {metrics['bleu']:.2f}" if "bleu" in metrics else "",
        )
        if self._metrics:
            self._metrics.write("valid", state.step, metrics)
        return metrics

    def _bleu(self, sentences_per_batch: int = 64) -> float:
        from aiayn.evaluate import score
        from aiayn.search import greedy_search

        data, cfg = self.bleu_data, self.model.cfg
        hypotheses = []
        for start in range(0, len(data.sources), sentences_per_batch):
            chunk = data.sources[start : start + sentences_per_batch]
            src = Batch.from_pairs([(s, []) for s in chunk], cfg.pad_id, cfg.bos_id, cfg.eos_id).src
            with self._autocast():
                found = greedy_search(self.model, src.to(self.device))
            hypotheses += [data.detokenize(h[0].tokens) for h in found]
        return score(hypotheses, data.references).bleu

    # ----- checkpoints ----------------------------------------------------------------

    def save(self) -> Path | None:
        """Write a step checkpoint (rank 0; every rank contributes its RNG state)."""
        rng = distributed.all_gather_object(_rng_state())
        if not self.env.is_main:
            return None
        trainer_state = {
            "state": vars(self.state).copy(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng,
            "world_size": self.env.world_size,
            "config": self.config.to_dict(),
        }
        return save_checkpoint(
            self.run_dir, self.state.step, self.model, trainer_state, self.config.keep_last
        )

    def resume(self) -> bool:
        """Load the latest checkpoint of `run_dir`, if there is one; return whether it did."""
        checkpoint = latest_checkpoint(self.run_dir)
        if checkpoint is None:
            return False
        saved = load_trainer_state(checkpoint)
        load_weights(self.model, checkpoint / "model.safetensors", self.device)
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.scaler.load_state_dict(saved["scaler"])
        self.state = TrainState(**saved["state"])
        self._batches = None
        if saved["world_size"] == self.env.world_size:
            _set_rng_state(saved["rng"][self.env.rank])
        else:
            log.warning(
                "checkpoint written by %d processes, resumed by %d: data order is kept, "
                "dropout draws differ from an uninterrupted run",
                saved["world_size"],
                self.env.world_size,
            )
            torch.manual_seed(self.config.seed + 1000 * self.state.step + self.env.rank)
        log.info(
            "resumed from %s (update %d, epoch %.2f)", checkpoint, self.state.step, self.epochs()
        )
        return True

    # ----- small parts ------------------------------------------------------------------

    def epochs(self) -> float:
        """Passes over the training data so far (fractional)."""
        return self.state.epoch + self.state.position / len(self.train_data)

    def result(self, stopped: str) -> TrainResult:
        """The `TrainResult` of the current state."""
        return TrainResult(
            run_dir=self.run_dir,
            steps=self.state.step,
            epochs=self.epochs(),
            train_minutes=self.state.train_seconds / 60,
            stopped=stopped,
            last_valid_loss=self.state.last_valid_loss,
            last_valid_bleu=self.state.last_valid_bleu,
        )

    def _network(self) -> torch.nn.Module:
        """The model as the training forward sees it: DDP-wrapped, compiled, as configured."""
        network: torch.nn.Module = self.model
        if distributed.active():
            ids = [self.device.index] if self.device.type == "cuda" else None
            network = DistributedDataParallel(network, device_ids=ids)
        if self.config.compile:
            network = torch.compile(network)
        return network

    def _autocast(self) -> contextlib.AbstractContextManager:
        precision = self.precision
        if precision is Precision.FP32:
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if precision is Precision.BF16 else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def _log_train(self, metrics: dict[str, float]) -> None:
        metrics = {
            **metrics,
            "epoch": self.epochs(),
            "train_minutes": self.state.train_seconds / 60,
        }
        log.info(
            "update %d: loss %.4f, lr %.3g, %.0f tgt tok/s, epoch %.2f",
            self.state.step,
            metrics["loss"],
            metrics["lr"],
            metrics["tgt_tokens_per_s"],
            metrics["epoch"],
        )
        if self._metrics:
            self._metrics.write("train", self.state.step, metrics)

    def _postfix(self, stats: dict[str, float], start_step: int) -> str:
        per_step = (time.monotonic() - self._started) / max(self.state.step - start_step, 1)
        return (
            f"loss {stats['loss'] / stats['tokens']:.3f} lr {stats['lr']:.2e} "
            f"tok/s {stats['tokens'] / per_step:,.0f} eta {_eta(self, per_step)}"
        )

    @contextlib.contextmanager
    def _signals_caught(self):
        """SIGINT / SIGTERM ask the loop to save and stop; a second SIGINT stops at once."""
        self._started = time.monotonic()
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum, frame):
            if self._signal is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self._signal = signum
            log.warning(
                "%s received: saving a checkpoint, then stopping", signal.Signals(signum).name
            )

        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, old in previous.items():
                signal.signal(s, old)

    @contextlib.contextmanager
    def _log_file(self):
        """The library's log lines also go to RUN/train.log (rank 0)."""
        if not self.env.is_main:
            yield
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(self.run_dir / "train.log", encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        handler.setLevel(logging.INFO)
        package = logging.getLogger("aiayn")
        level = package.level
        package.addHandler(handler)
        if package.getEffectiveLevel() > logging.INFO:
            package.setLevel(logging.INFO)
        try:
            yield
        finally:
            package.removeHandler(handler)
            package.setLevel(level)
            handler.close()
            if self._metrics:
                self._metrics.close()


def _eta(trainer: Trainer, seconds_per_step: float) -> str:
    """Time left until the first limit, as H:MM:SS."""
    config, state = trainer.config, trainer.state
    left = []
    if config.max_steps is not None:
        left.append((config.max_steps - state.step) * seconds_per_step)
    if config.max_epochs is not None:
        steps_per_epoch = len(trainer.train_data) / config.accumulation
        left.append((config.max_epochs - trainer.epochs()) * steps_per_epoch * seconds_per_step)
    if config.max_minutes is not None:
        left.append(config.max_minutes * 60 - state.train_seconds)
    seconds = max(0, int(min(left)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Window:
    """Training statistics summed since the last log line."""

    def __init__(self) -> None:
        self.loss = self.nll = self.tokens = 0.0
        self.updates = 0
        self.lr = 0.0
        self.started = time.monotonic()

    def add(self, stats: dict[str, float]) -> None:
        self.loss += stats["loss"]
        self.nll += stats["nll"]
        self.tokens += stats["tokens"]
        self.updates += 1
        self.lr = stats["lr"]

    def flush(self) -> dict[str, float]:
        seconds = max(time.monotonic() - self.started, 1e-9)
        out = {
            "loss": self.loss / self.tokens,
            "nll": self.nll / self.tokens,
            "ppl": math.exp(min(self.nll / self.tokens, 50.0)),
            "lr": self.lr,
            "tgt_tokens_per_s": self.tokens / seconds,
            "tokens_per_update": self.tokens / self.updates,
        }
        self.__init__()
        return out


class MetricsLog:
    """RUN/metrics.jsonl (appended; a resumed run repeats the steps after its checkpoint)
    and TensorBoard scalars in RUN/tb when tensorboard is installed."""

    _warned = False

    def __init__(self, run_dir: Path, step: int) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.file = open(run_dir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115
        self.board = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.board = SummaryWriter(str(run_dir / "tb"), purge_step=step + 1 if step else None)
        except ImportError:
            if not MetricsLog._warned:
                log.warning(
                    "tensorboard is not installed: no TensorBoard events (pip install tensorboard)"
                )
                MetricsLog._warned = True

    def write(self, kind: str, step: int, values: dict[str, float]) -> None:
        self.file.write(
            json.dumps({"kind": kind, "step": step, "time": time.time(), **values}) + "\n"
        )
        self.file.flush()
        if self.board is not None:
            for name, value in values.items():
                self.board.add_scalar(f"{kind}/{name}", value, step)

    def close(self) -> None:
        self.file.close()
        if self.board is not None:
            self.board.close()


def _rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----- recipes --------------------------------------------------------------------------

PRESETS = ("tiny", "base", "big")
DATA_KEYS = ("corpus",)
RESUMABLE_KEYS = ("train.max_steps", "train.max_epochs", "train.max_minutes")


@dataclass(frozen=True)
class Recipe:
    """A training recipe: the corpus, the model and the training settings.

    Attributes:
        corpus: a directory prepared by `aiayn prepare` (absolute).
        model: `preset` (tiny | base | big, optional) and any `ModelConfig` fields;
            vocab_size and the special ids come from the corpus's subword model
            when absent.
        train: the training settings.
    """

    corpus: Path
    model: dict[str, Any] = field(default_factory=dict)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(max_epochs=1))

    def model_config(self, vocab_size: int, pad_id: int, bos_id: int, eos_id: int) -> ModelConfig:
        """The `ModelConfig` for a tokenizer with these sizes and ids.

        Raises:
            ValueError: a field is out of range, or a special id disagrees with the
                tokenizer's.
        """
        fields = dict(self.model)
        preset = fields.pop("preset", None)
        tokenizer = {"vocab_size": vocab_size, "pad_id": pad_id, "bos_id": bos_id, "eos_id": eos_id}
        for name, value in tokenizer.items():
            if fields.setdefault(name, value) != value:
                raise ValueError(
                    f"model.{name} is {fields[name]} but the corpus's subword model has {value}"
                )
        if preset is None:
            return ModelConfig.from_dict(fields)
        unknown = sorted(set(fields) - config_fields(ModelConfig))
        if unknown:
            raise ValueError(f"unknown model key(s): {', '.join(unknown)}")
        return getattr(ModelConfig, preset)(**fields)

    def to_dict(self) -> dict[str, Any]:
        """The recipe as YAML-ready plain types."""
        return {
            "data": {"corpus": str(self.corpus)},
            "model": dict(self.model),
            "train": self.train.to_dict(),
        }


def _check_keys(section: str, keys: Sequence[str], where: str) -> None:
    allowed = {
        "data": set(DATA_KEYS),
        "model": config_fields(ModelConfig) | {"preset"},
        "train": config_fields(TrainConfig),
    }[section]
    unknown = [f"{section}.{k}" for k in keys if k not in allowed]
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}")


def recipe_from_dict(
    values: dict[str, Any],
    overrides: Sequence[str] = (),
    base_dir: Path | None = None,
    where: str = "recipe",
) -> Recipe:
    """Build a `Recipe` from its YAML form plus `key=value` overrides.

    Args:
        values: {"data": {"corpus": DIR}, "model": {...}, "train": {...}}.
        overrides: dotted keys with YAML values: "train.lr_scale=2", "model.d_model=256".
        base_dir: the recipe file's directory. A relative corpus path from the file is
            looked for there first, then in the current directory; one from an
            override is relative to the current directory.
        where: names the source in error messages.

    Raises:
        ValueError: unknown sections or keys (named), malformed overrides, bad values.
    """
    if not isinstance(values, dict):
        raise ValueError(f"{where}: expected a mapping with data, model and train sections")
    unknown = sorted(set(values) - {"data", "model", "train"})
    if unknown:
        raise ValueError(
            f"{where}: unknown section(s) {', '.join(unknown)} (expected data, model, train)"
        )
    sections: dict[str, dict[str, Any]] = {}
    for name in ("data", "model", "train"):
        section = values.get(name) or {}
        if not isinstance(section, dict):
            raise ValueError(f"{where}: section {name} must be a mapping")
        _check_keys(name, list(section), where)
        sections[name] = dict(section)
    corpus_from_file = "corpus" in sections["data"]
    for item in overrides:
        key, equals, text = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not equals or not dot or section not in sections or not name:
            raise ValueError(
                f"override {item!r}: expected SECTION.KEY=VALUE with SECTION data, model or train"
            )
        _check_keys(section, [name], "override")
        try:
            sections[section][name] = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ValueError(f"override {item!r}: not a YAML value: {err}") from None
        if key.strip() == "data.corpus":
            corpus_from_file = False
    if "corpus" not in sections["data"]:
        raise ValueError(f"{where}: data.corpus is missing (a directory from `aiayn prepare`)")
    corpus = Path(str(sections["data"]["corpus"])).expanduser()
    if not corpus.is_absolute():
        candidates = [base_dir / corpus] if corpus_from_file and base_dir is not None else []
        candidates.append(Path.cwd() / corpus)
        corpus = next((c for c in candidates if c.exists()), candidates[-1])
    preset = sections["model"].get("preset")
    if preset is not None and preset not in PRESETS:
        raise ValueError(
            f"{where}: model.preset must be one of {', '.join(PRESETS)}, got {preset!r}"
        )
    try:
        train = TrainConfig(**sections["train"])
    except TypeError as err:
        raise ValueError(f"{where}: train: {err}") from None
    return Recipe(corpus=corpus.resolve(), model=sections["model"], train=train)


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Read a YAML recipe and apply `key=value` overrides (see `recipe_from_dict`).

    Raises:
        FileNotFoundError: no such file.
        ValueError: invalid YAML, unknown keys (named) or bad values.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe not found: {path}")
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML: {err}") from None
    return recipe_from_dict(values, overrides, base_dir=path.parent.resolve(), where=str(path))


def _flatten(resolved: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {f"{s}.{k}": v for s, section in resolved.items() for k, v in section.items()}


def _check_same_run(run_dir: Path, resolved: dict[str, dict[str, Any]]) -> None:
    """Refuse to resume a run made with another recipe (limits excepted)."""
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return
    old = _flatten(yaml.safe_load(path.read_text(encoding="utf-8")) or {})
    new = _flatten(resolved)
    differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    differ = [k for k in differ if k not in RESUMABLE_KEYS]
    if differ:
        raise ValueError(
            f"{run_dir} holds a run of another recipe: {', '.join(differ)} differ from its "
            f"{CONFIG_FILE} (only {', '.join(RESUMABLE_KEYS)} may change when resuming); "
            "use another --run directory"
        )


def _fitting(
    pairs: list[tuple[list[int], list[int]]], limit: int, split: str
) -> list[tuple[list[int], list[int]]]:
    """Pairs whose sides, with one special token, fit `limit`; the others are counted and logged."""
    kept = [p for p in pairs if len(p[0]) < limit and len(p[1]) < limit]
    if len(kept) < len(pairs):
        log.warning(
            "%s: %d pair(s) longer than %d tokens left out", split, len(pairs) - len(kept), limit
        )
    return kept


def resolve_device(device: str | None, env: distributed.DistEnv) -> torch.device:
    """`device`, or CUDA when available, else CPU; under torchrun, GPU `local_rank`."""
    name = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r}: not a device name (cpu, cuda, cuda:1, ...)") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: no CUDA device is available here")
        if resolved.index is None:
            resolved = torch.device("cuda", env.local_rank)
    return resolved


def train_from_recipe(
    recipe: str | Path | Recipe,
    run_dir: str | Path,
    overrides: Sequence[str] = (),
    device: str | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train (or resume training) a model from a recipe into `run_dir`.

    Calling it again with the same `run_dir` resumes from the latest checkpoint; the
    recipe may then differ only in its limits (`train.max_steps`, `max_epochs`,
    `max_minutes`, the last counting cumulative training time). Under torchrun every
    process calls it with the same arguments.

    Args:
        recipe: a YAML file or a `Recipe`.
        run_dir: the run directory (created).
        overrides: "section.key=value" strings applied to the recipe.
        device: "cpu", "cuda", "cuda:1"...; default CUDA if available, else CPU.
        progress: show a progress bar.

    Returns:
        How the run ended (see `TrainResult`).

    Raises:
        FileNotFoundError: the recipe or the corpus is missing.
        ValueError: a bad recipe, or a run directory of a different recipe.
    """
    if isinstance(recipe, Recipe):
        recipe = recipe_from_dict(recipe.to_dict(), overrides) if overrides else recipe
    else:
        recipe = load_recipe(recipe, overrides)
    from aiayn.data.corpus import PreparedCorpus

    env = distributed.from_environment()
    device_ = resolve_device(device, env)
    run_dir = Path(run_dir)
    corpus = PreparedCorpus.load(recipe.corpus)
    tokenizer = corpus.tokenizer()
    cfg = recipe.model_config(
        tokenizer.vocab_size, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    )
    train = recipe.train
    resolved = {
        "data": {"corpus": str(recipe.corpus)},
        "model": cfg.to_dict(),
        "train": train.to_dict(),
    }
    _check_same_run(run_dir, resolved)
    copied = run_dir / TOKENIZER_FILE
    if copied.is_file() and copied.read_bytes() != corpus.tokenizer_path.read_bytes():
        raise ValueError(
            f"{copied} differs from {corpus.tokenizer_path}: the corpus was prepared again"
        )

    joined = not distributed.active()
    env = distributed.setup(device_)
    try:
        if env.is_main:
            from aiayn.data.corpus import write_atomic

            run_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(run_dir / CONFIG_FILE, yaml.safe_dump(resolved, sort_keys=False))
            if not copied.is_file():
                shutil.copyfile(corpus.tokenizer_path, copied)
        limit = min(train.max_tokens, cfg.max_len)
        train_pairs = _encode(tokenizer, corpus.read("train"))
        train_pairs = _fitting(train_pairs, limit, "train")
        valid_text = corpus.read("valid")
        valid_pairs = _fitting(_encode(tokenizer, valid_text), limit, "valid")
        specials = (cfg.pad_id, cfg.bos_id, cfg.eos_id)
        train_data = TokenBatcher(
            train_pairs, train.max_tokens, *specials, seed=train.seed,
            rank=env.rank, world_size=env.world_size,
        )  # fmt: skip
        valid_data = (
            TokenBatcher(valid_pairs, train.max_tokens, *specials, shuffle=False)
            if valid_pairs
            else None
        )
        bleu_data = None
        if train.valid_bleu_sentences and valid_text:
            chosen = valid_text[: train.valid_bleu_sentences]
            sources = tokenizer.encode_batch([s for s, _ in chosen])
            keep = [i for i, s in enumerate(sources) if len(s) < cfg.max_len]
            bleu_data = BleuSet(
                [sources[i] for i in keep], [chosen[i][1] for i in keep], tokenizer.decode
            )
        torch.manual_seed(train.seed)
        model = Transformer(cfg)
        log.info(
            "training %s parameters on %d pairs (%d batches per epoch per process) on %s",
            f"{model.num_parameters():,}", len(train_pairs), len(train_data), device_,
        )  # fmt: skip
        trainer = Trainer(
            model, train, train_data, run_dir, valid_data, bleu_data, device_, progress
        )
        return trainer.fit()
    finally:
        if joined:
            distributed.teardown()


def _encode(tokenizer, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    if not pairs:
        return []
    sources = tokenizer.encode_batch([s for s, _ in pairs])
    targets = tokenizer.encode_batch([t for _, t in pairs])
    return list(zip(sources, targets, strict=True))
