"""Adam and the learning-rate schedule of section 5.3.

    lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)

"This corresponds to increasing the learning rate linearly for the first warmup_steps
training steps, and decreasing it thereafter proportionally to the inverse square
root of the step number." Here it is multiplied by `lr_scale` (1 in the paper).
`step_num` counts updates from 1: the first update uses `lrate(1)`.

`lr_schedule: linear_decay` keeps the warmup and its peak but then lowers the rate
linearly to zero at the end of the run's budget (`linear_decay_lr`), for runs whose
length is known in advance, such as the quickstart's 15 minutes.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from torch.optim import Adam, Optimizer
from torch.optim.lr_scheduler import LambdaLR

from aiayn.config import LRSchedule, TrainConfig


def inverse_sqrt_lr(step: int, d_model: int, warmup: int, lr_scale: float = 1.0) -> float:
    """The learning rate of update number `step` (from 1), by the paper's formula."""
    return lr_scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def linear_decay_lr(
    step: int, d_model: int, warmup: int, fraction_done: float, lr_scale: float = 1.0
) -> float:
    """The rate of update `step` (from 1) when the run has used `fraction_done` of its budget.

    Linear warmup to the paper's peak `lr_scale * d_model^-0.5 * warmup^-0.5`, then
    the peak times `1 - fraction_done` (zero once the budget is spent).
    """
    peak = inverse_sqrt_lr(warmup, d_model, warmup, lr_scale)
    return peak * min(step / warmup, max(0.0, 1.0 - fraction_done))


_FUSED_DEVICES = ("cpu", "cuda")


def build_optimizer(model: nn.Module, config: TrainConfig) -> Adam:
    """Adam over all trainable parameters, with the config's betas and eps.

    The base learning rate is 1: `build_scheduler` multiplies it by the schedule's
    value at every step. Where every parameter lives on the CPU or a CUDA device,
    Adam runs fused (one kernel over all parameters instead of several operations
    per tensor; measured against the for-loop Adam by benchmarks/bench_kernels.py).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    fused = all(p.device.type in _FUSED_DEVICES and p.is_floating_point() for p in params)
    return Adam(params, lr=1.0, betas=config.betas, eps=config.eps, fused=fused or None)


def build_scheduler(
    optimizer: Optimizer,
    d_model: int,
    config: TrainConfig,
    fraction_done: Callable[[], float] | None = None,
) -> LambdaLR:
    """The config's schedule (`config.lr_schedule`) as a `LambdaLR`.

    Call `scheduler.step()` after each `optimizer.step()`. Its state (`state_dict`)
    is the number of updates made; the formula itself is rebuilt from the config.

    Args:
        fraction_done: for `linear_decay`, the share of the run's budget spent so far
            (`aiayn.training.stopping.fraction_done` of the trainer's state), asked at every step.

    Raises:
        ValueError: `linear_decay` without `fraction_done`.
    """
    if config.lr_schedule is LRSchedule.LINEAR_DECAY and fraction_done is None:
        raise ValueError("lr_schedule linear_decay needs the run's fraction_done")

    def factor(updates_done: int) -> float:
        # LambdaLR passes the count of updates made so far; the next one is number +1
        step = updates_done + 1
        if config.lr_schedule is LRSchedule.LINEAR_DECAY:
            done = fraction_done()
            return linear_decay_lr(step, d_model, config.warmup, done, config.lr_scale)
        return inverse_sqrt_lr(step, d_model, config.warmup, config.lr_scale)

    return LambdaLR(optimizer, factor)
