"""The decoder-only Transformer: GPT's shape, from the encoder-decoder's own blocks.

Shape legend:
    B batch, T length, D d_model, V vocabulary, H heads. Token ids are int64.

    model = DecoderOnly(ModelConfig.gpt(vocab_size=50257))
    logits = model(ids)                              # (B, T, V): position t predicts t + 1

It is the paper's decoder without the encoder: `Decoder(cfg, tokens,
cross_attention=False)`, so each layer is causal self-attention and the
feed-forward network (`DecoderLayer` with no cross-attention), over one token
stream. The layers are `cfg.n_decoder_layers` (`n_encoder_layers` is unused).
GPT-2 (Radford et al. 2019) differs from the paper's decoder only through config
fields: pre-norm with a final LayerNorm (`norm_first`), learned positions, GELU,
unscaled embeddings (`ModelConfig.gpt`). The output projection is the token
embedding (tied) unless `tie_output` is off.

Inputs have no padding: training sequences are packed into full blocks, and a
prompt is one unpadded row per sequence (prompts of one length per batch).

For search, `start(prompt)` returns a `DecoderOnlyDecoding`: the prompt fills the
key/value cache in one pass, and the search continues from there.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.models import register_shape
from aiayn.models.encoder_decoder import (
    AttentionMaps,
    Decoder,
    PreSoftmaxProjection,
    check_ids,
    normal_initialisation,
)
from aiayn.nn.attention import KVCache


@register_shape(
    "decoder_only",
    frozen="aiayn.inference.frozen:FrozenDecoderOnly",
    user="aiayn.apps.generate:Generator",
    verb="generate",
    task="lm",
)
class DecoderOnly(PreSoftmaxProjection):
    """A decoder-only language model (GPT).

    Args:
        cfg: the hyper-parameters; see `ModelConfig` (and `ModelConfig.gpt`).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)  # no padding row: inputs are unpadded
        self.decoder = Decoder(cfg, tokens, cross_attention=False)
        self.build_output(cfg)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's initialisation (`normal_initialisation`, std 0.02), with the projections
        into the residual stream (attention's W^O, the FFN's W2) scaled by 1/sqrt(2N) for
        the N layers that add to it (Radford et al. 2019, section 2.3)."""
        normal_initialisation(self)
        residual_std = 0.02 / (2 * self.cfg.n_decoder_layers) ** 0.5
        for layer in self.decoder.layers:
            nn.init.normal_(layer.self_attn.out_proj.weight, std=residual_std)
            nn.init.normal_(layer.feed_forward.linear2.weight, std=residual_std)

    def forward(self, ids: Tensor, cache: KVCache | None = None) -> Tensor:
        """Next-token logits at every position.

        Args:
            ids: (B, T) token ids; with a `cache`, only those after the cached prefix.
            cache: from `new_cache()`; filled and extended in place.

        Returns:
            (B, T, V) unnormalised scores of the token after each position.

        Raises:
            ValueError: if the sequence (cached prefix included) is longer than `cfg.max_len`.
        """
        return self.project(self.hidden(ids, cache))

    def hidden(self, ids: Tensor, cache: KVCache | None = None) -> Tensor:
        """The last layer's states (after the final LayerNorm, if any): (B, T, D)."""
        offset = 0 if cache is None else cache.length
        check_ids(ids, "input", self.cfg.max_len, offset)
        return self.decoder(ids, None, None, cache)

    def output_embedding(self) -> nn.Embedding:
        """The token embedding: the output matrix when tied."""
        return self.decoder.embedding.tokens

    def new_cache(self) -> KVCache:
        """An empty key/value cache: one growing self-attention store per layer."""
        kernels = [layer.self_attn.kernel for layer in self.decoder.layers]
        return KVCache.empty(self.cfg.n_decoder_layers, cross=False, kernels=kernels)

    def start(self, prompt: Tensor, beam: int = 1) -> DecoderOnlyDecoding:
        """Begin continuing (B, T) unpadded prompts for `aiayn.inference.search`, `beam` rows each."""
        return DecoderOnlyDecoding(self, prompt, beam)

    def attention_maps(self, ids: Tensor) -> AttentionMaps:
        """Every layer's causal self-attention weights, (B, H, T, T), as `maps.decoder`
        (`encoder` and `cross` are empty), from the explicit attention path."""
        check_ids(ids, "input", self.cfg.max_len)
        return AttentionMaps.read(self, lambda: self.decoder(ids, None, None))


class DecoderOnlyDecoding:
    """A batch of prompts being continued: the key/value cache, seen by the search
    (`aiayn.inference.search.Decoding`) through `input_lengths`, `step` and `keep`.

    The prompt runs through the model once, at construction, filling the cache and
    giving the logits of the first new token; each of the `beam` rows of a prompt
    starts from a copy of that prompt's cache. The search's first `step` feeds its
    start token (bos), which stands for the prompt: that step returns the prompt's
    logits and feeds nothing. Every later step feeds the newest token.

    The whole sequence must fit the positions: a prompt of T tokens can be followed by
    at most `cfg.max_len - T + 1` tokens (the last one is never fed back), so a caller
    passes `max_output_len` no larger than that to the search.

    Args:
        model: a `DecoderOnly` (or a subclass) in eval mode.
        prompt: (B, T) ids, T >= 1, without padding.
        beam: hypothesis rows per prompt.

    Raises:
        ValueError: an empty prompt, or one longer than `cfg.max_len`.
    """

    def __init__(self, model: DecoderOnly, prompt: Tensor, beam: int = 1) -> None:
        if prompt.dim() != 2 or prompt.size(1) == 0:
            raise ValueError(f"prompt must be (batch, length >= 1), got {tuple(prompt.shape)}")
        self.model = model
        batch, length = prompt.shape
        self.input_lengths = torch.full((batch,), length, dtype=torch.long, device=prompt.device)
        self.cache = model.new_cache()
        first = model(prompt, self.cache)[:, -1]  # (B, V)
        if beam > 1:
            rows = torch.arange(batch, device=prompt.device).repeat_interleave(beam)
            self.cache.reorder(rows)
            first = first.index_select(0, rows)
        self.dtype = first.dtype
        self._first_logits: Tensor | None = first

    def step(self, last: Tensor) -> Tensor:
        """(R,) the newest token of each row -> (R, V) logits of the token after it."""
        if self._first_logits is not None:  # `last` is the start token: the prompt's turn
            logits, self._first_logits = self._first_logits, None
            return logits
        return self.model(last[:, None], self.cache)[:, -1]

    def keep(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Go on with rows `rows` (each new row's parent); `sentences` is not needed here:
        a decoder-only model has no per-sentence state besides the rows' caches."""
        self.cache.reorder(rows)
