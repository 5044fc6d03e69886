"""Scores against sacreBLEU itself, the tokenized BLEU by hand, and `aiayn evaluate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sacrebleu
from typer.testing import CliRunner

from aiayn.cli import app
from aiayn.evaluate import paper_tokenize, score, tokenized_bleu
from infer_helpers import make_run, sentences

HYPS = ["The cat sat on the mat.", "A rock-hard problem, solved!", "Nothing here"]
REFS = ["The cat sat on a mat.", "A rock-hard problem was solved!", "Something here."]


def test_bleu_and_chrf_equal_sacrebleu() -> None:
    scores = score(HYPS, REFS)
    assert scores.bleu == sacrebleu.corpus_bleu(HYPS, [REFS]).score
    assert scores.chrf == sacrebleu.corpus_chrf(HYPS, [REFS]).score
    assert scores.bleu_signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert scores.sentences == 3


def test_tokenized_bleu_splits_compounds() -> None:
    assert paper_tokenize("A rock-hard problem, solved!") == (
        "A rock ##AT##-##AT## hard problem , solved !"
    )
    hyps = [paper_tokenize(h) for h in HYPS]
    refs = [paper_tokenize(r) for r in REFS]
    expected = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", force=True).score
    assert tokenized_bleu(HYPS, REFS) == pytest.approx(expected)
    assert tokenized_bleu(REFS, REFS) == pytest.approx(100.0)


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
