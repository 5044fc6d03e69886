"""`aiayn quickstart` end to end (tiny mode, on the real Bible) and the commands the
README and the docs show."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import sacrebleu
import torch
from typer.testing import CliRunner

from aiayn.apps.quickstart import QuickstartConfig, default_recipe, evenly_spaced, recipes_dir
from aiayn.cli import app
from aiayn.config.devices import machine
from aiayn.data.corpus import PreparedCorpus
from aiayn.data.files import read_lines

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
SWORD = Path("/usr/share/sword/modules/texts/ztext")
needs_sword = pytest.mark.skipif(
    not all((SWORD / m).is_dir() for m in ("engWEB2015eb", "spaRV1909eb")),
    reason="needs: apt-get install sword-text-web sword-text-sparv (make test does it as root)",
)

# About 30 seconds of training of a very small model: the whole pipeline, not the quality.
TINY_RECIPE = """\
data:
  corpus: replaced-by-quickstart
model:
  preset: tiny
  d_model: 32
  n_heads: 2
  d_ff: 64
  n_layers: 1
  max_len: 512
train:
  max_tokens: 1024
  warmup: 20
  checkpoint_every_steps: 10
  keep_last: 3
  valid_every_steps: 20
  valid_bleu_sentences: 0
  log_every_steps: 10
