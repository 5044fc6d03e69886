"""Translator and `aiayn translate`: order, empty lines, batching, bad input."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from aiayn import ModelConfig, Transformer
from aiayn.apps.translate import Translator
from aiayn.cli import app
from aiayn.data.tokenizer import train_tokenizer
from aiayn.inference.decoding import start as start_decoding
from aiayn.inference.search import DecodeConfig, length_penalty, search
from aiayn.io.checkpoint import save_model
from infer_helpers import make_run, sentences


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("translate"))


@pytest.fixture(scope="module")
def translator(run: Path) -> Translator:
    return Translator.load(run)


def test_translate_keeps_order_across_batches(translator: Translator) -> None:
    texts = sentences(8, seed=1)
    together = translator.translate(texts, beam=3, max_tokens=24, extra_len=6)  # 3+ batches
    alone = [translator.translate([t], beam=3, extra_len=6)[0] for t in texts]
    assert together == alone
    # a model that said the same for every sentence would pass the line above
    assert len(set(alone)) >= len(texts) // 2, alone
    ids = translator.encode(texts)
    config = DecodeConfig(beam=3, extra_len=6)
    direct = search(translator.model, translator.to_batch(ids), config)
    assert together == [translator.tokenizer.decode(r[0].tokens) for r in direct]


def test_empty_lines_give_empty_translations(translator: Translator) -> None:
    out = translator.translate(["", "house.", "   ", "river tree."], beam=2)
    assert out[0] == "" and out[2] == ""
    assert out[1] == translator.translate(["house."], beam=2)[0]
    assert translator.translate_nbest([""], DecodeConfig(beam=2, nbest=2)) == [[]]


def test_nbest_lists_are_ranked(translator: Translator) -> None:
    (candidates,) = translator.translate_nbest(["house garden."], DecodeConfig(beam=4, nbest=3))
    assert 1 <= len(candidates) <= 3
    assert [c.score for c in candidates] == sorted((c.score for c in candidates), reverse=True)


def test_too_long_sentence_is_truncated_with_a_warning(
    translator: Translator, caplog: pytest.LogCaptureFixture
) -> None:
    long = " ".join(["bridge water summer night"] * 40)
    with caplog.at_level(logging.WARNING, logger="aiayn.apps.translate"):
        (out,) = translator.translate([long], beam=1)
    assert isinstance(out, str)
    assert "sentence 1" in caplog.text and "max_len=32" in caplog.text


def test_missing_and_corrupt_checkpoints_are_clear_errors(tmp_path: Path, run: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Translator.load(tmp_path / "nowhere")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"this is not a checkpoint")
    with pytest.raises(ValueError, match="not a readable safetensors"):
        Translator.load(bad, tokenizer=run / "spm.model")
    lone = tmp_path / "lone" / "model.safetensors"
    lone.parent.mkdir()
    lone.write_bytes((run / "checkpoints" / "step-00000001" / "model.safetensors").read_bytes())
    with pytest.raises(FileNotFoundError, match=r"no subword model \(spm\.model\)"):
        Translator.load(lone)


def test_vocabulary_mismatch_is_a_clear_error(tmp_path: Path, run: Path) -> None:
    other = train_tokenizer(sentences(200), tmp_path / "other.model", vocab_size=40)
    with pytest.raises(ValueError, match="40 pieces"):
        Translator.load(run, tokenizer=other.path)
    save_model(Transformer(ModelConfig.tiny(vocab_size=100)), tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match="do not belong together"):
        Translator.load(tmp_path / "m.safetensors", tokenizer=run / "spm.model")


# ----- the command ---------------------------------------------------------------


def test_cli_translate_keeps_order_and_empty_lines(
    tmp_path: Path, run: Path, translator: Translator
) -> None:
    lines = ["house garden.", "", "river.", "", "the night tree stone.", "water."]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out" / "hyp.txt"
    args = ["-i", str(src), "-o", str(out), "--max-tokens", "8", "--extra-len", "4"]
    result = CliRunner().invoke(app, ["translate", str(run), *args])
    assert result.exit_code == 0, result.output
    expected = translator.translate(lines, extra_len=4)
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == expected
    assert out.read_text(encoding="utf-8").split("\n")[1] == ""
    assert "6/6" in result.stderr  # the progress bar, on stderr, when writing to a file

    piped = CliRunner().invoke(app, ["translate", str(run), "--beam", "1"], input="river.\n\n")
    assert piped.exit_code == 0, piped.output
    assert piped.stdout == translator.translate(["river."], beam=1)[0] + "\n\n"
    assert "2/2" not in piped.stderr  # no bar when the output is the terminal or a pipe


def test_cli_nbest_format(run: Path) -> None:
    result = CliRunner().invoke(app, ["translate", str(run), "--nbest", "2"], input="house.\n")
    assert result.exit_code == 0, result.output
    rows = result.stdout.splitlines()
    assert 1 <= len(rows) <= 2 and all(r.startswith("0 ||| ") for r in rows)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["translate", "{tmp}/nowhere"], "no checkpoint or run directory"),
        (["translate", "{run}", "-i", "{tmp}/bad.txt"], "bad.txt:2: invalid UTF-8"),
        (["translate", "{run}", "-i", "{tmp}/missing.txt"], "input file not found"),
        (["translate", "{run}", "--beam", "2", "--nbest", "3"], "nbest"),
        (["translate", "{run}", "--device", "cuda:7"], "cuda"),
    ],
)
def test_cli_bad_input_is_one_clear_line(
    tmp_path: Path, run: Path, args: list[str], message: str
) -> None:
    (tmp_path / "bad.txt").write_bytes(b"ok\n\xc3\x28\n")
    args = [a.format(tmp=tmp_path, run=run) for a in args]
    if args[-1] == "cuda:7" and torch.cuda.is_available():
        pytest.skip("a CUDA device exists here")
    result = CliRunner().invoke(app, args, input="house.\n")
    assert result.exit_code == 1
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_cli_dtype_takes_torchs_names(run: Path) -> None:
    result = CliRunner().invoke(
        app, ["translate", str(run), "--dtype", "bfloat16"], input="house.\n"
    )
    assert result.exit_code == 0, result.output
    assert (
        result.stdout == Translator.load(run, dtype=torch.bfloat16).translate(["house."])[0] + "\n"
    )
    bad = CliRunner().invoke(app, ["translate", str(run), "--dtype", "fp64"], input="house.\n")
    message = " ".join(bad.output.replace("│", " ").split())  # typer's box unwrapped
    assert bad.exit_code == 2 and "'fp64'; use float32, bfloat16, float16, int8, auto" in message


def test_cli_fp32_translations_do_not_depend_on_the_batch(run: Path, tmp_path: Path) -> None:
    """In fp32 a sentence's translation is the same whatever it is batched with (bf16's
    is not always: docs/reference/cli.md gives the rate, benchmarks/bench_bf16_batching.py)."""
    source = tmp_path / "source.txt"
    source.write_text("\n".join(sentences(40, seed=5)) + "\n", encoding="utf-8")
    outputs = []
    for way in (["--max-tokens", "4096"], ["--max-tokens", "60"], ["--continuous", "16"]):
        args = ["translate", str(run), "-i", str(source), "--extra-len", "6", *way]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        outputs.append(result.stdout.splitlines())
    assert len(outputs[0]) == 40 and len(set(outputs[0])) > 10  # not one output for all
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0]


class _RecordingDecoding:
    """A `Decoding` that keeps, for every prefix it was asked to extend, the logits it returned."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.input_lengths, self.dtype = inner.input_lengths, inner.dtype
        self.prefixes: list[tuple[int, ...]] | None = None
        self.logits: dict[tuple[int, ...], torch.Tensor] = {}

    def step(self, last: torch.Tensor) -> torch.Tensor:
        logits = self.inner.step(last)
        if self.prefixes is None:
            self.prefixes = [() for _ in last]  # `last` is bos: prefixes hold generated ids
        else:
            self.prefixes = [(*p, int(t)) for p, t in zip(self.prefixes, last, strict=True)]
        for prefix, row in zip(self.prefixes, logits, strict=True):
            self.logits[prefix] = row.clone()
        return logits

    def keep(self, rows: torch.Tensor, sentences: torch.Tensor | None = None) -> None:
        self.inner.keep(rows, sentences)
        self.prefixes = [self.prefixes[int(r)] for r in rows]


