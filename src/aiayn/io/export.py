"""Export: a model trained with aiayn as a Hugging Face directory, or a CTranslate2 one.

    export_hf("runs/bible", "exports/bible-hf")                  # transformers loads it
    export_ctranslate2("runs/bible", "exports/bible-ct2", quantization="int8")
    export("runs/bible", "exports/bible-hf", to="hf")            # either, by name

Each model shape goes to the `transformers` architecture that computes the same
function, not an approximation of it (`hf_target` says which, or refuses by name):

    aiayn                                              transformers
    encoder-decoder, post-norm, sinusoidal positions   MarianMTModel
    encoder-decoder, pre-norm, sinusoidal positions    PegasusForConditionalGeneration
    decoder-only, learned positions, pre-norm (GPT)    GPT2LMHeadModel
    decoder-only, rotary positions, pre-norm           GPTNeoXForCausalLM (sequential
                                                       residual, rotary on all of each head)
    encoder-only, learned positions, post-norm (BERT)  BertForMaskedLM

Pre-norm encoder-decoders do not go to M2M100 (issue 33 suggested it): M2M100's
sinusoids have other frequencies, 10000^(-i / (D/2 - 1)) where the paper's are
10000^(-2i / D), computed in code and not stored, so no weight can correct them.
Pegasus is M2M100's structure (pre-norm, a final LayerNorm per stack, scaled
embeddings) with Marian's sinusoids, which are the paper's.

Marian and Pegasus lay the sinusoids out as halves (all sines, then all cosines)
where the paper, and aiayn's `sinusoidal` positions, interleave them. The export
permutes the d_model basis of every weight that reads or writes the residual
stream: embeddings and the output matrix by column, projections into the stream
(W^O, W2) by row and bias, projections out of it (W^Q, W^K, W^V, W1) by column,
LayerNorm weights and biases by entry. Every sub-layer commutes with a permutation
of its input's coordinates (a LayerNorm's mean and variance do not see the order),
so the exported model computes the same logits, to the last bit, in the other basis.

The directory holds config.json, model.safetensors, generation_config.json (beam,
length penalty, maximum length and the special ids; not for BERT), the tokenizer
files built from the run's sentencepiece model, and README.md, a model card with
the Hub's metadata header. An encoder-decoder's tokenizer is Marian's (source.spm,
target.spm, vocab.json: sentencepiece itself, which appends eos to a source sentence
as aiayn's batching does; `aiayn convert marian` reads them back). A language
model's is a fast tokenizer (tokenizer.json, which TGI and vLLM want), converted by
`transformers` from the sentencepiece model: exact for BPE models (aiayn's default),
nearly so for unigram ones (a warning says so); BERT's reads [CLS] ... eos [SEP], as
`aiayn fill` reads text.

What no target expresses exactly is refused with a one-line `ExportError` naming
the setting and the target, before anything is written; OUT is written under a
temporary name and renamed when whole (`aiayn.files.write_fresh_dir`).

Generation differs in one place no setting bridges: aiayn's length penalty is the
paper's ((5 + |Y|) / 6)^alpha, `transformers`' is |Y|^alpha. The export writes the
run's alpha for `transformers`' form, and says so in the model card; aiayn decodes
as `transformers` does with `LengthPenalty.HF` (`aiayn.inference.search`).

`transformers` (for the tokenizer conversion) and, for CTranslate2, `ctranslate2`
are imported only here, when an export runs.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from aiayn.config import MAX_ALPHA, MAX_BEAM, Activation, ModelConfig
from aiayn.data.lm import CLS, MASK, SEP
from aiayn.data.tokenizer import TOKENIZER_FILE, SentencePieceTokenizer
from aiayn.files import check_fresh_output, check_output, write_atomic, write_dir_atomic
from aiayn.io.checkpoint import find_in_run, load_model, read_config, resolve_weights
from aiayn.nn.positions.sinusoidal import sinusoidal_table

log = logging.getLogger(__name__)

MARIAN, PEGASUS, GPT2, NEOX, BERT = "marian", "pegasus", "gpt2", "gpt_neox", "bert"
LANGUAGE_MODELS = (GPT2, NEOX)
ARCHITECTURES = {
    MARIAN: "MarianMTModel",
    PEGASUS: "PegasusForConditionalGeneration",
    GPT2: "GPT2LMHeadModel",
    NEOX: "GPTNeoXForCausalLM",
    BERT: "BertForMaskedLM",
}
TARGETS = ("hf", "ctranslate2")
QUANTIZATIONS = ("int8", "int8_float32", "bfloat16")
WEIGHTS = "model.safetensors"
RESULTS_FILE = "results.json"  # where `aiayn quickstart` records its test BLEU
RUN_CONFIG_FILE = "config.yaml"
HF_LAYER_NORM_EPS = 1e-5  # Marian's and Pegasus's LayerNorms: torch's default, not a setting

# aiayn's activations under the names transformers' ACT2FN (and CTranslate2) know them by.
_HF_ACTIVATIONS = {
    Activation.RELU: "relu",
    Activation.GELU: "gelu",
    Activation.GELU_TANH: "gelu_pytorch_tanh",  # torch.nn.functional.gelu(approximate="tanh")
    Activation.SWISH: "swish",
}
_EXACT_KERNELS = ("sdpa", "explicit")  # dense softmax attention: what every target computes


class ExportError(ValueError):
    """A model that no export target expresses exactly (the message names the setting)."""


# ----- which target, or why none ---------------------------------------------------


def hf_target(cfg: ModelConfig) -> str:
    """The `transformers` model type that expresses `cfg` exactly: marian, pegasus, gpt2,
    gpt_neox or bert.

    Raises:
        ExportError: naming the first setting no target expresses, and the target.
    """
    target = {
        "encoder_decoder": PEGASUS if cfg.norm_first else MARIAN,
        "decoder_only": NEOX if cfg.positional == "rotary" else GPT2,
        "encoder_only": BERT,
    }.get(cfg.architecture)
    if target is None:
        raise ExportError(
            f"architecture={cfg.architecture}: no Hugging Face architecture expresses it "
            "(exported: encoder_decoder, decoder_only, encoder_only)"
        )
    name = ARCHITECTURES[target]

    def refuse(setting: str, why: str) -> ExportError:
        return ExportError(f"{setting}: {name} has no equivalent ({why}); not exported")

    if cfg.attention not in _EXACT_KERNELS:
        raise refuse(f"attention={cfg.attention}", "it computes dense softmax attention")
    if cfg.attention_options:
        raise refuse(f"attention_options={dict(cfg.attention_options)}", "no kernel options")
    if cfg.position_options and (target != NEOX or set(dict(cfg.position_options)) - {"base"}):
        raise refuse(f"position_options={dict(cfg.position_options)}", "fixed positions")
    if cfg.n_kv_heads != cfg.n_heads:
        raise refuse(
            f"n_kv_heads={cfg.n_kv_heads} (grouped-query attention)", "no num_key_value_heads"
        )
    if cfg.d_k != cfg.d_model // cfg.n_heads or cfg.d_v != cfg.d_model // cfg.n_heads:
        raise refuse(
            f"d_k={cfg.d_k}, d_v={cfg.d_v} (separate head sizes)",
            f"its heads are d_model / n_heads = {cfg.d_model // cfg.n_heads} wide",
        )
    if cfg.d_model % cfg.n_heads:
        raise refuse(f"d_model={cfg.d_model} not divisible by n_heads={cfg.n_heads}", "head size")
    if cfg.kept_heads:
        raise refuse("kept_heads (pruned attention heads)", "every layer has all its heads")
    if cfg.d_ff == 0:
        raise refuse("d_ff=0 (attention-only layers)", "every layer has a feed-forward network")
    if cfg.activation not in _HF_ACTIVATIONS:
        raise refuse(f"activation={cfg.activation.value}", "not among its activations")

    if target in (MARIAN, PEGASUS):
        if cfg.positional not in ("sinusoidal", "sinusoidal_halves"):
            raise refuse(f"positional={cfg.positional}", "fixed sinusoidal positions only")
        if not cfg.tie_embeddings:
            raise refuse("tie_embeddings=false (separate source and target embeddings)", "one")
        if cfg.type_vocab_size or cfg.embedding_norm:
            raise refuse("token types or an embedding LayerNorm", "neither")
        if cfg.layer_norm_eps != HF_LAYER_NORM_EPS:
            raise refuse(f"layer_norm_eps={cfg.layer_norm_eps:g}", "its LayerNorms use 1e-05")
        if cfg.n_encoder_layers < 1 or cfg.n_decoder_layers < 1:
            raise refuse("a stack without layers", "both stacks have layers")
    elif target in LANGUAGE_MODELS:
        if target == GPT2 and cfg.positional != "learned":
            raise refuse(f"positional={cfg.positional}", "learned or rotary positions only")
        if not cfg.norm_first:
            raise refuse("norm_first=false (post-norm)", "GPT-2 and GPT-NeoX are pre-norm")
        if cfg.scale_embeddings:
            raise refuse("scale_embeddings=true", "GPT-2 does not scale its embeddings")
        if cfg.output_bias:
            raise refuse("output_bias=true", "GPT-2's output projection has no bias")
        if cfg.embedding_norm or cfg.type_vocab_size:
            raise refuse("token types or an embedding LayerNorm", "neither")
    else:  # BERT
        if cfg.positional != "learned":
            raise refuse(f"positional={cfg.positional}", "learned positions only")
        if cfg.norm_first:
            raise refuse("norm_first=true (pre-norm)", "BERT is post-norm")
        if cfg.scale_embeddings:
            raise refuse("scale_embeddings=true", "BERT does not scale its embeddings")
        if not cfg.embedding_norm:
            raise refuse("embedding_norm=false", "BERT normalises its embeddings")
    return target


# ----- weights ---------------------------------------------------------------------


def halves_permutation(d_model: int) -> torch.Tensor:
    """The d_model basis from the paper's interleaved sinusoids to Marian's halves: the
    index `p` with `halves[:, j] = interleaved[:, p[j]]` (even dimensions, then odd)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


