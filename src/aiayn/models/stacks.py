"""The pieces every model shape is built from: embedding, encoder and decoder stacks,
the pre-softmax projection (section 3 of the paper, figure 1).

    Embedding           token embedding x sqrt(d_model), positions, dropout (3.4, 3.5)
    Encoder, Decoder    N layers each, with their position schemes and final norms (3.1)
    PreSoftmaxProjection  the output projection, tied to the embedding or not (3.4)

The paper's encoder-decoder (`aiayn.models.encoder_decoder.Transformer`), GPT
(`decoder_only`), BERT (`encoder_only`), the prefix LM and the classifier assemble
them; none of them holds a piece another needs.

Shape legend:
    B batch, S source length, T target length, D d_model, V vocabulary,
    H heads. Token ids are int64; masks are bool with True = may attend.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.dropout import Dropout
from aiayn.nn.hooks import HookPoint, hooked, hooks
from aiayn.nn.kernels import DecodingStore, build_kernel, check_positions, kernel_class
from aiayn.nn.kernels.sdpa import SdpaKernel
from aiayn.nn.layers import DecoderLayer, EncoderLayer, FeedForward
from aiayn.nn.positions import PositionScheme, build_positions


@dataclass
class EncoderOutput:
    """The encoder's output and which source positions are real tokens."""

    hidden: Tensor  # (B, S, D)
    real_tokens: Tensor  # (B, S) bool, False at padding

    def index_select(self, index: Tensor) -> EncoderOutput:
        """Rows `index` of the batch (beam search: one copy per hypothesis)."""
        return EncoderOutput(
            self.hidden.index_select(0, index), self.real_tokens.index_select(0, index)
        )


@dataclass
class AttentionMaps:
    """Attention weights of every layer, from the explicit attention path."""

    encoder: list[Tensor]  # per layer (B, H, S, S)
    decoder: list[Tensor]  # per layer (B, H, T, T), causal
    cross: list[Tensor]  # per layer (B, H, T, S)

    @classmethod
    def read(cls, model: nn.Module, run: Callable[[], object]) -> AttentionMaps:
        """The weights every attention sub-layer of `model` computes during `run()`, read
        at its `hook_weights` (`aiayn.nn.hooks`), by kind and in layer order."""
        sublayers = attention_sublayers(model)  # "encoder.0.self" -> its module
        path = {id(module): name for name, module in model.named_modules()}
        point_of = {name: f"{path[id(module)]}.hook_weights" for name, module in sublayers.items()}
        found: dict[str, Tensor] = {}

        def keep(weights: Tensor, point: str) -> None:
            found[point] = weights

        with hooks(model, dict.fromkeys(point_of.values(), keep)):
            run()

        def kind(stack: str, part: str) -> list[Tensor]:
            return [
                found[point_of[name]]
                for name in sublayers
                if name.startswith(stack) and name.endswith(part)
            ]

        return cls(kind("encoder.", ".self"), kind("decoder.", ".self"), kind("decoder.", ".cross"))


class Embedding(nn.Module):
    """Token embeddings times sqrt(d_model), plus positions, then dropout (sections 3.4, 3.5).

    `positions` is the stack's position scheme; schemes that act inside attention
    (rotary, relative, ALiBi) add nothing here. BERT adds two things the paper has
    not: learned token-type (segment) vectors in the sum, and a LayerNorm on the sum
    before the dropout.

    Args:
        tokens: the (V, D) token embedding (shared with other stacks when tied).
        positions: the stack's position scheme.
        dropout: P_drop on the sum.
        scale: multiply the token embeddings by sqrt(D).
        token_types: a (type_vocab_size, D) embedding of token types, or None.
        norm: a LayerNorm on the sum, or None.
    """

    def __init__(
        self,
        tokens: nn.Embedding,
        positions: PositionScheme,
        dropout: float,
        scale: bool,
        token_types: nn.Embedding | None = None,
        norm: nn.LayerNorm | None = None,
    ):
        super().__init__()
        self.tokens = tokens
        self.positions = positions
        self.token_types = token_types
        self.norm = norm
        self.dropout = Dropout(dropout)
        self.scale = math.sqrt(tokens.embedding_dim) if scale else 1.0
        self.hook_embed = HookPoint()  # (B, L, D): tokens with positions, before dropout

    def forward(self, ids: Tensor, offset: int = 0, token_types: Tensor | None = None) -> Tensor:
        """ids: (B, L); token_types: (B, L) or None (type 0 everywhere). Returns (B, L, D)."""
        x = self.tokens(ids) * self.scale  # (B, L, D)
        added = self.positions.embeddings(ids.size(1), offset)  # (L, D) or None
        if added is not None:
            x = x + added
        if self.token_types is not None:
            types = torch.zeros_like(ids) if token_types is None else token_types
            x = x + self.token_types(types)
        elif token_types is not None:
            raise ValueError("token_types given to a model without them (type_vocab_size 0)")
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(hooked(self.hook_embed, x))


