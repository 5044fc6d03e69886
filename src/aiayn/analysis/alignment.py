"""Word alignment from a translation model's cross-attention, and a statistical baseline.

    cross, rolled = attention_matrices(model, src_ids, tgt_ids)  # (L, T, S), (T, S)
    links = word_alignment(cross[layer], src_pieces, tgt_pieces)
    model1 = Model1.train(word_pairs, iterations=5)          # IBM Model 1, the baseline
    error = aer(links, model1.align(src_words, tgt_words))
    report = align_pairs(model, tokenizer, pairs, train_pairs)   # what `aiayn align` does

Shape legend: L decoder layers, H heads, T target pieces, S source pieces.

An alignment is a set of links (i, j): source word i with target word j, both counted
from 0 (the "i-j" of the Pharaoh format, as fast_align and eflomal write it).

From attention. A (source, target) pair is run under teacher forcing (the decoder
reads bos + target). The weights at `decoder.layers.L.cross_attn.hook_weights` are
averaged over heads. The row of the query that *predicts* target piece j (the one
reading bos + the pieces before j) stands for piece j, as when the model translates;
the row that predicts eos and the source's eos column are dropped. Pieces are grouped
into words: a sentencepiece piece starting with "▁" starts a word, any other piece
continues the word before it (the first piece always starts one). The rule: each
target word is linked to the one source word with the highest attention summed over
the target word's pieces (rows) and the source word's pieces (columns); a tie goes to
the earlier source word. Every target word gets exactly one link.

Attention rollout (Abnar & Zuidema 2020), for the encoder-decoder. Their rollout
multiplies each layer's head-averaged attention, with the residual connection added as
0.5 A + 0.5 I and the rows renormalised, from the first layer up. Here the tokens are
the decoder's T positions and the S encoder outputs, and each decoder layer is two
such steps, in the order the layer runs them:
    self-attention:   R_T <- Â R_T,        R_S <- Â R_S,  Â = rownorm(0.5 A_self + 0.5 I)
    cross-attention:  R_T <- 0.5 R_T,      R_S <- 0.5 R_S + 0.5 C
starting from R_T = I (T, T), R_S = 0 (T, S); C is the layer's head-averaged
cross-attention. (The cross-attention step is 0.5 A + 0.5 I on the joint graph whose
source rows attend to themselves only; its rows already sum to 1.) The result is R_S
with each row renormalised to sum to 1: how much of each source position reaches
each target position through all layers. It is then grouped into words as above.
With identity self-attention and one layer it is the cross-attention itself; with
identity self-attention and layers C_1 ... C_L, it weighs C_l by 2^l. The encoder's
self-attention is not rolled out: the source positions are the encoder's outputs, as
in the cross-attention itself. Feed-forward layers and layer norms are ignored, as in
the paper.

The baseline: IBM Model 1 (Brown et al. 1993) trained by EM, with a NULL source word
and a fixed number of iterations, from a uniform start. It generates each target word
from one source word (or NULL), the direction the attention alignment has. Its Viterbi
alignment links each target word to the source word with the largest t(f | e); a
target word whose best source is NULL (or that was never seen in training) gets no
link. Words are those of the pieces above (the pieces of a word joined, "▁" removed),
so both aligners see the same words.

The measure: the alignment error rate (Och & Ney 2003),
    AER(A; S, P) = 1 - (|A ∩ S| + |A ∩ P|) / (|A| + |S|),
with one reference alignment used as both the sure (S) and the possible (P) links,
so AER = 1 - 2 |A ∩ R| / (|A| + |R|) (1 minus the F1 of the links). Over many
sentences the counts are summed before dividing (corpus AER).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from aiayn.data.files import strict_json, write_atomic
from aiayn.data.tokenizer import Tokenizer
from aiayn.models.encoder_decoder import Transformer
from aiayn.training.tasks.translation import encode_pairs

log = logging.getLogger(__name__)

Alignment = frozenset[tuple[int, int]]
"""Links (source word, target word), both counted from 0."""

WORD_START = "\u2581"  # sentencepiece's "▁"
JSON_FILE = "align.json"
ROLLOUT = "rollout"
DIAGONAL = "diagonal"
MODEL1_ITERATIONS = 5


# ----- the measure ----------------------------------------------------------------------


def aer(alignment: Iterable[tuple[int, int]], reference: Iterable[tuple[int, int]]) -> float:
    """The alignment error rate of `alignment` against one reference (S = P = reference).

    Args:
        alignment: links (source word, target word) to score.
        reference: the reference links, used as both sure and possible links.

    Returns:
        1 - 2 |A ∩ R| / (|A| + |R|): 0 when they agree, 1 when they share no link;
        0 when both are empty.
    """
    return corpus_aer([alignment], [reference])


def corpus_aer(
    alignments: Sequence[Iterable[tuple[int, int]]], references: Sequence[Iterable[tuple[int, int]]]
) -> float:
    """AER over many sentences: the counts |A ∩ R|, |A| and |R| summed before dividing.

    Raises:
        ValueError: the two lists differ in length.
    """
    if len(alignments) != len(references):
        raise ValueError(f"{len(alignments)} alignments but {len(references)} references")
    common = total = 0
    for alignment, reference in zip(alignments, references, strict=True):
        a, r = set(alignment), set(reference)
        common += len(a & r)
        total += len(a) + len(r)
    return 0.0 if total == 0 else 1.0 - 2.0 * common / total


def pharaoh(alignment: Iterable[tuple[int, int]]) -> str:
    """ "0-0 1-2 ...": links as fast_align writes them, sorted."""
    return " ".join(f"{i}-{j}" for i, j in sorted(alignment))


# ----- words from pieces ----------------------------------------------------------------


def word_index(pieces: Sequence[str]) -> list[int]:
    """The word each piece belongs to: a new word at each piece starting with "▁"."""
    index, word = [], -1
    for position, piece in enumerate(pieces):
        if position == 0 or piece.startswith(WORD_START):
            word += 1
        index.append(word)
    return index


def words(pieces: Sequence[str]) -> list[str]:
    """The words the pieces make (pieces joined, "▁" removed); see `word_index`."""
    out: list[str] = []
    for piece, word in zip(pieces, word_index(pieces), strict=True):
        if word == len(out):
            out.append("")
        out[word] += piece.replace(WORD_START, "")
    return out


def word_alignment(
    matrix: Tensor, src_pieces: Sequence[str], tgt_pieces: Sequence[str]
) -> Alignment:
    """Each target word linked to the source word with the most attention summed over both.

    Args:
        matrix: (T, S) attention of target pieces over source pieces, specials dropped.
        src_pieces: the S source pieces, for their words.
        tgt_pieces: the T target pieces.

    Returns:
        One link (source word, target word) per target word; ties go to the earlier
        source word.

    Raises:
        ValueError: the matrix's shape is not (len(tgt_pieces), len(src_pieces)).
    """
    if tuple(matrix.shape) != (len(tgt_pieces), len(src_pieces)):
        raise ValueError(
            f"the matrix has shape {tuple(matrix.shape)}; the pieces need "
            f"({len(tgt_pieces)}, {len(src_pieces)})"
        )
    src_word = torch.tensor(word_index(src_pieces), device=matrix.device)
    tgt_word = torch.tensor(word_index(tgt_pieces), device=matrix.device)
    n_src, n_tgt = int(src_word[-1]) + 1, int(tgt_word[-1]) + 1
    summed = torch.zeros(n_tgt, n_src, dtype=torch.float64, device=matrix.device)
    rows = torch.zeros(n_tgt, matrix.size(1), dtype=torch.float64, device=matrix.device)
    rows.index_add_(0, tgt_word, matrix.to(torch.float64))  # (words_T, S)
    summed.index_add_(1, src_word, rows)  # (words_T, words_S)
    best = summed.argmax(-1).tolist()  # first maximum on ties
    return frozenset((s, t) for t, s in enumerate(best))


def diagonal_alignment(n_src: int, n_tgt: int) -> Alignment:
    """The baseline that reads no model: target word j linked to the source word at the
    same relative position, floor((j + 1/2) * n_src / n_tgt).

    An attention alignment is worth reporting only where it beats this line through
    the sentence (the two languages' word orders are close: English and Spanish).

    Returns:
        One link per target word; none when either side is empty.
    """
    if n_src < 1 or n_tgt < 1:
        return frozenset()
    return frozenset(((2 * j + 1) * n_src // (2 * n_tgt), j) for j in range(n_tgt))


# ----- attention ------------------------------------------------------------------------


def _teacher_forced(model: Transformer, src_ids: Sequence[int], tgt_ids: Sequence[int]):
    cfg = model.cfg
    device = next(model.parameters()).device
    src = torch.tensor([[*src_ids, cfg.eos_id]], device=device)  # (1, S + 1)
    tgt_in = torch.tensor([[cfg.bos_id, *tgt_ids]], device=device)  # (1, T + 1)
    with torch.no_grad():
        return model.attention_maps(src, tgt_in)


def rollout(self_attention: Tensor, cross: Tensor) -> Tensor:
    """Attention rollout through the decoder, from source positions to target positions.

    Args:
        self_attention: (L, T, T) each layer's decoder self-attention, heads averaged.
        cross: (L, T, S) each layer's cross-attention, heads averaged, rows summing to 1.

    Returns:
        (T, S) the rolled-out source share of each target position, rows summing to
        1 (the recurrence is in the module docstring).

    Raises:
        ValueError: the two have different numbers of layers.
    """
    if self_attention.size(0) != cross.size(0):
        raise ValueError(
            f"{self_attention.size(0)} self-attention layers but {cross.size(0)} cross-attention"
        )
    n_tgt = cross.size(1)
    eye = torch.eye(n_tgt, dtype=torch.float64, device=cross.device)
    to_target = eye.clone()  # R_T
    to_source = torch.zeros(cross.shape[1:], dtype=torch.float64, device=cross.device)  # R_S
    for a_self, a_cross in zip(
        self_attention.to(torch.float64), cross.to(torch.float64), strict=True
    ):
        mixed = 0.5 * a_self + 0.5 * eye
        mixed = mixed / mixed.sum(-1, keepdim=True)
        to_target, to_source = mixed @ to_target, mixed @ to_source
        to_target, to_source = 0.5 * to_target, 0.5 * to_source + 0.5 * a_cross
    return to_source / to_source.sum(-1, keepdim=True)


def attention_matrices(
    model: Transformer, src_ids: Sequence[int], tgt_ids: Sequence[int]
) -> tuple[Tensor, Tensor]:
    """Each decoder layer's cross-attention and the rollout, target pieces over source pieces.

    Args:
        model: an encoder-decoder `Transformer` (eval mode for a fixed answer).
        src_ids: source piece ids, without eos.
        tgt_ids: target piece ids, without bos or eos.

    Returns:
        (L, T, S) float32 cross-attention averaged over heads, and (T, S) the rollout
        (`rollout`), both from one teacher-forced pass. Row j is the query that
        predicts target piece j; the row predicting eos and the eos column are dropped
        (cross-attention rows are not renormalised; the rollout's are, after the cut).
        The rollout runs over the full matrices, bos and eos included.
    """
    maps = _teacher_forced(model, src_ids, tgt_ids)
    cross = torch.stack([w[0].float().mean(0) for w in maps.cross])  # (L, T + 1, S + 1)
    decoder = torch.stack([w[0].float().mean(0) for w in maps.decoder])  # (L, T + 1, T + 1)
    rolled = rollout(decoder, cross)[:-1, :-1]
    return cross[:, :-1, :-1], (rolled / rolled.sum(-1, keepdim=True)).float()


# ----- IBM Model 1 ----------------------------------------------------------------------


NULL = "<NULL>"


@dataclass(frozen=True)
class Model1:
    """IBM Model 1's translation table t(target word | source word), NULL included.

    Attributes:
        source_vocab: source word -> id; NULL is id 0.
        target_vocab: target word -> id.
        keys: sorted int64 keys e * len(target_vocab) + f of the (e, f) pairs seen together.
        prob: t(f | e) of each key.
        iterations: EM iterations run.
    """

    source_vocab: dict[str, int]
    target_vocab: dict[str, int]
    keys: np.ndarray
    prob: np.ndarray
    iterations: int

    @classmethod
    def train(
        cls,
        pairs: Sequence[tuple[Sequence[str], Sequence[str]]],
        iterations: int = MODEL1_ITERATIONS,
    ) -> Model1:
        """EM from a uniform table: `iterations` rounds of expected counts, then renormalising.

        Args:
            pairs: (source words, target words) per sentence pair.
            iterations: EM rounds (at least 1).

        Raises:
            ValueError: iterations below 1, or no pair with words on both sides.
        """
        if iterations < 1:
            raise ValueError(f"Model 1 needs at least 1 EM iteration, got {iterations}")
        source_vocab, target_vocab = {NULL: 0}, {}
        pairs = [(s, t) for s, t in pairs if s and t]
        if not pairs:
            raise ValueError("IBM Model 1 needs sentence pairs with words on both sides")
        encoded = [
            (
                np.array([0, *(source_vocab.setdefault(w, len(source_vocab)) for w in s)]),
                np.array([target_vocab.setdefault(w, len(target_vocab)) for w in t]),
            )
            for s, t in pairs
        ]
        n_target = len(target_vocab)
        # One entry per (sentence, target position, source position incl. NULL).
        flat_keys, flat_group, groups = [], [], 0
        for e, f in encoded:
            flat_keys.append((e[None, :] * n_target + f[:, None]).ravel())  # (|f| * (|e| + 1),)
            flat_group.append(np.repeat(np.arange(groups, groups + len(f)), len(e)))
            groups += len(f)
        keys, pair_of = np.unique(np.concatenate(flat_keys), return_inverse=True)
        del flat_keys  # the entries can number tens of millions: keep the indices small
        pair_of = pair_of.astype(np.int32 if len(keys) < 2**31 else np.int64)
        group = np.concatenate(flat_group).astype(pair_of.dtype)
        del flat_group
        source_of = keys // n_target
        prob = np.ones(len(keys))  # uniform: any constant gives the same first E-step
        for _ in range(iterations):
            weight = prob[pair_of]
            share = weight / np.bincount(group, weight, minlength=groups)[group]  # E-step
            counts = np.bincount(pair_of, share, minlength=len(keys))
            prob = counts / np.bincount(source_of, counts)[source_of]  # M-step
        return cls(source_vocab, target_vocab, keys, prob, iterations)

    def table(self, source: Sequence[str], target: Sequence[str]) -> np.ndarray:
        """t(f | e) for NULL + `source` (rows) and `target` (columns); 0 where never seen."""
        e = np.array([0, *(self.source_vocab.get(w, -1) for w in source)])
        f = np.array([self.target_vocab.get(w, -1) for w in target])
        wanted = e[:, None] * len(self.target_vocab) + f[None, :]  # (|e| + 1, |f|)
        at = np.searchsorted(self.keys, wanted).clip(max=len(self.keys) - 1)
        known = (self.keys[at] == wanted) & (e[:, None] >= 0) & (f[None, :] >= 0)
        return np.where(known, self.prob[at], 0.0)

    def align(self, source: Sequence[str], target: Sequence[str]) -> Alignment:
        """The Viterbi alignment: each target word's best source word; none where NULL wins.

        A tie goes to NULL, then to the earlier source word, so a target word never seen
        in training stays unlinked.
        """
        if not source or not target:
            return frozenset()
        best = self.table(source, target).argmax(0)  # row 0 is NULL
        return frozenset((int(i) - 1, j) for j, i in enumerate(best) if i > 0)


# ----- the whole measurement ------------------------------------------------------------


@dataclass
class AlignReport:
    """Attention alignments against Model 1's, per cross-attention layer and by rollout.

    Attributes:
        layer_aer: corpus AER of each decoder layer's cross-attention alignment.
        rollout_aer: corpus AER of the rollout's alignment.
        diagonal_aer: corpus AER of `diagonal_alignment`, the baseline that reads no model.
        best_layer: the layer with the lowest AER (the earliest on a tie).
        pairs: pairs aligned.
        skipped: pairs left out (an empty side, or longer than the model's max_len).
        model1_pairs: pairs Model 1 was trained on.
        model1_iterations: its EM iterations.
        sentences: per pair its words and the alignments (Pharaoh strings).
    """

    layer_aer: list[float]
    rollout_aer: float
    diagonal_aer: float
    best_layer: int
    pairs: int
    skipped: int
    model1_pairs: int
    model1_iterations: int
    sentences: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self, **context: Any) -> dict[str, Any]:
        """align.json's content; `context` (run, split...) goes first."""
        return {
            **context,
            "method": (
                "AER = 1 - 2|A∩R|/(|A|+|R|) summed over sentences, against IBM Model 1's "
                "Viterbi alignment as the one reference (sure = possible links); attention: "
                "cross-attention averaged over heads, each target word linked to the source "
                "word with the highest summed attention; rollout: Abnar & Zuidema 2020 "
                "through decoder self- and cross-attention; diagonal: target word j linked to "
                "source word floor((j + 1/2) S / T), the baseline that reads no model"
            ),
            "pairs": self.pairs,
            "skipped": self.skipped,
            "model1_pairs": self.model1_pairs,
            "model1_iterations": self.model1_iterations,
            "aer": {
                **{f"layer {i}": v for i, v in enumerate(self.layer_aer)},
                ROLLOUT: self.rollout_aer,
                DIAGONAL: self.diagonal_aer,
            },
            "best_layer": self.best_layer,
            "sentences": self.sentences,
        }

    def table(self) -> str:
        """A plain-text table: one row per layer and one for the rollout, best marked."""
        rows = [(f"layer {i}", v) for i, v in enumerate(self.layer_aer)]
        rows.append((ROLLOUT, self.rollout_aer))
        rows.append((DIAGONAL, self.diagonal_aer))
        lines = ["attention   AER vs Model 1"]
        for i, (name, value) in enumerate(rows):
            mark = "  (best layer)" if i == self.best_layer else ""
            lines.append(f"{name:<11} {value:.4f}{mark}")
        return "\n".join(lines) + "\n"


def best_layer(
    layer_alignments: Sequence[Sequence[Alignment]], references: Sequence[Alignment]
) -> int:
    """The layer whose alignments have the lowest corpus AER against `references`.

    Args:
        layer_alignments: per layer, one alignment per sentence.
        references: one reference alignment per sentence.

    Returns:
        The layer's index; the earliest on a tie.
    """
    errors = [corpus_aer(alignments, references) for alignments in layer_alignments]
    return int(np.argmin(errors))


def _pieces(tokenizer: Tokenizer, text: str, ids: Sequence[int]) -> list[str]:
    """The pieces of `text` as written (an unknown piece keeps its characters, not
    "<unk>"), or the pieces of its ids should the two ever disagree in length."""
    pieces = tokenizer.pieces(text)
    return pieces if len(pieces) == len(ids) else [tokenizer.id_to_piece(i) for i in ids]


def align_pairs(
    model: Transformer,
    tokenizer: Tokenizer,
    pairs: Sequence[tuple[str, str]],
    train_pairs: Sequence[tuple[str, str]] = (),
    iterations: int = MODEL1_ITERATIONS,
    progress: bool = True,
) -> AlignReport:
    """Align `pairs` by each layer's cross-attention, by rollout and by Model 1; score them.

    Model 1 is trained on `train_pairs` and `pairs` together (an aligner is run on the
    sentences it aligns, as fast_align and eflomal are), on the tokenizer's words.

    Args:
        model: an encoder-decoder `Transformer`; put in eval mode while it runs.
        tokenizer: its subword model (sentencepiece: "▁" starts a word).
        pairs: (source, target) sentences to align.
        train_pairs: more (source, target) sentences for Model 1 alone.
        iterations: Model 1's EM iterations.
        progress: show a progress bar.

    Returns:
        An `AlignReport`.

    Raises:
        ValueError: no pair has words on both sides within the model's max_len.
    """
    limit = model.cfg.max_len
    encoded = encode_pairs(tokenizer, pairs)
    fits = [bool(s and t and len(s) < limit and len(t) < limit) for s, t in encoded]
    kept = [ids for ids, fit in zip(encoded, fits, strict=True) if fit]
    if len(kept) < len(encoded):
        log.warning(
            "%d pair(s) empty or longer than %d tokens left out", len(encoded) - len(kept), limit
        )
    if not kept:
        raise ValueError(f"no pair has words on both sides and fits the model's max_len={limit}")
    model1_data = [(words(tokenizer.pieces(s)), words(tokenizer.pieces(t))) for s, t in train_pairs]
    texts = [text for text, fit in zip(pairs, fits, strict=True) if fit]
    pieces = [
        (_pieces(tokenizer, s, s_ids), _pieces(tokenizer, t, t_ids))
        for (s, t), (s_ids, t_ids) in zip(texts, kept, strict=True)
    ]
    model1 = Model1.train([*model1_data, *((words(s), words(t)) for s, t in pieces)], iterations)
    references, per_layer, rolled, diagonal, sentences = [], [], [], [], []
    was_training = model.training
    model.eval()
    try:
        for (src_ids, tgt_ids), (src_pieces, tgt_pieces) in tqdm(
            list(zip(kept, pieces, strict=True)), desc="align", disable=not progress
        ):
            cross, rolled_matrix = attention_matrices(model, src_ids, tgt_ids)
            layers = [word_alignment(c, src_pieces, tgt_pieces) for c in cross]
            rollout_links = word_alignment(rolled_matrix, src_pieces, tgt_pieces)
            source_words, target_words = words(src_pieces), words(tgt_pieces)
            reference = model1.align(source_words, target_words)
            references.append(reference)
            diagonal.append(diagonal_alignment(len(source_words), len(target_words)))
            per_layer.append(layers)
            rolled.append(rollout_links)
            sentences.append(
                {
                    "source": source_words,
                    "target": target_words,
                    "model1": pharaoh(reference),
                    **{f"layer {i}": pharaoh(links) for i, links in enumerate(layers)},
                    ROLLOUT: pharaoh(rollout_links),
                }
            )
    finally:
        model.train(was_training)
    by_layer = [list(column) for column in zip(*per_layer, strict=True)]
    return AlignReport(
        layer_aer=[corpus_aer(alignments, references) for alignments in by_layer],
        rollout_aer=corpus_aer(rolled, references),
        diagonal_aer=corpus_aer(diagonal, references),
        best_layer=best_layer(by_layer, references),
        pairs=len(kept),
        skipped=len(pairs) - len(kept),
        model1_pairs=len(model1_data) + len(kept),
        model1_iterations=iterations,
        sentences=sentences,
    )


def write_alignment(report: AlignReport, out_dir: str | Path, **context: Any) -> Path:
    """align.json (`AlignReport.to_dict` with `context`) in `out_dir`, atomically."""
    text = strict_json(report.to_dict(**context), ensure_ascii=False)
    return write_atomic(Path(out_dir) / JSON_FILE, text)