class _Stream:
    """Weights of the residual stream in a permuted basis `p` (None: as they are)."""

    def __init__(self, state: dict[str, torch.Tensor], p: torch.Tensor | None) -> None:
        self.state, self.p = state, p

    def reads(self, name: str) -> torch.Tensor:
        """A (out, D) matrix that reads the stream: its columns permuted."""
        weight = self.state[name]
        return weight if self.p is None else weight[:, self.p]

    def writes(self, name: str) -> torch.Tensor:
        """A (D, in) matrix or a (D,) vector that writes the stream: its rows permuted."""
        tensor = self.state[name]
        return tensor if self.p is None else tensor[self.p]

    def same(self, name: str) -> torch.Tensor:
        return self.state[name]


def _linear_in(out: dict, theirs: str, s: _Stream, ours: str) -> None:
    """A projection out of the stream (W^Q, W^K, W^V, W1): columns permuted, bias as is."""
    out[f"{theirs}.weight"], out[f"{theirs}.bias"] = (
        s.reads(f"{ours}.weight"),
        s.same(f"{ours}.bias"),
    )


def _linear_out(out: dict, theirs: str, s: _Stream, ours: str) -> None:
    """A projection into the stream (W^O, W2): rows and bias permuted."""
    out[f"{theirs}.weight"], out[f"{theirs}.bias"] = (
        s.writes(f"{ours}.weight"),
        s.writes(f"{ours}.bias"),
    )


