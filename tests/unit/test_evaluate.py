"""Scores against sacreBLEU itself, the tokenized BLEU by hand, and `aiayn evaluate`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import sacrebleu
from typer.testing import CliRunner

from aiayn.cli import app
from aiayn.training.evaluate import paper_tokenize, score, tokenized_bleu
from infer_helpers import make_run, sentences

HYPS = ["The cat sat on the mat.", "A rock-hard problem, solved!", "Nothing here"]
REFS = ["The cat sat on a mat.", "A rock-hard problem was solved!", "Something here."]


def test_bleu_and_chrf_equal_sacrebleu() -> None:
    scores = score(HYPS, REFS)
    assert scores.bleu == sacrebleu.corpus_bleu(HYPS, [REFS]).score
    assert scores.chrf == sacrebleu.corpus_chrf(HYPS, [REFS]).score
    assert scores.bleu_signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert scores.sentences == 3


# 13a's rules (mteval-v13a.pl, as sacreBLEU implements them), then tensor2tensor's
# get_ende_bleu.sh compound rule, perl's s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g: matches do
# not overlap, so in "x-y-z" the second hyphen stays. Written out by hand.
PAPER_TOKENS = {
    "A rock-hard problem, solved!": "A rock ##AT##-##AT## hard problem , solved !",
    "state-of-the-art": "state ##AT##-##AT## of ##AT##-##AT## the ##AT##-##AT## art",
    "x-y-z": "x ##AT##-##AT## y-z",
    "It costs $5,000.50 (approx.)": "It costs $ 5,000.50 ( approx . )",
    "a 5-year plan": "a 5 - year plan",  # 13a splits digit-hyphen (Moses would not)
    'Dr. Smith\'s "quote": yes; no?': 'Dr . Smith\'s " quote " : yes ; no ?',
    "  E-Mail an info@x.de, 3.5%  ": "E ##AT##-##AT## Mail an info @ x . de , 3.5 %",
}


@pytest.mark.parametrize(("text", "tokens"), PAPER_TOKENS.items())
def test_paper_tokenize_is_13a_then_tensor2tensors_compound_split(text: str, tokens: str) -> None:
    assert paper_tokenize(text) == tokens


def _multi_bleu(matches: list[int], totals: list[int], hyp_len: int, ref_len: int) -> float:
    """BLEU from clipped n-gram matches and totals (n = 1..4) as multi-bleu.perl computes
    it: no smoothing (a zero precision gives 0), brevity penalty exp(1 - r/c) when c < r."""
    if 0 in matches:
        return 0.0
    log_precision = sum(math.log(m / t) for m, t in zip(matches, totals, strict=True)) / 4
    brevity = math.exp(min(0.0, 1 - ref_len / hyp_len))
    return 100 * brevity * math.exp(log_precision)


def test_tokenized_bleu_equals_ngram_counts_by_hand() -> None:
    """HYPS / REFS tokenized (see PAPER_TOKENS), counted by hand:

    The cat sat on the mat .          |  The cat sat on a mat .
    A rock ##AT##-##AT## hard problem , solved !  |  ... hard problem was solved !
    Nothing here                      |  Something here .

    1-grams 6/7 + 7/8 + 1/2 = 14/17 ("the", ",", "Nothing" unmatched; case counts)
    2-grams 4/6 + 5/7 + 0/1 = 9/14
    3-grams 2/5 + 3/6 + 0/0 = 5/11
    4-grams 1/4 + 2/5 + 0/0 = 3/9
    lengths: hypotheses 7 + 8 + 2 = 17, references 7 + 8 + 3 = 18
    """
    expected = _multi_bleu([14, 9, 5, 3], [17, 14, 11, 9], hyp_len=17, ref_len=18)
    assert tokenized_bleu(HYPS, REFS) == pytest.approx(expected, rel=1e-9)
    assert tokenized_bleu(REFS, REFS) == pytest.approx(100.0)


def test_tokenized_bleu_is_unsmoothed_like_multi_bleu() -> None:
    """No 4-gram in common: multi-bleu.perl (and so tensor2tensor's figure) gives 0,
    where sacreBLEU's default exp smoothing would give about 40."""
    hyp, ref = ["the cat sat on the mat"], ["the cat sits on the mat"]
    # 1-grams 5/6, 2-grams 3/5 (the cat, on the, the mat), 3-grams 1/4, 4-grams 0/3
    assert _multi_bleu([5, 3, 1, 0], [6, 5, 4, 3], 6, 6) == 0.0
    assert tokenized_bleu(hyp, ref) == 0.0
    # with one 4-gram in common the figure is the plain geometric mean
    hyp, ref = ["the cat sat on the mat"], ["the cat sat on a mat"]  # 5/6 3/5 2/4 1/3
    assert tokenized_bleu(hyp, ref) == pytest.approx(_multi_bleu([5, 3, 2, 1], [6, 5, 4, 3], 6, 6))


def test_mismatched_lengths_are_an_error() -> None:
    with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
        score(HYPS[:2], REFS)


def test_cli_evaluate_writes_hypotheses_and_scores(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    src, ref = tmp_path / "test.src", tmp_path / "test.ref"
    src.write_text("\n".join(sentences(5, seed=2)) + "\n", encoding="utf-8")
    ref.write_text("\n".join(sentences(5, seed=3)) + "\n", encoding="utf-8")
    out = tmp_path / "eval"
    args = ["evaluate", str(run), "--src", str(src), "--ref", str(ref), "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--beam", "2"])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "scores.json").read_text(encoding="utf-8"))
    hyps = (out / "hypotheses.txt").read_text(encoding="utf-8").split("\n")[:-1]
    refs = ref.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyps) == 5
    assert saved["bleu"] == sacrebleu.corpus_bleu(hyps, [refs]).score  # the same files
    assert saved["chrf"] == sacrebleu.corpus_chrf(hyps, [refs]).score
    assert "tokenized" in saved["tokenized_bleu_label"]
    assert f"BLEU {saved['bleu']:.2f} (nrefs:1|" in result.stdout and "chrF " in result.stdout

    usage = CliRunner().invoke(app, ["evaluate", str(run), "--src", str(src)])
    assert usage.exit_code == 1 and "--split NAME or both --src" in usage.stderr
    missing = CliRunner().invoke(app, ["evaluate", str(run), "--split", "test"])
    assert missing.exit_code == 1 and "config.yaml is missing" in missing.stderr