def _embedding(
    cfg: ModelConfig, tokens: nn.Embedding, causal: bool, token_types: bool = False
) -> Embedding:
    """A stack's embedding: its position scheme (for a `causal` stack or not), and
    BERT's token types (where the stack reads them, `token_types`: the encoder's input)
    and LayerNorm when the config has them."""
    types = None
    if cfg.type_vocab_size > 0 and token_types:
        types = nn.Embedding(cfg.type_vocab_size, cfg.d_model)
    norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.embedding_norm else None
    positions = build_positions(cfg.positional, cfg, causal=causal)
    check_positions(cfg, kernel_class(cfg.attention), positions)
    return Embedding(
        tokens,
        positions,
        cfg.dropout,
        cfg.scale_embeddings,
        types,
        norm,
    )


def attention_positions(
    positions: PositionScheme, q_len: int, k_len: int
) -> tuple[PositionScheme | None, Tensor | None]:
    """What a stack's self-attention takes of its positions: a rotary scheme and a bias.

    The bias, (H, T, S), is computed once per forward pass and shared by every
    layer (as T5 does); the queries are the last `q_len` of `k_len` positions.
    """
    rotary = positions if positions.rotary else None
    return rotary, positions.attention_bias(q_len, k_len)


def _attention(cfg: ModelConfig, name: str) -> MultiHeadAttention:
    """The attention sub-layer `name` ("encoder.0.self", "decoder.3.cross"...), pruned or not."""
    # encoder-decoder attention reads all of the source: the dense kernel
    kernel = SdpaKernel() if name.endswith(".cross") else build_kernel(cfg)
    kept = cfg.heads_of(name)
    return MultiHeadAttention(
        d_model=cfg.d_model,
        n_heads=cfg.n_heads if kept is None else len(kept),
        n_kv_heads=cfg.n_kv_heads if kept is None else max(kept) + 1,
        d_k=cfg.d_k,
        d_v=cfg.d_v,
        dropout=cfg.attention_dropout,
        kernel=kernel,
        kv_of_head=kept,
    )


def attention_sublayers(model: nn.Module) -> dict[str, MultiHeadAttention]:
    """Every attention sub-layer of a model by name, in model order: "encoder.I.self",
    then "decoder.I.self" and "decoder.I.cross" per decoder layer. A decoder-only
    (GPT) model has only "decoder.I.self", an encoder-only (BERT) one "encoder.I.self"."""
    found = {}
    for stack in ("encoder", "decoder"):
        if getattr(model, stack, None) is None:
            continue
        for i, layer in enumerate(getattr(model, stack).layers):
            found[f"{stack}.{i}.self"] = layer.self_attn
            if getattr(layer, "cross_attn", None) is not None:
                found[f"{stack}.{i}.cross"] = layer.cross_attn
    return found


def _feed_forward(cfg: ModelConfig) -> FeedForward | None:
    # d_ff 0: attention-only layers (no feed-forward sub-layer)
    return FeedForward(cfg.d_model, cfg.d_ff, cfg.activation) if cfg.d_ff else None


def _final_norm(cfg: ModelConfig) -> nn.Module:
    # Pre-norm leaves the residual stream un-normalised, so each stack ends with a
    # LayerNorm; post-norm already normalises after every sub-layer and has none.
    if cfg.norm_first:
        return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
    return nn.Identity()


class Encoder(nn.Module):
    """N identical layers of self-attention and feed-forward over the embedded source."""

    def __init__(self, cfg: ModelConfig, tokens: nn.Embedding) -> None:
        super().__init__()
        self.embedding = _embedding(cfg, tokens, causal=False, token_types=True)
        self.layers = nn.ModuleList(
            EncoderLayer(
                _attention(cfg, f"encoder.{i}.self"),
                _feed_forward(cfg),
                cfg.d_model,
                cfg.dropout,
                cfg.norm_first,
                cfg.layer_norm_eps,
            )
            for i in range(cfg.n_encoder_layers)
        )
        self.final_norm = _final_norm(cfg)

    def forward(
        self, src: Tensor, mask: Tensor | None, token_types: Tensor | None = None
    ) -> Tensor:
        """src: (B, S) ids; mask: bool (B, 1, 1, S) or None; token_types: (B, S) or None.
        Returns (B, S, D)."""
        x = self.embedding(src, token_types=token_types)
        rotary, bias = attention_positions(self.embedding.positions, src.size(1), src.size(1))
        for layer in self.layers:
            x = layer(x, mask, rotary, bias)
        return self.final_norm(x)


class DecoderCache(Protocol):
    """What a decoder reads of the cache it decodes with: per layer, a self-attention
    store and (with cross-attention) a static encoder-decoder store, and the positions
    already decoded. `aiayn.inference.kv_cache.KVCache` is the one decoding makes; the
    model only duck-types it (models sit below inference)."""

    self_attention: list[DecodingStore]
    cross_attention: list[DecodingStore]

    @property
    def length(self) -> int:
        """Positions already decoded."""
        ...


