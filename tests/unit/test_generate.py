"""Generator, `aiayn generate`, and the decoder-only shape of `freeze`.

References: the search's own greedy_search and sample (on the literal model, not
the frozen one the Generator runs), the tokenizer's decode of the whole sequence,
and transformers' GPT-2 `generate` on the same random weights.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from aiayn import ModelConfig
from aiayn.apps.generate import Generator, PromptError
from aiayn.apps.model_use import WrongShapeError
from aiayn.cli import app
from aiayn.data.tokenizer import train_tokenizer
from aiayn.inference.frozen import FrozenDecoderOnly, freeze
from aiayn.inference.search import greedy_pick, greedy_search, sample
from aiayn.io.checkpoint import TOKENIZER_FILE, save_model
from aiayn.models.decoder_only import DecoderOnly
from infer_helpers import make_run, sentences

MAX_LEN = 24


def lm_config(vocab_size: int, **overrides) -> ModelConfig:
    return ModelConfig.gpt(
        vocab_size=vocab_size,
        n_layers=2,
        d_model=32,
        n_heads=4,
        d_ff=64,
        max_len=MAX_LEN,
        dropout=0.0,
        **overrides,
    )


def random_lm(vocab_size: int, seed: int = 0) -> DecoderOnly:
    """A random GPT with spread-out logits (std 0.02 would make every token as likely)."""
    torch.manual_seed(seed)
    model = DecoderOnly(lm_config(vocab_size))
    with torch.no_grad():
        model.decoder.embedding.tokens.weight.normal_(std=0.2)
    return model.eval()


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RUN/spm.model and RUN/checkpoints/step-00000001/model.safetensors of a random GPT."""
    root = tmp_path_factory.mktemp("lm")
    tokenizer = train_tokenizer(sentences(300), root / TOKENIZER_FILE, vocab_size=48)
    run = root / "run"
    save_model(
        random_lm(tokenizer.vocab_size), run / "checkpoints" / "step-00000001" / "model.safetensors"
    )
    shutil.copy(root / TOKENIZER_FILE, run / TOKENIZER_FILE)
    return run


@pytest.fixture(scope="module")
def generator(lm_run: Path) -> Generator:
    return Generator.load(lm_run)


def test_greedy_generation_is_the_greedy_search_of_the_literal_model(generator: Generator):
    prompt_ids = generator.encode_prompt("house garden river")
    tokens = list(generator.generate_ids(prompt_ids, 12, greedy_pick))
    prompt = torch.tensor([prompt_ids])
    # max_output_len counts the final eos: 12 free tokens, then only eos.
    (best,), *_ = greedy_search(generator.model, prompt, None, max_output_len=13)
    assert tokens == best.tokens and len(tokens) > 0
    text = generator.generate("house garden river", max_new_tokens=12, greedy=True)
    tokenizer = generator.tokenizer
    full = tokenizer.decode(prompt_ids + tokens)
    assert full == tokenizer.decode(prompt_ids) + text


def test_sampling_draws_what_the_searchs_sampler_draws_with_the_same_seed(generator: Generator):
    prompt_ids = generator.encode_prompt("stone bridge")
    options = {"temperature": 0.8, "top_k": 20, "top_p": 0.9}
    pick = generator.picker(**options, seed=7)
    tokens = list(generator.generate_ids(prompt_ids, 15, pick))
    (drawn,), *_ = sample(
        generator.model, torch.tensor([prompt_ids]), None, **options, seed=7, max_output_len=16
    )
    assert tokens == drawn.tokens
    again = generator.generate("stone bridge", 15, **options, seed=7)
    assert again == generator.generate("stone bridge", 15, **options, seed=7)
    others = {generator.generate("stone bridge", 15, seed=seed) for seed in range(6)}
    assert len(others) > 1  # the seed matters


def test_generation_stops_where_the_sequence_fills_max_len(
    generator: Generator, caplog: pytest.LogCaptureFixture
):
    prompt_ids = generator.encode_prompt("house")[:1] * (MAX_LEN - 3)
    with caplog.at_level("WARNING", logger="aiayn.apps.generate"):
        tokens = list(generator.generate_ids(prompt_ids, 50, greedy_pick))
    # The last token is never fed back: a prompt of T tokens takes max_len - T + 1 more.
    assert len(prompt_ids) + len(tokens) <= MAX_LEN + 1
    assert "generating at most" in caplog.text


