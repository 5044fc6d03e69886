"""The unit of training and evaluation: a padded batch of source and target ids.

Shape legend: B batch, S source length, T target length (targets + 1 special token).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def round_up(length: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is at least `length`."""
    return -(-length // multiple) * multiple


@dataclass
class Batch:
    """Padded ids for one step; the model derives its masks from the pad id.

    Attributes:
        src: (B, S) source ids (ending in eos), padded.
        tgt_in: (B, T) bos + target ids, padded: the decoder's input.
        tgt_out: (B, T) target ids + eos, padded: what the decoder must predict.
        n_src_tokens: real (non-pad) tokens in `src`.
        n_tgt_tokens: real (non-pad) tokens in `tgt_out`, the loss's denominator.
    """

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    n_src_tokens: int
    n_tgt_tokens: int

    @classmethod
    def from_pairs(
        cls,
        pairs: list[tuple[list[int], list[int]]],
        pad_id: int,
        bos_id: int,
        eos_id: int,
        length_multiple: int = 1,
    ) -> Batch:
        """Pad (source ids, target ids) pairs, without specials, into a batch.

        eos is appended to each source and to `tgt_out`; bos is prepended to `tgt_in`.
        Each side's padded length is rounded up to a multiple of `length_multiple`.
        """
        if not pairs:
            raise ValueError("Batch.from_pairs needs at least one pair")
        src_len = round_up(max(len(s) for s, _ in pairs) + 1, length_multiple)
        tgt_len = round_up(max(len(t) for _, t in pairs) + 1, length_multiple)
        src = torch.full((len(pairs), src_len), pad_id, dtype=torch.long)
        tgt_in = torch.full((len(pairs), tgt_len), pad_id, dtype=torch.long)
        tgt_out = torch.full((len(pairs), tgt_len), pad_id, dtype=torch.long)
        for row, (s, t) in enumerate(pairs):
            src[row, : len(s) + 1] = torch.tensor([*s, eos_id])
            tgt_in[row, : len(t) + 1] = torch.tensor([bos_id, *t])
            tgt_out[row, : len(t) + 1] = torch.tensor([*t, eos_id])
        n_src = sum(len(s) + 1 for s, _ in pairs)
        n_tgt = sum(len(t) + 1 for _, t in pairs)
        return cls(src, tgt_in, tgt_out, n_src, n_tgt)

    def to(self, device: torch.device | str) -> Batch:
        """The same batch on `device`."""
        return Batch(
            self.src.to(device, non_blocking=True),
            self.tgt_in.to(device, non_blocking=True),
            self.tgt_out.to(device, non_blocking=True),
            self.n_src_tokens,
            self.n_tgt_tokens,
        )

    @property
    def size(self) -> int:
        """Sentences in the batch."""
        return self.src.size(0)