_norm = _linear_out  # a LayerNorm's weight and bias hold one entry per stream coordinate


def _output_matrix(model: nn.Module) -> torch.Tensor:
    return model.output_weight().detach()


def seq2seq_state_dict(model: nn.Module, target: str) -> dict[str, torch.Tensor]:
    """An encoder-decoder's weights under Marian's or Pegasus's names, in the halves basis."""
    cfg = model.cfg
    state = {k: v.detach() for k, v in model.state_dict().items()}
    state["output_weight"] = _output_matrix(model)
    p = halves_permutation(cfg.d_model) if cfg.positional == "sinusoidal" else None
    s = _Stream(state, p)
    embedding = s.reads("encoder.embedding.tokens.weight")
    positions = sinusoidal_table(cfg.max_len, cfg.d_model, halves=True)
    bias = state.get("output_bias", torch.zeros(cfg.vocab_size))
    out = {
        "model.shared.weight": embedding,
        "model.encoder.embed_tokens.weight": embedding,
        "model.decoder.embed_tokens.weight": embedding,
        "model.encoder.embed_positions.weight": positions,
        "model.decoder.embed_positions.weight": positions,
        "lm_head.weight": s.reads("output_weight"),
        "final_logits_bias": bias.reshape(1, -1),
    }
    projections = ("q_proj", "k_proj", "v_proj")
    for i in range(cfg.n_encoder_layers):
        ours, theirs = f"encoder.layers.{i}", f"model.encoder.layers.{i}"
        for name in projections:
            _linear_in(out, f"{theirs}.self_attn.{name}", s, f"{ours}.self_attn.{name}")
        _linear_out(out, f"{theirs}.self_attn.out_proj", s, f"{ours}.self_attn.out_proj")
        _norm(out, f"{theirs}.self_attn_layer_norm", s, f"{ours}.attn_residual.norm")
        _linear_in(out, f"{theirs}.fc1", s, f"{ours}.feed_forward.linear1")
        _linear_out(out, f"{theirs}.fc2", s, f"{ours}.feed_forward.linear2")
        _norm(out, f"{theirs}.final_layer_norm", s, f"{ours}.ff_residual.norm")
    for i in range(cfg.n_decoder_layers):
        ours, theirs = f"decoder.layers.{i}", f"model.decoder.layers.{i}"
        for name in projections:
            _linear_in(out, f"{theirs}.self_attn.{name}", s, f"{ours}.self_attn.{name}")
            _linear_in(out, f"{theirs}.encoder_attn.{name}", s, f"{ours}.cross_attn.{name}")
        _linear_out(out, f"{theirs}.self_attn.out_proj", s, f"{ours}.self_attn.out_proj")
        _linear_out(out, f"{theirs}.encoder_attn.out_proj", s, f"{ours}.cross_attn.out_proj")
        _norm(out, f"{theirs}.self_attn_layer_norm", s, f"{ours}.self_residual.norm")
        _norm(out, f"{theirs}.encoder_attn_layer_norm", s, f"{ours}.cross_residual.norm")
        _linear_in(out, f"{theirs}.fc1", s, f"{ours}.feed_forward.linear1")
        _linear_out(out, f"{theirs}.fc2", s, f"{ours}.feed_forward.linear2")
        _norm(out, f"{theirs}.final_layer_norm", s, f"{ours}.ff_residual.norm")
    if target == PEGASUS:  # pre-norm: each stack ends with a LayerNorm
        _norm(out, "model.encoder.layer_norm", s, "encoder.final_norm")
        _norm(out, "model.decoder.layer_norm", s, "decoder.final_norm")
    return out


