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
`max_len` (with its bos or eos) is skipped and counted.
"""

from __future__ import annotations

import json
import logging
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor
from tqdm.auto import tqdm

from aiayn.analysis.viz import AttentionKind, write_png
from aiayn.data.batch import Batch
from aiayn.data.batching import token_budget_batches
from aiayn.data.files import strict_json, write_atomic
from aiayn.data.tokenizer import Tokenizer
from aiayn.models.encoder_decoder import Transformer, attention_sublayers
from aiayn.nn.attention import MultiHeadAttention
from aiayn.training.loss import label_smoothed_cross_entropy
from aiayn.training.tasks.translation import encode_pairs, fitting_pairs

log = logging.getLogger(__name__)

JSON_FILE = "heads.json"
HEADS_FILE = Path("heads") / JSON_FILE  # RUN/heads/heads.json, the default place
REPORT_FILE = "report.md"

# Per-head numbers in heads.json order: field name -> JSON key.
METRICS = {
    "entropy": "entropy",
    "confidence": "confidence",
    "offset_prev": "offset_-1",
    "offset_same": "offset_0",
    "offset_next": "offset_+1",
    "eos": "eos",
    "bos": "bos",
    "punctuation": "punctuation",
    "monotonicity": "monotonicity",
    "ablation": "ablation",
    "gradient": "gradient",
}
UNITS = {
    "entropy": "nats",
    "confidence": "attention weight",
    "offset_-1, offset_0, offset_+1": "share of queries (0 to 1)",
    "eos, bos, punctuation": "attention weight",
    "monotonicity": "Pearson r (-1 to 1)",
    "ablation": "nats/token (mean NLL increase with the head zeroed)",
    "gradient": "nats/token per unit of head mask (sum over pairs of |dL/dm| / tokens)",
    "baseline_nll": "nats/token",
}
OFFSETS = (-1, 0, 1)


@dataclass(frozen=True)
class HeadStats:
    """One head's numbers; None where a metric does not apply to its kind (see module doc)."""

    kind: AttentionKind
    layer: int
    head: int
    entropy: float
    confidence: float
    offset_prev: float | None
    offset_same: float | None
    offset_next: float | None
    eos: float | None
    bos: float | None
    punctuation: float
    monotonicity: float | None
    ablation: float
    gradient: float

    @property
    def name(self) -> str:
        """ "encoder L0 H3": kind, layer and head, counted from 0."""
        return f"{self.kind.value} L{self.layer} H{self.head}"

    def value(self, metric: str) -> float | None:
        """The number under its heads.json key ("offset_-1", "ablation", ...)."""
        return getattr(self, _FIELD_OF[metric])

    def to_dict(self) -> dict[str, Any]:
        """heads.json's record: kind, layer, head, then every metric by its JSON key."""
        return {
            "kind": self.kind.value,
            "layer": self.layer,
            "head": self.head,
            **{key: getattr(self, name) for name, key in METRICS.items()},
        }


_FIELD_OF = {key: name for name, key in METRICS.items()}


@dataclass
class HeadReport:
    """Every head's `HeadStats`, and what they were measured on.

    Attributes:
        heads: in model order (`attention_sublayers`), heads in order within each.
        sentences: pairs measured.
        skipped: pairs left out for being longer than the model's max_len.
        source_tokens: real source tokens (eos included).
        target_tokens: real target tokens (eos included): the NLL's denominator.
        baseline_nll: mean NLL per target token with every head on, in nats.
        config: the model's `ModelConfig.to_dict()`.
    """

    heads: list[HeadStats]
    sentences: int
    skipped: int
    source_tokens: int
    target_tokens: int
    baseline_nll: float
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, **context: Any) -> dict[str, Any]:
        """Plain types for JSON; `context` (run, split...) goes first."""
        return {
            **context,
            "sentences": self.sentences,
            "skipped": self.skipped,
            "source_tokens": self.source_tokens,
            "target_tokens": self.target_tokens,
            "baseline_nll": self.baseline_nll,
            "units": UNITS,
            "config": self.config,
            "heads": [h.to_dict() for h in self.heads],
        }

    def to_json(self, **context: Any) -> str:
        """heads.json's text; see `to_dict`."""
        return strict_json(self.to_dict(**context), ensure_ascii=False)


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


