"""The encoder-decoder Transformer (section 3, figure 1).

Shape legend:
    B batch, S source length, T target length, D d_model, V vocabulary,
    H heads. Token ids are int64; masks are bool with True = may attend.

    model = Transformer(ModelConfig.base(vocab_size=37000))
    logits = model(src_ids, tgt_in_ids)          # (B, T, V)

For search, `encode` runs the encoder once and `decode` runs the decoder on new
target tokens only, with a `KVCache` holding the keys and values of the prefix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from aiayn.attention import KVCache, MultiHeadAttention
from aiayn.config import ModelConfig, Positional
from aiayn.dropout import Dropout
from aiayn.layers import DecoderLayer, EncoderLayer, FeedForward
from aiayn.linear import InferenceWeights, Linear, inference_linear
from aiayn.masks import key_mask, padding_mask
from aiayn.positional import LearnedPositions, SinusoidalPositions


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


class Embedding(nn.Module):
    """Token embeddings times sqrt(d_model), plus positions, then dropout (sections 3.4, 3.5)."""

    def __init__(self, tokens: nn.Embedding, positions: nn.Module, dropout: float, scale: bool):
        super().__init__()
        self.tokens = tokens
        self.positions = positions
        self.dropout = Dropout(dropout)
        self.scale = math.sqrt(tokens.embedding_dim) if scale else 1.0

    def forward(self, ids: Tensor, offset: int = 0) -> Tensor:
        x = self.tokens(ids) * self.scale  # (B, L, D)
        return self.dropout(x + self.positions(ids.size(1), offset))


def _positions(cfg: ModelConfig) -> nn.Module:
    if cfg.positional is Positional.LEARNED:
        return LearnedPositions(cfg.max_len, cfg.d_model)
    halves = cfg.positional is Positional.SINUSOIDAL_HALVES
    return SinusoidalPositions(cfg.max_len, cfg.d_model, halves)


def _attention(cfg: ModelConfig) -> MultiHeadAttention:
    return MultiHeadAttention(
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        n_kv_heads=cfg.n_kv_heads,
        d_k=cfg.d_k,
        d_v=cfg.d_v,
        dropout=cfg.attention_dropout,
    )


def _feed_forward(cfg: ModelConfig) -> FeedForward:
    return FeedForward(cfg.d_model, cfg.d_ff, cfg.activation)


def _final_norm(cfg: ModelConfig) -> nn.Module:
    # Pre-norm leaves the residual stream un-normalised, so each stack ends with a
    # LayerNorm; post-norm already normalises after every sub-layer and has none.
    if cfg.norm_first:
        return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
    return nn.Identity()


def _source_mask(real_tokens: Tensor) -> Tensor | None:
    """The (B, 1, 1, S) key mask over the source, or None when no position is padding.

    Without a mask attention takes SDPA's unmasked kernel and skips its guard for
    fully padded rows: a batch of equal-length sentences (as after length
    bucketing) decodes faster. Checked on the CPU only, where reading the mask
    costs nothing; on an accelerator it would wait for the device.
    """
    if real_tokens.device.type == "cpu" and bool(real_tokens.all()):
        return None
    return key_mask(real_tokens)


class Encoder(nn.Module):
    """N identical layers of self-attention and feed-forward over the embedded source."""

    def __init__(self, cfg: ModelConfig, tokens: nn.Embedding) -> None:
        super().__init__()
        self.embedding = Embedding(tokens, _positions(cfg), cfg.dropout, cfg.scale_embeddings)
        self.layers = nn.ModuleList(
            EncoderLayer(
                _attention(cfg),
                _feed_forward(cfg),
                cfg.d_model,
                cfg.dropout,
                cfg.norm_first,
                cfg.layer_norm_eps,
            )
            for _ in range(cfg.n_encoder_layers)
        )
        self.final_norm = _final_norm(cfg)

    def forward(
        self, src: Tensor, real_tokens: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor]]:
        """src: (B, S) ids; real_tokens: (B, S) bool. Returns (B, S, D) and per-layer weights."""
        x = self.embedding(src)
        mask = _source_mask(real_tokens)  # (B, 1, 1, S) or None
        all_weights = []
        for layer in self.layers:
            x, weights = layer(x, mask, need_weights)
            if weights is not None:
                all_weights.append(weights)
        return self.final_norm(x), all_weights


class Decoder(nn.Module):
    """N identical layers of causal self-attention, encoder-decoder attention and feed-forward."""

    def __init__(self, cfg: ModelConfig, tokens: nn.Embedding) -> None:
        super().__init__()
        self.embedding = Embedding(tokens, _positions(cfg), cfg.dropout, cfg.scale_embeddings)
        self.layers = nn.ModuleList(
            DecoderLayer(
                _attention(cfg),
                _attention(cfg),
                _feed_forward(cfg),
                cfg.d_model,
                cfg.dropout,
                cfg.norm_first,
                cfg.layer_norm_eps,
            )
            for _ in range(cfg.n_decoder_layers)
        )
        self.final_norm = _final_norm(cfg)

    def forward(
        self,
        tgt: Tensor,
        encoded: EncoderOutput,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """Decode target ids (only the new ones when a cache holds the prefix).

        Returns:
            (B, T, D) states, per-layer self-attention and cross-attention weights.
        """
        offset = 0 if cache is None else cache.length
        x = self.embedding(tgt, offset)
        memory_mask = _source_mask(encoded.real_tokens)  # (B, 1, 1, S) or None
        self_maps, cross_maps = [], []
        for i, layer in enumerate(self.layers):
            self_cache = None if cache is None else cache.self_attention[i]
            cross_cache = None if cache is None else cache.cross_attention[i]
            x, self_weights, cross_weights = layer(
                x, encoded.hidden, memory_mask, self_cache, cross_cache, need_weights
            )
            if need_weights:
                self_maps.append(self_weights)
                cross_maps.append(cross_weights)
        return self.final_norm(x), self_maps, cross_maps


class Transformer(nn.Module):
    """The encoder-decoder Transformer of "Attention Is All You Need".

    Args:
        cfg: the hyper-parameters; see `ModelConfig`.

    With `cfg.tie_embeddings` and `cfg.tie_output` (the default) one (V, D) matrix is
    the source embedding, the target embedding and the pre-softmax projection (3.4).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        src_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        tgt_tokens = (
            src_tokens
            if cfg.tie_embeddings
            else nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        )
        self.encoder = Encoder(cfg, src_tokens)
        self.decoder = Decoder(cfg, tgt_tokens)
        self.output_proj = (
            None if cfg.tie_output else Linear(cfg.d_model, cfg.vocab_size, bias=False)
        )
        self.output_bias = nn.Parameter(torch.zeros(cfg.vocab_size)) if cfg.output_bias else None
        self._output_weight = InferenceWeights()  # laid out for CPU inference (aiayn.linear)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise as fairseq and tensor2tensor do for this model.

        Linear weights: Xavier/Glorot uniform, which keeps activation variance about
        constant through the stacks; biases zero. Token embeddings: N(0, d_model^-0.5),
        so that after the sqrt(d_model) scaling each entry has unit variance, the
        scale of the sinusoids, and tied output logits start near zero. The padding
        row is zero. LayerNorms: weight 1, bias 0 (PyTorch's default).
        """
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=self.cfg.d_model**-0.5)
                with torch.no_grad():
                    module.weight[self.cfg.pad_id].zero_()

    # ----- the three entry points -------------------------------------------

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits.

        Args:
            src: (B, S) source ids, padded with `cfg.pad_id`.
            tgt_in: (B, T) target ids shifted right (bos first), padded likewise.

        Returns:
            (B, T, V) unnormalised next-token scores.

        Raises:
            ValueError: if a sequence is longer than `cfg.max_len`.
        """
        return self.decode(tgt_in, self.encode(src))

    def encode(self, src: Tensor) -> EncoderOutput:
        """Run the encoder once: (B, S) ids to an `EncoderOutput`."""
        self._check_length(src, "source")
        real_tokens = padding_mask(src, self.cfg.pad_id)
        hidden, _ = self.encoder(src, real_tokens)
        return EncoderOutput(hidden, real_tokens)

    def decode(self, tgt: Tensor, encoded: EncoderOutput, cache: KVCache | None = None) -> Tensor:
        """Logits for target ids given the encoder output.

        Args:
            tgt: (B, T) target ids; with a `cache`, only the positions not yet decoded.
            encoded: from `encode`: one row per row of `tgt`, or one per group of G
                consecutive rows of `tgt` that share a source (beam search's beams).
            cache: from `new_cache()`; filled and extended in place.

        Returns:
            (B, T, V) logits.
        """
        offset = 0 if cache is None else cache.length
        self._check_length(tgt, "target", offset)
        hidden, _, _ = self.decoder(tgt, encoded, cache)
        return self.project(hidden)

    def project(self, hidden: Tensor) -> Tensor:
        """The pre-softmax linear map: (B, T, D) states to (B, T, V) logits."""
        weight = (
            self.decoder.embedding.tokens.weight
            if self.output_proj is None
            else self.output_proj.weight
        )
        return inference_linear(hidden, weight, self.output_bias, self._output_weight)

    def new_cache(self) -> KVCache:
        """An empty key/value cache for incremental decoding."""
        return KVCache.empty(self.cfg.n_decoder_layers)

    def attention_maps(self, src: Tensor, tgt_in: Tensor) -> AttentionMaps:
        """All attention weights for one teacher-forced pass (explicit attention path)."""
        self._check_length(src, "source")
        self._check_length(tgt_in, "target")
        real_tokens = padding_mask(src, self.cfg.pad_id)
        hidden, encoder_maps = self.encoder(src, real_tokens, need_weights=True)
        encoded = EncoderOutput(hidden, real_tokens)
        _, decoder_maps, cross_maps = self.decoder(tgt_in, encoded, need_weights=True)
        return AttentionMaps(encoder_maps, decoder_maps, cross_maps)

    def num_parameters(self) -> int:
        """Distinct trainable parameters (a tied matrix counts once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def _check_length(self, ids: Tensor, side: str, offset: int = 0) -> None:
        if ids.dim() != 2:
            raise ValueError(f"{side} ids must be (batch, length), got shape {tuple(ids.shape)}")
        if offset + ids.size(1) > self.cfg.max_len:
            raise ValueError(
                f"{side} sequence of {offset + ids.size(1)} tokens is longer than the model's "
                f"max_len={self.cfg.max_len}"
            )