def gpt2_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """A decoder-only model's weights under GPT-2's names (Conv1D weights are (in, out))."""
    cfg = model.cfg
    state = {k: v.detach() for k, v in model.state_dict().items()}
    out = {
        "transformer.wte.weight": state["decoder.embedding.tokens.weight"],
        "transformer.wpe.weight": state["decoder.embedding.positions.weight"],
        "transformer.ln_f.weight": state["decoder.final_norm.weight"],
        "transformer.ln_f.bias": state["decoder.final_norm.bias"],
        "lm_head.weight": _output_matrix(model),
    }
    for i in range(cfg.n_decoder_layers):
        ours, theirs = f"decoder.layers.{i}", f"transformer.h.{i}"
        attention = f"{ours}.self_attn"
        qkv = [state[f"{attention}.{n}.weight"] for n in ("q_proj", "k_proj", "v_proj")]
        out[f"{theirs}.attn.c_attn.weight"] = torch.cat(qkv).t()  # (D, 3D)
        out[f"{theirs}.attn.c_attn.bias"] = torch.cat(
            [state[f"{attention}.{n}.bias"] for n in ("q_proj", "k_proj", "v_proj")]
        )
        for theirs_name, ours_name in (
            ("attn.c_proj", "self_attn.out_proj"),
            ("mlp.c_fc", "feed_forward.linear1"),
            ("mlp.c_proj", "feed_forward.linear2"),
        ):
            out[f"{theirs}.{theirs_name}.weight"] = state[f"{ours}.{ours_name}.weight"].t()
            out[f"{theirs}.{theirs_name}.bias"] = state[f"{ours}.{ours_name}.bias"]
        for theirs_name, ours_name in (("ln_1", "self_residual"), ("ln_2", "ff_residual")):
            out[f"{theirs}.{theirs_name}.weight"] = state[f"{ours}.{ours_name}.norm.weight"]
            out[f"{theirs}.{theirs_name}.bias"] = state[f"{ours}.{ours_name}.norm.bias"]
    return out


def gpt_neox_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """A rotary decoder-only model's weights under GPT-NeoX's names.

    GPT-NeoX's fused query_key_value holds each head's query, key and value rows
    together, head by head: (H, 3, Dk, D). aiayn's rotary pairs dimension i with
    i + Dk/2 (rotate-half), as GPT-NeoX does, so no row is permuted.
    """
    cfg = model.cfg
    state = {k: v.detach() for k, v in model.state_dict().items()}
    out = {
        "gpt_neox.embed_in.weight": state["decoder.embedding.tokens.weight"],
        "gpt_neox.final_layer_norm.weight": state["decoder.final_norm.weight"],
        "gpt_neox.final_layer_norm.bias": state["decoder.final_norm.bias"],
        "lm_head.weight": _output_matrix(model),
    }
    heads = cfg.n_heads
    for i in range(cfg.n_decoder_layers):
        ours, theirs = f"decoder.layers.{i}", f"gpt_neox.layers.{i}"
        for kind in ("weight", "bias"):
            q, k, v = (
                state[f"{ours}.self_attn.{n}.{kind}"] for n in ("q_proj", "k_proj", "v_proj")
            )
            per_head = [t.reshape(heads, -1, *t.shape[1:]) for t in (q, k, v)]  # (H, Dk, ...)
            fused = torch.stack(per_head, dim=1)  # (H, 3, Dk, ...)
            out[f"{theirs}.attention.query_key_value.{kind}"] = fused.reshape(-1, *q.shape[1:])
            for theirs_name, ours_name in (
                ("attention.dense", "self_attn.out_proj"),
                ("mlp.dense_h_to_4h", "feed_forward.linear1"),
                ("mlp.dense_4h_to_h", "feed_forward.linear2"),
                ("input_layernorm", "self_residual.norm"),
                ("post_attention_layernorm", "ff_residual.norm"),
            ):
                out[f"{theirs}.{theirs_name}.{kind}"] = state[f"{ours}.{ours_name}.{kind}"]
    return out


