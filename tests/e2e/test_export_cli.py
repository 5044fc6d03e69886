"""`aiayn export`: a run written for transformers and CTranslate2, and each model that no
target expresses exactly refused by name, in one line, with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from aiayn import ModelConfig, build_model
from aiayn.cli import app
from aiayn.data.lm import SYMBOLS
from aiayn.data.tokenizer import train_tokenizer
from aiayn.io.export import ExportError, export_hf, hf_target
from infer_helpers import save_run, sentences

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

V = 48


@pytest.fixture(scope="module")
def spm(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spm") / "spm.model"
    train_tokenizer(sentences(300), path, vocab_size=V, user_defined_symbols=list(SYMBOLS))
    return path


def tiny(**overrides) -> ModelConfig:
    settings = dict(d_model=32, n_heads=4, d_ff=64, dropout=0.0, max_len=64)
    return ModelConfig.tiny(V, **{**settings, **overrides})


def gpt(**overrides) -> ModelConfig:
    settings = dict(n_layers=1, d_model=32, n_heads=4, d_ff=64, dropout=0.0, max_len=64)
    return ModelConfig.gpt(V, **{**settings, **overrides})


def bert(**overrides) -> ModelConfig:
    return ModelConfig.bert(V, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_len=64, **overrides)


def run_of(cfg: ModelConfig, root: Path, spm: Path) -> Path:
    torch.manual_seed(0)
    return save_run(root / "run", build_model(cfg), spm)


def export(*args: str):
    return CliRunner().invoke(app, ["export", *args])


def test_a_run_exports_with_its_model_card_and_loads_in_transformers(spm, tmp_path):
    run = run_of(tiny(norm_first=True), tmp_path, spm)
    weights = run / "checkpoints" / "step-00000001" / "model.safetensors"
    results = {"bleu": 12.34, "beam": 8, "alpha": 1.0, "weights": str(weights)}
    (run / "results.json").write_text(json.dumps(results))
    other = {**results, "bleu": 56.78, "weights": str(tmp_path / "other" / "model.safetensors")}
    (tmp_path / "results.json").write_text(json.dumps(other))  # another run's: not taken
    out = tmp_path / "hf"
    result = export(str(run), str(out), "--beam", "5", "--alpha", "1.0")
    assert result.exit_code == 0, result.output
    card = (out / "README.md").read_text(encoding="utf-8")
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: translation\n")
    assert "value: 12.34" in card and "PegasusForConditionalGeneration" in card
    assert "56.78" not in card
    header = yaml.safe_load(card.split("---\n")[1])  # the Hub's metadata: valid YAML
    assert header["pipeline_tag"] == "translation" and "aiayn" in header["tags"]
    assert header["model-index"][0]["results"][0]["metrics"][0]["value"] == 12.34
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"]) == (5, 1.0)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out, local_files_only=True)
    assert type(model).__name__ == "PegasusForConditionalGeneration"
    assert f"{build_model(tiny(norm_first=True)).num_parameters():,} distinct" in card


def test_a_run_exports_to_ctranslate2_in_int8(spm, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    run = run_of(tiny(), tmp_path, spm)
    out = tmp_path / "ct2"
    result = export(str(run), str(out), "--to", "ctranslate2", "--quantization", "int8")
    assert result.exit_code == 0, result.output
    assert (out / "model.bin").is_file() and (out / "README.md").is_file()
    translator = ctranslate2.Translator(str(out), compute_type="int8")
    assert translator.translate_batch([["▁house", "</s>"]], beam_size=2, max_decoding_length=20)[
        0
    ].hypotheses


REFUSED = {
    "alibi": (lambda: tiny(positional="alibi"), "positional=alibi"),
    "t5-relative": (lambda: tiny(positional="relative"), "positional=relative"),
    "learned-seq2seq": (lambda: tiny(positional="learned"), "positional=learned"),
    "rotary-seq2seq": (lambda: tiny(positional="rotary"), "positional=rotary"),
    "alibi-gpt": (lambda: gpt(positional="alibi"), "positional=alibi"),
    "sliding-window": (
        lambda: gpt(attention="sliding_window", attention_window=8),
        "attention=sliding_window",
    ),
    "separate-dk-dv": (lambda: tiny(d_k=16, d_v=4), "d_k=16, d_v=4"),
    "gqa": (lambda: tiny(n_kv_heads=2), "n_kv_heads=2"),
    "attention-only": (lambda: tiny(d_ff=0), "d_ff=0"),
    "pruned": (lambda: tiny(kept_heads=[("encoder.0.self", [0, 1])]), "kept_heads"),
    "untied-source-target": (lambda: tiny(tie_embeddings=False), "tie_embeddings=false"),
    "layer-norm-eps": (lambda: tiny(layer_norm_eps=1e-6), "layer_norm_eps=1e-06"),
    "post-norm-gpt": (lambda: gpt(norm_first=False), "norm_first=false"),
    "gpt-output-bias": (lambda: gpt(output_bias=True), "output_bias=true"),
    "gpt-scaled-embeddings": (lambda: gpt(scale_embeddings=True), "scale_embeddings=true"),
    "pre-norm-bert": (lambda: bert(norm_first=True), "norm_first=true"),
    "prefix-lm": (lambda: gpt(architecture="prefix_lm"), "architecture=prefix_lm"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_no_target_expresses_is_refused_by_name_and_nothing_is_written(spm, tmp_path, case):
    build, setting = REFUSED[case]
    cfg = build()
    with pytest.raises(ExportError, match=setting):
        hf_target(cfg)
    run = run_of(cfg, tmp_path, spm)
    out = tmp_path / "out"
    result = export(str(run), str(out))
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and setting in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no temporary left


def test_a_bert_run_to_ctranslate2_is_refused(spm, tmp_path):
    run = run_of(bert(), tmp_path, spm)
    result = export(str(run), str(tmp_path / "out"), "--to", "ctranslate2")
    assert result.exit_code == 1 and "masked-LM head" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to", "onnx"], "--to 'onnx'"),
        (["--quantization", "int8"], "--to ctranslate2 only"),
        (["--to", "ctranslate2", "--quantization", "int4"], "--quantization 'int4'"),
        (["--beam", "0"], "beam must lie in"),
    ],
)
def test_bad_options_are_refused_in_one_line(spm, tmp_path, args, message):
    run = run_of(tiny(), tmp_path, spm)
    result = export(str(run), str(tmp_path / "out"), *args)
    assert result.exit_code == 1 and message in result.stderr, result.output
    assert result.stderr.count("\n") == 1 and not (tmp_path / "out").exists()


def test_an_existing_out_needs_force_and_the_run_is_never_replaced(spm, tmp_path):
    run = run_of(gpt(), tmp_path, spm)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = export(str(run), str(out))
    assert result.exit_code == 1 and "--force" in result.stderr
    assert (out / "keep.txt").read_text() == "mine"
    assert export(str(run), str(out), "--force").exit_code == 0
    assert not (out / "keep.txt").exists() and (out / "config.json").is_file()
    result = export(str(run), str(run), "--force")  # OUT the run: refused
    assert result.exit_code == 1 and "is the run" in result.stderr
    assert (run / "checkpoints").is_dir()


def test_a_model_object_exports_from_python(spm, tmp_path):
    model = build_model(bert())
    out = export_hf(model, tmp_path / "hf", spm=spm)
    assert not (out / "generation_config.json").exists()  # nothing to generate
    tokenizer = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tokenizer.mask_token == "[MASK]"


def test_a_quickstart_run_exports_with_its_results_and_decodes_as_aiayn(tmp_path):
    """The quickstart's own layout (OUT/run, OUT/results.json), trained six steps, pre-norm
    as its recipe is: Pegasus, the test BLEU in the card, logits and greedy outputs equal."""
    from aiayn.inference.search import DecodeConfig, LengthPenalty, search
    from aiayn.io.checkpoint import load_model, resolve_weights
    from train_helpers import tiny_quickstart

    results, _ = tiny_quickstart(tmp_path / "qs", "--set", "model.norm_first=true")
    run, out = tmp_path / "qs" / "run", tmp_path / "hf"
    result = export(str(run), str(out))
    assert result.exit_code == 0, result.output
    card = (out / "README.md").read_text(encoding="utf-8")
    assert f"value: {results['bleu']}" in card and "norm_first: true" in card
    model = load_model(resolve_weights(run)).eval()
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(out, local_files_only=True).eval()
    assert type(hf).__name__ == "PegasusForConditionalGeneration"
    tokenizer = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    batch = tokenizer(sentences(20, seed=4), return_tensors="pt", padding=True)
    settings = DecodeConfig(
        beam=1, extra_len=None, max_output_len=20, length_penalty=LengthPenalty.HF,
        free_forced_eos=True,
    )  # fmt: skip
    with torch.no_grad():
        generated = hf.generate(**batch, num_beams=1, max_length=21)
        found = search(model, batch["input_ids"], settings)
        target = generated[:, :-1]
        logits = hf(**batch, decoder_input_ids=target).logits
        torch.testing.assert_close(model(batch["input_ids"], target), logits, atol=1e-4, rtol=0)
    eos = model.cfg.eos_id
    for row, hypotheses in zip(generated.tolist(), found, strict=True):
        row = row[1:]
        assert hypotheses[0].tokens == (row[: row.index(eos)] if eos in row else row)
