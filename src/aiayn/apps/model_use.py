"""What the users of a trained model share: weights of the right shape, and their tokenizer.

    model, weights = load_shape("runs/gpt", DECODER_ONLY)   # refuses a translation run
    tokenizer = run_tokenizer(weights)                      # RUN/spm.model or HF files

Each model shape has its own user: an encoder-decoder translates (`Translator`,
`aiayn translate`), a decoder-only model continues text (`Generator`, `aiayn
generate`), an encoder-only model fills masks (`MaskFiller`, `aiayn fill`).
Handing a checkpoint to the wrong one is refused before any weight is read, in
one line that names the shape found and the user that runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from aiayn.config import ModelConfig
from aiayn.data.tokenizer import TOKENIZER_FILE, SentencePieceTokenizer, Tokenizer
from aiayn.io.checkpoint import find_in_run, load_model, read_config, resolve_weights
from aiayn.models import SHAPES

ENCODER_DECODER, DECODER_ONLY, ENCODER_ONLY = "encoder_decoder", "decoder_only", "encoder_only"
# Files `save_pretrained` writes for a tokenizer (any one of them marks a directory).
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt")


class WrongShapeError(ValueError):
    """A checkpoint of one model shape given to the user of another."""


def check_shape(cfg: ModelConfig, wanted: str, source: str | Path) -> None:
    """Raise a `WrongShapeError` unless `cfg` is of architecture `wanted`.

    Args:
        cfg: the checkpoint's config.
        wanted: the architecture the caller runs ("decoder_only", ...).
        source: the checkpoint, for the message.
    """
    if cfg.architecture == wanted:
        return
    found = cfg.architecture
    other = f"; run it with {SHAPES.get(found).user_name}" if found in SHAPES else ""
    raise WrongShapeError(
        f"{source} holds a model of architecture {found}, but {SHAPES.get(wanted).user_name} "
        f"needs architecture {wanted}{other}"
    )


@dataclass(frozen=True)
class RunFiles:
    """A checkpoint found and read once (`run_files`): the weights file and its config."""

    weights: Path
    cfg: ModelConfig


def run_files(run_or_weights: str | Path, wanted: str) -> RunFiles:
    """Resolve the weights once, read their config once and check its shape once, before
    any weight is read; loading then takes the config from here (`load_model(cfg=...)`).

    Args:
        run_or_weights: a run directory, a checkpoint directory or a weights file
            (`aiayn.io.checkpoint.resolve_weights`).
        wanted: the architecture the caller runs ("encoder_decoder", ...).

    Returns:
        The weights file and its `ModelConfig`.

    Raises:
        FileNotFoundError: nothing to load there.
        ValueError: a corrupt checkpoint, or a `WrongShapeError` naming the weights.
    """
    weights = resolve_weights(run_or_weights)
    cfg = read_config(weights)
    check_shape(cfg, wanted, weights)
    return RunFiles(weights, cfg)


def load_shape(run_or_weights: str | Path, wanted: str) -> tuple[nn.Module, Path]:
    """Load a run's (or a checkpoint's) weights, refusing another model shape first.

    Returns:
        The model (on the CPU) and its weights file.

    Raises:
        FileNotFoundError: nothing to load there.
        ValueError: a corrupt checkpoint, or a `WrongShapeError`.
    """
    files = run_files(run_or_weights, wanted)
    return load_model(files.weights, cfg=files.cfg), files.weights


def check_tokenizer_fits(tokenizer: Tokenizer, cfg: ModelConfig) -> None:
    """Refuse a tokenizer with ids the model has no embedding for (a larger vocabulary).

    A model's vocabulary may be larger (padded, as some Hugging Face checkpoints are).
    """
    if tokenizer.vocab_size > cfg.vocab_size:
        source = f" ({tokenizer.path})" if tokenizer.path else ""
        raise ValueError(
            f"the tokenizer{source} has {tokenizer.vocab_size} pieces but the model's "
            f"vocabulary has {cfg.vocab_size}: they do not belong together"
        )


def run_tokenizer(weights: Path) -> Tokenizer:
    """The tokenizer of a checkpoint: its run's spm.model, or the Hugging Face tokenizer
    files beside it (a directory written by `aiayn convert gpt2 / bert`).

    Raises:
        FileNotFoundError: naming where both were looked for.
    """
    spm_path = find_in_run(weights, TOKENIZER_FILE)
    if spm_path is not None:
        return SentencePieceTokenizer.load(spm_path)
    if any((weights.parent / name).is_file() for name in HF_TOKENIZER_FILES):
        from aiayn.data.hf_tokenizer import HFTokenizer

        return HFTokenizer(weights.parent)
    raise FileNotFoundError(
        f"no tokenizer for {weights}: neither {TOKENIZER_FILE} in its run nor Hugging Face "
        f"tokenizer files ({', '.join(HF_TOKENIZER_FILES)}) beside it"
    )


class ModelUser:
    """`load` and `from_hf` for a class that runs one model shape (`Generator`, `MaskFiller`).

    A subclass names its `SHAPE` and its Hugging Face loader (`aiayn.io.hf_models.load_gpt2`
    or `load_bert`, by name: imported only when used), and takes
    `(model, tokenizer, device, dtype)` in its constructor.
    """

    SHAPE: ClassVar[str]
    HF_LOADER: ClassVar[str]

    @classmethod
    def load(
        cls,
        run_or_weights: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
    ) -> Any:
        """A run directory, a checkpoint directory or a weights file, with its tokenizer.

        The weights are those `aiayn.io.checkpoint.resolve_weights` picks; the tokenizer is
        the run's spm.model, or the Hugging Face tokenizer files beside the weights (a
        directory written by `aiayn convert gpt2 / bert`).

        Raises:
            FileNotFoundError: no checkpoint or tokenizer.
            ValueError: a corrupt checkpoint, or one of another shape (`WrongShapeError`).
        """
        model, weights = load_shape(run_or_weights, cls.SHAPE)
        return cls(model, run_tokenizer(weights), device, dtype)

    @classmethod
    def from_hf(
        cls,
        directory: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
    ) -> Any:
        """A directory as `transformers` saves it (config, weights, tokenizer files).

        Raises:
            FileNotFoundError: a file is missing.
            ValueError: naming a config field the conversion does not cover.
        """
        import aiayn.io.hf_models
        from aiayn.data.hf_tokenizer import HFTokenizer

        loader: Callable[[str | Path], tuple[nn.Module, ModelConfig]]
        loader = getattr(aiayn.io.hf_models, cls.HF_LOADER)
        model, _ = loader(directory)
        return cls(model, HFTokenizer(directory), device, dtype)
