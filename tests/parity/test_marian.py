"""Marian checkpoints built locally with `transformers` give the same numbers in aiayn."""

import json
import logging
import random
import subprocess
import sys

import pytest
import torch

from aiayn.analysis.viz import translation_attention
from aiayn.apps.translate import Translator
from aiayn.data.tokenizer import Tokenizer, train_tokenizer
from aiayn.inference.search import EarlyStopping, LengthPenalty, search
from aiayn.io.marian import (
    MarianFormatError,
    MarianTokenizer,
    load_marian_model,
    marian_generation,
    marian_model_config,
)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

WORDS_EN = "the a cat dog sat ran on under mat house red big small quickly and".split()  # noqa: SIM905
WORDS_DE = "der die das katze hund sass lief auf unter matte haus rot gross klein und".split()  # noqa: SIM905


def sentences(words, n, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(n)]


def build_marian_directory(path, shape, seed=0):
    """A random-weight MarianMTModel with its own sentencepiece models, saved like opus-mt."""
    source = train_tokenizer(sentences(WORDS_EN, 400, seed), path / "src.model", vocab_size=60)
    target = train_tokenizer(sentences(WORDS_DE, 400, seed + 1), path / "tgt.model", vocab_size=60)
    (path / "source.spm").write_bytes((path / "src.model").read_bytes())
    (path / "target.spm").write_bytes((path / "tgt.model").read_bytes())
    pieces = ["</s>", "<unk>"]
    for tok in (source, target):
        for i in range(4, tok.vocab_size):
            piece = tok.id_to_piece(i)
            if piece not in pieces:
                pieces.append(piece)
    pieces.append("<pad>")
    vocab = {piece: i for i, piece in enumerate(pieces)}
    (path / "vocab.json").write_text(json.dumps(vocab))
    config = transformers.MarianConfig(
        vocab_size=len(vocab),
        decoder_vocab_size=len(vocab),
        pad_token_id=vocab["<pad>"],
        decoder_start_token_id=vocab["<pad>"],
        eos_token_id=0,
        forced_eos_token_id=0,
        max_position_embeddings=128,
        scale_embedding=True,
        dropout=0.0,
        init_std=0.3,  # peaky enough that outputs depend on the source
        **shape,
    )
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():  # random biases and norms, so that no mapping hides behind a zero
        for name, p in model.named_parameters():
            if name.endswith("bias") or "layer_norm" in name:
                p.add_(0.1 * torch.randn_like(p))
        model.final_logits_bias.normal_(std=0.5)
        model.final_logits_bias[0, 0] += 1.0  # eos: some outputs end before max_length
    # opus-mt's generation settings (beam, length, the pad id banned)
    model.generation_config.num_beams = 4
    model.generation_config.max_length = 40
    model.generation_config.bad_words_ids = [[vocab["<pad>"]]]
    model.save_pretrained(path)
    tokenizer = transformers.MarianTokenizer(
        str(path / "source.spm"), str(path / "target.spm"), str(path / "vocab.json")
    )
    tokenizer.save_pretrained(path)
    return model, tokenizer


SHAPES = {
    "swish-2x2": dict(
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function="swish",
    ),
    "gelu-3x1-untied": dict(
        d_model=48,
        encoder_layers=3,
        decoder_layers=1,
        encoder_attention_heads=6,
        decoder_attention_heads=6,
        encoder_ffn_dim=96,
        decoder_ffn_dim=96,
        activation_function="gelu",
        tie_word_embeddings=False,
    ),
    "relu-1x2-separate-embeddings": dict(
        d_model=16,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=40,
        decoder_ffn_dim=40,
        activation_function="relu",
        share_encoder_decoder_embeddings=False,
    ),
}


@pytest.fixture(scope="module", params=list(SHAPES))
def marian(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    model, tokenizer = build_marian_directory(path, SHAPES[request.param])
    return path, model, tokenizer


TEXTS = [
    "the cat sat on the mat",
    "a big red dog ran quickly under the small house and the mat",
    "dog",
]


def test_logits_equal_transformers_with_padding(marian):
    path, reference, hf_tokenizer = marian
    ours = load_marian_model(path)
    batch = hf_tokenizer(TEXTS, return_tensors="pt", padding=True)
    decoder_in = torch.randint(2, ours.cfg.vocab_size - 1, (len(TEXTS), 7))
    decoder_in[:, 0] = ours.cfg.bos_id
    with torch.no_grad():
        expected = reference(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=decoder_in,
        ).logits
        logits = ours(batch["input_ids"], decoder_in)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-4)  # the docs: within 1e-4


