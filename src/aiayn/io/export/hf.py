"""`export_hf`: a run written as a Hugging Face directory (see `aiayn.io.export`)."""

from __future__ import annotations

import logging
from pathlib import Path

from safetensors.torch import save_file
from torch import nn

from aiayn.config import ModelConfig
from aiayn.data.files import strict_json, write_atomic, write_fresh_dir
from aiayn.data.tokenizer import TOKENIZER_FILE, SentencePieceTokenizer
from aiayn.io.checkpoint import find_in_run, load_model, read_config, resolve_weights
from aiayn.io.export.card import model_card
from aiayn.io.export.configs import GenerationSettings, generation_config, hf_config
from aiayn.io.export.targets import (
    ARCHITECTURES,
    BERT,
    GPT2,
    MARIAN,
    NEOX,
    PEGASUS,
    WEIGHTS,
    ExportError,
    hf_target,
)
from aiayn.io.export.tokenizers import fast_tokenizer_files, marian_tokenizer_files
from aiayn.io.export.weights import (
    bert_state_dict,
    gpt2_state_dict,
    gpt_neox_state_dict,
    seq2seq_state_dict,
)
from aiayn.io.hf_config import checked_tensor

log = logging.getLogger(__name__)


# ----- the export --------------------------------------------------------------------


def _check_finite(model: nn.Module, where: str | Path) -> None:
    """Refuse weights that hold NaN or infinities, by tensor: the formats would take
    them without a word, and the exported model compute nothing."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point():
            checked_tensor(name, tensor, Path(where), ExportError)


def load_for_export(run_or_model: str | Path | nn.Module, spm: str | Path | None):
    """(model, weights file or None, sentencepiece model path); weights that are not
    finite are refused by tensor."""
    if isinstance(run_or_model, nn.Module):
        if spm is None:
            raise ValueError(
                "exporting a model object needs its subword model: give spm=PATH (the "
                f"{TOKENIZER_FILE} of the corpus it was trained on)"
            )
        _check_finite(run_or_model, "the model")
        return run_or_model, None, Path(spm)
    weights = resolve_weights(run_or_model)
    cfg = read_config(weights)
    hf_target(cfg)  # refuse before reading a weight
    spm_path = Path(spm) if spm is not None else find_in_run(weights, TOKENIZER_FILE)
    if spm_path is None:
        raise FileNotFoundError(
            f"no {TOKENIZER_FILE} beside {weights} or in its run: the export needs the "
            f"subword model the run was trained with; give it with --tokenizer FILE (the "
            f"{TOKENIZER_FILE} that aiayn prepare wrote into the corpus)"
        )
    if not spm_path.is_file():
        raise FileNotFoundError(f"--tokenizer {spm_path}: no such file")
    model = load_model(weights, cfg=cfg)
    _check_finite(model, weights)
    return model, weights, spm_path


def _check_tokenizer(tokenizer: SentencePieceTokenizer, cfg: ModelConfig, spm: Path) -> None:
    ids = (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
    if ids != (cfg.pad_id, cfg.bos_id, cfg.eos_id):
        raise ExportError(
            f"{spm} has pad/bos/eos ids {ids} but the model uses "
            f"{(cfg.pad_id, cfg.bos_id, cfg.eos_id)}: they do not belong together"
        )
    if tokenizer.vocab_size != cfg.vocab_size:
        raise ExportError(
            f"{spm} has {tokenizer.vocab_size} pieces but the model's vocabulary has "
            f"{cfg.vocab_size}: the Hugging Face tokenizer would not cover it exactly"
        )


def _write_hf(
    model: nn.Module,
    target: str,
    spm_path: Path,
    tokenizer: SentencePieceTokenizer,
    settings: GenerationSettings,
    weights: Path | None,
    out: Path,
) -> None:
    cfg = model.cfg
    state = {
        MARIAN: lambda: seq2seq_state_dict(model, MARIAN),
        PEGASUS: lambda: seq2seq_state_dict(model, PEGASUS),
        GPT2: lambda: gpt2_state_dict(model),
        NEOX: lambda: gpt_neox_state_dict(model),
        BERT: lambda: bert_state_dict(model),
    }[target]()
    if target in (MARIAN, PEGASUS):
        marian_tokenizer_files(spm_path, out, tokenizer, cfg.max_len)
    else:
        fast_tokenizer_files(spm_path, out, tokenizer, target, cfg.max_len)
    write_atomic(out / "config.json", strict_json(hf_config(cfg, target)))
    if target != BERT:
        generation = generation_config(cfg, target, settings)
        write_atomic(out / "generation_config.json", strict_json(generation))
    write_atomic(out / "README.md", model_card(model, target, settings, weights))
    # each tensor its own contiguous copy: safetensors stores no shared or strided memory
    tensors = {name: t.float().contiguous().clone() for name, t in state.items()}
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})


def export_hf(
    run_or_model: str | Path | nn.Module,
    out: str | Path,
    *,
    spm: str | Path | None = None,
    generation: GenerationSettings | None = None,
    force: bool = False,
) -> Path:
    """Write a run's model as a Hugging Face directory that `transformers` loads offline.

    Args:
        run_or_model: a run directory, a checkpoint directory or weights file
            (`aiayn.io.checkpoint.resolve_weights`), or a model object.
        out: the directory to write; it must not exist or be empty unless `force`.
        spm: the sentencepiece model (default: the run's spm.model).
        generation: beam, length penalty and maximum length for generation_config.json.
        force: replace an OUT that exists and is not empty.

    Returns:
        OUT.

    Raises:
        ExportError: a setting no Hugging Face architecture expresses exactly, or a
            weight that is NaN or infinite (named).
        FileNotFoundError: no checkpoint, or no sentencepiece model.
        ValueError: an OUT refused (naming why).
        aiayn.data.files.WriteFailed: the system refused a write to OUT.
    """
    model, weights, spm_path = load_for_export(run_or_model, spm)
    target = hf_target(model.cfg)
    tokenizer = SentencePieceTokenizer.load(spm_path)
    _check_tokenizer(tokenizer, model.cfg, spm_path)
    settings = generation or GenerationSettings()
    model = model.float().eval()
    out = Path(out)

    def fill(tmp: Path) -> None:
        _write_hf(model, target, spm_path, tokenizer, settings, weights, tmp)

    # never the run (all of it, not only the checkpoint read) nor the subword model's home
    write_fresh_dir([weights, spm_path], out, fill, force)
    log.info("exported %s as %s to %s", weights or "the model", ARCHITECTURES[target], out)
    return out
