"""The training loop of section 5: from a recipe to a run directory of checkpoints.

`train_from_recipe(recipe, run_dir)` reads a YAML recipe, builds the task, its data
and the model, and hands them to a `Trainer`, whose `fit` loop reads top to bottom:

    resume from the latest checkpoint (if any)
    until a limit (steps, epochs, cumulative minutes) or a signal:
        one update: `accumulation` batches, the task's forward and loss, backward,
            (clip), Adam step, schedule step; a non-finite loss skips the update
        log, validate (loss, perplexity, the task's metrics), checkpoint, as scheduled
    validate and checkpoint at the end

The trainer knows the model only through its task (`aiayn.training.tasks`): the forward pass,
the loss and the data are the task's. The other concerns live beside it:
`aiayn.training.recipe` (the YAML), `aiayn.training.stopping` (limits and signals), `aiayn.training.metrics`
(metrics.jsonl, TensorBoard, log lines), `aiayn.training.precision` (autocast),
`aiayn.training.state` (what a checkpoint holds besides the weights).

A run directory holds (see also `aiayn.io.checkpoint`):

    RUN/config.yaml      the resolved recipe (every model and train field; corpus absolute)
    RUN/spm.model        the subword model, copied from the corpus
    RUN/checkpoints/     step-NNNNNNNN/ (model.safetensors + trainer.pt), best/
    RUN/metrics.jsonl    one JSON object per log line: {"kind": "train" | "valid" | ...}
    RUN/tb/              TensorBoard events (when tensorboard is installed)
    RUN/train.log        the library's log lines
    RUN/.lock            held by the one trainer of the run (`claim_run`)

A start checks everything before it writes anything, takes the run's lock (a second
trainer is refused), and removes what a killed checkpoint write left behind.
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
import logging
import math
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from aiayn.config import TrainConfig
from aiayn.config.devices import usable_device
from aiayn.data.files import (
    LockHeld,
    check_output,
    exclusive_lock,
    remove_temporaries,
    write_atomic,
    write_file_atomic,
)
from aiayn.io.checkpoint import (
    BEST_DIR,
    LOCK_FILE,
    STEP_PREFIX,
    TOKENIZER_FILE,
    latest_checkpoint,
    load_trainer_state,
    load_weights,
    save_best,
    save_checkpoint,
)
from aiayn.models import build_model
from aiayn.training import distributed
from aiayn.training.host_memory import tune_host_memory
from aiayn.training.metrics import (
    MetricsLog,
    ProgressBar,
    Window,
    log_to_file,
    train_line,
    valid_line,
)
from aiayn.training.optim import build_optimizer, build_scheduler
from aiayn.training.precision import autocast, grad_scaler, training_precision
from aiayn.training.recipe import CONFIG_FILE, Recipe, check_same_run, load_recipe, recipe_from_dict
from aiayn.training.state import (
    TrainState,
    restore_trainer_state,
    rng_state,
    trainer_state_dict,
)
from aiayn.training.stopping import SAVE, StopPolicy, StopSignals, fraction_done
from aiayn.training.tasks import Batches, Task, TaskBatch, build_task, evaluate_task

log = logging.getLogger(__name__)
T = TypeVar("T")


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
        last_valid_bleu: the latest validation BLEU (the translation task's greedy
            search on the validation subset), or None.
        signal_number: the signal that stopped it (SIGINT, SIGTERM), or None.
    """

    run_dir: Path
    steps: int
    epochs: float
    train_minutes: float
    stopped: str
    last_valid_loss: float | None
    last_valid_bleu: float | None
    signal_number: int | None = None


