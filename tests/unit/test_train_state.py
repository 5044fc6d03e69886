"""Trainer state: RNG capture and restore, and the trainer.pt round trip."""

from __future__ import annotations

import logging
import random

import numpy as np
import torch

from aiayn.config import TrainConfig
from aiayn.training.distributed import DistEnv
from aiayn.training.state import (
    TrainState,
    restore_trainer_state,
    rng_state,
    set_rng_state,
    trainer_state_dict,
)

CONFIG = TrainConfig(max_steps=10, warmup=2)


def draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_restored_rng_states_repeat_the_same_draws():
    saved = rng_state()
    first = draws()
    set_rng_state(saved)
    assert draws() == first


def parts() -> tuple:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step + 1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    return model, optimizer, scheduler, scaler


def test_trainer_state_round_trips_counters_optimizer_schedule_and_rng():
    model, optimizer, scheduler, scaler = parts()
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    state = TrainState(step=1, epoch=2, position=3, train_seconds=4.5, non_finite_total=1)
    saved = trainer_state_dict(state, optimizer, scheduler, scaler, [rng_state()], 1, CONFIG)
    expected = draws()
    _, optimizer2, scheduler2, scaler2 = parts()
    restored = restore_trainer_state(saved, optimizer2, scheduler2, scaler2, DistEnv(), seed=0)
    assert restored == state and draws() == expected
    assert scheduler2.last_epoch == scheduler.last_epoch
    exp_avg = [s["exp_avg"] for s in optimizer.state_dict()["state"].values()]
    exp_avg2 = [s["exp_avg"] for s in optimizer2.state_dict()["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(exp_avg, exp_avg2, strict=True))


def test_another_number_of_processes_reseeds_with_a_warning(caplog):
    _, optimizer, scheduler, scaler = parts()
    two = [rng_state(), rng_state()]
    saved = trainer_state_dict(TrainState(step=3), optimizer, scheduler, scaler, two, 2, CONFIG)
    with caplog.at_level(logging.WARNING, logger="aiayn"):
        restore_trainer_state(saved, optimizer, scheduler, scaler, DistEnv(), seed=7)
    assert "written by 2 processes, resumed by 1" in caplog.text
    resumed = torch.rand(3)
    torch.manual_seed(7 + 1000 * 3)
    assert torch.equal(resumed, torch.rand(3))


def test_record_validation_keeps_the_best_loss():
    state = TrainState(step=4)
    assert state.record_validation({"loss": 2.0, "ppl": 7.4, "bleu": 3.0})
    state.step = 6
    assert not state.record_validation({"loss": 2.5, "ppl": 12.2})
    assert (state.best_valid_loss, state.last_valid_loss, state.last_valid_step) == (2.0, 2.5, 6)
    assert state.last_valid_bleu is None
