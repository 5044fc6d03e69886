"""Scores of translations against references: sacreBLEU, chrF and the paper's tokenized BLEU.

sacreBLEU (Post, 2018) scores detokenized text with its own fixed tokenization and
prints a signature that says exactly how; that is the figure to report. The paper's
BLEU (Table 2) was computed the tensor2tensor way, on tokenized text with hyphenated
compounds split ("rock-hard" -> "rock ##AT##-##AT## hard") and multi-bleu; it is
typically higher and is reported here only as a labelled second figure, for
comparison with published numbers. We approximate Moses tokenization with
sacreBLEU's 13a tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from aiayn.data.files import lines_text, strict_json, write_atomic

_COMPOUND = re.compile(r"(\S)-(\S)")
TOKENIZED_BLEU_LABEL = (
    "tokenized BLEU (13a tokens, compounds split, as tensor2tensor; not sacreBLEU)"
)


@dataclass(frozen=True)
class Scores:
    """Corpus-level scores of one set of hypotheses.

    Attributes:
        bleu: sacreBLEU, 0-100.
        bleu_signature: sacreBLEU's signature string (how the score was computed).
        bleu_detail: sacreBLEU's one-line summary (n-gram precisions, brevity penalty).
        chrf: chrF, 0-100.
        chrf_signature: its signature.
        tokenized_bleu: the paper-style tokenized BLEU, 0-100 (see module docstring).
        sentences: number of hypotheses scored.
    """

    bleu: float
    bleu_signature: str
    bleu_detail: str
    chrf: float
    chrf_signature: str
    tokenized_bleu: float
    sentences: int

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "tokenized_bleu_label": TOKENIZED_BLEU_LABEL}

    def summary(self) -> str:
        """Three lines for people: the signed figures first, the paper-style one labelled."""
        return (
            f"BLEU {self.bleu:.2f} ({self.bleu_signature})\n"
            f"chrF {self.chrf:.2f} ({self.chrf_signature})\n"
            f"{TOKENIZED_BLEU_LABEL} = {self.tokenized_bleu:.2f}"
        )


def _check(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: "
            "they must pair up line by line"
        )
    if not hypotheses:
        raise ValueError("nothing to score: no hypotheses")


def paper_tokenize(text: str) -> str:
    """13a tokenization, then hyphenated compounds split as tensor2tensor's get_ende_bleu.sh."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", Tokenizer13a()(text.strip()))


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """The paper-style tokenized BLEU, 0-100 (see the module docstring), unsmoothed as
    multi-bleu.perl is: 0 when some n-gram order (n <= 4) has no match in the corpus."""
    _check(hypotheses, references)
    hyps = [paper_tokenize(h) for h in hypotheses]
    refs = [paper_tokenize(r) for r in references]
    # multi-bleu.perl does not smooth: a zero n-gram precision gives 0
    return BLEU(tokenize="none", force=True, smooth_method="none").corpus_score(hyps, [refs]).score


def score(hypotheses: Sequence[str], references: Sequence[str]) -> Scores:
    """sacreBLEU, chrF and tokenized BLEU of `hypotheses` against one reference each.

    Raises:
        ValueError: if the two lists differ in length or are empty.
    """
    _check(hypotheses, references)
    hyps, refs = list(hypotheses), [list(references)]
    bleu, chrf = BLEU(), CHRF()
    bleu_score = bleu.corpus_score(hyps, refs)
    chrf_score = chrf.corpus_score(hyps, refs)
    return Scores(
        bleu=bleu_score.score,
        bleu_signature=str(bleu.get_signature()),
        bleu_detail=str(bleu_score),
        chrf=chrf_score.score,
        chrf_signature=str(chrf.get_signature()),
        tokenized_bleu=tokenized_bleu(hypotheses, references),
        sentences=len(hyps),
    )


@dataclass(frozen=True)
class PairedDifference:
    """How a system's sacreBLEU differs from a baseline's on the same sentences.

    Attributes:
        baseline_bleu, system_bleu: their corpus sacreBLEU, 0-100.
        difference: system_bleu - baseline_bleu.
        low, high: the 95% interval of the difference (2.5th and 97.5th percentiles over
            the resamples: each resample draws the sentences with replacement, the same
            draw for both systems, and scores both on it).
        p_value: sacreBLEU's paired bootstrap test (`PairedTest`, "bs"; Koehn 2004):
            the chance of a difference at least this large if the systems were equal.
        resamples: the number of resamples of both.
    """

    baseline_bleu: float
    system_bleu: float
    difference: float
    low: float
    high: float
    p_value: float
    resamples: int


def _sentence_statistics(hypotheses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """BLEU's sufficient statistics per sentence: (N, 2 + 2 * 4) as sys_len, ref_len,
    the n-gram matches and the n-gram totals for n = 1..4 (they add over sentences)."""
    bleu = BLEU(effective_order=True)  # counts only; the order is applied at corpus level
    rows = []
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        s = bleu.sentence_score(hypothesis, [reference])
        rows.append([s.sys_len, s.ref_len, *s.counts, *s.totals])
    return np.array(rows, dtype=np.int64)


def _corpus_bleu(statistics: np.ndarray) -> np.ndarray:
    """Corpus sacreBLEU (its defaults: exp smoothing) of summed statistics, per row."""
    return np.array(
        [
            BLEU.compute_bleu(
                row[2:6].tolist(), row[6:10].tolist(), int(row[0]), int(row[1]), "exp"
            ).score
            for row in statistics
        ]
    )


def paired_bootstrap(
    baseline: Sequence[str],
    system: Sequence[str],
    references: Sequence[str],
    resamples: int = 1000,
    seed: int = 12345,
) -> PairedDifference:
    """The difference in sacreBLEU between `system` and `baseline`, with its 95% interval
    and sacreBLEU's paired bootstrap p-value (both over `resamples` resamples).

    `seed` draws the interval's resamples; sacreBLEU's test draws its own from the
    SACREBLEU_SEED environment variable (12345 unless set), as its command line does.

    Raises:
        ValueError: lists of different lengths, or empty ones.
    """
    _check(baseline, references)
    _check(system, references)
    base_stats = _sentence_statistics(baseline, references)
    system_stats = _sentence_statistics(system, references)
    rows = np.random.default_rng(seed).choice(
        len(references), size=(resamples, len(references)), replace=True
    )
    differences = _corpus_bleu(system_stats[rows].sum(axis=1)) - _corpus_bleu(
        base_stats[rows].sum(axis=1)
    )
    base_bleu = float(_corpus_bleu(base_stats.sum(axis=0, keepdims=True))[0])
    system_bleu = float(_corpus_bleu(system_stats.sum(axis=0, keepdims=True))[0])
    test = PairedTest(
        [("baseline", list(baseline)), ("system", list(system))],
        {"BLEU": BLEU()},
        [list(references)],
        test_type="bs",
        n_samples=resamples,
    )
    _, results = test()
    low, high = np.percentile(differences, [2.5, 97.5])
    return PairedDifference(
        baseline_bleu=base_bleu,
        system_bleu=system_bleu,
        difference=system_bleu - base_bleu,
        low=float(low),
        high=float(high),
        p_value=float(results["BLEU"][1].p_value),
        resamples=resamples,
    )


def write_report(scores: Scores, hypotheses: Sequence[str], out_dir: str | Path) -> Path:
    """Write `hypotheses.txt` (one per line) and `scores.json` to `out_dir`; return the JSON path."""
    out_dir = Path(out_dir)
    write_atomic(out_dir / "hypotheses.txt", lines_text(hypotheses))
    return write_atomic(out_dir / "scores.json", strict_json(scores.to_dict()))