class Trainer:
    """Trains a model at a task on token-budget batches, with checkpoints in `run_dir`.

    Args:
        model: the bare model (not yet on `device`, not wrapped); `model.cfg.d_model`
            sets the learning-rate schedule.
        task: the forward pass, the loss and the validation metrics (`aiayn.training.tasks`).
        config: the training recipe.
        train_data: this process's training batches of `task` (sharded by rank).
        run_dir: where checkpoints, metrics and logs go (rank 0 writes).
        valid_data: validation batches (unsharded; only rank 0 validates), or None.
        device: where to train.
        progress: show a tqdm progress bar (rank 0).

    Raises:
        ValueError: a precision the device cannot train in.
    """

    def __init__(
        self,
        model: nn.Module,
        task: Task,
        config: TrainConfig,
        train_data: Batches,
        run_dir: str | Path,
        valid_data: Batches | None = None,
        device: str | torch.device = "cpu",
        progress: bool = True,
    ) -> None:
        self.device = torch.device(device)
        # before the first product (the precision's timing): oneDNN's cache and malloc
        self.host_memory = tune_host_memory() if self.device.type == "cpu" else []
        self.precision = training_precision(config.precision, self.device)
        self.config, self.task = config, task
        self.env = distributed.from_environment() if distributed.active() else distributed.DistEnv()
        self.model = model.to(self.device)
        self.train_data, self.valid_data = train_data, valid_data
        self.run_dir = Path(run_dir)
        self.progress = progress and self.env.is_main
        self.state = TrainState()
        self.optimizer = build_optimizer(self.model, config)
        self.scheduler = build_scheduler(
            self.optimizer,
            model.cfg.d_model,
            config,
            lambda: fraction_done(self.config, self.state, self.epochs()),
        )
        self.scaler = grad_scaler(self.precision, self.device)
        self._batches: Iterator[TaskBatch] | None = None
        self._metrics = MetricsLog(self.run_dir, 0, enabled=False)

    # ----- the loop ---------------------------------------------------------------

    def fit(self) -> TrainResult:
        """Train until a limit, a signal or repeated non-finite losses; return how it ended."""
        with log_to_file(self.run_dir, self.env.is_main):
            log.info(
                "training %s parameters at %s on %s",
                f"{self.model.num_parameters():,}",
                self.task.name,
                self.device,
            )
            if self.host_memory:
                log.info("host memory: %s", "; ".join(self.host_memory))
            self.resume()
            start_step = self.state.step
            if start_step == 0:  # dropout draws; a resumed run restores its RNG states instead
                torch.manual_seed(self.config.seed + self.env.rank)
            network = _training_network(self.model, self.device, self.config.compile)
            self._metrics = MetricsLog(self.run_dir, start_step, enabled=self.env.is_main)
            bar = ProgressBar(self.config.max_steps, start_step, enabled=self.progress)
            policy = StopPolicy(self.config, start_step, self.device)
            with StopSignals() as signals, self._metrics:
                self._log_data()
                stopped = self._train(network, policy, signals, bar)
                bar.close()
                self._finish(stopped, start_step)
        return self.result(stopped, signals.received)

    def _train(
        self, network: nn.Module, policy: StopPolicy, signals: StopSignals, bar: ProgressBar
    ) -> str:
        """Updates until `policy` says stop; return why."""
        window = Window()
        clock = time.monotonic()
        updates_per_epoch = len(self.train_data) / self.config.accumulation
        while True:
            now = time.monotonic()
            self.state.train_seconds += now - clock
            clock = now
            decision = policy.check(self.state, self.epochs(), signals.received is not None)
            if decision == SAVE:
                self.save()
                policy.saved()
            elif decision is not None:
                return decision

            stats = self._update(network)
            if stats is None:
                if policy.too_many_non_finite(self.state):
                    return "non_finite"
                continue
            window.add(stats)
            step = self.state.step
            bar.advance(
                step,
                stats,
                lambda per: policy.seconds_left(self.state, self.epochs(), updates_per_epoch, per),
            )
            if step % self.config.log_every_steps == 0:
                self._log_train(window.flush())
            paused = time.monotonic()  # evaluation and saving do not count in tok/s
            every = self.config.valid_every_steps
            if every and step % every == 0:
                self.validate()
            every = self.config.checkpoint_every_steps
            if every and step % every == 0:
                self.save()
                policy.saved()
            window.started += time.monotonic() - paused

    def _update(self, network: nn.Module) -> dict[str, float] | None:
        """One optimizer update over `accumulation` batches; None if the loss was not finite."""
        config, task = self.config, self.task
        batches = [self._next_batch() for _ in range(config.accumulation)]
        (tokens,) = distributed.all_reduce(
            [sum(task.target_tokens(b) for b in batches)], self.device
        )
        # Gradients of (summed loss / all target tokens of the update); DDP divides by
        # the number of processes when it averages, so multiply that back.
        scale = self.env.world_size / tokens
        lr = self.optimizer.param_groups[0]["lr"]
        network.train()
        loss_sum = nll_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            sync = (
                contextlib.nullcontext() if last or not distributed.active() else network.no_sync()
            )
            with sync:
                with self._autocast():
                    out = task.loss(network, batch.to(self.device), config.label_smoothing)
                self.scaler.scale(out.loss * scale).backward()
            loss_sum = loss_sum + out.loss.detach()
            nll_sum = nll_sum + out.nll.detach()
        loss_sum, nll_sum = distributed.all_reduce([loss_sum.item(), nll_sum.item()], self.device)

        if not math.isfinite(loss_sum):
            self._skip_update()
            return None
        if config.clip_norm is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.state.step += 1  # first: a linear_decay schedule reads the updates made
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.non_finite_in_row = 0
        return {"loss": loss_sum, "nll": nll_sum, "tokens": tokens, "lr": lr}

    def _skip_update(self) -> None:
        """Drop the gradients of a non-finite loss; count and report it."""
        self.optimizer.zero_grad(set_to_none=True)
        state = self.state
        state.non_finite_total += 1
        state.non_finite_in_row += 1
        log.warning(
            "non-finite loss at update %d: update skipped (%d in a row, %d in all)",
            state.step + 1,
            state.non_finite_in_row,
            state.non_finite_total,
        )
        self._metrics.write("non_finite", state.step + 1, {"in_row": state.non_finite_in_row})

    def _next_batch(self) -> TaskBatch:
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
        """Validation loss, perplexity and the task's metrics, logged; rank 0 only.

        Returns:
            The metrics (None on other ranks or without validation data).

        Raises:
            aiayn.data.files.WriteFailed: the disk is full (writing `best`); on every rank.
        """
        metrics = on_main_rank(self.env, self.device, self._validate, "could not validate")
        # On every rank, not only where `record_validation` ran: `_finish` decides by it
        # whether to validate (a collective) once more, and all ranks must decide alike.
        self.state.last_valid_step = self.state.step
        return metrics

    def _validate(self) -> dict[str, float] | None:
        if self.valid_data is None:
            return None
        metrics = evaluate_task(self.task, self.model, self.valid_data, self.device, self._autocast)
        step = self.state.step
        if self.state.record_validation(metrics):
            save_best(self.run_dir, self.model, {"step": step, **metrics})
        log.info("%s", valid_line(step, metrics))
        self._metrics.write("valid", step, metrics)
        return metrics

    # ----- checkpoints ----------------------------------------------------------------

    def save(self) -> Path | None:
        """Write a step checkpoint (rank 0; every rank contributes its RNG state).

        Raises:
            aiayn.data.files.WriteFailed: the disk is full or not writable; on every rank.
        """
        rng = distributed.all_gather_object(rng_state())
        parts = (self.optimizer, self.scheduler, self.scaler)

        def write() -> Path:
            state = trainer_state_dict(self.state, *parts, rng, self.env.world_size, self.config)
            return save_checkpoint(
                self.run_dir, self.state.step, self.model, state, self.config.keep_last
            )

        return on_main_rank(self.env, self.device, write, "could not write a checkpoint")

    def resume(self) -> bool:
        """Load the latest checkpoint of `run_dir`, if there is one; return whether it did."""
        checkpoint = latest_checkpoint(self.run_dir)
        if checkpoint is None:
            return False
        saved = load_trainer_state(checkpoint)
        load_weights(self.model, checkpoint / "model.safetensors", self.device)
        parts = (self.optimizer, self.scheduler, self.scaler)
        self.state = restore_trainer_state(saved, *parts, self.env, self.config.seed)
        # The next update's rate by this run's schedule, not the one saved: a
        # linear_decay run resumed with a larger budget starts again from the rate
        # that budget gives (the same value when the budget is unchanged).
        for group, base, factor in zip(
            self.optimizer.param_groups,
            self.scheduler.base_lrs,
            self.scheduler.lr_lambdas,
            strict=True,
        ):
            group["lr"] = base * factor(self.scheduler.last_epoch)
        self._batches = None
        log.info(
            "resumed from %s (update %d, epoch %.2f)", checkpoint, self.state.step, self.epochs()
        )
        return True

    # ----- small parts ------------------------------------------------------------------

    def epochs(self) -> float:
        """Passes over the training data so far (fractional)."""
        return self.state.epoch + self.state.position / len(self.train_data)

    def result(self, stopped: str, signal_number: int | None = None) -> TrainResult:
        """The `TrainResult` of the current state."""
        return TrainResult(
            run_dir=self.run_dir,
            steps=self.state.step,
            epochs=self.epochs(),
            train_minutes=self.state.train_seconds / 60,
            stopped=stopped,
            last_valid_loss=self.state.last_valid_loss,
            last_valid_bleu=self.state.last_valid_bleu,
            signal_number=signal_number,
        )

    def _autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.precision, self.device)

    def _log_data(self) -> None:
        """The training data's size and padding share, in train.log."""
        log.info(
            "%d batches per epoch per process, %.1f%% of their positions padding",
            len(self.train_data),
            100 * self.train_data.padding_fraction(),
        )

    def _log_train(self, metrics: dict[str, float]) -> None:
        metrics = {
            **metrics,
            "epoch": self.epochs(),
            "train_minutes": self.state.train_seconds / 60,
        }
        log.info("%s", train_line(self.state.step, metrics))
        self._metrics.write("train", self.state.step, metrics)


