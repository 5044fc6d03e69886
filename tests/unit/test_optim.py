"""The schedule of section 5.3 and the budget's linear decay, as the optimizer sees them."""

import math

import pytest
import torch

from aiayn.config import LRSchedule, TrainConfig
from aiayn.training.optim import build_optimizer, build_scheduler, inverse_sqrt_lr, linear_decay_lr


def formula(step: int, d_model: int, warmup: int) -> float:
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@pytest.mark.parametrize("lr_scale", [1.0, 2.0])
def test_lr_of_update_n_is_the_formula_at_step_1_warmup_and_10x_warmup(lr_scale):
    warmup, d_model = 40, 512
    config = TrainConfig(warmup=warmup, lr_scale=lr_scale, max_steps=1)
    model = torch.nn.Linear(2, 2)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, d_model, config)
    seen = {}
    for step in range(1, 10 * warmup + 1):
        seen[step] = optimizer.param_groups[0]["lr"]  # the rate update `step` uses
        optimizer.step()
        scheduler.step()
    for step in (1, warmup, 10 * warmup):
        assert math.isclose(seen[step], lr_scale * formula(step, d_model, warmup), rel_tol=1e-12)
    assert max(seen, key=seen.get) == warmup  # the peak is at the end of warmup
    assert math.isclose(inverse_sqrt_lr(4000, 512, 4000), 512**-0.5 * 4000**-0.5)


def test_adam_hyperparameters_are_the_papers():
    optimizer = build_optimizer(torch.nn.Linear(2, 2), TrainConfig(max_steps=1))
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9


def test_fused_adam_on_the_cpu_takes_the_steps_of_plain_adam():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    reference = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    reference.load_state_dict(model.state_dict())
    config = TrainConfig(max_steps=1)
    optimizer = build_optimizer(model, config)
    assert optimizer.param_groups[0]["fused"] is True
    plain = torch.optim.Adam(
        reference.parameters(), lr=1.0, betas=config.betas, eps=config.eps, foreach=False
    )
    for group in (*optimizer.param_groups, *plain.param_groups):
        group["lr"] = 1e-2
    for _ in range(5):
        x = torch.randn(4, 6)
        for net, opt in ((model, optimizer), (reference, plain)):
            opt.zero_grad()
            net(x).square().sum().backward()
            opt.step()
    for fused_p, plain_p in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(fused_p, plain_p, rtol=1e-5, atol=1e-6)


def test_schedule_state_round_trips():
    config = TrainConfig(warmup=10, max_steps=1)
    model = torch.nn.Linear(2, 2)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, 64, config)
    for _ in range(7):
        optimizer.step()
        scheduler.step()
    state = (optimizer.state_dict(), scheduler.state_dict())
    optimizer2 = build_optimizer(model, config)
    scheduler2 = build_scheduler(optimizer2, 64, config)
    optimizer2.load_state_dict(state[0])
    scheduler2.load_state_dict(state[1])
    assert optimizer2.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    optimizer.step(), scheduler.step(), optimizer2.step(), scheduler2.step()
    assert optimizer2.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]


def test_linear_decay_warms_up_like_the_paper_then_falls_to_zero_at_the_budget():
    d_model, warmup = 64, 4
    peak = 2.0 * d_model**-0.5 * warmup**-0.5
    done = {"fraction": 0.0}
    config = TrainConfig(warmup=warmup, lr_scale=2.0, max_steps=1, lr_schedule="linear_decay")
    optimizer = build_optimizer(torch.nn.Linear(2, 2), config)
    scheduler = build_scheduler(optimizer, d_model, config, lambda: done["fraction"])
    seen = [optimizer.param_groups[0]["lr"]]
    for fraction in (0.0, 0.0, 0.0, 0.25, 0.5, 0.9, 1.0, 1.5):
        done["fraction"] = fraction
        optimizer.step()
        scheduler.step()
        seen.append(optimizer.param_groups[0]["lr"])
    # updates 1-4 warm up exactly as the paper's schedule (same peak at update 4) ...
    for step in range(1, warmup + 1):
        assert math.isclose(seen[step - 1], 2.0 * formula(step, d_model, warmup), rel_tol=1e-12)
    assert math.isclose(seen[warmup - 1], peak, rel_tol=1e-12)
    # ... then the peak times the budget left: 0.75, 0.5, 0.1, then zero (never below)
    expected = [peak * 0.75, peak * 0.5, peak * 0.1, 0.0, 0.0]
    for got, want in zip(seen[warmup:], expected, strict=True):
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15)
    assert math.isclose(linear_decay_lr(2, 512, 4000, 0.0), inverse_sqrt_lr(2, 512, 4000))


def test_linear_decay_needs_the_budget_and_unknown_schedules_are_named():
    config = TrainConfig(max_steps=1, lr_schedule="linear_decay")
    with pytest.raises(ValueError, match="fraction_done"):
        build_scheduler(build_optimizer(torch.nn.Linear(2, 2), config), 64, config)
    with pytest.raises(ValueError, match="lr_schedule must be one of inverse_sqrt, linear_decay"):
        TrainConfig(max_steps=1, lr_schedule="cosine")
    assert TrainConfig(max_steps=1).lr_schedule is LRSchedule.INVERSE_SQRT  # the paper's default
