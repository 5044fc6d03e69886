"""What each attention head does, measured over sentence pairs under teacher forcing.

    report = head_report(translator.model, translator.tokenizer, pairs, sentences=200)
    write_head_report(report, "runs/base/heads", run="runs/base", split="valid")
    # heads.json, report.md, and a heat map per metric and kind of attention

Shape legend: B batch, H heads, T query length, S key length, V vocabulary.

For every head of every attention sub-layer (encoder self-attention, decoder
self-attention, encoder-decoder attention) two families of numbers:

What its weights look like, from `Transformer.attention_maps`, averaged over the
real (non-pad) queries of all sentences; pad keys carry no weight:
    entropy      -sum_j a_j log a_j of each query's distribution, in nats.
    confidence   the largest weight of each query (Voita et al. 2019, section 4.1).
    offset_-1/0/+1  self-attention only: the share of queries whose strongest key
                 is the previous token, the token itself, the next token. Each share
                 counts only the queries that can see a real key at that offset: the
                 first token has no previous one, the last no next one, and no
                 decoder query sees the next token (causal), so the decoder's +1 is
                 None. A perfect previous-token head scores 1.
    eos          the weight on the source's end marker: encoder self-attention and
                 encoder-decoder attention (their keys are source tokens, eos last).
                 None for decoder self-attention, whose keys (bos + target) have no eos.
    bos          decoder self-attention only: the weight on bos, the one token every
                 decoder query sees, the decoder's counterpart of eos as a place to
                 put weight that reads nothing (Clark et al. 2019 on [SEP]). None elsewhere.
    punctuation  the weight on pieces that are punctuation only (every character of
                 the piece, "▁" removed, in a Unicode P* category).
    monotonicity encoder-decoder attention only: per sentence, Pearson's r between
                 the target position and the position of its strongest source key,
                 averaged over sentences. A sentence with one decoder query (an
                 empty target: bos alone) says nothing and is skipped; a head whose
                 strongest key never moves has no trend and scores 0 there (r itself
                 is undefined).

What the model loses without it, in nats per target token, against the baseline
mean negative log-likelihood of the same pairs (no label smoothing; summed in
float32 by `aiayn.training.loss`, whatever the model's dtype):
    ablation     the increase of the mean NLL when this head's output alone is zeroed
                 (`MultiHeadAttention.head_mask`), all other heads on. Negative: the
                 model does better without it.
    gradient     Michel et al. 2019's importance I_h = E_x |dL(x)/dm_h| at m = 1,
                 with m_h the head's mask, x one sentence pair and L(x) its summed NLL:
                 the sum over pairs of |dL(x)/dm_h|, divided by the target tokens, so
                 nats/token per unit of mask. The absolute value is taken per
                 sentence, as in the paper's definition (their released code takes it
                 per batch). `head_mask` is one (H,) vector for the whole batch, whose
                 gradient sums over the batch's sentences before any absolute value
                 could be taken; so here each sentence gets its own row of ones,
                 multiplied in at the same place, the input of W^O, by a hook that
                 lives only during the measurement. The paper's layer-wise
                 normalisation is not applied: the numbers are raw.

Pairs are the first `sentences` of the list; a pair longer than the model's
`max_len` (with its bos or eos) is skipped and counted. The numbers' records and their
files (heads.json, report.md, the heat maps) are `aiayn.analysis.head_records`'s.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor
from tqdm.auto import tqdm

from aiayn.analysis.head_records import (
    HEADS_FILE,
    JSON_FILE,
    KIND_TITLES,
    METRICS,
    REPORT_FILE,
    UNITS,
    HeadKey,
    HeadReport,
    HeadStats,
    head_figures,
    plot_head_metric,
    read_head_records,
    report_markdown,
    write_head_report,
)
from aiayn.analysis.viz import AttentionKind
from aiayn.data.batch import Batch
from aiayn.data.batching import token_budget_batches
from aiayn.data.tokenizer import Tokenizer
from aiayn.models.encoder_decoder import Transformer, attention_sublayers
from aiayn.nn.attention import MultiHeadAttention
from aiayn.training.loss import label_smoothed_cross_entropy
from aiayn.training.tasks.translation import encode_pairs, fitting_pairs

log = logging.getLogger(__name__)

# The records and their files live in `aiayn.analysis.head_records`; their names are
# importable from here too, as before.
__all__ = [
    "HEADS_FILE",
    "JSON_FILE",
    "KIND_TITLES",
    "METRICS",
    "OFFSETS",
    "REPORT_FILE",
    "UNITS",
    "HeadKey",
    "HeadReport",
    "HeadStats",
    "HeadSums",
    "head_figures",
    "head_report",
    "plot_head_metric",
    "punctuation_ids",
    "read_head_records",
    "report_markdown",
    "write_head_report",
]

OFFSETS = (-1, 0, 1)


# ----- measuring ---------------------------------------------------------------------


def _kind(sublayer: str) -> AttentionKind:
    """ "encoder.0.self" -> ENCODER, "decoder.0.self" -> DECODER, "decoder.0.cross" -> CROSS."""
    stack, _, use = sublayer.split(".")
    if use == "cross":
        return AttentionKind.CROSS
    return AttentionKind.ENCODER if stack == "encoder" else AttentionKind.DECODER


def punctuation_ids(tokenizer: Tokenizer, vocab_size: int) -> Tensor:
    """(V,) bool: True at pieces made of punctuation only ("▁" removed); specials are not."""
    specials = {tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id}
    flags = torch.zeros(vocab_size, dtype=torch.bool)
    for token_id in range(min(vocab_size, tokenizer.vocab_size)):
        if token_id in specials:
            continue
        text = tokenizer.id_to_piece(token_id).replace("\u2581", "")
        flags[token_id] = bool(text) and all(unicodedata.category(c)[0] == "P" for c in text)
    return flags


class HeadSums:
    """Running sums of one sub-layer's statistics, per head, in float64."""

    def __init__(self, n_heads: int) -> None:
        def zeros() -> Tensor:
            return torch.zeros(n_heads, dtype=torch.float64)

        self.queries = 0.0  # real queries seen
        self.entropy, self.confidence = zeros(), zeros()
        self.key_weight = {"eos": zeros(), "bos": zeros(), "punctuation": zeros()}
        self.offset_hits = {d: zeros() for d in OFFSETS}
        self.offset_queries = dict.fromkeys(OFFSETS, 0.0)
        self.monotonicity, self.monotone_sentences = zeros(), 0.0
        self.ablated_nll = zeros()  # summed NLL with each head zeroed in turn
        self.gradient = zeros()  # sum over sentences of |dL/dm_h|

    def add_weights(
        self,
        weights: Tensor,
        query_real: Tensor,
        key_real: Tensor,
        key_marks: dict[str, Tensor],
        kind: AttentionKind,
    ) -> None:
        """Add one batch's (B, H, T, S) weights; real queries (B, T), keys (B, S); key_marks:
        name -> (B, S) bool of the keys whose weight that metric sums."""
        weights = weights.detach().to(torch.float64)
        real = query_real.to(torch.float64)[:, None, :]  # (B, 1, T)
        self.queries += float(query_real.sum())
        entropy = -torch.special.xlogy(weights, weights).sum(-1)  # (B, H, T), 0 log 0 = 0
        self.entropy += (entropy * real).sum((0, 2)).cpu()
        self.confidence += (weights.amax(-1) * real).sum((0, 2)).cpu()
        for name, marked in key_marks.items():
            on_marked = (weights * marked.to(weights.dtype)[:, None, None, :]).sum(-1)
            self.key_weight[name] += (on_marked * real).sum((0, 2)).cpu()
        strongest = weights.argmax(-1)  # (B, H, T)
        if kind is AttentionKind.CROSS:
            self._add_monotonicity(strongest, query_real)
        else:
            self._add_offsets(strongest, query_real, key_real, causal=kind is AttentionKind.DECODER)

    def _add_offsets(
        self, strongest: Tensor, query_real: Tensor, key_real: Tensor, causal: bool
    ) -> None:
        t_len, s_len = query_real.size(1), key_real.size(1)
        positions = torch.arange(t_len, device=strongest.device)
        for offset in OFFSETS:
            key = positions + offset  # (T,)
            inside = (key >= 0) & (key < s_len)
            seen = key_real[:, key.clamp(0, s_len - 1)] & inside  # (B, T): a real key there
            if causal and offset > 0:
                seen = torch.zeros_like(seen)  # the future is masked
            counted = query_real & seen  # (B, T)
            hits = (strongest == key) & counted[:, None, :]  # (B, H, T)
            self.offset_hits[offset] += hits.sum((0, 2)).to(torch.float64).cpu()
            self.offset_queries[offset] += float(counted.sum())

    def _add_monotonicity(self, strongest: Tensor, query_real: Tensor) -> None:
        """Pearson's r of (target position, strongest source position), per sentence."""
        real = query_real.to(torch.float64)[:, None, :]  # (B, 1, T)
        n = real.sum(-1)  # (B, 1)
        position = torch.arange(real.size(-1), dtype=torch.float64, device=real.device)
        source = strongest.to(torch.float64)  # (B, H, T)

        def centred(x: Tensor) -> Tensor:
            mean = (x * real).sum(-1, keepdim=True) / n[..., None].clamp_min(1)
            return (x - mean) * real

        dx, dy = centred(position.expand_as(source)), centred(source)
        var_x, var_y = dx.square().sum(-1), dy.square().sum(-1)  # (B, H)
        moves = var_y > 1e-9  # positions are integers: any movement gives var_y >= 1/2
        r = torch.where(moves, (dx * dy).sum(-1) / (var_x * var_y).clamp_min(1e-300).sqrt(), 0.0)
        informative = (n >= 2).to(torch.float64)  # (B, 1)
        self.monotonicity += (r * informative).sum(0).cpu()
        self.monotone_sentences += float(informative.sum())

    def key_mean(self, name: str, head: int) -> float:
        """Mean weight per real query on the keys `name` marks."""
        return float(self.key_weight[name][head]) / self.queries

    def stats(
        self, kind: AttentionKind, layer: int, tokens: int, baseline_nll: float
    ) -> list[HeadStats]:
        """The per-head means (baseline_nll: nats/token, with every head on)."""

        def mean(total: Tensor, count: float) -> list[float | None]:
            return [float(v) / count if count else None for v in total]

        n_heads = self.entropy.numel()
        none = [None] * n_heads
        self_attention = kind is not AttentionKind.CROSS
        prev, same, nxt = (
            mean(self.offset_hits[d], self.offset_queries[d]) if self_attention else none
            for d in OFFSETS
        )
        return [
            HeadStats(
                kind=kind,
                layer=layer,
                head=h,
                entropy=float(self.entropy[h]) / self.queries,
                confidence=float(self.confidence[h]) / self.queries,
                offset_prev=prev[h],
                offset_same=same[h],
                offset_next=nxt[h],
                eos=None if kind is AttentionKind.DECODER else self.key_mean("eos", h),
                bos=self.key_mean("bos", h) if kind is AttentionKind.DECODER else None,
                punctuation=self.key_mean("punctuation", h),
                monotonicity=(
                    mean(self.monotonicity, self.monotone_sentences)[h]
                    if kind is AttentionKind.CROSS
                    else None
                ),
                ablation=float(self.ablated_nll[h]) / tokens - baseline_nll,
                gradient=float(self.gradient[h]) / tokens,
            )
            for h in range(n_heads)
        ]


