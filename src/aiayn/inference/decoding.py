"""The state of a batch being decoded, and how decoding begins: what the search steps.

    state = start(model, src, beam=4)           # encodes once, makes the cache
    logits = state.step(last_tokens)            # (R, V), one new token per row
    state.keep(parents, sentences)              # follow beam search's choices

The search (`aiayn.inference.search`) knows a model only through `start`, which returns
a `Decoding`: an encoder-decoder's encoder output and key/value cache
(`EncoderDecoderDecoding`), or a decoder-only model's cache after its prompt
(`DecoderOnlyDecoding`). The models themselves (`aiayn.models`) only encode and decode
with a cache they are handed; the cache is made here (`new_cache`, from
`aiayn.inference.kv_cache`), by each layer's kernel's declared kind of store.

Beams and the source: the literal `Transformer` copies each sentence's encoder output
to its `beam` rows; a model whose class sets `shares_source_rows`
(`aiayn.inference.frozen.FrozenTransformer`) keeps one row per sentence, and its
cross-attention stores hold each sentence's keys and values once for its `beam` rows
(`LayerKV.group`). It stays a class attribute of the model because it is what its
cross-attention modules can do, not a choice of the search.

Shape legend: B sentences (or prompts), R rows being decoded (B x beam), S source
length, T prompt length, V vocabulary.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from aiayn.config import ModelConfig
from aiayn.inference.kv_cache import KVCache
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_decoder import Transformer


class Decoding(Protocol):
    """One batch being decoded: whatever the model keeps between steps.

    Rows are hypotheses: K consecutive rows per sentence (K = 1 but in beam search).

    Attributes:
        input_lengths: (B,) real input tokens of each sentence, eos included (the
            output's length limit is relative to it).
        dtype: the model's floating-point type (scores are summed in float64 for
            a float64 model, else in float32).
    """

    input_lengths: Tensor
    dtype: torch.dtype

    def step(self, last: Tensor) -> Tensor:
        """(R,) the newest token of each row -> (R, V) logits of the next token."""
        ...

    def keep(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Go on with rows `rows` (each new row's parent); `sentences`: the live
        sentences kept when some finished, None when all stay."""
        ...


class Decodable(Protocol):
    """What the search needs of a model: its `cfg`, and a way to begin decoding, which
    `start` finds: a `Transformer` or a `DecoderOnly` (literal or frozen) by its shape,
    anything else by a `start(src, beam) -> Decoding` method of its own (the wrappers
    `aiayn.inference.shortlist.Shortlisted` and `aiayn.inference.threads.StepThreads`,
    a plug-in shape)."""

    cfg: ModelConfig


def new_cache(model: Transformer | DecoderOnly, group: int = 1) -> KVCache:
    """An empty cache for decoding with `model`, literal or frozen.

    One self-attention store per decoder layer, of the kind the layer's kernel keeps
    (`aiayn.inference.kv_cache.KVCache.empty`), and for an encoder-decoder one static
    cross-attention store per layer.

    Args:
        model: a `Transformer` or a `DecoderOnly` (or a subclass: `PrefixLM`, the frozen
            forms).
        group: query rows per stored cross-attention row (beams sharing a sentence's
            source, `shares_source_rows`); an encoder-decoder's only.

    Returns:
        The empty `KVCache`, to pass to `model.decode` (encoder-decoder) or `model(ids,
        cache)` (decoder-only).

    Raises:
        ValueError: a model of neither shape, naming its class.
    """
    if not isinstance(model, Transformer | DecoderOnly):
        raise ValueError(
            f"{type(model).__name__} has no decoder to cache: new_cache takes a Transformer "
            "or a DecoderOnly model"
        )
    kernels = [layer.self_attn.kernel for layer in model.decoder.layers]
    cross = isinstance(model, Transformer)
    return KVCache.empty(len(kernels), cross=cross, group=group, kernels=kernels)


