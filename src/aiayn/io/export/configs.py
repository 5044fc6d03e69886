"""config.json and generation_config.json of an export."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from aiayn.config import MAX_ALPHA, MAX_BEAM, ModelConfig
from aiayn.io.export.targets import (
    ARCHITECTURES,
    GPT2,
    HF_ACTIVATIONS,
    MARIAN,
    NEOX,
    PEGASUS,
)

# ----- config.json and generation_config.json ----------------------------------------


@dataclass(frozen=True)
class GenerationSettings:
    """The search an export asks `transformers` for (generation_config.json).

    Attributes:
        beam: num_beams (1: greedy search).
        length_penalty: alpha, applied by `transformers` as |Y|^alpha (aiayn's default
            form is the paper's ((5 + |Y|) / 6)^alpha).
        max_length: the longest output, the decoder start token counted; None: the
            model's max_len.
    """

    beam: int = 4
    length_penalty: float = 0.6
    max_length: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.beam <= MAX_BEAM:
            raise ValueError(f"beam must lie in [1, {MAX_BEAM}], got {self.beam}")
        if not (math.isfinite(self.length_penalty) and 0 <= self.length_penalty <= MAX_ALPHA):
            raise ValueError(
                f"length_penalty (alpha) must lie in [0, {MAX_ALPHA:g}], got {self.length_penalty}"
            )
        if self.max_length is not None and self.max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {self.max_length}")


def hf_config(cfg: ModelConfig, target: str) -> dict[str, Any]:
    """config.json for `target`, every field that changes the network spelled out."""
    common = {"architectures": [ARCHITECTURES[target]], "model_type": target, "dtype": "float32"}
    ids = {"pad_token_id": cfg.pad_id, "bos_token_id": cfg.bos_id, "eos_token_id": cfg.eos_id}
    activation = HF_ACTIVATIONS[cfg.activation]
    if target in (MARIAN, PEGASUS):
        fields = {
            "vocab_size": cfg.vocab_size,
            "d_model": cfg.d_model,
            "encoder_layers": cfg.n_encoder_layers,
            "decoder_layers": cfg.n_decoder_layers,
            "encoder_attention_heads": cfg.n_heads,
            "decoder_attention_heads": cfg.n_heads,
            "encoder_ffn_dim": cfg.d_ff,
            "decoder_ffn_dim": cfg.d_ff,
            "activation_function": activation,
            "max_position_embeddings": cfg.max_len,
            "scale_embedding": cfg.scale_embeddings,
            "dropout": cfg.dropout,
            "attention_dropout": cfg.attention_dropout,
            "activation_dropout": 0.0,
            "encoder_layerdrop": 0.0,
            "decoder_layerdrop": 0.0,
            "is_encoder_decoder": True,
            "decoder_start_token_id": cfg.bos_id,
            "forced_eos_token_id": cfg.eos_id,
            "tie_word_embeddings": cfg.tie_output,
            **ids,
        }
        if target == MARIAN:
            fields |= {
                "decoder_vocab_size": cfg.vocab_size,
                "share_encoder_decoder_embeddings": True,
            }
        return common | fields
    if target == NEOX:  # sequential residual, rotary (rotate-half) on every dimension
        base = dict(cfg.position_options).get("base", 10000.0)
        return common | {
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model,
            "num_hidden_layers": cfg.n_decoder_layers,
            "num_attention_heads": cfg.n_heads,
            "intermediate_size": cfg.d_ff,
            "hidden_act": activation,
            "max_position_embeddings": cfg.max_len,
            "layer_norm_eps": cfg.layer_norm_eps,
            "use_parallel_residual": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": base},
            "rotary_pct": 1.0,  # transformers 4's names
            "rotary_emb_base": base,
            "attention_bias": True,
            "hidden_dropout": cfg.dropout,
            "attention_dropout": cfg.attention_dropout,
            "tie_word_embeddings": cfg.tie_output,
            **ids,
        }
    if target == GPT2:
        return common | {
            "vocab_size": cfg.vocab_size,
            "n_positions": cfg.max_len,
            "n_embd": cfg.d_model,
            "n_layer": cfg.n_decoder_layers,
            "n_head": cfg.n_heads,
            "n_inner": cfg.d_ff,
            "activation_function": activation,
            "resid_pdrop": cfg.dropout,
            "embd_pdrop": cfg.dropout,
            "attn_pdrop": cfg.attention_dropout,
            "layer_norm_epsilon": cfg.layer_norm_eps,
            "scale_attn_weights": True,
            "tie_word_embeddings": cfg.tie_output,
            **ids,
        }
    return common | {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_encoder_layers,
        "num_attention_heads": cfg.n_heads,
        "intermediate_size": cfg.d_ff,
        "hidden_act": activation,
        "max_position_embeddings": cfg.max_len,
        "type_vocab_size": max(cfg.type_vocab_size, 1),
        "layer_norm_eps": cfg.layer_norm_eps,
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": cfg.tie_output,
        "pad_token_id": cfg.pad_id,
        "cls_token_id": cfg.bos_id,
        "sep_token_id": cfg.eos_id,
    }


def generation_config(cfg: ModelConfig, target: str, settings: GenerationSettings) -> dict:
    """generation_config.json: the search `transformers` runs by default, as aiayn's.

    pad and bos are banned (aiayn's search never generates them); eos is forced at
    max_length (as aiayn ends a sentence at its longest output); early_stopping=True
    stops when no live hypothesis can still win, as aiayn's exact stop does.
    """
    banned = sorted({cfg.pad_id, cfg.bos_id} - {cfg.eos_id})
    values = {
        "bos_token_id": cfg.bos_id,
        "eos_token_id": cfg.eos_id,
        "pad_token_id": cfg.pad_id,
        "max_length": settings.max_length or cfg.max_len,
        "bad_words_ids": [[i] for i in banned],
    }
    if target in (MARIAN, PEGASUS):
        values |= {
            "decoder_start_token_id": cfg.bos_id,
            "forced_eos_token_id": cfg.eos_id,
            "num_beams": settings.beam,
            "length_penalty": settings.length_penalty,
        }
        if settings.beam > 1:  # a beam's setting (transformers warns of it on greedy search)
            values["early_stopping"] = True
    else:  # a language model continues a prompt greedily by default
        values |= {"num_beams": 1, "do_sample": False}
    return values