def bert_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """An encoder-only model's weights under BertForMaskedLM's names.

    A model without token types gets one type whose vector is zero (BERT always adds one).
    """
    cfg = model.cfg
    state = {k: v.detach() for k, v in model.state_dict().items()}
    types = state.get("encoder.embedding.token_types.weight", torch.zeros(1, cfg.d_model))
    out = {
        "bert.embeddings.word_embeddings.weight": state["encoder.embedding.tokens.weight"],
        "bert.embeddings.position_embeddings.weight": state["encoder.embedding.positions.weight"],
        "bert.embeddings.token_type_embeddings.weight": types,
        "bert.embeddings.LayerNorm.weight": state["encoder.embedding.norm.weight"],
        "bert.embeddings.LayerNorm.bias": state["encoder.embedding.norm.bias"],
        "cls.predictions.transform.dense.weight": state["mlm_head.dense.weight"],
        "cls.predictions.transform.dense.bias": state["mlm_head.dense.bias"],
        "cls.predictions.transform.LayerNorm.weight": state["mlm_head.norm.weight"],
        "cls.predictions.transform.LayerNorm.bias": state["mlm_head.norm.bias"],
        "cls.predictions.decoder.weight": _output_matrix(model),
        "cls.predictions.bias": state.get("output_bias", torch.zeros(cfg.vocab_size)),
    }
    # the same bias under the decoder's name too: transformers ties the two, unless the
    # output matrix is untied (then it reads the decoder's)
    out["cls.predictions.decoder.bias"] = out["cls.predictions.bias"]
    names = {
        "attention.self.query": "self_attn.q_proj",
        "attention.self.key": "self_attn.k_proj",
        "attention.self.value": "self_attn.v_proj",
        "attention.output.dense": "self_attn.out_proj",
        "attention.output.LayerNorm": "attn_residual.norm",
        "intermediate.dense": "feed_forward.linear1",
        "output.dense": "feed_forward.linear2",
        "output.LayerNorm": "ff_residual.norm",
    }
    for i in range(cfg.n_encoder_layers):
        for theirs, ours in names.items():
            for kind in ("weight", "bias"):
                out[f"bert.encoder.layer.{i}.{theirs}.{kind}"] = state[
                    f"encoder.layers.{i}.{ours}.{kind}"
                ]
    return out


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
    activation = _HF_ACTIVATIONS[cfg.activation]
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


# ----- tokenizer files ----------------------------------------------------------


def _marian_tokenizer_files(
    spm_path: Path, out: Path, tokenizer: SentencePieceTokenizer, max_len: int
) -> None:
    """source.spm, target.spm (both the run's shared model) and vocab.json (piece -> id)."""
    data = spm_path.read_bytes()
    write_atomic(out / "source.spm", data)
    write_atomic(out / "target.spm", data)
    vocab = {tokenizer.id_to_piece(i): i for i in range(tokenizer.vocab_size)}
    write_atomic(out / "vocab.json", json.dumps(vocab, ensure_ascii=False, indent=1) + "\n")
    settings = {
        "tokenizer_class": "MarianTokenizer",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": max_len,
        "separate_vocabs": False,
    }
    write_atomic(out / "tokenizer_config.json", json.dumps(settings, indent=2) + "\n")


def fast_tokenizer_files(
    spm_path: Path, out: Path, tokenizer: SentencePieceTokenizer, target: str, max_len: int
) -> None:
    """Write OUT/tokenizer.json and OUT/tokenizer_config.json: a `PreTrainedTokenizerFast`
    converted from the sentencepiece model, which `AutoTokenizer` loads whatever
    config.json's model type.

    Args:
        spm_path: the sentencepiece model.
        out: the directory to write into.
        tokenizer: the same model, loaded.
        target: the model type (BERT's tokenizer reads [CLS] ... eos [SEP]).
        max_len: the model's longest input (model_max_length).

    Raises:
        ExportError: transformers missing or too old, or a BERT model without
            [CLS], [SEP] and [MASK] pieces.
    """
    try:
        from tokenizers.processors import TemplateProcessing
        from transformers import PreTrainedTokenizerFast
        from transformers.convert_slow_tokenizer import SpmConverter, import_protobuf
    except ImportError as err:
        raise ExportError(
            f"exporting to Hugging Face needs transformers and protobuf ({err.name} is "
            "missing): pip install 'aiayn[test]'"
        ) from None
    if not hasattr(SpmConverter, "build_tokenizer_from_spm_proto"):
        raise ExportError(
            "exporting a sentencepiece tokenizer needs transformers 5 or later "
            "(SpmConverter.build_tokenizer_from_spm_proto); upgrade transformers"
        )
    proto = import_protobuf().ModelProto.FromString(spm_path.read_bytes())
    vocab = {tokenizer.id_to_piece(i): i for i in range(tokenizer.vocab_size)}
    if proto.trainer_spec.model_type == proto.trainer_spec.UNIGRAM:  # pieces with their scores
        log.warning(
            "%s is a unigram model: its conversion to tokenizer.json segments a few inputs "
            "otherwise than sentencepiece does (see benchmarks/check_tokenizer_export.py); "
            "the bpe models aiayn trains by default convert exactly",
            spm_path,
        )
        pieces = [(piece.piece, piece.score) for piece in proto.pieces]
        backend = SpmConverter.build_tokenizer_from_spm_proto(proto, pieces)
    else:  # BPE: merges ranked by piece score
        backend = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab)
    piece = tokenizer.id_to_piece
    specials: dict[str, str] = {
        "pad_token": piece(tokenizer.pad_id),
        "eos_token": piece(tokenizer.eos_id),
        "bos_token": piece(tokenizer.bos_id),
        "unk_token": piece(tokenizer.unk_id),
    }
    eos = (specials["eos_token"], tokenizer.eos_id)
    if target == BERT:  # [CLS] text eos [SEP], as `aiayn fill` reads text
        ids = {p: vocab[p] for p in (CLS, SEP, MASK) if p in vocab}
        if len(ids) < 3:
            raise ExportError(
                f"{spm_path} has no {', '.join(p for p in (CLS, SEP, MASK) if p not in ids)} "
                "piece: BertForMaskedLM's tokenizer needs [CLS], [SEP] and [MASK]"
            )
        end = "" if tokenizer.eos_id == ids[SEP] else f" {eos[0]}"
        backend.post_processor = TemplateProcessing(
            single=f"{CLS} $A{end} {SEP}",
            special_tokens=[(CLS, ids[CLS]), (SEP, ids[SEP]), eos],
        )
        specials |= {"cls_token": CLS, "sep_token": SEP, "mask_token": MASK}
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=max_len, **specials)
    with tempfile.TemporaryDirectory() as tmp:
        fast.save_pretrained(tmp)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            data = (Path(tmp) / name).read_text(encoding="utf-8")
            if name == "tokenizer_config.json":  # whatever the model type, this class
                settings = json.loads(data) | {"tokenizer_class": "PreTrainedTokenizerFast"}
                data = json.dumps(settings, indent=2, ensure_ascii=False) + "\n"
            write_atomic(out / name, data)