def start(model: Decodable, src: Tensor, beam: int = 1) -> Decoding:
    """Begin decoding a batch: the state the search steps (`Decoding`).

    A model or wrapper with a `start(src, beam)` method of its own is asked for it
    (`FrozenDecoderOnly`, whose prompt's pass projects its last position only;
    `Shortlisted`; `StepThreads`; a plug-in shape). Otherwise the shape decides: an
    encoder-decoder (`Transformer`, literal or frozen) gets an `EncoderDecoderDecoding`,
    a decoder-only model (`DecoderOnly`, `PrefixLM`) a `DecoderOnlyDecoding`.

    Args:
        model: the model (see `Decodable`), in eval mode.
        src: (B, S) source ids, or (B, T) unpadded prompts for a decoder-only model.
        beam: hypothesis rows per sentence.

    Returns:
        The batch's `Decoding`.

    Raises:
        ValueError: a model that cannot decode (an `EncoderOnly`), naming its class; or
            what the decoding refuses (an empty prompt, one past `max_len`).
    """
    own = getattr(model, "start", None)
    if callable(own):
        return own(src, beam)
    if isinstance(model, Transformer):
        return EncoderDecoderDecoding(model, src, beam)
    if isinstance(model, DecoderOnly):
        return DecoderOnlyDecoding(model, src, beam)
    raise ValueError(
        f"{type(model).__name__} cannot be decoded: the search decodes an encoder-decoder "
        "(Transformer), a decoder-only model (DecoderOnly, PrefixLM) or a model with a "
        "start(src, beam) method of its own"
    )


class EncoderDecoderDecoding:
    """One batch being decoded by an encoder-decoder: its encoder output and key/value cache.

    The search (`aiayn.inference.search`) sees it through `input_lengths`, `step` and `keep`.
    Rows are hypotheses: `beam` consecutive rows per sentence. The literal model
    copies each sentence's encoder output to its `beam` rows; a model with
    `shares_source_rows` (`aiayn.inference.frozen.FrozenTransformer`) keeps one row per
    sentence and computes its cross-attention keys and values once, for all beams.

    Args:
        model: a `Transformer` (or a subclass) in eval mode.
        src: (B, S) source ids.
        beam: hypothesis rows per sentence.
    """

    def __init__(self, model: Transformer, src: Tensor, beam: int = 1) -> None:
        self.model = model
        encoded = model.encode(src)
        self.input_lengths = encoded.real_tokens.sum(dim=1)  # (B,) eos included
        self.dtype = encoded.hidden.dtype
        self.shared = beam > 1 and model.shares_source_rows
        if beam > 1 and not self.shared:
            encoded = encoded.index_select(
                torch.arange(src.size(0), device=src.device).repeat_interleave(beam)
            )
        self.encoded = encoded
        self.cache = new_cache(model, group=beam if self.shared else 1)

    def step(self, last: Tensor) -> Tensor:
        """(R,) the newest token of each row -> (R, V) logits of the token after it."""
        return self.model.decode(last[:, None], self.encoded, self.cache)[:, -1]

    def keep(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Go on with hypothesis rows `rows` (each row's parent, in the new order).

        Args:
            rows: (R',) indices into the current rows.
            sentences: the live sentences kept, when some finished (None: all stay).
                Beams of a sentence share its source, so the encoder output and
                cross-attention stores change only when sentences leave.
        """
        for store in self.cache.self_attention:
            store.reorder(rows)
        if sentences is None:
            return
        index = sentences if self.shared else rows
        for store in self.cache.cross_attention:
            store.reorder(index)
        self.encoded = self.encoded.index_select(index)


class DecoderOnlyDecoding:
    """A batch of prompts being continued: the key/value cache, seen by the search
    (a `Decoding`) through `input_lengths`, `step` and `keep`.

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
        last_position_only: the prompt's pass projects only its last position to logits,
            skipping the (T - 1) x V products no search reads (the frozen model's
            `start`); False: the model's own forward pass, all positions projected.

    Raises:
        ValueError: an empty prompt, or one longer than `cfg.max_len`.
    """

    def __init__(
        self, model: DecoderOnly, prompt: Tensor, beam: int = 1, last_position_only: bool = False
    ) -> None:
        if prompt.dim() != 2 or prompt.size(1) == 0:
            raise ValueError(f"prompt must be (batch, length >= 1), got {tuple(prompt.shape)}")
        self.model = model
        batch, length = prompt.shape
        self.input_lengths = torch.full((batch,), length, dtype=torch.long, device=prompt.device)
        self.cache = new_cache(model)
        if last_position_only:
            first = model.project(model.hidden(prompt, self.cache)[:, -1:])[:, -1]  # (B, V)
        else:
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
