"""`aiayn train` of the induction recipes: bad attention-only settings, one line, exit 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aiayn.data.lm import prepare_lm_text
from aiayn.data.prepare import PrepareConfig
from train_helpers import EN


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mono")
    rng = np.random.default_rng(0)
    for name, n in (("train.txt", 200), ("valid.txt", 40)):
        lines = [" ".join(rng.choice(EN, size=5)) for _ in range(n)]
        (root / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    prepare_lm_text(root / "train.txt", root / "lm", "en", valid=root / "valid.txt",
                    config=PrepareConfig(vocab_size=60))  # fmt: skip
    return root / "lm"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.d_ff=-1", "ModelConfig.d_ff must be >= 0 (0: attention-only layers), got -1"),
        (
            'data.task_options={"in_context_late": [0.9, 2]}',
            "data.task_options: lm in_context_late must have 0 <= a < b <= 1, got [0.9, 2]",
        ),
    ],
)
def test_bad_attention_only_settings_are_one_line_and_write_nothing(
    corpus, tmp_path, override, message
):
    run = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "aiayn", "train", "gpt-induction-attn-only-bible-en-cpu",
         "--run", str(run), f"data.corpus={corpus}", "model.max_len=20", override],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr == f"aiayn: error: {message}\n"
    assert not run.exists()
