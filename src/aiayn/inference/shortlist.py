"""Decoding over an output shortlist: a small candidate set of target pieces, not the vocabulary.

    engine = Shortlisted(freeze(model), Shortlist.load("shortlist.safetensors"))
    beam_search(engine, src)          # the output projection runs over the candidates only

As Marian's `--shortlist` and CTranslate2's vocabulary map: for a batch, the
candidates are the `frequent` most frequent target pieces, plus, for every source
piece in the batch, its `per_source` best translations, plus eos (and any id the
caller forces). The set is the union over the batch, computed once when decoding
starts. At every step the output projection multiplies by the candidates' rows of
the output matrix only ((R, D) x (D, C) instead of (D, V)); the logits of every
other piece are -inf, so the search is unchanged and can only pick candidates.
Note the softmax then normalises over the candidates (as in Marian and CTranslate2).
The table itself is built and stored by `aiayn.data.shortlist` (re-exported here).

Shape legend: R rows being decoded, D d_model, V vocabulary, C candidates.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import Tensor

from aiayn.data.shortlist import (  # noqa: F401  (the table's names, where they were)
    DEFAULT_FREQUENT,
    DEFAULT_MIN_COUNT,
    DEFAULT_PER_SOURCE,
    SHORTLIST_FILE,
    Shortlist,
    build,
    build_from_files,
    encode_target,
    read_parallel,
    recall,
    vocabulary_digest,
)
from aiayn.inference.decoding import EncoderDecoderDecoding
from aiayn.inference.decoding import start as start_decoding
from aiayn.inference.search import NEG_INF
from aiayn.models.encoder_decoder import Transformer

log = logging.getLogger(__name__)


def _float_output(engine: Transformer) -> tuple[Tensor | None, Tensor | None]:
    """The engine's output matrix as a (D, V) view, and its (V,) bias; (None, None) when
    the output layer keeps no floating-point weight (e.g. int8)."""
    output = getattr(engine, "output", None)
    if output is None:  # the literal model
        return engine.output_weight().detach().t(), engine.output_bias
    weight_t = getattr(output, "weight_t", None)
    weight = getattr(output, "weight", None)
    bias = getattr(output, "bias", None)
    if isinstance(weight_t, Tensor) and weight_t.is_floating_point():
        return weight_t, bias
    if isinstance(weight, Tensor) and weight.is_floating_point():
        return weight.t(), bias
    return None, None


class Shortlisted:
    """An encoder-decoder (a `Decodable`) whose output projection runs over a shortlist.

    `start` computes the batch's candidates (`Shortlist.candidates` of its source,
    plus eos and `forced_ids`) and gathers their rows of the output matrix once; each
    step then projects onto those rows only and returns (R, V) logits that are -inf
    outside the candidates. When the candidates are the whole vocabulary the engine
    decodes as it is (same outputs, bit for bit). An engine whose output layer holds
    no floating-point weight (int8) computes full logits and masks them instead.

    Args:
        engine: a `Transformer` or its `aiayn.inference.frozen.freeze` copy, in eval mode.
        shortlist: for the engine's vocabulary.
        forced_ids: ids the search may force, always candidates.

    Raises:
        ValueError: a shortlist for another vocabulary.
    """

    def __init__(
        self, engine: Transformer, shortlist: Shortlist, forced_ids: Sequence[int] = ()
    ) -> None:
        self.cfg = engine.cfg
        if shortlist.vocab_size != self.cfg.vocab_size:
            raise ValueError(
                f"the shortlist covers a vocabulary of {shortlist.vocab_size}, the model "
                f"has {self.cfg.vocab_size}"
            )
        self.engine, self.shortlist = engine, shortlist
        self.forced_ids = (self.cfg.eos_id, *forced_ids)
        self.weight_t, self.bias = _float_output(engine)
        if self.weight_t is None:
            log.info("the output layer has no float weight: the shortlist masks full logits")

    def start(self, src: Tensor, beam: int = 1) -> EncoderDecoderDecoding:
        """Begin decoding (B, S) `src` (see `aiayn.inference.decoding.Decodable`)."""
        ids = self.shortlist.candidates(src, self.forced_ids)
        if ids.numel() == self.cfg.vocab_size:
            return start_decoding(self.engine, src, beam)
        return ShortlistedDecoding(self, src, beam, ids)


class ShortlistedDecoding(EncoderDecoderDecoding):
    """An `EncoderDecoderDecoding` whose steps project onto the candidates `ids` only.

    Args:
        shortlisted: the `Shortlisted` engine.
        src: (B, S) source ids.
        beam: hypothesis rows per sentence.
        ids: (C,) the candidates, sorted.
    """

    def __init__(self, shortlisted: Shortlisted, src: Tensor, beam: int, ids: Tensor) -> None:
        super().__init__(shortlisted.engine, src, beam)
        self.ids = ids
        self.vocab = shortlisted.cfg.vocab_size
        weight_t, bias = shortlisted.weight_t, shortlisted.bias
        if weight_t is None:  # mask the full logits
            self.outside = torch.ones(self.vocab, dtype=torch.bool, device=ids.device)
            self.outside[ids] = False
            return
        self.weight_t = weight_t.index_select(1, ids)  # (D, C), contiguous for the product
        self.bias = None if bias is None else bias.index_select(0, ids)

    def step(self, last: Tensor) -> Tensor:
        """(R,) the newest token of each row -> (R, V) logits, -inf outside the candidates."""
        if not hasattr(self, "weight_t"):
            return super().step(last).masked_fill(self.outside, NEG_INF)
        model, tgt = self.model, last[:, None]
        model._check_length(tgt, "target", self.cache.length)
        memory_mask = model.source_mask(self.encoded.real_tokens)
        hidden = model.decoder(tgt, self.encoded.hidden, memory_mask, self.cache)
        hidden = hidden[:, -1]  # (R, D)
        if hidden.dtype != self.weight_t.dtype:
            hidden = hidden.to(self.weight_t.dtype)
        if self.bias is None:
            scores = hidden @ self.weight_t  # (R, C)
        else:
            scores = torch.addmm(self.bias, hidden, self.weight_t)
        logits = scores.new_full((scores.size(0), self.vocab), NEG_INF)
        return logits.index_copy_(1, self.ids, scores)  # (R, V)


# ----- from text files -----------------------------------------------------------