# ----- the model card ---------------------------------------------------------------


def _read_json(path: Path | None) -> dict[str, Any] | None:
    if path is None or not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        log.warning("%s is not readable JSON: the model card leaves it out", path)
        return None
    return value if isinstance(value, dict) else None


def _run_results(weights: Path | None) -> dict[str, Any] | None:
    """The quickstart's results.json for these weights: in their run, or in the folder
    holding the run (the quickstart's OUT), if it names weights of this run."""
    if weights is None:
        return None
    weights = weights.absolute()
    in_run = weights.parent.parent.name == "checkpoints"  # RUN/checkpoints/NAME/weights
    run = weights.parents[2] if in_run else weights.parent
    for place in (run, run.parent):
        results = _read_json(place / RESULTS_FILE)
        scored = Path(str((results or {}).get("weights", ""))).absolute()
        if results is not None and run in scored.parents:
            return results
    return None


def model_card(
    model: nn.Module,
    target: str,
    settings: GenerationSettings,
    weights: Path | None,
) -> str:
    """README.md: the Hub's metadata header, then the recipe, data, score and parameters."""
    cfg = model.cfg
    pipeline = {MARIAN: "translation", PEGASUS: "translation", GPT2: "text-generation"}
    pipeline[NEOX] = "text-generation"
    header = [
        "---",
        "library_name: transformers",
        f"pipeline_tag: {pipeline.get(target, 'fill-mask')}",
        "tags:",
        "- aiayn",
        f"- {target}",
    ]
    results = _run_results(weights)
    recipe = find_in_run(weights, RUN_CONFIG_FILE) if weights is not None else None
    parameters = model.num_parameters()
    body = [
        f"# {ARCHITECTURES[target]} exported from aiayn",
        "",
        f"A {cfg.architecture.replace('_', '-')} Transformer trained with aiayn, "
        f"exported as `{ARCHITECTURES[target]}` by "
        "`aiayn export`. It computes the same logits as the aiayn model (within 1e-4) "
        "and decodes the same tokens.",
        "",
        "## Parameters",
        "",
        f"{parameters:,} distinct parameters; d_model {cfg.d_model}, {cfg.n_heads} heads, "
        f"d_ff {cfg.d_ff}, layers {cfg.n_encoder_layers} + {cfg.n_decoder_layers} "
        f"(encoder + decoder), {cfg.vocab_size} pieces, positions {cfg.positional}, "
        f"{'pre' if cfg.norm_first else 'post'}-norm, {cfg.activation.value}.",
    ]
    if results is not None:
        model_index = results.get("bleu")
        if model_index is not None:
            header += [
                "model-index:",
                "- name: aiayn-export",
                "  results:",
                "  - task:",
                f"      type: {pipeline.get(target, 'fill-mask')}",
                "    dataset:",
                "      type: aiayn-prepared-corpus",
                "      name: the run's test split (its config.yaml's data.corpus)",
                "      split: test",
                "    metrics:",
                "    - type: bleu",
                f"      value: {model_index}",
                f"      name: test BLEU (sacrebleu, beam {results.get('beam')}, "
                f"alpha {results.get('alpha')})",
            ]
        body += ["", "## Results", "", "From the run's results.json:", "", "```json"]
        body += [json.dumps(results, indent=2, ensure_ascii=False), "```"]
    if recipe is not None:
        body += ["", "## Recipe and data", "", f"The run's {RUN_CONFIG_FILE}:", "", "```yaml"]
        body += [recipe.read_text(encoding="utf-8").rstrip(), "```"]
    if target != BERT:
        body += [
            "",
            "## Generation",
            "",
            f"generation_config.json: beam {1 if target in LANGUAGE_MODELS else settings.beam}, "
            f"length penalty {settings.length_penalty} in transformers' form |Y|^alpha "
            "(aiayn's default is the paper's ((5 + |Y|) / 6)^alpha; the two rank long "
            "and short outputs differently), max_length "
            f"{settings.max_length or cfg.max_len}; pad and bos are never generated.",
        ]
    header.append("---")
    return "\n".join([*header, "", *body]) + "\n"


