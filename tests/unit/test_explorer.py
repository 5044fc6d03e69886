"""The explorer's payload, its per-head metrics, and the self-contained HTML export."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from aiayn.analysis.viz import AttentionKind, translation_attention
from aiayn.apps.explorer import STATIC_DIR, attention_payload, explorer_html, head_metrics
from aiayn.apps.translate import Translator
from aiayn.cli import app
from aiayn.inference.search import DecodeConfig
from infer_helpers import make_run

SENTENCE = "house by the river."


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("explorer"), max_len=16)


@pytest.fixture(scope="module")
def translator(run: Path) -> Translator:
    return Translator.load(run)


def _first(n: int) -> torch.Tensor:
    return (torch.arange(n) == 0)[None]  # (1, n)


def _last(n: int) -> torch.Tensor:
    return (torch.arange(n) == n - 1)[None]  # (1, n)


def _entropy(row: list[float]) -> float:
    return -sum(p * math.log(p) for p in row if p > 0)


# ----- metrics, against a hand computation --------------------------------------------

DIAGONAL = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
BACKWARD = [[0.6, 0.4, 0.0], [0.7, 0.2, 0.1], [0.1, 0.6, 0.3]]  # strongest keys 0, 0, 1


def test_self_attention_metrics_by_hand() -> None:
    weights = torch.tensor([[DIAGONAL, BACKWARD]])  # (1, H=2, 3, 3)
    diagonal, backward = head_metrics(weights, AttentionKind.ENCODER, {"eos": _last(3)})
    assert diagonal["entropy"] == pytest.approx(0.0)
    assert diagonal["confidence"] == pytest.approx(1.0)
    assert (diagonal["offset_-1"], diagonal["offset_0"], diagonal["offset_+1"]) == (0, 1, 0)
    assert diagonal["dominant_offset"] == "same"
    assert diagonal["eos"] == pytest.approx(1 / 3)  # only the last query looks at eos
    assert backward["entropy"] == pytest.approx(sum(_entropy(r) for r in BACKWARD) / 3)
    assert backward["confidence"] == pytest.approx((0.6 + 0.7 + 0.6) / 3)
    # previous: queries 1 and 2 have a previous key, both look there; same: query 0 of 3;
    # next: queries 0 and 1 have a next key, neither looks there
    assert backward["offset_-1"] == pytest.approx(1.0)
    assert backward["offset_0"] == pytest.approx(1 / 3)
    assert backward["offset_+1"] == pytest.approx(0.0)
    assert backward["dominant_offset"] == "previous"
    assert backward["eos"] == pytest.approx((0.0 + 0.1 + 0.3) / 3)
    assert backward["bos"] is None and backward["monotonicity"] is None


def test_decoder_and_cross_metrics_by_hand() -> None:
    causal = [[1.0, 0.0, 0.0], [0.3, 0.7, 0.0], [0.2, 0.3, 0.5]]
    (decoder,) = head_metrics(torch.tensor([[causal]]), AttentionKind.DECODER, {"bos": _first(3)})
    assert decoder["bos"] == pytest.approx((1.0 + 0.3 + 0.2) / 3)
    assert decoder["eos"] is None
    assert decoder["offset_+1"] is None  # a decoder query never sees the next token
    assert decoder["offset_0"] == pytest.approx(1.0) and decoder["dominant_offset"] == "same"
    cross_rows = [[0.1, 0.8, 0.1], [0.2, 0.2, 0.6]]  # 2 target queries x 3 source keys
    (cross,) = head_metrics(torch.tensor([[cross_rows]]), AttentionKind.CROSS, {"eos": _last(3)})
    assert cross["offset_-1"] is cross["offset_0"] is cross["dominant_offset"] is None
    assert cross["eos"] == pytest.approx((0.1 + 0.6) / 2)
    assert cross["confidence"] == pytest.approx((0.8 + 0.6) / 2)
    assert cross["monotonicity"] == pytest.approx(1.0)  # strongest keys 1 then 2: rising


# ----- the payload ---------------------------------------------------------------------


def test_payload_is_the_beam_hypothesis_with_its_maps(translator: Translator) -> None:
    decode = DecodeConfig(beam=3, alpha=0.6)
    payload = attention_payload(translator, SENTENCE, decode)
    json.dumps(payload, allow_nan=False)  # JSON as it is, no NaN
    (best,) = translator.translate_nbest([SENTENCE], decode)[0]
    assert payload["translation"] == best.text
    tokenizer = translator.tokenizer
    assert payload["target_tokens"] == ["<s>"] + [
        tokenizer.id_to_piece(i) for i in best.hypothesis.tokens
    ]
    source_ids = [*tokenizer.encode(SENTENCE), translator.model.cfg.eos_id]  # as the model sees it
    assert payload["source_tokens"] == [tokenizer.id_to_piece(i) for i in source_ids]
    assert payload["decode"] == {"beam": 3, "alpha": 0.6}

    maps, _, _ = translation_attention(translator, SENTENCE, decode)
    cfg = translator.model.cfg
    layers, heads = cfg.n_layers, cfg.n_heads
    assert payload["model"] == {"encoder_layers": layers, "decoder_layers": layers, "heads": heads}
    sides = {"source": len(payload["source_tokens"]), "target": len(payload["target_tokens"])}
    for kind, reference in (
        ("encoder", maps.encoder),
        ("decoder", maps.decoder),
        ("cross", maps.cross),
    ):
        part = payload["attention"][kind]
        weights = torch.tensor(part["weights"])  # (L, H, Tq, Tk)
        assert weights.shape == (
            cfg.n_layers,
            cfg.n_heads,
            sides[part["queries"]],
            sides[part["keys"]],
        ), kind
        assert torch.allclose(weights, torch.cat(reference), atol=5e-4), kind
        assert len(part["metrics"]) == cfg.n_layers
        assert all(len(layer) == cfg.n_heads for layer in part["metrics"])


def test_payload_metrics_follow_its_weights(translator: Translator) -> None:
    """Entropy, confidence and eos of every head, recomputed from the weights shown."""
    payload = attention_payload(translator, SENTENCE, DecodeConfig(beam=2))
    for kind in ("encoder", "cross"):
        part = payload["attention"][kind]
        for layer_weights, layer_metrics in zip(part["weights"], part["metrics"], strict=True):
            for rows, metrics in zip(layer_weights, layer_metrics, strict=True):
                assert metrics["entropy"] == pytest.approx(
                    sum(_entropy(r) for r in rows) / len(rows), abs=0.01
                )
                assert metrics["confidence"] == pytest.approx(
                    sum(max(r) for r in rows) / len(rows), abs=0.002
                )
                assert metrics["eos"] == pytest.approx(
                    sum(r[-1] for r in rows) / len(rows), abs=0.002
                )
    decoder = payload["attention"]["decoder"]
    rows = decoder["weights"][0][0]
    assert decoder["metrics"][0][0]["bos"] == pytest.approx(
        sum(r[0] for r in rows) / len(rows), abs=0.002
    )


def test_blank_sentence_is_refused(translator: Translator) -> None:
    with pytest.raises(ValueError, match="empty sentence"):
        attention_payload(translator, "  ", DecodeConfig())


# ----- the self-contained page ---------------------------------------------------------


def _embedded(page: str) -> dict:
    found = re.search(r'<script type="application/json" id="aiayn-data">(.*?)</script>', page, re.S)
    assert found, "no embedded payload"
    return json.loads(found.group(1))


def test_html_inlines_page_and_data(translator: Translator) -> None:
    payload = attention_payload(translator, SENTENCE, DecodeConfig(beam=1))
    payload["source"] = "a </script><script>alert(1)</script> & <b>"  # must stay data
    page = explorer_html(payload)
    assert _embedded(page) == payload
    assert page.count("</script>") == 2  # the data's element and the inlined script's
    assert not re.search(r'\b(src|href)\s*=\s*"(?!data:)', page), "the page must load nothing"
    assert (STATIC_DIR / "explorer.js").read_text(encoding="utf-8") in page
    assert (STATIC_DIR / "explorer.css").read_text(encoding="utf-8") in page


def test_cli_writes_the_explorer(tmp_path: Path, run: Path, translator: Translator) -> None:
    out = tmp_path / "explorer.html"
    result = CliRunner().invoke(
        app, ["attention", str(run), SENTENCE, "--html", str(out), "--beam", "2"]
    )
    assert result.exit_code == 0, result.output
    assert str(out) in result.output
    payload = _embedded(out.read_text(encoding="utf-8"))
    assert payload["translation"] == translator.translate([SENTENCE], beam=2, alpha=0.6)[0]
    assert payload["run"] == str(run)
    assert not (tmp_path / "attention").exists()  # no PNGs beside it


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--layer", "0"], "--layer and --head choose PNG panels"),
        (["--beam", "0"], "beam"),
    ],
)
def test_cli_html_refuses_bad_options(
    tmp_path: Path, run: Path, extra: list[str], message: str
) -> None:
    out = tmp_path / "explorer.html"
    result = CliRunner().invoke(app, ["attention", str(run), SENTENCE, "--html", str(out), *extra])
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_cli_html_unwritable_path_is_one_line(tmp_path: Path, run: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = CliRunner().invoke(
        app, ["attention", str(run), SENTENCE, "--html", str(blocker / "explorer.html")]
    )
    assert result.exit_code == 1
    assert str(blocker) in result.output and len(result.output.strip().splitlines()) == 1