def on_main_rank(
    env: distributed.DistEnv, device: torch.device, work: Callable[[], T], failure: str
) -> T | None:
    """`work()` on global rank 0 alone (None elsewhere). When it fails there with an
    OSError or a ValueError (a full disk, a held lock), every rank raises, rather than
    the others waiting for rank 0 at their next collective until a timeout.

    Args:
        failure: what the other ranks say happened ("could not write a checkpoint").
    """
    error: Exception | None = None
    result = None
    if env.is_main:
        try:
            result = work()
        except (OSError, ValueError) as err:
            error = err
    (failed,) = distributed.all_reduce([float(error is not None)], device, op="max")
    if error is not None:
        raise error
    if failed:
        raise ValueError(f"rank 0 {failure}; see its error")
    return result


def _training_network(model: nn.Module, device: torch.device, compile: bool) -> nn.Module:
    """The model as the training forward sees it: DDP-wrapped under torchrun, compiled if
    asked. Its parameters are the model's own, so the optimizer and checkpoints use `model`."""
    network = model
    if distributed.active():
        ids = [device.index] if device.type == "cuda" else None
        network = DistributedDataParallel(network, device_ids=ids)
    if compile:
        network = torch.compile(network)
    return network


# ----- from a recipe --------------------------------------------------------------------