# ----- the export --------------------------------------------------------------------


def _load(run_or_model: str | Path | nn.Module, spm: str | Path | None):
    """(model, weights file or None, sentencepiece model path)."""
    if isinstance(run_or_model, nn.Module):
        if spm is None:
            raise ValueError("exporting a model object needs its sentencepiece model (spm=)")
        return run_or_model, None, Path(spm)
    weights = resolve_weights(run_or_model)
    cfg = read_config(weights)
    hf_target(cfg)  # refuse before reading a weight
    spm_path = Path(spm) if spm is not None else find_in_run(weights, TOKENIZER_FILE)
    if spm_path is None:
        raise FileNotFoundError(f"no {TOKENIZER_FILE} in the run of {weights}: give spm=")
    return load_model(weights, cfg=cfg), weights, spm_path


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
        _marian_tokenizer_files(spm_path, out, tokenizer, cfg.max_len)
    else:
        fast_tokenizer_files(spm_path, out, tokenizer, target, cfg.max_len)
    write_atomic(out / "config.json", json.dumps(hf_config(cfg, target), indent=2) + "\n")
    if target != BERT:
        generation = generation_config(cfg, target, settings)
        write_atomic(out / "generation_config.json", json.dumps(generation, indent=2) + "\n")
    write_atomic(out / "README.md", model_card(model, target, settings, weights))
    # each tensor its own contiguous copy: safetensors stores no shared or strided memory
    tensors = {name: t.float().contiguous().clone() for name, t in state.items()}
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})


