"""`aiayn prepare ...`: the commands, their errors, and the real Bible end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aiayn.cli import app
from aiayn.data.batching import TokenBatcher
from aiayn.data.corpus import PreparedCorpus

runner = CliRunner()
EN = ["the cat sat on the mat", "a dog ran home", "birds sing in the morning", "we read books"]
DE = ["die Katze sass auf der Matte", "ein Hund lief heim", "Vögel singen am Morgen", "wir lesen"]


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_prepare_text_command(tmp_path):
    src = write(tmp_path / "t.en", EN * 30)
    tgt = write(tmp_path / "t.de", DE * 30)
    vsrc = write(tmp_path / "v.en", EN[:2])
    vtgt = write(tmp_path / "v.de", DE[:2])
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "prepare", "text", "--src-train", src, "--tgt-train", tgt,
            "--src-valid", vsrc, "--tgt-valid", vtgt,
            "--src-lang", "en", "--tgt-lang", "de", "--out", str(out), "--vocab-size", "80",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "train:" in result.output and "120 pairs" in result.output
    corpus = PreparedCorpus.load(out)
    assert corpus.read("valid") == list(zip(EN[:2], DE[:2], strict=True))
    assert json.loads((out / "stats.json").read_text())["vocab_size"] == 80


def test_prepare_text_errors_are_one_line(tmp_path):
    src = write(tmp_path / "t.en", EN)
    tgt = write(tmp_path / "t.de", DE[:3])
    args = ["prepare", "text", "--src-train", src, "--tgt-train", tgt]
    result = runner.invoke(
        app, [*args, "--src-lang", "en", "--tgt-lang", "de", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 1
    assert f"{src} has 4 lines, {tgt} has 3" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(
        app,
        [*args, "--src-valid", src, "--src-lang", "en", "--tgt-lang", "de", "--out", str(tmp_path)],
    )
    assert result.exit_code != 0
    assert "--tgt-valid" in result.output


def test_prepare_tsv_and_hf_commands(tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_text(
        "".join(f"{s}\t{t}\n" for s, t in zip(EN, DE, strict=True)) * 30, encoding="utf-8"
    )
    out = tmp_path / "tsv"
    common = ["--src-lang", "en", "--tgt-lang", "de", "--vocab-size", "80"]
    result = runner.invoke(app, ["prepare", "tsv", "--train", str(tsv), "--out", str(out), *common])
    assert result.exit_code == 0, result.output
    assert PreparedCorpus.load(out).read("train")[:4] == list(zip(EN, DE, strict=True))

    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    rows = [{"en": s, "de": t} for s, t in zip(EN, DE, strict=True)] * 30
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"translation": rows})}).save_to_disk(
        str(saved)
    )
    out = tmp_path / "hf"
    result = runner.invoke(app, ["prepare", "hf", str(saved), "--out", str(out), *common])
    assert result.exit_code == 0, result.output
    assert len(PreparedCorpus.load(out).read("train")) == 120


def test_prepare_bible_rejects_unknown_source(tmp_path):
    result = runner.invoke(app, ["prepare", "bible", "--out", str(tmp_path), "--src", "niv"])
    assert result.exit_code != 0
    assert "web or kjv" in result.output


REAL = Path("/usr/share/sword/mods.d")


@pytest.mark.skipif(
    not all((REAL / f"{m}.conf").is_file() for m in ("engWEB2015eb", "spaRV1909eb")),
    reason="Debian SWORD modules absent: sudo apt-get install sword-text-web sword-text-sparv",
)
@pytest.mark.slow
def test_prepare_bible_real_modules_and_padding(tmp_path):
    out = tmp_path / "bible"
    result = runner.invoke(app, ["prepare", "bible", "--out", str(out)])
    assert result.exit_code == 0, result.output
    corpus = PreparedCorpus.load(out)
    stats = corpus.stats
    counts = {split: stats["splits"][split]["pairs"] for split in ("train", "valid", "test")}
    assert counts["train"] > 29_000
    assert 200 <= counts["valid"] <= 800 and 200 <= counts["test"] <= 800
    held_out = stats["source"]["held_out_chapters"]
    assert not set(held_out["valid"]) & set(held_out["test"])
    tokenizer = corpus.tokenizer()
    train = corpus.read("train")
    ids = list(
        zip(
            tokenizer.encode_batch([s for s, _ in train]),
            tokenizer.encode_batch([t for _, t in train]),
            strict=True,
        )
    )
    ids_in_stats = sum(len(s) for s, _ in ids)
    assert ids_in_stats == stats["splits"]["train"]["src_tokens"]
    for budget in (25_000, 4_000):
        batcher = TokenBatcher(ids, budget, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
        assert batcher.padding_fraction() < 0.10, budget
