"""`--dtype auto` (issue 41, item 4): `aiayn translate`, `aiayn serve` and the quickstart's
test translation decode in float32 or bfloat16 as a timing of the model's own steps says
(aiayn.apps.precision_choice), log the choice with the ratio and record it.

The timings are faked here, both ways (tests/conftest.py fakes "no faster" for every other
test); one test runs the real timing and checks only that it gives a ratio."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import aiayn.apps.precision_choice as precision_choice
import aiayn.apps.serve
from aiayn.apps.precision_choice import (
    BF16_MIN_SPEEDUP,
    MAX_TIMED_ROWS,
    PrecisionChoice,
    sample_rows,
)
from aiayn.apps.quickstart import other_machine_line
from aiayn.apps.translate import Translator
from aiayn.cli import app
from aiayn.inference.frozen import FrozenTransformer
from infer_helpers import make_run, sentences

# bound before tests/conftest.py's fixture fakes the module's attribute for each test
REAL_SPEEDUP = precision_choice.bf16_decoding_speedup


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("precision"))


class FakeTiming:
    """Stands for `bf16_decoding_speedup`: answers `ratio` and keeps each call's arguments."""

    def __init__(self) -> None:
        self.ratio = 1.0
        self.calls: list[dict] = []

    def __call__(self, fp32, bf16, src, beam) -> float:
        self.calls.append({"fp32": fp32, "bf16": bf16, "src": src, "beam": beam})
        return self.ratio


@pytest.fixture
def timed(monkeypatch: pytest.MonkeyPatch) -> FakeTiming:
    fake = FakeTiming()
    monkeypatch.setattr(precision_choice, "bf16_decoding_speedup", fake)
    return fake


@pytest.mark.parametrize(
    ("ratio", "chosen"),
    [(2.0, "bfloat16"), (BF16_MIN_SPEEDUP, "bfloat16"), (1.19, "float32"), (0.5, "float32")],
)
def test_auto_follows_the_timed_ratio_and_logs_and_records_it(
    run: Path, timed: FakeTiming, caplog: pytest.LogCaptureFixture, ratio: float, chosen: str
) -> None:
    translator = Translator.load(run)
    rows = translator.encode(sentences(6, seed=3))
    timed.ratio = ratio
    with caplog.at_level(logging.INFO, logger="aiayn.apps.precision_choice"):
        choice = translator.choose_precision(rows, beam=3)
    assert len(timed.calls) == 1
    assert isinstance(timed.calls[0]["fp32"], FrozenTransformer) and timed.calls[0]["beam"] == 3
    assert {p.dtype for p in timed.calls[0]["fp32"].parameters()} == {torch.float32}
    assert {p.dtype for p in timed.calls[0]["bf16"].parameters()} == {torch.bfloat16}
    assert choice is translator.precision
    assert translator.dtype == getattr(torch, chosen) == choice.dtype
    assert {p.dtype for p in translator.model.parameters()} == {getattr(torch, chosen)}
    assert choice.record() == {
        "requested": "auto",
        "chosen": chosen,
        "bf16_speedup": round(ratio, 2),
        "bf16_min_speedup": BF16_MIN_SPEEDUP,
        "rows": 6 * 3,
    }
    line = (
        f"decoding precision: {chosen} (auto: bfloat16 steps timed {ratio:.2f}x float32's "
        f"at 18 rows; bfloat16 needs {BF16_MIN_SPEEDUP:g}x)"
    )
    assert choice.line() == line
    assert [r.getMessage() for r in caplog.records] == [line]


@pytest.mark.parametrize(("ratio", "dtype"), [(2.0, torch.bfloat16), (0.5, torch.float32)])
def test_a_chosen_precision_translates_as_that_precision_given(
    run: Path, timed: FakeTiming, ratio: float, dtype: torch.dtype
) -> None:
    texts = sentences(10, seed=4)
    chosen = Translator.load(run)
    timed.ratio = ratio
    chosen.choose_precision(chosen.encode(texts), beam=3)
    given = Translator.load(run, dtype=dtype)
    assert chosen.dtype == given.dtype == dtype
    ours = chosen.translate_nbest(texts, chosen.decode_config(beam=3, nbest=2, extra_len=6))
    theirs = given.translate_nbest(texts, given.decode_config(beam=3, nbest=2, extra_len=6))
    assert [[(c.text, c.score) for c in cs] for cs in ours] == [
        [(c.text, c.score) for c in cs] for cs in theirs
    ]
    assert len({cs[0].text for cs in ours}) > 3  # not one output for every sentence