# ----- the paired bootstrap ---------------------------------------------------------------

WORDS = [
    "in",
    "the",
    "beginning",
    "god",
    "created",
    "heavens",
    "and",
    "earth",
    "was",
    "formless",
    "empty",
    "darkness",
]


def noisy_corpus(n: int, seed: int) -> tuple[list[str], list[str]]:
    """`n` references of 8-14 words and hypotheses that change some of their words."""
    import random

    rng = random.Random(seed)
    refs, hyps = [], []
    for _ in range(n):
        ref = [rng.choice(WORDS) for _ in range(rng.randint(8, 14))]
        hyp = [w if rng.random() < 0.7 else rng.choice(WORDS) for w in ref]
        refs.append(" ".join(ref))
        hyps.append(" ".join(hyp))
    return hyps, refs


def test_summed_sentence_statistics_give_sacrebleus_corpus_score() -> None:
    from aiayn.training.evaluate import _corpus_bleu, _sentence_statistics

    hyps, refs = noisy_corpus(40, seed=1)
    stats = _sentence_statistics(hyps, refs)
    assert stats.shape == (40, 10)
    whole = _corpus_bleu(stats.sum(axis=0, keepdims=True))[0]
    assert whole == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
    half = _corpus_bleu(stats[:20].sum(axis=0, keepdims=True))[0]
    assert half == pytest.approx(sacrebleu.corpus_bleu(hyps[:20], [refs[:20]]).score, abs=1e-9)


def test_paired_bootstrap_of_a_clearly_better_system() -> None:
    from aiayn.training.evaluate import paired_bootstrap

    better, refs = noisy_corpus(60, seed=2)
    worse = [" ".join(reversed(h.split())) for h in better]  # same words, broken order
    result = paired_bootstrap(worse, better, refs, resamples=300)
    expected = (
        sacrebleu.corpus_bleu(better, [refs]).score - sacrebleu.corpus_bleu(worse, [refs]).score
    )
    assert result.difference == pytest.approx(expected, abs=1e-9)
    assert result.system_bleu == pytest.approx(sacrebleu.corpus_bleu(better, [refs]).score)
    assert 0 < result.low < result.difference < result.high
    assert result.p_value < 0.01
    assert result.resamples == 300


def test_paired_bootstrap_of_a_system_against_itself_is_zero_everywhere() -> None:
    from aiayn.training.evaluate import paired_bootstrap

    hyps, refs = noisy_corpus(30, seed=3)
    result = paired_bootstrap(hyps, hyps, refs, resamples=100)
    assert result.difference == 0 and result.low == 0 and result.high == 0


def test_paired_bootstrap_of_a_small_change_is_not_significant() -> None:
    from aiayn.training.evaluate import paired_bootstrap

    hyps, refs = noisy_corpus(80, seed=4)
    changed = [*hyps[:-1], hyps[-1] + " the"]  # one word more in one sentence of 80
    result = paired_bootstrap(hyps, changed, refs, resamples=300)
    assert result.low <= result.difference <= result.high
    assert result.low <= 0 <= result.high  # resamples without that sentence differ by 0
    assert result.p_value > 0.05


def test_paired_bootstrap_refuses_lists_of_different_lengths() -> None:
    from aiayn.training.evaluate import paired_bootstrap

    with pytest.raises(ValueError):
        paired_bootstrap(["a b"], ["a b", "c"], ["a b"])