def resolve_device(device: str | None, env: distributed.DistEnv) -> torch.device:
    """`device`, or CUDA when available, else CPU; under torchrun, GPU `local_rank`."""
    name = device or ("cuda" if torch.cuda.is_available() else "cpu")
    resolved = usable_device(name, "device")
    if resolved.type == "cuda" and resolved.index is None:
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
    `max_minutes`, the last counting cumulative training time). A run directory
    without a checkpoint starts afresh with whatever recipe it is given. Under
    torchrun every process calls it with the same arguments.

    Everything is checked (recipe, device, precision, data, an existing run) before
    anything is written, so a failed start leaves `run_dir` as it was. Then the run is
    claimed (see `claim_run`): one trainer at a time.

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
        ValueError: a bad recipe, a run directory of a different recipe, or one
            that another trainer holds.
        aiayn.data.files.WriteFailed: (an OSError) the disk is full or not writable; the
            message names the path, and the run resumes once it can be written.
    """
    if isinstance(recipe, Recipe):
        recipe = recipe_from_dict(recipe.to_dict(), overrides) if overrides else recipe
    else:
        recipe = load_recipe(recipe, overrides)
    from aiayn.data.corpus import PreparedCorpus

    device_ = resolve_device(device, distributed.from_environment())
    run_dir = Path(run_dir)
    check_output(run_dir, "run directory", directory=True)
    corpus = PreparedCorpus.load(recipe.corpus)
    tokenizer = corpus.tokenizer()
    cfg = recipe.model_config(
        tokenizer.vocab_size, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    )
    resolved = recipe.resolved(cfg)
    check_resumable(run_dir, resolved, corpus.tokenizer_path)

    joined = not distributed.active()
    env = distributed.setup(device_)
    try:
        task = build_task(recipe.task, cfg, recipe.task_options)
        data = task.build_data(corpus, tokenizer, recipe.train, env)
        torch.manual_seed(recipe.train.seed)
        model = build_model(cfg)  # the class named by cfg.architecture (aiayn.models)
        trainer = Trainer(
            model, task, recipe.train, data.train, run_dir, data.valid,
            device=device_, progress=progress,
        )  # fmt: skip
        with claim_run(run_dir, resolved, corpus.tokenizer_path, env, device_):
            return trainer.fit()
    finally:
        if joined:
            distributed.teardown()


def check_resumable(run_dir: Path, resolved: dict, tokenizer_path: Path) -> None:
    """Refuse to resume a run that has a checkpoint from another recipe or subword model.

    A run directory without a checkpoint holds nothing to resume (a start that failed,
    or was killed before its first checkpoint) and accepts any recipe.

    Raises:
        ValueError: naming what differs.
    """
    if latest_checkpoint(run_dir) is None:
        return
    check_same_run(run_dir, resolved)
    copied = run_dir / TOKENIZER_FILE
    if copied.is_file() and copied.read_bytes() != tokenizer_path.read_bytes():
        raise ValueError(
            f"{copied} differs from {tokenizer_path}: the corpus was prepared again; "
            "use another --run directory"
        )


# What the trainer writes atomically, by directory: a kill leaves temporaries of these.
RUN_WRITES = {".": (CONFIG_FILE, TOKENIZER_FILE), "checkpoints": (f"{STEP_PREFIX}*", BEST_DIR)}


@contextlib.contextmanager
def claim_run(
    run_dir: Path,
    resolved: dict,
    tokenizer_path: Path,
    env: distributed.DistEnv,
    device: torch.device,
) -> Iterator[None]:
    """Hold the run for the training inside: on global rank 0, lock RUN/.lock, remove
    what writes killed by an earlier crash left behind, and write config.yaml and
    spm.model (atomically). Other ranks wait for rank 0 and fail with it.

    Raises:
        ValueError: another trainer holds the run (its process id named), or the run
            changed (another recipe) since `check_resumable` looked.
        aiayn.data.files.WriteFailed: (an OSError) the disk is full or not writable.
    """
    with contextlib.ExitStack() as held:
        on_main_rank(
            env,
            device,
            lambda: _start_run(held, run_dir, resolved, tokenizer_path),
            f"could not start the run {run_dir}",
        )
        yield


def _start_run(held: contextlib.ExitStack, run_dir: Path, resolved: dict, spm: Path) -> None:
    """Rank 0's part of `claim_run`; the lock is held until `held` closes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        held.enter_context(exclusive_lock(run_dir / LOCK_FILE))
    except LockHeld as err:
        raise ValueError(
            f"run {run_dir} is in use by another trainer (process {err.holder or 'unknown'}); "
            "wait for it to end or stop it, or give another --run directory"
        ) from None
    check_resumable(run_dir, resolved, spm)  # again: the run may have changed meanwhile
    for folder, names in RUN_WRITES.items():
        for leftover in remove_temporaries(run_dir / folder, names):
            log.warning("removed %s, left by a write that was killed", leftover)
    write_atomic(run_dir / CONFIG_FILE, yaml.safe_dump(resolved, sort_keys=False))
    copied = run_dir / TOKENIZER_FILE
    if not copied.is_file() or copied.read_bytes() != spm.read_bytes():
        write_file_atomic(copied, lambda tmp: shutil.copyfile(spm, tmp))
