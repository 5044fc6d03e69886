"""The encoder-only Transformer with a masked-language-model head: BERT's shape.

Shape legend:
    B batch, T length, D d_model, V vocabulary, H heads. Token ids are int64;
    padding (`cfg.pad_id`) is masked out as keys.

    model = EncoderOnly(ModelConfig.bert(vocab_size=30522))
    logits = model(ids, token_types)            # (B, T, V): a guess at every position

It is the paper's encoder (`Encoder`: bidirectional self-attention and the
feed-forward network, `cfg.n_encoder_layers` layers; `n_decoder_layers` is unused)
under BERT's masked-language-model head (Devlin et al. 2019, appendix A.1: the
transformation of the original code's `cls.predictions`):

    MLM(h) = LayerNorm(act(h W_t + b_t)) E^T + b        (E: the token embedding, tied)

BERT differs from the paper's encoder through config fields only: learned
positions, token-type (segment) vectors (`type_vocab_size`), a LayerNorm on the
embeddings (`embedding_norm`), GELU, unscaled embeddings, post-norm layers with
eps 1e-12 (`ModelConfig.bert`).
"""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.models import register_shape
from aiayn.models.stacks import (
    AttentionMaps,
    Encoder,
    PreSoftmaxProjection,
    check_ids,
    normal_initialisation,
)
from aiayn.nn.layers import activation_function
from aiayn.nn.masks import key_mask, padding_mask


class MaskedLanguageModelHead(nn.Module):
    """BERT's transformation before the output projection: dense D -> D, activation, LayerNorm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.activation = activation_function(cfg.activation)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.norm(self.activation(self.dense(hidden)))  # (B, T, D)


@register_shape("encoder_only", task="mlm")
class EncoderOnly(PreSoftmaxProjection):
    """A bidirectional encoder with a masked-language-model head (BERT).

    Args:
        cfg: the hyper-parameters; see `ModelConfig` (and `ModelConfig.bert`).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.encoder = Encoder(cfg, tokens)
        self.mlm_head = MaskedLanguageModelHead(cfg)
        self.build_output(cfg)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """BERT's initialisation: `normal_initialisation`, std 0.02."""
        normal_initialisation(self)

    def forward(
        self, ids: Tensor, token_types: Tensor | None = None, project: bool = True
    ) -> Tensor:
        """Masked-language-model logits at every position.

        Args:
            ids: (B, T) token ids, padded with `cfg.pad_id` (masked out as keys).
            token_types: (B, T) segment ids in [0, type_vocab_size), or None (all 0).
            project: False gives the MLM head's states instead of the logits, for a loss
                that applies the pre-softmax projection itself
                (`aiayn.training.loss.projected_cross_entropy`).

        Returns:
            (B, T, V) unnormalised scores of the token at each position, or (B, T, D)
            states.

        Raises:
            ValueError: if a sequence is longer than `cfg.max_len`, or token types are
                given to a model without them.
        """
        hidden = self.mlm_head(self.encode(ids, token_types))
        return self.project(hidden) if project else hidden

    def encode(self, ids: Tensor, token_types: Tensor | None = None) -> Tensor:
        """The encoder's output: (B, T, D) states (BERT's `last_hidden_state`)."""
        return self._run(ids, token_types)

    def output_embedding(self) -> nn.Embedding:
        """The token embedding: the output matrix (BERT's decoder) when tied."""
        return self.encoder.embedding.tokens

    def attention_maps(self, ids: Tensor, token_types: Tensor | None = None) -> AttentionMaps:
        """Every layer's self-attention weights, (B, H, T, T), as `maps.encoder`
        (`decoder` and `cross` are empty), from the explicit attention path."""
        return AttentionMaps.read(self, lambda: self._run(ids, token_types))

    def _run(self, ids: Tensor, token_types: Tensor | None) -> Tensor:
        check_ids(ids, "input", self.cfg.max_len)
        if token_types is not None and token_types.shape != ids.shape:
            raise ValueError(
                f"token_types must have the ids' shape {tuple(ids.shape)}, "
                f"got {tuple(token_types.shape)}"
            )
        mask = key_mask(padding_mask(ids, self.cfg.pad_id))  # (B, 1, 1, T)
        return self.encoder(ids, mask, token_types)