def test_tokenization_equals_transformers(marian):
    path, _, hf_tokenizer = marian
    ours = MarianTokenizer(path)
    for text in [*TEXTS, "unseen zebra words", ">>deu<< the cat"]:
        expected = hf_tokenizer(text)["input_ids"]
        assert [*ours.encode(text), ours.eos_id] == expected
    assert ours.vocab_size == len(hf_tokenizer.get_vocab())
    for text in ["the cat sat", "unseen zebra words", "der hund"]:
        ids = [*ours.encode(text), ours.eos_id, ours.pad_id]
        assert ours.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)
    assert isinstance(ours, Tokenizer)
    every_id = list(range(ours.vocab_size))
    assert [ours.id_to_piece(i) for i in every_id] == hf_tokenizer.convert_ids_to_tokens(every_id)
    with pytest.raises(ValueError, match=r"vocab\.json"):
        ours.id_to_piece(ours.vocab_size)


def test_config_maps_every_difference_explicitly(marian):
    path, reference, _ = marian
    cfg = load_marian_model(path).cfg
    hf = reference.config
    assert cfg.positional == "sinusoidal_halves"
    assert cfg.output_bias and cfg.scale_embeddings
    assert cfg.bos_id == cfg.pad_id == hf.decoder_start_token_id
    assert cfg.eos_id == hf.eos_token_id
    embeddings = (
        reference.model.encoder.embed_tokens.weight,
        reference.model.decoder.embed_tokens.weight,
    )
    assert cfg.tie_embeddings == torch.equal(*embeddings)
    assert cfg.tie_output == torch.equal(reference.lm_head.weight, embeddings[1])
    assert cfg.activation.value in hf.activation_function  # swish / gelu / relu


def test_generation_defaults_are_read_from_the_directory(marian):
    path, reference, _ = marian
    generation = marian_generation(path)
    assert generation.beam == 4
    assert generation.max_length == 40
    assert generation.bad_word_ids == (reference.config.pad_token_id,)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("normalize_before", True),
        ("add_bias_logits", True),
        ("normalize_embedding", True),
        ("activation_function", "tanh"),
        ("decoder_ffn_dim", 17),
        ("model_type", "bart"),
        ("decoder_vocab_size", 11),  # a separate target vocabulary
    ],
)
def test_unmapped_config_fields_are_refused_by_name(field, value):
    hf = {
        "model_type": "marian",
        "vocab_size": 10,
        "d_model": 8,
        "encoder_layers": 1,
        "decoder_layers": 1,
        "encoder_attention_heads": 2,
        "decoder_attention_heads": 2,
        "encoder_ffn_dim": 16,
        "decoder_ffn_dim": 16,
        "pad_token_id": 9,
        "eos_token_id": 0,
    }
    marian_model_config(hf)  # the base config converts
    with pytest.raises(MarianFormatError, match=field):
        marian_model_config({**hf, field: value})


