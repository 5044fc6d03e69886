"""An encoder with a pooled classification head: sequence classification (Long Range
Arena's ListOps and text tasks; `aiayn.data.listops`, `aiayn.data.bible_books`).

Shape legend: B batch, T length, D d_model, V vocabulary.

    model = EncoderClassifier(cfg)        # cfg.architecture "encoder_classifier"
    scores = model(ids)                   # (B, V)

It is `EncoderOnly` (the paper's encoder under BERT's output head) whose head reads one
vector per sequence instead of every position's: by `cfg.pooling`, the mean of the
encoder's states at the real (non-pad) positions, or the state at position 0 (BERT's
[CLS] reading, here the text's first token):

    score(x) = LayerNorm(act(pool(h) W_t + b_t)) E^T + b        (E tied, as BERT's)
    pool(h) = mean_t h_t  ("mean")  or  h_0  ("first")

The scores are over the vocabulary; the classes are pieces of it (a classification
corpus has one piece per class, `aiayn.data.classification.class_piece`), and the
task reads their rows (`aiayn.training.tasks.classify`). So the model needs no setting
of its own, and a class's output row is the embedding of its piece.
"""

from __future__ import annotations

from torch import Tensor

from aiayn.models import register_shape
from aiayn.models.encoder_only import EncoderOnly


@register_shape("encoder_classifier", task="classify")
class EncoderClassifier(EncoderOnly):
    """A bidirectional encoder whose output head scores one pooled state per sequence."""

    def forward(self, ids: Tensor, token_types: Tensor | None = None) -> Tensor:
        """Scores of every piece for each sequence, from its pooled states.

        Args:
            ids: (B, T) token ids, padded with `cfg.pad_id` (masked out as keys and left
                out of the mean).
            token_types: (B, T) segment ids, or None.

        Returns:
            (B, V) unnormalised scores.

        Raises:
            ValueError: as `EncoderOnly.forward`.
        """
        states = self.encode(ids, token_types)  # (B, T, D)
        if self.cfg.pooling == "first":
            pooled = states[:, 0]  # (B, D)
        else:
            real = (ids != self.cfg.pad_id).unsqueeze(-1).to(states.dtype)  # (B, T, 1)
            pooled = (states * real).sum(dim=1) / real.sum(dim=1).clamp(min=1.0)  # (B, D)
        return self.project(self.mlm_head(pooled))  # (B, V)