@contextmanager
def _per_sentence_masks(
    sublayers: dict[str, MultiHeadAttention], batch_size: int, like: Tensor
) -> Iterator[dict[str, Tensor]]:
    """(B, H) masks of ones, one row per sentence, as each sub-layer's `head_mask`
    while the block runs, for per-sentence gradients. They are float32, or
    float64 for a float64 model (`like`: a parameter of the model)."""
    dtype = torch.promote_types(like.dtype, torch.float32)
    masks = {
        name: torch.ones(batch_size, mha.n_heads, dtype=dtype, device=like.device).requires_grad_()
        for name, mha in sublayers.items()
    }
    previous = {name: mha.head_mask for name, mha in sublayers.items()}
    try:
        for name, mha in sublayers.items():
            mha.head_mask = masks[name]
        yield masks
    finally:
        for name, mha in sublayers.items():
            mha.head_mask = previous[name]


def _batches(
    model: Transformer, tokenizer: Tokenizer, pairs: Sequence[tuple[str, str]], batch_tokens: int
) -> tuple[list[Batch], int]:
    """The pairs as teacher-forcing batches, and how many were too long for the model."""
    cfg = model.cfg
    kept = fitting_pairs(encode_pairs(tokenizer, pairs), cfg.max_len, "heads")
    skipped = len(pairs) - len(kept)
    if not kept:
        raise ValueError(f"no pair fits the model's max_len={cfg.max_len}")
    lengths = [(len(s) + 1, len(t) + 1) for s, t in kept]
    return [
        Batch.from_pairs([kept[i] for i in rows], cfg.pad_id, cfg.bos_id, cfg.eos_id)
        for rows in token_budget_batches(lengths, batch_tokens)
    ], skipped