def test_bfloat16_model_still_sums_scores_in_float32(run: Path) -> None:
    """The bf16 model's logits, turned into log-probabilities and summed along the
    winning path in float32 by hand, give the search's log_prob and score to float32
    precision; summing in bfloat16 (8 significant bits) would be off by about 1%."""
    translator = Translator.load(run, dtype=torch.bfloat16)
    assert next(translator.model.parameters()).dtype == torch.bfloat16
    model = translator.engine  # what `translate` decodes with
    decodings = []

    class Recording:
        cfg = model.cfg

        def start(self, src: torch.Tensor, beam: int = 1) -> _RecordingDecoding:
            decodings.append(_RecordingDecoding(start_decoding(model, src, beam)))
            return decodings[-1]

    alpha = 0.6
    src = translator.to_batch(translator.encode(["house garden river."]))
    (hypotheses,) = search(Recording(), src, DecodeConfig(beam=2, alpha=alpha, extra_len=6))
    (decoding,) = decodings
    assert decoding.dtype == torch.bfloat16
    assert {row.dtype for row in decoding.logits.values()} == {torch.bfloat16}
    for hypothesis in hypotheses:
        path = [*hypothesis.tokens, model.cfg.eos_id]
        log_prob = torch.zeros((), dtype=torch.float32)
        for t, token in enumerate(path):
            logits = decoding.logits[tuple(path[:t])].float()
            log_prob += torch.log_softmax(logits, dim=-1)[token]
        assert hypothesis.log_prob == pytest.approx(log_prob.item(), rel=1e-6, abs=1e-6)
        score = log_prob / length_penalty(torch.tensor(len(path), dtype=torch.float32), alpha)
        assert hypothesis.score == pytest.approx(score.item(), rel=1e-6, abs=1e-6)