def _fresh_dir(out: Path, source: Path, force: bool, fill: Callable[[Path], None]) -> Path:
    """`fill` a temporary directory renamed to OUT when whole, OUT checked first."""
    check_output(out, "OUT", directory=True)
    check_fresh_output(out, "OUT", source, force)
    return write_dir_atomic(out, fill)


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
        ExportError: a setting no Hugging Face architecture expresses exactly (named).
        FileNotFoundError: no checkpoint, or no sentencepiece model.
        ValueError: an OUT refused (naming why).
        aiayn.files.WriteFailed: the system refused a write to OUT.
    """
    model, weights, spm_path = _load(run_or_model, spm)
    target = hf_target(model.cfg)
    tokenizer = SentencePieceTokenizer.load(spm_path)
    _check_tokenizer(tokenizer, model.cfg, spm_path)
    settings = generation or GenerationSettings()
    model = model.float().eval()
    source = weights.parent if weights is not None else spm_path
    out = Path(out)

    def fill(tmp: Path) -> None:
        _write_hf(model, target, spm_path, tokenizer, settings, weights, tmp)

    _fresh_dir(out, source, force, fill)
    log.info("exported %s as %s to %s", weights or "the model", ARCHITECTURES[target], out)
    return out


def _ct2_converter(directory: Path, target: str) -> Any:
    """CTranslate2's `TransformersConverter` for an exported directory, with its own
    loaders corrected where they assume a convention of the original checkpoints
    that an aiayn export does not follow:

    - GPT-NeoX's loader reads transformers 4's names (embed_out, rotary_pct) and
      leaves the rotary base at 10000 whatever the config says.
    - Marian's loader drops the last row of the vocabulary (opus-mt's pad, which
      `transformers` appends) and starts the decoder from a zero vector (opus-mt's pad
      embedding); Pegasus's starts it from pad. An aiayn model's vocabulary is whole and
      its decoder starts from bos, the export's decoder_start_token_id.
    """
    import numpy as np
    import transformers
    from ctranslate2.converters import TransformersConverter
    from ctranslate2.converters.transformers import (
        BartLoader,
        GPT2Loader,
        GPTNeoXLoader,
        MarianMTLoader,
        PegasusLoader,
    )

    def decoder_start(config: Any, model: Any, tokenizer: Any) -> None:
        BartLoader.set_config(None, config, model, tokenizer)
        bos = model.config.bos_token_id  # a Marian tokenizer names no bos token
        config.bos_token = tokenizer.convert_ids_to_tokens(bos)

    class Marian(MarianMTLoader):
        def get_model_spec(self, model: Any) -> Any:
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return BartLoader.get_model_spec(self, model)  # the whole vocabulary

        def set_config(self, config: Any, model: Any, tokenizer: Any) -> None:
            decoder_start(config, model, tokenizer)

        def set_decoder(self, spec: Any, decoder: Any) -> None:
            BartLoader.set_decoder(self, spec, decoder)  # from the bos embedding

        def get_vocabulary(self, model: Any, tokenizer: Any) -> list[str]:
            return BartLoader.get_vocabulary(self, model, tokenizer)

    class Pegasus(PegasusLoader):
        def get_model_spec(self, model: Any) -> Any:
            model.config.normalize_before = True
            model.config.normalize_embedding = False
            return super().get_model_spec(model)

        def set_config(self, config: Any, model: Any, tokenizer: Any) -> None:
            decoder_start(config, model, tokenizer)

    class NeoX(GPTNeoXLoader):
        def get_model_spec(self, model: Any) -> Any:  # transformers 5 names embed_out lm_head
            model.embed_out = model.lm_head
            model.config.rotary_pct = 1.0  # transformers 5: rope_parameters; always whole here
            spec = super().get_model_spec(model)
            base = np.float32(model.config.rope_parameters["rope_theta"])  # not read upstream
            for layer in spec.decoder.layer:
                layer.self_attention.rotary_base = base
            return spec

    loader = {MARIAN: Marian, PEGASUS: Pegasus, GPT2: GPT2Loader, NEOX: NeoX}[target]()

    class Converter(TransformersConverter):
        def _load(self) -> Any:
            with torch.no_grad():
                model_class = getattr(transformers, loader.architecture_name)
                model = model_class.from_pretrained(str(directory)).eval()
                tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
                return loader(model, tokenizer)

    return Converter(str(directory))


def export_ctranslate2(
    run_or_model: str | Path | nn.Module,
    out: str | Path,
    *,
    quantization: str | None = None,
    spm: str | Path | None = None,
    generation: GenerationSettings | None = None,
    force: bool = False,
) -> Path:
    """Write a run's model as a CTranslate2 directory (`ctranslate2.Translator` for an
    encoder-decoder, `ctranslate2.Generator` for a decoder-only model).

    The model is exported to Hugging Face first (`export_hf`, in a temporary
    directory), then converted by CTranslate2's own `TransformersConverter`. The
    tokenizer files, the model card and the run's sentencepiece model (spm.model,
    which turns text into the pieces CTranslate2 reads) are copied beside
    CTranslate2's files.

    Args:
        run_or_model, spm, generation, force: as `export_hf`.
        out: the directory to write.
        quantization: int8, int8_float32 or bfloat16 weights; None keeps float32.

    Returns:
        OUT.

    Raises:
        ExportError: as `export_hf`; an encoder-only model (CTranslate2 runs BERT
            without its masked-LM head); ctranslate2 not installed.
        ValueError: an unknown quantization, or an OUT refused.
    """
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"--quantization {quantization!r}: not one of {', '.join(QUANTIZATIONS)}")
    model, weights, spm_path = _load(run_or_model, spm)
    target = hf_target(model.cfg)
    if target == BERT:
        raise ExportError(
            "architecture=encoder_only: CTranslate2 runs BERT as an encoder without its "
            "masked-LM head, so it cannot fill masks; export it with --to hf"
        )
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise ExportError(
            "exporting to CTranslate2 needs ctranslate2: pip install ctranslate2"
        ) from None
    source = weights.parent if weights is not None else spm_path
    out = Path(out)
    check_output(out, "OUT", directory=True)
    check_fresh_output(out, "OUT", source, force)
    with tempfile.TemporaryDirectory(prefix="aiayn-export-") as tmp:
        hf_dir = Path(tmp) / "hf"
        export_hf(model, hf_dir, spm=spm_path, generation=generation)
        if weights is not None:  # the card names the run's results
            card = model_card(model, target, generation or GenerationSettings(), weights)
            write_atomic(hf_dir / "README.md", card)

        def fill(tmp_out: Path) -> None:
            converter = _ct2_converter(hf_dir, target)
            converter.convert(str(tmp_out), quantization=quantization, force=True)
            write_atomic(tmp_out / TOKENIZER_FILE, spm_path.read_bytes())  # pieces from text
            for path in hf_dir.iterdir():
                if path.name not in (WEIGHTS, "config.json") and not (tmp_out / path.name).exists():
                    write_atomic(tmp_out / path.name, path.read_bytes())

        write_dir_atomic(out, fill)
    log.info("exported %s to CTranslate2 (%s) in %s", weights or "the model", quantization, out)
    return out


def export(
    run_or_model: str | Path | nn.Module,
    out: str | Path,
    to: str = "hf",
    **options: Any,
) -> Path:
    """`export_hf` (to="hf") or `export_ctranslate2` (to="ctranslate2").

    Raises:
        ValueError: an unknown target; otherwise as the function it calls.
    """
    if to == "hf":
        return export_hf(run_or_model, out, **options)
    if to == "ctranslate2":
        return export_ctranslate2(run_or_model, out, **options)
    raise ValueError(f"--to {to!r}: not one of {', '.join(TARGETS)}")


__all__ = [
    "ARCHITECTURES",
    "ExportError",
    "GenerationSettings",
    "export",
    "export_ctranslate2",
    "export_hf",
    "hf_target",
]