def head_report(
    model: Transformer,
    tokenizer: Tokenizer,
    pairs: Sequence[tuple[str, str]],
    sentences: int = 200,
    batch_tokens: int = 4096,
    progress: bool = True,
) -> HeadReport:
    """Measure every attention head of `model` on (source, target) sentence pairs.

    What is measured, and how, is in the module docstring. The model runs in eval
    mode (its mode is restored afterwards); head masks are set only while a head
    is ablated and restored to what they were (None normally).

    Args:
        model: an encoder-decoder `Transformer` (the literal model, not a frozen one).
        tokenizer: its subword model.
        pairs: (source, target) sentences; the first `sentences` are used.
        sentences: how many pairs to measure on.
        batch_tokens: the padded size of each side of a batch, specials included.
        progress: show a tqdm bar (one tick per forward pass).

    Returns:
        The `HeadReport`.

    Raises:
        ValueError: `sentences` < 1, no pairs, or none that fits the model's max_len.
    """
    if sentences < 1:
        raise ValueError(f"sentences must be at least 1, got {sentences}")
    if not pairs:
        raise ValueError("no sentence pairs to measure the heads on")
    pairs = list(pairs[:sentences])
    batches, skipped = _batches(model, tokenizer, pairs, batch_tokens)
    device = next(model.parameters()).device
    cfg = model.cfg
    punctuation = punctuation_ids(tokenizer, cfg.vocab_size).to(device)
    sublayers = attention_sublayers(model)
    sums = {name: HeadSums(mha.n_heads) for name, mha in sublayers.items()}
    kept_masks = {name: mha.head_mask for name, mha in sublayers.items()}
    passes = len(batches) * (2 + sum(mha.n_heads for mha in sublayers.values()))
    total_nll, tokens = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        with tqdm(total=passes, desc="heads", unit="pass", disable=not progress) as bar:
            for batch in batches:
                batch = batch.to(device)
                _add_maps(model, batch, sums, punctuation)
                bar.update()
                total_nll += _add_gradients(model, batch, sublayers, sums)
                tokens += batch.n_tgt_tokens
                bar.update()
                _add_ablations(model, batch, sublayers, sums, kept_masks, bar.update)
    finally:
        for name, mha in sublayers.items():
            mha.head_mask = kept_masks[name]
        model.train(was_training)
    baseline = total_nll / tokens
    heads = []
    for name, head_sums in sums.items():
        heads += head_sums.stats(_kind(name), int(name.split(".")[1]), tokens, baseline)
    return HeadReport(
        heads=heads,
        sentences=len(pairs) - skipped,
        skipped=skipped,
        source_tokens=sum(b.n_src_tokens for b in batches),
        target_tokens=tokens,
        baseline_nll=baseline,
        config=cfg.to_dict(),
    )


