"""The encoder-decoder Transformer (section 3, figure 1).

Shape legend:
    B batch, S source length, T target length, D d_model, V vocabulary,
    H heads. Token ids are int64; masks are bool with True = may attend.

    model = Transformer(ModelConfig.base(vocab_size=37000))
    logits = model(src_ids, tgt_in_ids)          # (B, T, V)

For search, `encode` runs the encoder once and `decode` runs the decoder on new
target tokens only, with a cache holding the keys and values of the prefix (a
`DecoderCache`: `aiayn.inference.decoding.new_cache` makes it); the decoding state
the search runs is `aiayn.inference.decoding`'s, not the model's.

The embedding, the stacks and the output projection, which every shape shares, are
`aiayn.models.stacks` (importable from here too). This is the training model, the
paper written literally; `aiayn.inference.frozen.freeze`
turns a trained one into the fast model that decoding runs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.models import register_shape
from aiayn.models.stacks import (
    AttentionMaps,
    Decoder,
    DecoderCache,
    Embedding,
    Encoder,
    EncoderOutput,
    PreSoftmaxProjection,
    attention_positions,
    attention_sublayers,
    check_ids,
    normal_initialisation,
)
from aiayn.nn.masks import key_mask, padding_mask

__all__ = [  # the stacks' names stay importable from here, where they were
    "AttentionMaps", "Decoder", "DecoderCache", "Embedding", "Encoder", "EncoderOutput",
    "PreSoftmaxProjection", "Transformer", "attention_positions", "attention_sublayers",
    "check_ids", "normal_initialisation",
]  # fmt: skip


@register_shape("encoder_decoder", task="translation")
class Transformer(PreSoftmaxProjection):
    """The encoder-decoder Transformer of "Attention Is All You Need".

    Args:
        cfg: the hyper-parameters; see `ModelConfig`.

    With `cfg.tie_embeddings` and `cfg.tie_output` (the default) one (V, D) matrix is
    the source embedding, the target embedding and the pre-softmax projection (3.4).
    """

    # beams copy their sentence's encoder output (`aiayn.inference.decoding` reads this)
    shares_source_rows = False

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
        self.build_output(cfg)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise as fairseq and tensor2tensor do for this model.

        Linear weights: Xavier/Glorot uniform, which keeps activation variance about
        constant through the stacks; biases zero. Token embeddings: N(0, d_model^-0.5),
        so that after the sqrt(d_model) scaling each entry has unit variance, the
        scale of the sinusoids, and tied output logits start near zero. The padding
        row is zero. LayerNorms: weight 1, bias 0 (PyTorch's default). Position
        schemes keep their own initialisation.
        """
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for tokens in {self.encoder.embedding.tokens, self.decoder.embedding.tokens}:
            nn.init.normal_(tokens.weight, std=self.cfg.d_model**-0.5)
            with torch.no_grad():
                tokens.weight[self.cfg.pad_id].zero_()

    # ----- the three entry points -------------------------------------------

    def forward(self, src: Tensor, tgt_in: Tensor, project: bool = True) -> Tensor:
        """Teacher-forced logits.

        Args:
            src: (B, S) source ids, padded with `cfg.pad_id`.
            tgt_in: (B, T) target ids shifted right (bos first), padded likewise.
            project: False gives the decoder's last states instead of the logits, for a
                loss that applies the pre-softmax projection itself
                (`aiayn.training.loss.projected_cross_entropy`).

        Returns:
            (B, T, V) unnormalised next-token scores, or (B, T, D) states.

        Raises:
            ValueError: if a sequence is longer than `cfg.max_len`.
        """
        return self.decode(tgt_in, self.encode(src), project=project)

    def encode(self, src: Tensor) -> EncoderOutput:
        """Run the encoder once: (B, S) ids to an `EncoderOutput`."""
        self._check_length(src, "source")
        real_tokens = padding_mask(src, self.cfg.pad_id)
        hidden = self.encoder(src, self.source_mask(real_tokens))
        return EncoderOutput(hidden, real_tokens)

    def decode(
        self,
        tgt: Tensor,
        encoded: EncoderOutput,
        cache: DecoderCache | None = None,
        project: bool = True,
    ) -> Tensor:
        """Logits for target ids given the encoder output.

        Args:
            tgt: (B, T) target ids; with a `cache`, only the positions not yet decoded.
            encoded: from `encode`, one row per row of `tgt`.
            cache: from `aiayn.inference.decoding.new_cache`; filled and extended in place.
            project: False stops before the pre-softmax projection (see `forward`).

        Returns:
            (B, T, V) logits, or (B, T, D) states.
        """
        offset = 0 if cache is None else cache.length
        self._check_length(tgt, "target", offset)
        memory_mask = self.source_mask(encoded.real_tokens)
        hidden = self.decoder(tgt, encoded.hidden, memory_mask, cache)
        return self.project(hidden) if project else hidden

    def output_embedding(self) -> nn.Embedding:
        """The target embedding: the pre-softmax matrix when tied (section 3.4)."""
        return self.decoder.embedding.tokens

    def source_mask(self, real_tokens: Tensor) -> Tensor:
        """The (B, 1, 1, S) key mask over the source: True at real tokens."""
        return key_mask(real_tokens)

    def attention_maps(self, src: Tensor, tgt_in: Tensor) -> AttentionMaps:
        """All attention weights for one teacher-forced pass (explicit attention path)."""
        self._check_length(src, "source")
        self._check_length(tgt_in, "target")
        real_tokens = padding_mask(src, self.cfg.pad_id)
        mask = key_mask(real_tokens)
        return AttentionMaps.read(self, lambda: self.decoder(tgt_in, self.encoder(src, mask), mask))

    def _check_length(self, ids: Tensor, side: str, offset: int = 0) -> None:
        check_ids(ids, side, self.cfg.max_len, offset)
