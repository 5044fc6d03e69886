"""The decoder-only Transformer: GPT's shape, from the stacks every shape shares (`stacks`).

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

For search, `aiayn.inference.decoding.start(model, prompt)` returns a
`DecoderOnlyDecoding`: the prompt fills the key/value cache in one pass, and the
search continues from there.
"""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.models import register_shape
from aiayn.models.stacks import (
    AttentionMaps,
    Decoder,
    DecoderCache,
    PreSoftmaxProjection,
    check_ids,
    normal_initialisation,
)


@register_shape("decoder_only", task="lm")
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
            if layer.feed_forward is not None:  # None: attention-only (d_ff 0)
                nn.init.normal_(layer.feed_forward.linear2.weight, std=residual_std)

    def forward(
        self, ids: Tensor, cache: DecoderCache | None = None, project: bool = True
    ) -> Tensor:
        """Next-token logits at every position.

        Args:
            ids: (B, T) token ids; with a `cache`, only those after the cached prefix.
            cache: from `aiayn.inference.decoding.new_cache`; filled and extended in place.
            project: False gives `hidden`'s states instead of the logits, for a loss that
                applies the pre-softmax projection itself
                (`aiayn.training.loss.projected_cross_entropy`).

        Returns:
            (B, T, V) unnormalised scores of the token after each position, or (B, T, D)
            states.

        Raises:
            ValueError: if the sequence (cached prefix included) is longer than `cfg.max_len`.
        """
        hidden = self.hidden(ids, cache)
        return self.project(hidden) if project else hidden

    def hidden(self, ids: Tensor, cache: DecoderCache | None = None) -> Tensor:
        """The last layer's states (after the final LayerNorm, if any): (B, T, D)."""
        offset = 0 if cache is None else cache.length
        check_ids(ids, "input", self.cfg.max_len, offset)
        return self.decoder(ids, None, None, cache)

    def output_embedding(self) -> nn.Embedding:
        """The token embedding: the output matrix when tied."""
        return self.decoder.embedding.tokens

    def attention_maps(self, ids: Tensor) -> AttentionMaps:
        """Every layer's causal self-attention weights, (B, H, T, T), as `maps.decoder`
        (`encoder` and `cross` are empty), from the explicit attention path."""
        check_ids(ids, "input", self.cfg.max_len)
        return AttentionMaps.read(self, lambda: self.decoder(ids, None, None))