def test_missing_and_corrupt_directories_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_marian_model(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(MarianFormatError, match=r"config\.json"):
        load_marian_model(tmp_path)


def test_conversion_does_not_import_transformers(marian):
    path, _, _ = marian
    code = (
        "import sys; from aiayn.io.marian import load_marian_model, MarianTokenizer; "
        f"load_marian_model({str(path)!r}); MarianTokenizer({str(path)!r}); "
        "assert 'transformers' not in sys.modules, 'transformers was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ----- generation: the same tokens as transformers' generate -------------------

GENERATION_TEXTS = [
    *TEXTS,
    "red house",
    "the dog and the cat ran",
    "small",
    "quickly quickly under a big mat",
    "a a mat on cat small ran cat and under on the",  # found by search: see CHANGES_A_WINNER
]
MAX_LENGTH = 20  # transformers' max_length, counting the decoder start token


def hf_outputs(reference, hf_tokenizer, **generate):
    """transformers' generated ids per sentence, without start token, eos and padding."""
    batch = hf_tokenizer(GENERATION_TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = reference.generate(**batch, do_sample=False, max_length=MAX_LENGTH, **generate)
    pad, eos = reference.config.pad_token_id, reference.config.eos_token_id
    rows = []
    for row in out.tolist():
        row = row[1:]
        rows.append([i for i in row[: row.index(eos)] if i != pad] if eos in row else row)
    return batch["input_ids"], rows


def our_outputs(path, src, **overrides):
    translator = Translator.from_marian(path, max_output_len=MAX_LENGTH - 1, **overrides)
    return [hyps[0].tokens for hyps in search(translator.model, src, translator.decode)]


def test_greedy_equals_transformers_token_for_token(marian):
    path, reference, hf_tokenizer = marian
    src, expected = hf_outputs(reference, hf_tokenizer, num_beams=1)
    assert (src == reference.config.pad_token_id).any()  # a padded batch
    assert len({tuple(row) for row in expected}) > 1  # outputs depend on the source
    assert our_outputs(path, src, beam=1) == expected


@pytest.mark.parametrize(
    ("length_penalty", "early_stopping", "renormalize"),
    [
        (1.0, False, False),  # opus-mt's defaults
        (0.6, False, False),
        (2.0, False, False),
        (1.0, True, False),
        (0.6, "never", False),
        (1.0, "never", False),
        (1.0, False, True),
    ],
)
def test_beam_4_equals_transformers_token_for_token(
    marian, length_penalty, early_stopping, renormalize
):
    expected, ours = _beam_4_both(*marian, length_penalty, early_stopping, renormalize)
    assert ours == expected


# Beam-4 settings (length_penalty, early_stopping, renormalize_logits) and a change to
# one of them that changes some winner on GENERATION_TEXTS, in transformers and in
# aiayn alike: an aiayn that ignored the setting would fail here. Found by trying the
# shapes and random sentences; at alpha 0.6 early_stopping changes nothing here.
CHANGES_A_WINNER = [
    ("swish-2x2", (1.0, False, False), (0.6, False, False)),
    ("swish-2x2", (1.0, False, False), (2.0, False, False)),
    ("swish-2x2", (1.0, False, False), (1.0, True, False)),
    ("swish-2x2", (1.0, False, False), (1.0, "never", False)),
    ("swish-2x2", (1.0, True, False), (1.0, "never", False)),
    ("relu-1x2-separate-embeddings", (1.0, False, False), (1.0, False, True)),
]


def _beam_4_both(path, reference, hf_tokenizer, length_penalty, early_stopping, renormalize):
    """transformers' and aiayn's beam-4 outputs on GENERATION_TEXTS with these settings."""
    src, theirs = hf_outputs(
        reference,
        hf_tokenizer,
        num_beams=4,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        renormalize_logits=renormalize,
    )
    stopping = {False: EarlyStopping.HEURISTIC, True: EarlyStopping.EXACT}
    ours = our_outputs(
        path,
        src,
        beam=4,
        alpha=length_penalty,
        early_stopping=stopping.get(early_stopping, EarlyStopping.NEVER),
        renormalize=renormalize,
    )
    return theirs, ours


@pytest.mark.parametrize(
    ("marian", "before", "after"),
    CHANGES_A_WINNER,
    indirect=["marian"],
    ids=[f"{shape}-{a}-{b}" for shape, a, b in CHANGES_A_WINNER],
)
def test_each_beam_setting_changes_a_winner_in_both(marian, before, after):
    theirs_before, ours_before = _beam_4_both(*marian, *before)
    theirs_after, ours_after = _beam_4_both(*marian, *after)
    assert theirs_after != theirs_before  # the change matters on these sentences
    assert ours_before == theirs_before
    assert ours_after == theirs_after


def test_translator_from_marian_uses_the_directory_defaults(marian):
    path, reference, hf_tokenizer = marian
    translator = Translator.from_marian(path)
    config = translator.decode
    assert (config.beam, config.alpha, config.max_output_len) == (4, 1.0, 40 - 1)
    assert config.length_penalty is LengthPenalty.HF and config.extra_len is None
    assert config.banned_ids == (reference.config.pad_token_id,) and config.free_forced_eos
    batch = hf_tokenizer(GENERATION_TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():  # the saved generation config: beam 4, max_length 40
        out = reference.generate(**batch)
    expected = hf_tokenizer.batch_decode(out, skip_special_tokens=True)
    assert translator.translate([*GENERATION_TEXTS, ""]) == [*expected, ""]


@pytest.mark.parametrize("marian", ["gelu-3x1-untied"], indirect=True)  # a subprocess: slow
def test_convert_then_translate_from_the_command_line(marian, tmp_path):
    path, reference, hf_tokenizer = marian
    out = tmp_path / "converted"
    code = (
        "import sys; from typer.testing import CliRunner; from aiayn.cli import app\n"
        f"r = CliRunner().invoke(app, ['convert', 'marian', {str(path)!r}, {str(out)!r}])\n"
        "assert r.exit_code == 0, r.output\n"
        f"r = CliRunner().invoke(app, ['translate', {str(out)!r}], input=sys.stdin.read())\n"
        "assert r.exit_code == 0, r.output\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
        "sys.stdout.write(r.stdout)\n"
    )
    lines = [GENERATION_TEXTS[0], "", *GENERATION_TEXTS[1:]]
    result = subprocess.run(
        [sys.executable, "-c", code],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "marian.json",
        "model.safetensors",
        "source.spm",
        "target.spm",
        "vocab.json",
    ]
    batch = hf_tokenizer(GENERATION_TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = hf_tokenizer.batch_decode(reference.generate(**batch), skip_special_tokens=True)
    assert result.stdout.split("\n")[:-1] == [expected[0], "", *expected[1:]]
    converted = Translator.load(out)  # the same model, tokenization and settings
    assert converted.decode == Translator.from_marian(path).decode
    assert isinstance(converted.tokenizer, MarianTokenizer)


@pytest.mark.parametrize("marian", ["swish-2x2"], indirect=True)
def test_attention_plots_of_a_converted_directory(marian, tmp_path):
    from typer.testing import CliRunner

    from aiayn.cli import app

    path, _, _ = marian
    out = tmp_path / "converted"
    converted = CliRunner().invoke(app, ["convert", "marian", str(path), str(out)])
    assert converted.exit_code == 0, converted.output
    pictures = tmp_path / "attention"
    args = ["attention", str(out), "the cat sat on the mat", "--out", str(pictures)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in pictures.iterdir()) == ["cross.png", "decoder.png", "encoder.png"]
    _, src_pieces, tgt_pieces = translation_attention(Translator.load(out), "the cat sat")
    assert src_pieces[-1] == "</s>" and tgt_pieces[0] == "<pad>"  # Marian starts from pad


def test_convert_refuses_a_bad_directory_without_writing(tmp_path):
    from typer.testing import CliRunner

    from aiayn.cli import app

    out, empty = tmp_path / "out", tmp_path / "empty"  # OUT beside the source, not inside
    empty.mkdir()
    result = CliRunner().invoke(app, ["convert", "marian", str(empty), str(out)])
    assert result.exit_code == 1 and "config.json" in result.output
    assert not out.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("no_repeat_ngram_size", 3),
        ("do_sample", True),
        ("forced_eos_token_id", 5),
        ("min_length", 5),
        ("min_new_tokens", 2),
        ("repetition_penalty", 1.2),
        ("encoder_repetition_penalty", 0.9),
        ("num_beam_groups", 2),
        ("diversity_penalty", 0.5),
        ("forced_bos_token_id", 3),
        ("length_penalty", -0.5),
    ],
)
@pytest.mark.parametrize("marian", ["swish-2x2"], indirect=True)
def test_unsupported_generation_settings_are_refused_by_name(marian, tmp_path, field, value):
    path, _, _ = marian
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_bytes((path / "config.json").read_bytes())
    settings = json.loads((path / "generation_config.json").read_text())
    (directory / "generation_config.json").write_text(json.dumps({**settings, field: value}))
    with pytest.raises(MarianFormatError, match=field):
        marian_generation(directory)


@pytest.mark.parametrize("marian", ["swish-2x2"], indirect=True)
def test_multi_token_bad_words_are_ignored_with_a_warning(marian, tmp_path, caplog):
    path, reference, _ = marian
    pad = reference.config.pad_token_id
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_bytes((path / "config.json").read_bytes())
    settings = json.loads((path / "generation_config.json").read_text())
    bad_words = [[pad], [5], [7, 8]]
    (directory / "generation_config.json").write_text(
        json.dumps({**settings, "bad_words_ids": bad_words})
    )
    with caplog.at_level(logging.WARNING, logger="aiayn.io.marian"):
        generation = marian_generation(directory)
    assert generation.bad_word_ids == tuple(sorted({pad, 5}))  # single tokens banned
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("ignoring a multi-token bad word [7, 8]" in w for w in warnings), warnings


@pytest.mark.parametrize("marian", ["gelu-3x1-untied"], indirect=True)
def test_without_generation_settings_the_length_is_transformers_default(marian, tmp_path):
    """No max_length anywhere: transformers 5 generates up to 20 tokens after the start."""
    path, _, hf_tokenizer = marian
    bare = tmp_path / "bare"
    bare.mkdir()
    for file in path.iterdir():
        if file.name != "generation_config.json":
            (bare / file.name).write_bytes(file.read_bytes())
    reference = transformers.MarianMTModel.from_pretrained(bare).eval()
    batch = hf_tokenizer(GENERATION_TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = reference.generate(**batch)
    assert out.shape[1] == 1 + 20  # some output reached the limit: the test can tell
    expected = hf_tokenizer.batch_decode(out, skip_special_tokens=True)
    assert Translator.from_marian(bare).translate(GENERATION_TEXTS) == expected


@pytest.mark.parametrize("marian", ["gelu-3x1-untied"], indirect=True)
def test_evaluate_searches_a_converted_model_with_its_own_settings(marian, tmp_path):
    """`aiayn evaluate` on a converted directory: the model's beam and length penalty."""
    from typer.testing import CliRunner

    from aiayn.cli import app

    path, reference, hf_tokenizer = marian
    out = tmp_path / "converted"
    assert CliRunner().invoke(app, ["convert", "marian", str(path), str(out)]).exit_code == 0
    sources = tmp_path / "src.txt"
    sources.write_text("".join(text + "\n" for text in GENERATION_TEXTS))
    args = ["evaluate", str(out), "--src", str(sources), "--ref", str(sources)]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    batch = hf_tokenizer(GENERATION_TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():  # the saved generation config: beam 4, length penalty 1.0
        expected = hf_tokenizer.batch_decode(reference.generate(**batch), skip_special_tokens=True)
    assert (tmp_path / "eval" / "hypotheses.txt").read_text().splitlines() == expected


@pytest.mark.parametrize("marian", ["swish-2x2"], indirect=True)
def test_convert_int8_carries_the_int8_weights_freeze_would_make(marian, tmp_path, monkeypatch):
    """`convert marian --dtype int8` stores the int8 products' weights as int8 with their
    scales; the directory then translates in int8 by default, with the very int8 values
    `freeze(model, torch.int8)` makes from the float weights."""
    from typer.testing import CliRunner

    import aiayn.inference.frozen
    import aiayn.io.int8_weights
    from aiayn.cli import app
    from aiayn.inference.frozen import Int8Linear
    from aiayn.io.checkpoint import int8_weights
    from aiayn.io.int8_weights import int8_weight_names

    monkeypatch.setattr(
        aiayn.io.int8_weights, "INT8_MIN_ELEMENTS", 0
    )  # quantize the small test model
    path, _, _ = marian
    runner = CliRunner()
    for dtype, out in (("float32", tmp_path / "float"), ("int8", tmp_path / "int8")):
        result = runner.invoke(app, ["convert", "marian", str(path), str(out), "--dtype", dtype])
        assert result.exit_code == 0, result.output
    names = int8_weights(tmp_path / "int8" / "model.safetensors")
    assert names == int8_weight_names(load_marian_model(path)) and names
    assert int8_weights(tmp_path / "float" / "model.safetensors") == []
    assert json.loads((tmp_path / "int8" / "marian.json").read_text())["dtype"] == "int8"
    from safetensors import safe_open

    with safe_open(str(tmp_path / "int8" / "model.safetensors"), "pt") as f:
        assert all(f.get_tensor(name).dtype == torch.int8 for name in names)
    sizes = {d: (tmp_path / d / "model.safetensors").stat().st_size for d in ("float", "int8")}
    assert sizes["int8"] < sizes["float"]

    stored = Translator.load(tmp_path / "int8")  # int8 by default
    made = Translator.from_marian(path, dtype=torch.int8)
    assert stored.dtype == torch.int8
    stored_products = [m for m in stored.engine.modules() if isinstance(m, Int8Linear)]
    made_products = [m for m in made.engine.modules() if isinstance(m, Int8Linear)]
    assert len(stored_products) == len(made_products) > 0
    for a, b in zip(stored_products, made_products, strict=True):
        torch.testing.assert_close(a.dequantized()[0], b.dequantized()[0], rtol=1e-6, atol=0)
    assert stored.translate(GENERATION_TEXTS) == made.translate(GENERATION_TEXTS)
    as_float = Translator.load(tmp_path / "int8", dtype=torch.float32)  # asked otherwise
    assert not any(isinstance(m, Int8Linear) for m in as_float.engine.modules())

    bad = runner.invoke(app, ["convert", "marian", str(path), str(tmp_path / "x"), "--dtype", "q4"])
    assert bad.exit_code == 1 and "use float32 or int8" in bad.output
    assert not (tmp_path / "x").exists()
