"""The explorer's analysis views: heads.json beside each head, the logit lens of the translation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from aiayn.analysis.heads import HEADS_FILE, read_head_records
from aiayn.analysis.logit_lens import logit_lens
from aiayn.analysis.viz import AttentionKind
from aiayn.apps.explorer import attention_payload
from aiayn.apps.translate import Translator
from aiayn.cli import app
from aiayn.inference.search import DecodeConfig, search
from infer_helpers import make_run

SENTENCE = "house by the river."
KINDS = list(AttentionKind)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("explorer-views"), max_len=16)


@pytest.fixture(scope="module")
def translator(run: Path) -> Translator:
    return Translator.load(run)


def _record(kind: AttentionKind, layer: int, head: int) -> dict:
    """A heads.json record whose numbers say which head it is."""
    tag = 100 * KINDS.index(kind) + 10 * layer + head
    return {"kind": kind.value, "layer": layer, "head": head, "entropy": tag + 0.5,
            "bos": None, "ablation": -tag, "gradient": tag / 1000}  # fmt: skip


def _heads_json(path: Path, translator: Translator, drop: tuple = ()) -> Path:
    cfg = translator.model.cfg
    layers = {AttentionKind.ENCODER: cfg.n_encoder_layers}
    layers[AttentionKind.DECODER] = layers[AttentionKind.CROSS] = cfg.n_decoder_layers
    records = [
        _record(kind, layer, head)
        for kind in KINDS
        for layer in range(layers[kind])
        for head in range(cfg.n_heads)
        if (kind, layer, head) not in drop
    ]
    records.reverse()  # the payload finds them by (kind, layer, head), not by order
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run": "x", "sentences": 3, "heads": records}), encoding="utf-8")
    return path


def _embedded(page: str) -> dict:
    found = re.search(r'<script type="application/json" id="aiayn-data">(.*?)</script>', page, re.S)
    assert found, "no embedded payload"
    return json.loads(found.group(1))


# ----- heads.json -----------------------------------------------------------------------


def test_heads_json_records_attach_by_kind_layer_head(
    tmp_path: Path, translator: Translator
) -> None:
    missing = (AttentionKind.CROSS, 1, 0)
    corpus = read_head_records(_heads_json(tmp_path / "heads.json", translator, (missing,)))
    payload = attention_payload(translator, SENTENCE, DecodeConfig(beam=1), corpus=corpus)
    seen = 0
    for kind in KINDS:
        table = payload["attention"][kind.value]["corpus"]
        assert len(table) == len(payload["attention"][kind.value]["metrics"])
        for layer, heads in enumerate(table):
            for head, record in enumerate(heads):
                if (kind, layer, head) == missing:
                    assert record is None
                    continue
                expected = _record(kind, layer, head)
                assert record == {
                    k: expected[k] for k in ("entropy", "bos", "ablation", "gradient")
                }
                seen += 1
    assert seen == len(corpus) and seen > 0


def test_without_heads_json_nothing_changes(translator: Translator) -> None:
    payload = attention_payload(translator, SENTENCE, DecodeConfig(beam=1))
    assert all("corpus" not in payload["attention"][kind.value] for kind in KINDS)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not readable JSON"),
        ('{"sentences": 3}', 'has no "heads" list'),
        ('{"heads": [{"kind": "encoder", "layer": 0, "head": 0}, {"kind": "self"}]}', "record 2"),
        ('{"heads": [{"kind": "cross", "layer": 0, "head": -1}]}', "record 1"),
        ('{"heads": [{"kind": "cross", "layer": 0, "head": 1}, '
         '{"kind": "cross", "layer": 0, "head": 1}]}', "repeats cross layer 0 head 1"),
    ],
)  # fmt: skip
def test_bad_heads_json_is_named(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "heads.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        read_head_records(path)
    assert str(path) in str(err.value)


# ----- the logit lens ---------------------------------------------------------------------


def test_lens_in_payload_is_logit_lens_of_the_translation(translator: Translator) -> None:
    model, tokenizer, cfg = translator.model, translator.tokenizer, translator.model.cfg
    src = translator.to_batch(translator.encode([SENTENCE]))  # (1, S)
    (best, *_), *_ = search(translator.engine, src, DecodeConfig(beam=2))
    payload = attention_payload(translator, SENTENCE, DecodeConfig(beam=2), best)
    lens = payload["lens"]
    tgt_in = torch.tensor([[cfg.bos_id, *best.tokens]])
    tgt_out = torch.tensor([[*best.tokens, cfg.eos_id]])
    reference = logit_lens(model, (src, tgt_in), top_k=3, target=tgt_out)
    n_layers = cfg.n_decoder_layers
    assert lens["layers"] == ["embed", *(f"layer {i}" for i in range(n_layers))]
    assert lens["inputs"] == payload["target_tokens"]  # the attention maps' rows
    assert lens["targets"] == [tokenizer.id_to_piece(i) for i in tgt_out[0].tolist()]
    ids = reference.top_ids[:, 0, :, 0].tolist()
    assert lens["top"] == [[tokenizer.id_to_piece(i) for i in row] for row in ids]
    assert torch.tensor(lens["prob"]).numpy() == pytest.approx(
        reference.top_probs[:, 0, :, 0].numpy(), abs=1e-3
    )
    assert reference.target_probs is not None
    assert torch.tensor(lens["target_prob"]).numpy() == pytest.approx(
        reference.target_probs[:, 0].numpy(), abs=1e-3
    )
    # the top row is the model's own distribution: plain forward, softmax, max
    with torch.no_grad():
        own = model(src, tgt_in)[0].float().softmax(-1)  # (T, V)
    assert lens["prob"][-1] == pytest.approx(own.max(-1).values.tolist(), abs=1e-3)
    assert lens["target_prob"][-1] == pytest.approx(
        own.gather(-1, tgt_out[0][:, None])[:, 0].tolist(), abs=1e-3
    )


# ----- the CLI's --html: heads.json read from the run -------------------------------------


def test_cli_html_carries_the_runs_heads_json(
    tmp_path: Path, run: Path, translator: Translator
) -> None:
    heads_json = _heads_json(run / HEADS_FILE, translator)
    out = tmp_path / "explorer.html"
    try:
        result = CliRunner().invoke(app, ["attention", str(run), SENTENCE, "--html", str(out)])
    finally:
        heads_json.unlink()
    assert result.exit_code == 0, result.output
    payload = _embedded(out.read_text(encoding="utf-8"))
    assert payload["attention"]["cross"]["corpus"][1][2]["ablation"] == -(200 + 10 + 2)
    assert payload["lens"]["layers"][0] == "embed"


def test_cli_html_bad_heads_json_is_one_line(tmp_path: Path, run: Path) -> None:
    heads_json = run / HEADS_FILE
    heads_json.parent.mkdir(parents=True, exist_ok=True)
    heads_json.write_text('{"heads": [{"kind": "sideways", "layer": 0, "head": 0}]}')
    out = tmp_path / "explorer.html"
    try:
        result = CliRunner().invoke(app, ["attention", str(run), SENTENCE, "--html", str(out)])
    finally:
        heads_json.unlink()
    assert result.exit_code == 1
    assert str(heads_json) in result.output and "record 1" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()


# ----- aiayn serve: heads.json read beside the run --------------------------------------


def test_served_payload_carries_the_runs_heads_json(
    tmp_path: Path, translator: Translator, caplog: pytest.LogCaptureFixture
) -> None:
    from aiayn.apps.serve.batcher import Sentence
    from aiayn.apps.serve.engine import Options, TranslationEngine, corpus_heads

    run = tmp_path / "run"
    assert corpus_heads(run) is None  # no file: nothing changes
    _heads_json(run / HEADS_FILE, translator)
    engine = TranslationEngine(translator, threads=1, corpus=corpus_heads(run))
    options = Options(DecodeConfig(beam=1), attention=True)
    (result,) = engine.run_batch(options, [Sentence(SENTENCE, translator.encode([SENTENCE])[0])])
    assert result["attention"]["attention"]["decoder"]["corpus"][0][1]["ablation"] == -(100 + 1)
    (run / HEADS_FILE).write_text("{broken", encoding="utf-8")
    with caplog.at_level("WARNING"):
        assert corpus_heads(run) is None  # the server starts without the corpus numbers
    assert str(run / HEADS_FILE) in caplog.text