def test_bad_prompts_are_refused_by_name(generator: Generator):
    with pytest.raises(PromptError, match="empty"):
        generator.stream("   ")
    with pytest.raises(PromptError, match=f"max_len={MAX_LEN}"):
        generator.stream("house garden " * MAX_LEN)
    with pytest.raises(ValueError, match="temperature"):
        generator.stream("house", temperature=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generator.stream("house", max_new_tokens=0)


def test_a_translation_run_is_refused_by_the_generator(tmp_path: Path):
    with pytest.raises(WrongShapeError, match=r"encoder_decoder.*aiayn translate"):
        Generator.load(make_run(tmp_path))


# ----- freeze: the decoder-only shape --------------------------------------------------


def test_frozen_decoder_only_gives_the_models_logits_and_search(generator: Generator):
    model = generator.model
    frozen = freeze(model)
    assert isinstance(frozen, FrozenDecoderOnly)
    trained = {p.data_ptr() for p in model.parameters()}
    held = [t for t in (*frozen.parameters(), *frozen.buffers()) if t.data_ptr() in trained]
    assert held == [] and not any(p.requires_grad for p in frozen.parameters())
    ids = torch.randint(4, model.cfg.vocab_size, (3, 9))
    with torch.no_grad():
        torch.testing.assert_close(frozen(ids), model(ids), rtol=0, atol=1e-5)
        found = greedy_search(frozen, ids, None, max_output_len=10)
        expected = greedy_search(model, ids, None, max_output_len=10)
    assert [h[0].tokens for h in found] == [h[0].tokens for h in expected]


def test_frozen_decoder_only_in_bfloat16_follows_the_float32_model(generator: Generator):
    model = generator.model
    ids = torch.randint(4, model.cfg.vocab_size, (2, 6))
    with torch.no_grad():
        low = freeze(model, dtype=torch.bfloat16)(ids)
        torch.testing.assert_close(low.float(), model(ids), rtol=0, atol=0.15)


# ----- streaming ---------------------------------------------------------------------


def test_streamed_pieces_join_to_the_generated_text(generator: Generator):
    pieces = list(generator.stream("river tree", 12, greedy=True))
    assert len(pieces) > 1
    assert "".join(pieces) == generator.generate("river tree", 12, greedy=True)


# ----- the command line --------------------------------------------------------------


def test_aiayn_generate_prints_the_prompt_and_its_continuation(lm_run: Path, generator: Generator):
    result = CliRunner().invoke(
        app, ["generate", str(lm_run), "house garden", "--greedy", "--max-tokens", "8"]
    )
    assert result.exit_code == 0, result.output
    expected = generator.generate("house garden", 8, greedy=True)
    assert result.stdout == "house garden" + expected + "\n"
    sampled = ["generate", str(lm_run), "house", "--seed", "3", "--top-p", "0.8"]
    first, second = CliRunner().invoke(app, sampled), CliRunner().invoke(app, sampled)
    assert first.exit_code == 0 and first.stdout == second.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["   "], "the prompt is empty"),
        (["house " * (MAX_LEN + 2)], f"more than the model's max_len={MAX_LEN}"),
        (["house", "--temperature", "0"], "temperature must be a positive"),
        (["house", "--top-p", "1.5"], "top_p must lie in"),
    ],
)
def test_aiayn_generate_refuses_bad_input_in_one_line(lm_run: Path, args, message):
    result = CliRunner().invoke(app, ["generate", str(lm_run), *args])
    assert result.exit_code == 1
    assert result.stdout == ""  # nothing half-written
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert "Traceback" not in result.output


def test_a_prompt_that_fills_max_len_is_refused_by_the_static_step_before_any_output(
    lm_run: Path, generator: Generator
):
    prompt = "house " * (MAX_LEN // 4)
    assert len(generator.encode_prompt(prompt)) == MAX_LEN  # 4 pieces a word
    default = CliRunner().invoke(app, ["generate", str(lm_run), prompt, "--greedy"])
    assert default.exit_code == 0, default.output  # one token fits after it
    result = CliRunner().invoke(app, ["generate", str(lm_run), prompt, "--greedy", "--static"])
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("aiayn: error: ") and result.stderr.count("\n") == 1
    assert f"max_len - 1 = {MAX_LEN - 1}" in result.stderr
    assert "Traceback" not in result.output


def test_each_command_refuses_a_checkpoint_of_another_shape(lm_run: Path, tmp_path: Path):
    translation_run = make_run(tmp_path)
    generate = CliRunner().invoke(app, ["generate", str(translation_run), "house"])
    translate = CliRunner().invoke(app, ["translate", str(lm_run)], input="house\n")
    for result, found, wanted in (
        (generate, "encoder_decoder", "decoder_only"),
        (translate, "decoder_only", "encoder_decoder"),
    ):
        assert result.exit_code == 1, result.output
        line = result.stderr.strip()
        assert "\n" not in line and f"architecture {found}" in line and wanted in line


def test_aiayn_attention_draws_a_decoder_only_run(lm_run: Path, tmp_path: Path):
    out = tmp_path / "maps"
    result = CliRunner().invoke(
        app, ["attention", str(lm_run), "house garden river", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out / "decoder.png")
    assert (out / "decoder.png").read_bytes().startswith(b"\x89PNG")
    html = CliRunner().invoke(
        app, ["attention", str(lm_run), "house", "--html", str(tmp_path / "x.html")]
    )
    assert html.exit_code == 1 and "--html" in html.stderr
    assert not (tmp_path / "x.html").exists()


# ----- a GPT-2 directory as transformers saves it ------------------------------------

TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "And God said, Let there be light: and there was light.",
]


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random GPT2LMHeadModel and a byte-level BPE tokenizer trained here, saved as
    `save_pretrained` does; <|endoftext|> is the last id, as in GPT-2."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    directory = tmp_path_factory.mktemp("gpt2")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXTS, vocab_size=300, min_frequency=1, show_progress=False)
    end = "<|endoftext|>"
    tokenizer = GPT2TokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token=end, eos_token=end, unk_token=end
    )
    tokenizer.add_special_tokens({"eos_token": end})
    tokenizer.save_pretrained(directory)
    eos = tokenizer.eos_token_id
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=eos,
        eos_token_id=eos,
        initializer_range=0.2,  # spread-out logits: greedy choices are not near ties
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        # Token 0 is aiayn's pad and start token for GPT-2 (it has none), which the
        # search never generates; a zero embedding keeps transformers from choosing it.
        model.transformer.wte.weight[0].zero_()
    model.save_pretrained(directory)
    return directory


