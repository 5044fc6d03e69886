"""The stop policy: limits, timed checkpoints, non-finite losses, signals."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from aiayn.config import TrainConfig
from aiayn.training.state import TrainState
from aiayn.training.stopping import SAVE, StopPolicy, StopSignals, fraction_done

CPU = torch.device("cpu")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def policy(start_step: int = 0, clock: FakeClock | None = None, **limits) -> StopPolicy:
    config = TrainConfig(**{"checkpoint_every_minutes": None, **limits})
    return StopPolicy(config, start_step, CPU, clock=clock or FakeClock())


def test_max_steps_and_max_epochs_stop_at_the_limit_not_before():
    steps = policy(max_steps=5)
    assert steps.check(TrainState(step=4), epochs=0.5, signalled=False) is None
    assert steps.check(TrainState(step=5), epochs=0.5, signalled=False) == "max_steps"
    epochs = policy(max_epochs=2)
    assert epochs.check(TrainState(step=99), epochs=1.99, signalled=False) is None
    assert epochs.check(TrainState(step=99), epochs=2.0, signalled=False) == "max_epochs"


def test_max_minutes_counts_the_state_s_cumulative_training_seconds():
    minutes = policy(max_minutes=1.5)
    assert minutes.check(TrainState(train_seconds=89.9), 0.0, signalled=False) is None
    assert minutes.check(TrainState(train_seconds=90.0), 0.0, signalled=False) == "max_minutes"


def test_a_signal_stops_but_a_reached_step_limit_is_named_first():
    limits = policy(max_steps=5)
    assert limits.check(TrainState(step=1), 0.0, signalled=True) == "signal"
    assert limits.check(TrainState(step=5), 0.0, signalled=True) == "max_steps"


def test_timed_checkpoint_is_due_a_period_after_the_last_save_and_after_an_update():
    clock = FakeClock()
    timed = policy(start_step=3, clock=clock, max_steps=100, checkpoint_every_minutes=2)
    clock.now += 120
    assert timed.check(TrainState(step=3), 0.0, signalled=False) is None  # no update yet
    assert timed.check(TrainState(step=4), 0.0, signalled=False) == SAVE
    timed.saved()
    clock.now += 119
    assert timed.check(TrainState(step=9), 0.0, signalled=False) is None
    clock.now += 1
    assert timed.check(TrainState(step=9), 0.0, signalled=False) == SAVE


def test_non_finite_losses_in_a_row_reach_the_limit():
    limit = policy(max_steps=10, max_non_finite=3)
    assert not limit.too_many_non_finite(TrainState(non_finite_in_row=2, non_finite_total=9))
    assert limit.too_many_non_finite(TrainState(non_finite_in_row=3))


def test_seconds_left_is_the_nearest_limit():
    both = policy(max_steps=100, max_epochs=2, max_minutes=10)
    state = TrainState(step=40, train_seconds=500.0)
    # steps: 60 updates * 2 s; epochs: 0.5 epoch * 50 updates * 2 s; minutes: 600 - 500 s
    assert both.seconds_left(state, 1.5, updates_per_epoch=50, seconds_per_update=2) == 50
    assert both.seconds_left(TrainState(step=200), 3, 50, 2) == 0


def test_fraction_done_is_the_largest_share_of_any_limit_and_1_where_the_policy_stops():
    config = TrainConfig(max_steps=100, max_epochs=4, max_minutes=10)
    # steps 40/100, epochs 1/4, minutes 300 s / 600 s: the minutes are furthest along
    assert fraction_done(config, TrainState(step=40, train_seconds=300.0), 1.0) == 0.5
    assert fraction_done(config, TrainState(step=90, train_seconds=0.0), 3.0) == 0.9
    only_minutes = TrainConfig(max_minutes=1.5)
    state = TrainState(step=10**6, train_seconds=90.0)  # steps do not count without max_steps
    assert fraction_done(only_minutes, state, 50.0) == 1.0
    assert policy(max_minutes=1.5).check(state, 50.0, signalled=False) == "max_minutes"


def test_stop_signals_record_the_first_signal_and_restore_the_handlers():
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with StopSignals() as signals:
        assert signals.received is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.received == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):  # a second SIGINT stops at once
            os.kill(os.getpid(), signal.SIGINT)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == previous


def test_a_first_sigint_is_recorded_and_a_second_stops_at_once():
    with StopSignals() as signals:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: save, then stop; no exception here
        assert signals.received == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def test_a_sigterm_after_a_sigint_keeps_the_first_signal():
    # The exit code is 128 + the first signal: a later SIGTERM must not turn 130 into 143.
    with StopSignals() as signals:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.received == signal.SIGINT