# ----- writing: heads.json, heat maps, report.md -----------------------------------------


def plot_head_metric(
    values: Sequence[Sequence[float | None]], title: str, digits: int = 2
) -> Figure:
    """A layers x heads heat map of one metric, each cell annotated with its value.

    Args:
        values: per layer, per head; None cells stay blank.
        title: the figure's title.
        digits: decimals of the annotations.

    Returns:
        The matplotlib figure (not shown; call `savefig`).
    """
    n_layers, n_heads = len(values), max(len(row) for row in values)
    grid = np.full((n_layers, n_heads), np.nan)
    for layer, row in enumerate(values):
        grid[layer, : len(row)] = [np.nan if v is None else v for v in row]
    size = (max(3.5, 1.5 + 0.75 * n_heads), 1.4 + 0.55 * n_layers)  # inches
    fig = Figure(figsize=size, layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    low, high = np.nanmin(grid), np.nanmax(grid)
    for (layer, head), v in np.ndenumerate(grid):
        if not np.isnan(v):  # dark text on the light (high) end of viridis
            dark = high > low and (v - low) / (high - low) > 0.6
            colour = "black" if dark else "white"
            ax.text(head, layer, f"{v:.{digits}f}", ha="center", va="center", fontsize=7, c=colour)
    ax.set_xticks(range(n_heads), [str(h) for h in range(n_heads)], fontsize=8)
    ax.set_yticks(range(n_layers), [str(i) for i in range(n_layers)], fontsize=8)
    ax.set_xlabel("head", fontsize=8)
    ax.set_ylabel("layer", fontsize=8)
    fig.colorbar(image, ax=ax, shrink=0.8).ax.tick_params(labelsize=7)
    ax.set_title(title, fontsize=9)
    return fig


KIND_TITLES = {
    AttentionKind.ENCODER: "encoder self-attention",
    AttentionKind.DECODER: "decoder self-attention",
    AttentionKind.CROSS: "encoder-decoder attention",
}
_METRIC_TITLES = {
    "entropy": "entropy (nats)",
    "confidence": "confidence (mean max weight)",
    "offset_-1": "strongest key at offset -1 (share)",
    "offset_0": "strongest key at offset 0 (share)",
    "offset_+1": "strongest key at offset +1 (share)",
    "eos": "weight on eos",
    "bos": "weight on bos",
    "punctuation": "weight on punctuation",
    "monotonicity": "monotonicity (Pearson r)",
    "ablation": "ablation: NLL increase (nats/token)",
    "gradient": "gradient importance (nats/token)",
}


def head_figures(report: HeadReport) -> dict[str, Figure]:
    """A heat map per metric and kind, by file name ("cross-monotonicity.png")."""
    figures = {}
    for kind in AttentionKind:
        of_kind = [h for h in report.heads if h.kind is kind]
        if not of_kind:
            continue
        n_layers = max(h.layer for h in of_kind) + 1
        for metric in METRICS.values():
            rows: list[list[float | None]] = [[] for _ in range(n_layers)]
            for h in of_kind:
                rows[h.layer].append(h.value(metric))
            if all(v is None for row in rows for v in row):
                continue  # the metric does not apply to this kind
            digits = 3 if metric in ("ablation", "gradient") else 2
            title = f"{KIND_TITLES[kind]}\n{_METRIC_TITLES[metric]}"
            figures[f"{kind.value}-{metric}.png"] = plot_head_metric(rows, title, digits)
    return figures


def _table(heads: Sequence[HeadStats], columns: Sequence[str]) -> list[str]:
    lines = ["| head | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for h in heads:
        cells = ["–" if h.value(c) is None else f"{h.value(c):.4g}" for c in columns]
        lines.append(f"| {h.name} | " + " | ".join(cells) + " |")
    return lines


def _top(heads: Sequence[HeadStats], metric: str, n: int, largest: bool) -> list[HeadStats]:
    scored = [h for h in heads if h.value(metric) is not None]
    return sorted(scored, key=lambda h: h.value(metric), reverse=largest)[:n]


def report_markdown(report: HeadReport, title: str, split: str | None = None, n: int = 5) -> str:
    """The short markdown summary: the extremes of each measure, `n` heads each."""
    where = f" of the {split} split" if split else ""
    lines = [
        f"# Attention heads: {title}",
        "",
        f"{report.sentences} sentence pairs{where} under teacher forcing "
        f"({report.source_tokens} source and {report.target_tokens} target tokens"
        + (f"; {report.skipped} longer than max_len skipped" if report.skipped else "")
        + f"). Baseline NLL {report.baseline_nll:.4f} nats/token. Heads are named kind, "
        "layer, head, counted from 0; every number is in heads.json, heat maps per metric "
        "and kind beside it.",
    ]
    sections = [
        ("Most confident (mean largest weight, Voita et al. 2019)", "confidence", True,
         ["confidence", "entropy"], None),
        ("Least important by ablation (NLL increase with the head zeroed, nats/token)",
         "ablation", False, ["ablation", "gradient"], None),
        ("Least important by gradient (Michel et al. 2019, nats/token per unit mask)",
         "gradient", False, ["gradient", "ablation"], None),
        ("Most positional: previous token (share of queries, offset -1)", "offset_-1", True,
         ["offset_-1", "offset_0"], None),
        ("Most positional: next token (share of queries, offset +1)", "offset_+1", True,
         ["offset_+1", "offset_0"], None),
        ("Most monotone encoder-decoder attention (Pearson r, target vs. strongest source "
         "position)", "monotonicity", True, ["monotonicity", "confidence"], AttentionKind.CROSS),
    ]  # fmt: skip
    for heading, metric, largest, columns, kind in sections:
        heads = [h for h in report.heads if kind is None or h.kind is kind]
        top = _top(heads, metric, n, largest)
        if top:
            lines += ["", f"## {heading}", "", *_table(top, columns)]
    return "\n".join(lines) + "\n"


def write_head_report(
    report: HeadReport, out_dir: str | Path, run: str | None = None, split: str | None = None
) -> list[Path]:
    """Write heads.json, report.md and the heat maps into `out_dir`, each atomically.

    Args:
        report: from `head_report`.
        out_dir: the directory (created if missing).
        run, split: what was measured, recorded in heads.json and report.md.

    Returns:
        The paths written: heads.json, report.md, then the PNGs.
    """
    out_dir = Path(out_dir)
    figures = head_figures(report)  # all drawn before anything is written
    context = {key: value for key, value in (("run", run), ("split", split)) if value is not None}
    paths = [
        write_atomic(out_dir / JSON_FILE, report.to_json(**context)),
        write_atomic(out_dir / REPORT_FILE, report_markdown(report, run or "model", split)),
    ]
    paths += [write_png(fig, out_dir / name) for name, fig in figures.items()]
    return paths


# ----- reading heads.json back -----------------------------------------------------------

HeadKey = tuple[AttentionKind, int, int]  # kind, layer, head


def read_head_records(path: str | Path) -> dict[HeadKey, dict[str, Any]]:
    """The per-head records of a heads.json written by `write_head_report`.

    Args:
        path: the heads.json.

    Returns:
        (kind, layer, head) -> that head's metrics by their JSON keys (kind, layer and
        head left out); a metric the file lacks is absent, one that does not apply is None.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, no "heads" list, or a record without a valid kind
            (encoder, decoder, cross), layer and head, or listed twice; named by
            file and record number.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not readable JSON ({err}); rerun `aiayn heads`") from None
    records = data.get("heads") if isinstance(data, dict) else None
    if not isinstance(records, list):
        raise ValueError(f'{path} has no "heads" list; rerun `aiayn heads`')
    kinds = {kind.value: kind for kind in AttentionKind}
    heads: dict[HeadKey, dict[str, Any]] = {}
    for number, record in enumerate(records, start=1):
        try:
            key = (kinds[record["kind"]], int(record["layer"]), int(record["head"]))
            if key[1] < 0 or key[2] < 0 or isinstance(record["layer"], bool):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{path}: record {number} needs a kind ({', '.join(kinds)}), a layer and a "
                "head, each counted from 0"
            ) from None
        if key in heads:
            raise ValueError(
                f"{path}: record {number} repeats {key[0].value} layer {key[1]} head {key[2]}"
            )
        heads[key] = {k: v for k, v in record.items() if k not in ("kind", "layer", "head")}
    return heads