def transformers_greedy(directory: Path, prompt: str, new_tokens: int) -> tuple[list[int], str]:
    """transformers' own greedy generation: the new ids and the decoded whole sequence."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = GPT2LMHeadModel.from_pretrained(directory).eval()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=new_tokens,
        pad_token_id=tokenizer.eos_token_id,
    )
    new = [t for t in out[0, ids.size(1) :].tolist() if t != tokenizer.eos_token_id]
    return new, tokenizer.decode(out[0], skip_special_tokens=True)


@pytest.mark.parametrize("prompt", ["In the beginning", "And God said, Let"])
def test_generator_from_hf_writes_what_transformers_generates(gpt2_dir: Path, prompt: str):
    expected_ids, expected_text = transformers_greedy(gpt2_dir, prompt, 20)
    generator = Generator.from_hf(gpt2_dir)
    prompt_ids = generator.encode_prompt(prompt)
    assert list(generator.generate_ids(prompt_ids, 20, greedy_pick)) == expected_ids
    continuation = generator.generate(prompt, max_new_tokens=20, greedy=True)
    assert generator.tokenizer.decode(prompt_ids) + continuation == expected_text


def test_converted_gpt2_generates_the_same_from_the_command_line(gpt2_dir: Path, tmp_path: Path):
    out = tmp_path / "converted"
    converted = CliRunner().invoke(app, ["convert", "gpt2", str(gpt2_dir), str(out)])
    assert converted.exit_code == 0, converted.output
    _, expected_text = transformers_greedy(gpt2_dir, "In the beginning", 12)
    for source in (out, gpt2_dir):  # the aiayn directory, and the transformers one itself
        result = CliRunner().invoke(
            app, ["generate", str(source), "In the beginning", "--greedy", "--max-tokens", "12"]
        )
        assert result.exit_code == 0, result.output
        assert result.stdout == expected_text + "\n"


def test_streaming_holds_back_a_character_cut_between_byte_tokens(gpt2_dir: Path):
    generator = Generator.from_hf(gpt2_dir)
    text = " ¿Dónde está? «Aquí» — 漢字"  # bytes the tokenizer never merged: one id each
    ids = generator.tokenizer.encode(text)
    assert len(ids) > len(text)  # some characters are several ids
    prompt_ids = generator.encode_prompt("In the beginning")
    pieces = list(generator._pieces(prompt_ids, iter(ids)))
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)
    assert len(pieces) > 5  # given out as it grows, not at the end


def test_a_gpt2_field_the_conversion_does_not_cover_is_refused_in_one_line(
    gpt2_dir: Path, tmp_path: Path
):
    import json

    changed = tmp_path / "changed"
    shutil.copytree(gpt2_dir, changed)
    config = json.loads((changed / "config.json").read_text())
    config["scale_attn_by_inverse_layer_idx"] = True
    (changed / "config.json").write_text(json.dumps(config))
    for args in (
        ["convert", "gpt2", str(changed), str(tmp_path / "out")],
        ["generate", str(changed), "In"],
    ):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1
        assert result.stderr.count("\n") == 1 and "scale_attn_by_inverse_layer_idx" in result.stderr
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_translator_refuses_a_decoder_only_model_by_name():
    from aiayn import build_model
    from aiayn.apps.model_use import WrongShapeError
    from aiayn.apps.translate import Translator

    cfg = ModelConfig.tiny(vocab_size=32, architecture="decoder_only")
    with pytest.raises(WrongShapeError, match=r"decoder_only.*aiayn generate"):
        Translator(build_model(cfg), tokenizer=None)  # refused before the tokenizer is read
