"""An aiayn model's weights under the names of the `transformers` architecture it is
exported as, in the basis that architecture's positions use (see `aiayn.io.export`)."""

from __future__ import annotations

import torch
from torch import nn

from aiayn.io.export.targets import PEGASUS
from aiayn.nn.positions.sinusoidal import sinusoidal_table

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

    def attention(theirs: str, ours: str) -> None:
        for name in ("q_proj", "k_proj", "v_proj"):
            _linear_in(out, f"{theirs}.{name}", s, f"{ours}.{name}")
        _linear_out(out, f"{theirs}.out_proj", s, f"{ours}.out_proj")

    def feed_forward(theirs: str, ours: str) -> None:
        _linear_in(out, f"{theirs}.fc1", s, f"{ours}.feed_forward.linear1")
        _linear_out(out, f"{theirs}.fc2", s, f"{ours}.feed_forward.linear2")
        _norm(out, f"{theirs}.final_layer_norm", s, f"{ours}.ff_residual.norm")

    for i in range(cfg.n_encoder_layers):
        ours, theirs = f"encoder.layers.{i}", f"model.encoder.layers.{i}"
        attention(f"{theirs}.self_attn", f"{ours}.self_attn")
        _norm(out, f"{theirs}.self_attn_layer_norm", s, f"{ours}.attn_residual.norm")
        feed_forward(theirs, ours)
    for i in range(cfg.n_decoder_layers):
        ours, theirs = f"decoder.layers.{i}", f"model.decoder.layers.{i}"
        attention(f"{theirs}.self_attn", f"{ours}.self_attn")
        _norm(out, f"{theirs}.self_attn_layer_norm", s, f"{ours}.self_residual.norm")
        attention(f"{theirs}.encoder_attn", f"{ours}.cross_attn")
        _norm(out, f"{theirs}.encoder_attn_layer_norm", s, f"{ours}.cross_residual.norm")
        feed_forward(theirs, ours)
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