class Decoder(nn.Module):
    """N identical layers of causal self-attention, encoder-decoder attention and feed-forward.

    Without `cross_attention` it is GPT's stack: causal self-attention and
    feed-forward only, over one token stream (`aiayn.models.decoder_only`).
    """

    def __init__(self, cfg: ModelConfig, tokens: nn.Embedding, cross_attention: bool = True):
        super().__init__()
        self.embedding = _embedding(cfg, tokens, causal=True)
        self.layers = nn.ModuleList(
            DecoderLayer(
                _attention(cfg, f"decoder.{i}.self"),
                _attention(cfg, f"decoder.{i}.cross") if cross_attention else None,
                _feed_forward(cfg),
                cfg.d_model,
                cfg.dropout,
                cfg.norm_first,
                cfg.layer_norm_eps,
            )
            for i in range(cfg.n_decoder_layers)
        )
        self.final_norm = _final_norm(cfg)

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor | None,
        memory_mask: Tensor | None,
        cache: DecoderCache | None = None,
        self_mask: Tensor | None = None,
    ) -> Tensor:
        """Decode target ids (only the new ones when a cache holds the prefix).

        Args:
            tgt: (B, T) ids.
            memory: (B, S, D) encoder output (None without cross-attention).
            memory_mask: bool (B, 1, 1, S), True at real source tokens, or None.
            cache: the key/value stores, filled and extended in place.
            self_mask: the self-attention pattern, bool (B, 1, T, L + T), instead of
                the causal one (see `DecoderLayer`); None: causal.

        Returns:
            (B, T, D) states.
        """
        offset = 0 if cache is None else cache.length
        x = self.embedding(tgt, offset)
        t_len = tgt.size(1)
        rotary, bias = attention_positions(self.embedding.positions, t_len, offset + t_len)
        for i, layer in enumerate(self.layers):
            self_cache = None if cache is None else cache.self_attention[i]
            has_cross = cache is not None and bool(cache.cross_attention)
            cross_cache = cache.cross_attention[i] if has_cross else None
            x = layer(x, memory, memory_mask, self_cache, cross_cache, rotary, bias, self_mask)
        return self.final_norm(x)


class PreSoftmaxProjection(nn.Module):
    """The last linear map of a model shape, hidden states to logits (section 3.4).

    Its (V, D) matrix is the token embedding (`output_embedding`) when
    `cfg.tie_output`, else a matrix of its own, `output_proj`; `output_bias` is
    added with `cfg.output_bias`. Subclasses call `build_output(cfg)` in
    `__init__` and say which embedding is tied.
    """

    def build_output(self, cfg: ModelConfig) -> None:
        self.output_proj = (
            None if cfg.tie_output else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        )
        self.output_bias = nn.Parameter(torch.zeros(cfg.vocab_size)) if cfg.output_bias else None
        self.hook_logits = HookPoint()  # (B, T, V): the pre-softmax logits

    def output_embedding(self) -> nn.Embedding:
        """The token embedding the output matrix is tied to."""
        raise NotImplementedError

    def project(self, hidden: Tensor) -> Tensor:
        """The pre-softmax linear map: (B, T, D) states to (B, T, V) logits."""
        logits = nn.functional.linear(hidden, self.output_weight(), self.output_bias)
        return hooked(self.hook_logits, logits)

    def output_weight(self) -> Tensor:
        """The (V, D) pre-softmax matrix: the tied embedding's, or `output_proj`'s."""
        if self.output_proj is None:
            return self.output_embedding().weight
        return self.output_proj.weight

    def num_parameters(self) -> int:
        """Distinct trainable parameters (a tied matrix counts once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


def check_ids(ids: Tensor, side: str, max_len: int, offset: int = 0) -> None:
    """Refuse ids that are not (batch, length) or run past `max_len` after `offset` cached ones.

    Raises:
        ValueError: naming `side` ("source", "target", "input") and the lengths.
    """
    if ids.dim() != 2:
        raise ValueError(f"{side} ids must be (batch, length), got shape {tuple(ids.shape)}")
    if offset + ids.size(1) > max_len:
        raise ValueError(
            f"{side} sequence of {offset + ids.size(1)} tokens is longer than the model's "
            f"max_len={max_len}"
        )


def normal_initialisation(model: nn.Module, std: float = 0.02) -> None:
    """GPT's and BERT's initialisation: every linear and embedding weight from N(0, std),
    biases zero, LayerNorms weight 1 and bias 0, the padding row zero. Position schemes
    keep their own (`PositionScheme.reset_parameters`)."""
    schemes = [m for m in model.modules() if isinstance(m, PositionScheme)]
    inside_schemes = {id(m) for scheme in schemes for m in scheme.modules()}
    for module in model.modules():
        if id(module) in inside_schemes:
            continue
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.LayerNorm):
            module.reset_parameters()
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    for scheme in schemes:
        scheme.reset_parameters()