def test_the_batch_timed_is_the_first_that_will_run(run: Path, timed: FakeTiming) -> None:
    translator = Translator.load(run)
    eos = translator.model.cfg.eos_id
    rows = [[5, 6, eos], [eos], [5, 6, 7, 8, eos], [5, eos], [5, 6, 7, eos]]
    translator.choose_precision(rows, beam=2, max_tokens=10)
    # translate_ids' batches of 10 tokens, longest first: rows 2 and 4 (2 x 5 <= 10)
    expected = translator.to_batch([rows[2], rows[4]])
    assert torch.equal(timed.calls[-1]["src"], expected) and timed.calls[-1]["beam"] == 2
    translator.choose_precision(rows, max_tokens=None)  # one batch: every row with a token
    expected = translator.to_batch([rows[i] for i in (2, 4, 0, 3)])  # longest first
    assert torch.equal(timed.calls[-1]["src"], expected)
    assert timed.calls[-1]["beam"] == translator.decode.beam  # the translator's own by default


def test_a_large_first_batch_is_timed_on_its_longest_sentences(
    run: Path, timed: FakeTiming
) -> None:
    translator = Translator.load(run)
    rows = translator.encode(sentences(100, seed=8))
    translator.choose_precision(rows, beam=4)  # all 100 fit one batch of 4096 tokens
    timed_rows = MAX_TIMED_ROWS // 4
    longest = sorted(range(100), key=lambda i: -len(rows[i]))[:timed_rows]
    src = timed.calls[-1]["src"]
    assert src.shape == (timed_rows, len(rows[longest[0]]))
    assert sorted(map(tuple, src.tolist())) == sorted(
        map(tuple, translator.to_batch([rows[i] for i in longest]).tolist())
    )
    assert translator.precision.rows == MAX_TIMED_ROWS


def test_nothing_to_translate_and_a_type_given_are_not_timed(run: Path, timed: FakeTiming) -> None:
    translator = Translator.load(run)
    eos = translator.model.cfg.eos_id
    choice = translator.choose_precision([[eos], [eos]])
    assert choice.record() == {
        "requested": "auto",
        "chosen": "float32",
        "untimed": "nothing to translate",
    }
    assert choice.line() == "decoding precision: float32 (auto: nothing to translate)"
    int8 = Translator.load(run, dtype=torch.int8)
    assert int8.choose_precision([[5, eos]]).record() == {
        "requested": "auto",
        "chosen": "int8",
        "untimed": "the weights are int8",
    }
    assert timed.calls == []
    # a translator that was given its type says so, timing nothing
    assert Translator.load(run, dtype=torch.bfloat16).precision == PrecisionChoice(
        "bfloat16", "bfloat16"
    )
    assert Translator.load(run).precision.record() == {
        "requested": "float32",
        "chosen": "float32",
    }


