"""A prefix language model (Raffel et al. 2020, section 3.2.1; Dong et al. 2019, UniLM):
GPT's stack, whose prefix attends both ways.

A row is "prefix <sep> continuation" (`aiayn.training.tasks.lm_translation`: the source,
the separator, the translation). The prefix and the separator see each other
bidirectionally, as an encoder would; every later position sees the whole prefix and
the continuation up to itself, as a decoder does. One stack and one set of weights
play both parts, where the encoder-decoder has two.

Shape legend: B batch, T positions, V vocabulary.

The prefix length comes from the row itself: the positions up to its first separator
(`cfg.bos_id`, the separator of `lm_translation`); a row without one is a plain causal
language model. Cached decoding works as for `DecoderOnly` (`aiayn.inference.decoding`
decodes it with `DecoderOnlyDecoding`, which calls `hidden`): the prompt's pass
(prefix and separator) fills the cache with the bidirectional pattern, and every later
position only adds itself. It needs a kernel that takes a full mask (sdpa, explicit).
It has no frozen form and no command of its own: it is trained and scored by
`aiayn train` with the lm_translation task.
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.config import ModelConfig
from aiayn.models import register_shape
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.stacks import AttentionMaps, DecoderCache, check_ids
from aiayn.nn.kernels import kernel_class
from aiayn.nn.masks import prefix_mask


@register_shape("prefix_lm", task="lm_translation")
class PrefixLM(DecoderOnly):
    """GPT's blocks with a bidirectional prefix (see the module).

    Raises:
        ValueError: a kernel that takes no full attention mask.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        if not kernel_class(cfg.attention).takes_full_mask:
            raise ValueError(
                f"a prefix LM needs an attention kernel that takes a full mask; "
                f"ModelConfig.attention {cfg.attention!r} takes a key mask only"
            )
        super().__init__(cfg)

    def prefix_lengths(self, ids: Tensor) -> Tensor:
        """(B,) positions up to and including each row's first separator (0 without one)."""
        is_separator = ids == self.cfg.bos_id  # (B, T)
        first = is_separator.int().argmax(dim=1)
        return torch.where(is_separator.any(dim=1), first + 1, torch.zeros_like(first))

    def hidden(self, ids: Tensor, cache: DecoderCache | None = None) -> Tensor:
        """The last layer's states, (B, T, D), with the prefix pattern on a first pass."""
        offset = 0 if cache is None else cache.length
        check_ids(ids, "input", self.cfg.max_len, offset)
        mask = None
        if offset == 0:  # later positions, one at a time, see everything before them
            mask = prefix_mask(self.prefix_lengths(ids), ids.size(1), ids.size(1))
        return self.decoder(ids, None, None, cache, self_mask=mask)

    def attention_maps(self, ids: Tensor) -> AttentionMaps:
        """Every layer's self-attention weights, (B, H, T, T), as `maps.decoder`."""
        check_ids(ids, "input", self.cfg.max_len)
        mask = prefix_mask(self.prefix_lengths(ids), ids.size(1), ids.size(1))
        return AttentionMaps.read(self, lambda: self.decoder(ids, None, None, self_mask=mask))