def _nll(model: Transformer, batch: Batch, logits: Tensor | None = None) -> Tensor:
    """Summed NLL of the batch's targets (no label smoothing)."""
    logits = model(batch.src, batch.tgt_in) if logits is None else logits
    return label_smoothed_cross_entropy(logits, batch.tgt_out, model.cfg.pad_id, 0.0).nll


@torch.no_grad()
def _add_maps(
    model: Transformer, batch: Batch, sums: dict[str, HeadSums], punctuation: Tensor
) -> None:
    cfg = model.cfg
    maps = model.attention_maps(batch.src, batch.tgt_in)
    src_real, tgt_real = batch.src != cfg.pad_id, batch.tgt_in != cfg.pad_id  # (B, S), (B, T)
    source_marks = {"eos": batch.src == cfg.eos_id, "punctuation": punctuation[batch.src]}
    target_marks = {"bos": batch.tgt_in == cfg.bos_id, "punctuation": punctuation[batch.tgt_in]}
    uses = {
        AttentionKind.ENCODER: (maps.encoder, src_real, src_real, source_marks),
        AttentionKind.DECODER: (maps.decoder, tgt_real, tgt_real, target_marks),
        AttentionKind.CROSS: (maps.cross, tgt_real, src_real, source_marks),
    }
    for name, head_sums in sums.items():
        kind = _kind(name)
        layer_maps, query_real, key_real, marks = uses[kind]
        weights = layer_maps[int(name.split(".")[1])]  # (B, H, T, S)
        head_sums.add_weights(weights, query_real, key_real, marks, kind)


