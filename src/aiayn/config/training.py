"""How a model is trained: `TrainConfig` (section 5 of the paper plus the run's limits
and cadence), its learning-rate schedule and its numeric precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from aiayn.config.fields import (
    check_field_types,
    check_seed,
    config_from_dict,
    config_to_dict,
    enum_member,
)

if TYPE_CHECKING:
    import torch


class LRSchedule(str, Enum):
    """The shape of the learning rate over a run (`TrainConfig.lr_schedule`).

    Both warm up linearly for `warmup` updates to the same peak,
    `lr_scale * d_model^-0.5 * warmup^-0.5`; then
    INVERSE_SQRT decays it as `step^-0.5` (section 5.3: the paper's), and
    LINEAR_DECAY lowers it linearly to zero at the end of the run's budget: the
    fraction done of the first limit reached (`max_steps`, `max_epochs` or
    `max_minutes`, the last by the training clock). "Budgeted training" (Li et al.,
    ICLR 2020) found this shape the best when the budget is known in advance.
    """

    INVERSE_SQRT = "inverse_sqrt"
    LINEAR_DECAY = "linear_decay"


class Precision(str, Enum):
    """Floating-point arithmetic of a model, in training or in inference.

    Training (`TrainConfig.precision`) autocasts the forward and backward passes to
    it; the weights stay fp32. Inference (`aiayn translate --dtype`) casts the
    weights themselves to `dtype`. torch's names are accepted too:
    `Precision("bfloat16") is Precision.BF16`. INT8 is inference only (int8
    products on the CPU, `aiayn.inference.frozen.freeze`); training refuses it.
    """

    FP32 = "fp32"  # the CPU default
    BF16 = "bf16"  # autocast to bfloat16 (CUDA's default choice; weights stay fp32)
    FP16 = "fp16"  # autocast to float16 with a gradient scaler (CUDA only)
    AUTO = "auto"  # bf16 where timed faster (training: products; --dtype auto: steps), else fp32
    INT8 = "int8"  # inference only, on the CPU: int8 weights, activations quantized per call

    @classmethod
    def _missing_(cls, value: object) -> Precision | None:
        return next((p for p, name in _DTYPE_NAMES.items() if name == value), None)

    @property
    def dtype_name(self) -> str:
        """torch's name of the dtype: "float32", "bfloat16", "float16" or "int8".

        Raises:
            ValueError: for AUTO, which names no dtype until a device is known.
        """
        if self is Precision.AUTO:
            raise ValueError(
                "precision auto has no fixed dtype (training picks bf16 or fp32 per "
                "device); give fp32, bf16 or fp16"
            )
        return _DTYPE_NAMES[self]

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype (see `dtype_name`)."""
        import torch

        return getattr(torch, self.dtype_name)


_DTYPE_NAMES = {
    Precision.FP32: "float32",
    Precision.BF16: "bfloat16",
    Precision.FP16: "float16",
    Precision.INT8: "int8",
}


@dataclass(frozen=True)
class TrainConfig:
    """How a model is trained: section 5 of the paper plus the run's limits and cadence.

    Args:
        max_tokens: token budget of one batch per process, each side, padding and
            specials included (see `aiayn.data.batching`).
        accumulation: batches per update (update_freq); the paper's ~25,000-token
            batches are `max_tokens * accumulation * processes`.
        length_multiple: pad each batch's source and target length to a multiple of
            this (1: to the longest sentence). Fewer distinct shapes; see
            `aiayn.data.batching`.
        lr_scale: factor on the schedule `d_model^-0.5 * min(step^-0.5,
            step * warmup^-1.5)` (section 5.3 uses 1).
        warmup: warmup steps of the schedule (the paper: 4000).
        lr_schedule: the rate after warmup: inverse_sqrt (the paper's) or
            linear_decay (to zero at the end of the budget; see `LRSchedule`).
        betas, eps: Adam's (the paper: 0.9, 0.98, 1e-9).
        label_smoothing: epsilon_ls of section 5.4 (0.1).
        clip_norm: clip the gradient's global L2 norm to this; None = no clipping
            (the paper does not clip).
        max_steps, max_epochs, max_minutes: limits; the run stops cleanly, with a
            checkpoint, at the first one reached. `max_minutes` counts the run's
            cumulative training time across resumes. At least one must be set.
        checkpoint_every_steps, checkpoint_every_minutes: save a checkpoint every so
            many updates / minutes of wall time (either may be None = off).
        keep_last: step checkpoints kept (older ones are deleted; `best/` stays).
        valid_every_steps: validation loss and perplexity every so many updates
            (None = only when the run stops).
        valid_bleu_sentences: greedy-search BLEU on the first N validation pairs at
            each validation (0 = off).
        log_every_steps: a metrics line (and TensorBoard scalars) every so many updates.
        max_non_finite: this many non-finite losses in a row stop the run.
        seed: fixes initialisation, data order and dropout.
        precision: fp32, bf16 or fp16 (see `Precision`).
        compile: run the model through `torch.compile`.

    Raises:
        ValueError: a field out of range; the message names the field.
    """

    max_tokens: int = 4096
    accumulation: int = 1
    length_multiple: int = 1
    lr_scale: float = 1.0
    warmup: int = 4000
    lr_schedule: LRSchedule = LRSchedule.INVERSE_SQRT
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    label_smoothing: float = 0.1
    clip_norm: float | None = None
    max_steps: int | None = None
    max_epochs: float | None = None
    max_minutes: float | None = None
    checkpoint_every_steps: int | None = None
    checkpoint_every_minutes: float | None = 10.0
    keep_last: int = 5
    valid_every_steps: int | None = 1000
    valid_bleu_sentences: int = 0
    log_every_steps: int = 100
    max_non_finite: int = 5
    seed: int = 0
    precision: Precision = Precision.FP32
    compile: bool = False

    def __post_init__(self) -> None:
        def fail(name: str, rule: str) -> ValueError:
            return ValueError(f"TrainConfig.{name} must be {rule}, got {getattr(self, name)!r}")

        check_field_types(self)
        for name in (
            "max_tokens", "accumulation", "length_multiple", "warmup", "keep_last",
            "log_every_steps",
        ):  # fmt: skip
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise fail(name, "a positive integer")
        if self.max_non_finite < 1:
            raise fail("max_non_finite", "a positive integer")
        for name in ("max_steps", "checkpoint_every_steps", "valid_every_steps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise fail(name, "a positive integer or null")
        for name in ("max_epochs", "max_minutes", "checkpoint_every_minutes", "clip_norm"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise fail(name, "a positive number or null")
        if self.max_steps is None and self.max_epochs is None and self.max_minutes is None:
            raise ValueError("TrainConfig needs a limit: set max_steps, max_epochs or max_minutes")
        if not self.lr_scale > 0:
            raise fail("lr_scale", "positive")
        if not self.eps > 0:
            raise fail("eps", "positive")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise fail("label_smoothing", "in [0, 1)")
        if self.valid_bleu_sentences < 0:
            raise fail("valid_bleu_sentences", "0 (off) or positive")
        check_seed(self.seed, "TrainConfig.seed")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise fail("betas", "two numbers in [0, 1)")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        precision = enum_member(Precision, self.precision, "TrainConfig.precision")
        if precision is Precision.INT8:
            raise fail("precision", "fp32, bf16, fp16 or auto (int8 is for inference only)")
        object.__setattr__(self, "precision", precision)
        schedule = enum_member(LRSchedule, self.lr_schedule, "TrainConfig.lr_schedule")
        object.__setattr__(self, "lr_schedule", schedule)

    def to_dict(self) -> dict[str, Any]:
        """Plain types only, for YAML and JSON."""
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Inverse of `to_dict`; unknown keys raise a ValueError naming them."""
        return config_from_dict(cls, values)
