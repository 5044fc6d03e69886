"""benchmarks/record_export.py on a six-step quickstart: every quantization exported,
translated by CTranslate2 and scored (a quick check; the real record needs a trained run)."""

from __future__ import annotations

import pytest

from benchmarks.record_export import QUANTIZATIONS, record
from train_helpers import tiny_quickstart

pytest.importorskip("ctranslate2")
pytest.importorskip("transformers")


def test_record_export_scores_each_quantization_against_float32(tmp_path):
    results, _ = tiny_quickstart(tmp_path / "qs", "--set", "model.norm_first=true")
    payload = record(tmp_path / "qs", limit=4, threads=1)
    assert payload["sentences"] == 4 == results["test_pairs"]
    assert (payload["beam"], payload["alpha"]) == (results["beam"], results["alpha"])
    rows = {row["quantization"]: row for row in payload["quantizations"]}
    assert list(rows) == list(QUANTIZATIONS)
    assert rows["float32"]["same_as_float32"] == 1.0  # float32 against itself
    for row in rows.values():
        assert 0 <= row["bleu"] <= 100 and 0 <= row["same_as_float32"] <= 1