def _add_gradients(
    model: Transformer,
    batch: Batch,
    sublayers: dict[str, MultiHeadAttention],
    sums: dict[str, HeadSums],
) -> float:
    """Add sum_x |dL(x)/dm_h| for every head; return the batch's summed NLL (all heads on)."""
    parameter = next(model.parameters())
    with torch.enable_grad(), _per_sentence_masks(sublayers, batch.size, parameter) as m:
        nll = _nll(model, batch)
        grads = torch.autograd.grad(nll, list(m.values()))
    for name, grad in zip(m, grads, strict=True):
        sums[name].gradient += grad.abs().sum(0).to(torch.float64).cpu()
    return float(nll.detach())


@torch.no_grad()
def _add_ablations(
    model: Transformer,
    batch: Batch,
    sublayers: dict[str, MultiHeadAttention],
    sums: dict[str, HeadSums],
    kept_masks: dict[str, Tensor | None],
    tick: Callable[[], object],
) -> None:
    """Add the summed NLL with each head zeroed in turn (decoder heads reuse the encoder)."""
    encoded = model.encode(batch.src)
    for name, mha in sublayers.items():
        base = kept_masks[name]
        for head in range(mha.n_heads):
            mask = torch.ones(mha.n_heads, device=batch.src.device) if base is None else base
            mask = mask.clone()
            mask[head] = 0.0
            mha.head_mask = mask
            try:
                if name.startswith("encoder."):
                    nll = _nll(model, batch)
                else:
                    nll = _nll(model, batch, model.decode(batch.tgt_in, encoded))
            finally:
                mha.head_mask = base
            sums[name].ablated_nll[head] += float(nll)
            tick()
