"""What a checkpoint must hold for a resumed run to continue exactly: the trainer's state.

Beside the weights (`aiayn.io.checkpoint` writes those), a step checkpoint's trainer.pt
holds the loop's counters (`TrainState`), the optimizer, schedule and gradient-scaler
states, and every process's RNG states (Python, NumPy, torch, CUDA). Restored
together, the parameters after update n of a resumed run on CPU are bit-identical to
those of an uninterrupted run.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from aiayn.config import TrainConfig
from aiayn.training.distributed import DistEnv

log = logging.getLogger(__name__)


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

    def record_validation(self, metrics: dict[str, float]) -> bool:
        """Note a validation at the current step; return whether its loss is the best yet."""
        self.last_valid_loss, self.last_valid_step = metrics["loss"], self.step
        self.last_valid_bleu = metrics.get("bleu")
        if self.best_valid_loss is not None and metrics["loss"] >= self.best_valid_loss:
            return False
        self.best_valid_loss = metrics["loss"]
        return True


def rng_state() -> dict[str, Any]:
    """This process's random number generator states."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore states from `rng_state` (the CUDA ones only where CUDA is available)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainer_state_dict(
    state: TrainState,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    rng: list[dict[str, Any]],
    world_size: int,
    config: TrainConfig,
) -> dict[str, Any]:
    """The trainer.pt of a step checkpoint.

    Args:
        state: the loop's counters.
        optimizer, scheduler, scaler: their states are saved.
        rng: every process's `rng_state()`, in rank order.
        world_size: the number of processes that wrote it.
        config: the training settings (for the record; resuming reads the recipe).
    """
    return {
        "state": vars(state).copy(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": rng,
        "world_size": world_size,
        "config": config.to_dict(),
    }


def restore_trainer_state(
    saved: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    env: DistEnv,
    seed: int,
) -> TrainState:
    """Load a `trainer_state_dict` into the optimizer, schedule, scaler and this
    process's RNGs; return the counters.

    When the checkpoint was written by another number of processes, the RNGs are
    seeded from `seed`, the step and this process's rank instead: the data order is kept, the
    dropout draws differ from an uninterrupted run (a warning says so).
    """
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    scaler.load_state_dict(saved["scaler"])
    state = TrainState(**saved["state"])
    if saved["world_size"] == env.world_size:
        set_rng_state(saved["rng"][env.rank])
    else:
        log.warning(
            "checkpoint written by %d processes, resumed by %d: data order is kept, "
            "dropout draws differ from an uninterrupted run",
            saved["world_size"],
            env.world_size,
        )
        torch.manual_seed(seed + 1000 * state.step + env.rank)
    return state