"""


def test_evenly_spaced():
    assert evenly_spaced(9, 5) == [0, 2, 4, 6, 8]
    assert evenly_spaced(10, 4) == [0, 3, 6, 9]
    assert evenly_spaced(3, 5) == [0, 1, 2]
    assert evenly_spaced(7, 1) == [0]
    assert evenly_spaced(0, 5) == []


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="minutes"):
        QuickstartConfig(minutes=0)
    with pytest.raises(ValueError, match="average_last"):
        QuickstartConfig(average_last=0)
    with pytest.raises(ValueError, match="test_pairs"):
        QuickstartConfig(test_pairs=0)


def test_default_recipes_exist():
    assert recipes_dir() == (ROOT / "configs").resolve()  # configs/ links to the packaged ones
    assert default_recipe("cpu").is_file()
    assert default_recipe("cuda").is_file()


@pytest.mark.slow
@needs_sword
def test_quickstart_tiny_end_to_end_and_resume(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY_RECIPE, encoding="utf-8")
    out = tmp_path / "qs"
    args = [
        "quickstart", "--out", str(out), "--minutes", "0.4", "--recipe", str(recipe),
        "--vocab-size", "1000", "--test-pairs", "12", "--average", "2", "--beam", "2",
        "--device", "cpu",
    ]  # fmt: skip
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    for key in ("bleu", "chrf", "steps", "train_minutes", "device", "test_pairs"):
        assert key in results, key
    assert results["device"] == "cpu" and results["test_pairs"] == 12
    assert results["steps"] > 0 and 0.3 <= results["train_minutes"] <= 1.5
    assert len(results["samples"]) == 5
    # Which machine and which precision, so that a figure says where it came from (issue 41).
    assert results["machine"] == machine()
    assert results["precision"] == {"requested": "fp32", "chosen": "fp32"}  # the recipe's
    assert "precision: fp32" in first.output
    # the test translation's type: auto, timed (faked alike by tests/conftest.py) on the
    # first batch, the 12 verses at beam 2
    assert results["decode_precision"] == {
        "requested": "auto",
        "chosen": "float32",
        "bf16_speedup": 1.0,
        "bf16_min_speedup": 1.2,
        "rows": 24,
    }
    assert "decoding precision: float32 (auto: bfloat16 steps timed 1.00x float32's" in (
        first.output
    )

    # The score is sacreBLEU's on the files written, against the corpus's references.
    hypotheses = read_lines(out / "eval" / "hypotheses.txt")
    references = [t for _, t in PreparedCorpus.load(out / "data").read("test")[:12]]
    assert results["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=0.01
    )
    assert (
        "BLEU" in first.output and "source:" in first.output and "aiayn translate" in first.output
    )
    for name in ("encoder.png", "decoder.png", "cross.png"):
        assert (out / "attention" / name).stat().st_size > 0
    assert "averaged the last 2 checkpoints" in first.output

    # Same budget again: the corpus is reused and training does not start over.
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "corpus: reusing" in second.output
    again = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert again["steps"] == results["steps"]
    assert again["train_minutes"] == pytest.approx(results["train_minutes"], abs=0.01)

    # `aiayn evaluate RUN --split test` finds the corpus the run was trained on.
    scored = runner.invoke(
        app,
        [
            "evaluate",
            str(out / "run"),
            "--split",
            "test",
            "--beam",
            "1",
            "--out",
            str(tmp_path / "ev"),
        ],
    )
    assert scored.exit_code == 0, scored.output
    assert len(read_lines(tmp_path / "ev" / "hypotheses.txt")) == 296

    # What decodes is the inference transform of the Bible-trained model: same outputs.
    from aiayn.apps.translate import Translator
    from aiayn.inference.search import DecodeConfig, search

    translator = Translator.load(out / "run")
    sources = [s for s, _ in PreparedCorpus.load(out / "data").read("test")[:24]]
    src = translator.to_batch(translator.encode(sources))
    literal, frozen = translator.model, translator.engine
    with torch.no_grad():
        tgt = src[:, :6].clone()
        expected = literal.decode(tgt, literal.encode(src))
        torch.testing.assert_close(
            frozen.decode(tgt, frozen.encode(src)), expected, rtol=0, atol=1e-5
        )
    for beam in (1, 4):
        config = DecodeConfig(beam=beam, nbest=beam)
        want, got = search(literal, src, config), search(frozen, src, config)
        # The same n best scores, and the same best hypothesis wherever it is clear of the
        # next. A barely trained model (trained for 0.4 minutes, so a different number of
        # updates on each run and CPU) repeats tokens, and its n-best lists hold near-ties
        # that float noise may order, or swap in and out of the n best, either way.
        for mine, theirs in zip(got, want, strict=True):
            mine_scores = sorted(h.score for h in mine)
            their_scores = sorted(h.score for h in theirs)
            assert mine_scores == pytest.approx(their_scores, abs=1e-4)
            if len(theirs) < 2 or their_scores[-1] - their_scores[-2] > 1e-3:
                best = max(theirs, key=lambda h: h.score).tokens
                assert max(mine, key=lambda h: h.score).tokens == best


def test_quickstart_names_a_missing_recipe(tmp_path):
    result = runner.invoke(
        app, ["quickstart", "--out", str(tmp_path), "--recipe", str(tmp_path / "no.yaml")]
    )
    assert result.exit_code == 1
    assert "recipe not found" in result.output and "no.yaml" in result.output


def readme_subcommands() -> set[tuple[str, ...]]:
    """Every `aiayn SUB [SUBSUB]` README.md and the docs pages show."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    text = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    code = re.findall(r"```.*?```", text, flags=re.S) + re.findall(r"`[^`\n]+`", text)
    found = set()
    command = r"(?:^|`|\| |\$ |&& )(?:\S*/)?aiayn ([a-z]+)(?: ([a-z][a-z0-9]*))?"
    for match in re.finditer(command, "\n".join(code), flags=re.M):
        sub, subsub = match.groups()
        found.add((sub, subsub) if sub in {"prepare", "convert"} and subsub else (sub,))
    return found


def test_every_command_in_the_readme_has_help():
    commands = readme_subcommands()
    assert ("quickstart",) in commands and ("train",) in commands
    for command in sorted(commands):
        result = runner.invoke(app, [*command, "--help"])
        assert result.exit_code == 0, f"aiayn {' '.join(command)} --help: {result.output}"