def test_the_real_timing_gives_a_ratio(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No timing is asserted: only that the two types were timed, and the choice follows."""
    monkeypatch.setattr(precision_choice, "bf16_decoding_speedup", REAL_SPEEDUP)
    translator = Translator.load(run)
    choice = translator.choose_precision(translator.encode(sentences(4, seed=2)), beam=2)
    assert choice.bf16_speedup is not None and math.isfinite(choice.bf16_speedup)
    assert choice.bf16_speedup > 0 and choice.rows == 8
    assert choice.chosen == ("bfloat16" if choice.bf16_speedup >= BF16_MIN_SPEEDUP else "float32")


# ----- the commands ------------------------------------------------------------------


def test_cli_translate_times_by_default_and_not_with_a_dtype_given(
    run: Path, timed: FakeTiming, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIAYN_DTYPE")  # tests/conftest.py's float32 for every other test
    texts = sentences(12, seed=6)
    source = tmp_path / "in.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    args = ["translate", str(run), "-i", str(source), "--extra-len", "6", "--continuous", "0"]
    outputs = {}
    for ratio, dtype in ((2.0, torch.bfloat16), (0.5, torch.float32)):
        timed.ratio = ratio
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        outputs[dtype] = result.stdout.splitlines()
        expected = Translator.load(run, dtype=dtype).translate(texts, extra_len=6)
        assert outputs[dtype] == expected
    assert len(timed.calls) == 2
    assert timed.calls[0]["src"].shape[0] == 12  # the first batch of --max-tokens 4096: all
    for dtype in ("float32", "bfloat16"):  # given: never timed, as given
        result = CliRunner().invoke(app, [*args, "--dtype", dtype])
        assert result.exit_code == 0, result.output
        assert result.stdout.splitlines() == outputs[getattr(torch, dtype)]
    assert len(timed.calls) == 2
    # --continuous N: the N longest sentences are what the engine's table starts with
    result = CliRunner().invoke(app, [*args[:-1], "4"])
    assert result.exit_code == 0, result.output
    assert timed.calls[-1]["src"].shape[0] == 4
    # AIAYN_DTYPE sets the default: given, not timed
    monkeypatch.setenv("AIAYN_DTYPE", "bfloat16")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == outputs[torch.bfloat16] and len(timed.calls) == 3


def test_cli_serve_times_a_full_batch_and_reports_the_choice(
    run: Path, timed: FakeTiming, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[Translator] = []

    def fake_app(translator, settings, source):
        served.append(translator)
        return object()

    monkeypatch.setattr(aiayn.apps.serve, "create_app", fake_app)
    monkeypatch.setattr(aiayn.apps.serve, "run_server", lambda *args: None)
    monkeypatch.delenv("AIAYN_DTYPE")  # tests/conftest.py's float32 for every other test
    timed.ratio = 3.0
    args = ["serve", str(run), "--continuous", "0", "--max-batch", "8", "--max-tokens", "4096"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert served[-1].dtype == torch.bfloat16
    assert served[-1].precision.record()["bf16_speedup"] == 3.0
    cfg = served[-1].model.cfg
    assert torch.equal(timed.calls[-1]["src"], served[-1].to_batch(sample_rows(cfg, 8)))
    result = CliRunner().invoke(app, [*args, "--dtype", "float32"])
    assert result.exit_code == 0, result.output
    assert served[-1].dtype == torch.float32 and len(timed.calls) == 1


def test_the_servers_info_says_the_precision_and_its_measure(run: Path, timed: FakeTiming) -> None:
    from aiayn.apps.serve.engine import model_info

    translator = Translator.load(run)
    timed.ratio = 0.8
    translator.choose_precision(sample_rows(translator.model.cfg, 2), beam=1)
    info = model_info(translator, run)
    assert info["dtype"] == "float32"
    assert info["precision"] == {
        "requested": "auto",
        "chosen": "float32",
        "bf16_speedup": 0.8,
        "bf16_min_speedup": BF16_MIN_SPEEDUP,
        "rows": 2,
    }


def test_sample_rows_are_sentences_of_the_served_length(run: Path) -> None:
    cfg = Translator.load(run).model.cfg  # max_len 32
    rows = sample_rows(cfg, 5)
    assert len(rows) == 5 and {len(r) for r in rows} == {min(32, cfg.max_len)}
    specials = {cfg.pad_id, cfg.bos_id, cfg.eos_id}
    assert all(r[-1] == cfg.eos_id and not specials & set(r[:-1]) for r in rows)
    assert len({t for r in rows for t in r}) > 10  # drawn, not one token repeated


# ----- the quickstart's reference line -----------------------------------------------


def test_the_reference_note_says_when_the_test_set_was_decoded_otherwise() -> None:
    reference = {"machine": "AMD EPYC, 2 cores", "bleu": [25.0]}
    here, other = "AMD EPYC, 2 cores", "Intel(R) Xeon(R) Platinum 8481C, 2 cores"
    assert other_machine_line(reference, here, "float32") is None
    same_cpu = other_machine_line(reference, here, "bfloat16")
    assert same_cpu == (
        "the references decoded the test set in float32, this run in bfloat16 (timed faster "
        "here): some translations change, and BLEU with them by a few tenths"
    )
    both = other_machine_line(reference, other, "bfloat16")
    assert both.startswith(f"the references came from AMD EPYC, 2 cores; this is {other}")
    assert both.endswith(f"; and {same_cpu}") and "\n" not in both
    assert other_machine_line(reference, other, "float32") == other_machine_line(reference, other)
    assert "bfloat16" not in other_machine_line(reference, other)
    # references that say what they decoded in: bfloat16 runs, or a mix
    newer = {**reference, "decode_dtypes": ["bfloat16", "bfloat16"]}
    assert other_machine_line(newer, here, "bfloat16") is None
    assert other_machine_line(newer, here, "float32").startswith(
        "the references decoded the test set in bfloat16, this run in float32"
    )
    mixed = {**reference, "decode_dtypes": ["float32", "bfloat16"]}
    assert "in bfloat16 and float32, this run in bfloat16" in other_machine_line(
        mixed, here, "bfloat16"
    )
