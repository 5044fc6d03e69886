"""When the training loop stops or saves: limits, timed checkpoints, signals, non-finite losses.

The loop asks `StopPolicy.check` before every update. The answer is one of
`STOP_REASONS`, `SAVE` (a timed checkpoint is due, then carry on) or None, and it is
the same on every process: the conditions one process may see alone (a signal, the
clock) are combined over all processes first. `StopSignals` turns SIGINT and SIGTERM
into the 'signal' stop: save a checkpoint, then stop.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

import torch

from aiayn.config import TrainConfig
from aiayn.training import distributed
from aiayn.training.state import TrainState

log = logging.getLogger(__name__)

STOP_REASONS = ("max_steps", "max_epochs", "max_minutes", "signal", "non_finite")
SAVE = "save"  # `StopPolicy.check`: a timed checkpoint is due; not a reason to stop


class StopPolicy:
    """The limits of `TrainConfig` applied to the loop's state.

    Args:
        config: max_steps, max_epochs, max_minutes (cumulative training time),
            checkpoint_every_minutes and max_non_finite are read.
        start_step: the update this run (or resume) started from; a timed
            checkpoint needs at least one update after it.
        device: where the flags are combined over processes.
        clock: seconds, for timed checkpoints (a fake one in tests).
    """

    def __init__(
        self,
        config: TrainConfig,
        start_step: int,
        device: torch.device,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config, self.start_step, self.device, self.clock = config, start_step, device, clock
        self.last_save = clock()

    def check(self, state: TrainState, epochs: float, signalled: bool) -> str | None:
        """The stop reason, `SAVE` when a timed checkpoint is due, or None.

        Args:
            state: the loop's counters (`step`, `train_seconds`).
            epochs: passes over the training data so far (fractional).
            signalled: this process received SIGINT or SIGTERM.
        """
        config = self.config
        if config.max_steps is not None and state.step >= config.max_steps:
            return "max_steps"
        if config.max_epochs is not None and epochs >= config.max_epochs:
            return "max_epochs"
        minutes = config.checkpoint_every_minutes
        since_save = self.clock() - self.last_save
        flags = [
            float(signalled),
            float(
                config.max_minutes is not None and state.train_seconds >= config.max_minutes * 60
            ),
            float(
                minutes is not None and since_save >= minutes * 60 and state.step > self.start_step
            ),
        ]
        signalled, out_of_time, save_due = distributed.all_reduce(flags, self.device, op="max")
        if signalled:
            return "signal"
        if out_of_time:
            return "max_minutes"
        return SAVE if save_due else None

    def saved(self) -> None:
        """A checkpoint was just written: the next timed one is due a period from now."""
        self.last_save = self.clock()

    def too_many_non_finite(self, state: TrainState) -> bool:
        """Whether the non-finite losses in a row reached `max_non_finite` (logged if so)."""
        if state.non_finite_in_row < self.config.max_non_finite:
            return False
        log.error(
            "stopping: %d non-finite losses in a row at update %d; the last checkpoint is "
            "intact (lower lr_scale, enable clip_norm, or use bf16 instead of fp16)",
            state.non_finite_in_row,
            state.step + 1,
        )
        return True

    def seconds_left(
        self, state: TrainState, epochs: float, updates_per_epoch: float, seconds_per_update: float
    ) -> float:
        """Estimated seconds until the first limit, at `seconds_per_update` (0 when past it)."""
        config = self.config
        left = []
        if config.max_steps is not None:
            left.append((config.max_steps - state.step) * seconds_per_update)
        if config.max_epochs is not None:
            left.append((config.max_epochs - epochs) * updates_per_epoch * seconds_per_update)
        if config.max_minutes is not None:
            left.append(config.max_minutes * 60 - state.train_seconds)
        return max(0.0, min(left))


def fraction_done(config: TrainConfig, state: TrainState, epochs: float) -> float:
    """The share of the run's budget spent: the largest over its limits (steps, epochs,
    minutes of training time), so 1.0 exactly when `StopPolicy` stops the run."""
    shares = []
    if config.max_steps is not None:
        shares.append(state.step / config.max_steps)
    if config.max_epochs is not None:
        shares.append(epochs / config.max_epochs)
    if config.max_minutes is not None:
        shares.append(state.train_seconds / (config.max_minutes * 60))
    return max(shares)


class StopSignals:
    """SIGINT / SIGTERM ask the loop to save and stop; a second SIGINT stops at once.

    A context manager: the handlers are installed on entry and the previous ones
    come back on exit. Outside the main thread (where Python allows no handlers) it
    catches nothing.

    Attributes:
        received: the first signal's number, or None.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {
                s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)
            }
        return self

    def __exit__(self, *exc_info: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.received is None:
            self.received = signum
        log.warning("%s received: saving a checkpoint, then stopping", signal.Signals(signum).name)
