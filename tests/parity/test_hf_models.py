"""GPT-2 and BERT checkpoints of `transformers`, run by aiayn's blocks, against `transformers`.

Every model here is random, built and saved by `transformers` in the test (nothing is
downloaded). Its weights are perturbed away from the initialisation (LayerNorms
included), so that every tensor the conversion maps has to land in the right place.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from aiayn.inference.decoding import new_cache, start
from aiayn.inference.search import greedy_search
from aiayn.io.checkpoint import load_model
from aiayn.io.hf_models import (
    CONVERTED_FILE,
    HFFormatError,
    convert_bert,
    convert_gpt2,
    load_bert,
    load_gpt2,
)
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_only import EncoderOnly

transformers = pytest.importorskip("transformers")

GPT2_VOCAB, GPT2_EOS = 50, 49
BERT_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(55)]
MASK = BERT_TOKENS.index("[MASK]")


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    return model.eval()


def gpt2_directory(path: Path, **overrides) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    settings = dict(
        vocab_size=GPT2_VOCAB,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=4,
        initializer_range=0.2,
        bos_token_id=GPT2_EOS,
        eos_token_id=GPT2_EOS,
    )
    config = transformers.GPT2Config(**{**settings, **overrides})
    hf = perturbed(transformers.GPT2LMHeadModel(config))
    hf.save_pretrained(path)
    vocab = {f"t{i}": i for i in range(GPT2_VOCAB - 1)} | {"<|endoftext|>": GPT2_EOS}
    (path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (path / "merges.txt").write_text("#version: 0.2\nt 1\n", encoding="utf-8")
    return path, hf


def bert_directory(path: Path, head: bool = True, **overrides) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    settings = dict(
        vocab_size=len(BERT_TOKENS),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        initializer_range=0.2,
    )
    config = transformers.BertConfig(**{**settings, **overrides})
    model_class = transformers.BertForMaskedLM if head else transformers.BertModel
    hf = perturbed(model_class(config))
    hf.save_pretrained(path)
    (path / "vocab.txt").write_text("\n".join(BERT_TOKENS) + "\n", encoding="utf-8")
    return path, hf


def assert_refused_by_name(convert, source: Path, tmp_path: Path, field: str, value) -> None:
    """`convert` refuses a copy of `source` whose config.json sets `field` to `value`,
    naming the field, and writes nothing."""
    directory = tmp_path / "changed"
    shutil.copytree(source, directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, field: value}))
    out = tmp_path / "out"
    with pytest.raises(HFFormatError, match=field):
        convert(directory, out)
    assert not out.exists()  # nothing half-written


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return gpt2_directory(tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return bert_directory(tmp_path_factory.mktemp("bert"))


# ----- GPT-2 ---------------------------------------------------------------------------


def test_gpt2_logits_equal_transformers(gpt2):
    directory, hf = gpt2
    model, cfg = load_gpt2(directory)
    assert isinstance(model, DecoderOnly) and cfg.tie_output and cfg.norm_first
    ids = torch.randint(0, GPT2_VOCAB, (3, 20))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-4, rtol=0)
    assert model.num_parameters() == hf.num_parameters()


def test_gpt2_with_an_untied_output_matrix(tmp_path):
    directory, hf = gpt2_directory(tmp_path, tie_word_embeddings=False)
    model, cfg = load_gpt2(directory)
    assert not cfg.tie_output
    ids = torch.randint(0, GPT2_VOCAB, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-4, rtol=0)


def test_gpt2_cached_steps_equal_transformers_logits(gpt2):
    directory, hf = gpt2
    model, _ = load_gpt2(directory)
    ids = torch.randint(0, GPT2_VOCAB, (2, 12))
    with torch.no_grad():
        cache = new_cache(model)
        steps = [model(ids[:, :5], cache)] + [model(ids[:, t, None], cache) for t in range(5, 12)]
        torch.testing.assert_close(torch.cat(steps, 1), hf(ids).logits, atol=1e-4, rtol=0)


def test_gpt2_greedy_decoding_is_transformers_generate_token_for_token(gpt2):
    directory, hf = gpt2
    model, _ = load_gpt2(directory)
    prompt = torch.randint(0, GPT2_VOCAB, (3, 6))
    new_tokens = 20
    with torch.no_grad():
        expected = hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),  # or it masks prompt tokens equal to pad
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[:, prompt.size(1) :]
        # The search protocol by hand: the prompt fills the cache, one token per step.
        decoding = start(model, prompt)
        last, found = prompt[:, -1], []
        for _ in range(new_tokens):
            last = decoding.step(last).argmax(dim=-1)
            found.append(last)
    assert torch.equal(torch.stack(found, dim=1), expected)
    assert len(set(expected.flatten().tolist())) > 5  # a varied continuation


def test_gpt2_greedy_search_stops_at_eos_as_transformers_does(gpt2):
    directory, hf = gpt2
    model, cfg = load_gpt2(directory)
    assert cfg.eos_id == GPT2_EOS and cfg.pad_id == cfg.bos_id == 0  # GPT-2 names no pad
    prompt = torch.randint(1, GPT2_VOCAB, (6, 4))
    new_tokens = 25
    with torch.no_grad():
        generated = hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=GPT2_EOS,
            # aiayn's search never generates pad and bos (token 0 here, as GPT-2 names no
            # pad): transformers is told the same.
            suppress_tokens=[0],
        )[:, prompt.size(1) :].tolist()
        found = greedy_search(model, prompt, extra_len=None, max_output_len=new_tokens + 1)
    expected = [row[: row.index(GPT2_EOS)] if GPT2_EOS in row else row for row in generated]
    assert any(len(row) < new_tokens for row in expected)  # some stopped at eos
    assert any(len(row) == new_tokens for row in expected)  # some ran to the limit
    assert [h[0].tokens for h in found] == expected


def test_gpt2_base_model_names_and_mask_buffers_load(gpt2, tmp_path):
    """The hub's own gpt2 files: GPT2Model's names (no "transformer."), causal-mask buffers."""
    directory, hf = gpt2
    bare = tmp_path / "bare"
    shutil.copytree(directory, bare)
    tensors = load_file(bare / "model.safetensors")
    tensors = {name.removeprefix("transformer."): t for name, t in tensors.items()}
    for i in range(2):
        tensors[f"h.{i}.attn.bias"] = torch.tril(torch.ones(32, 32)).view(1, 1, 32, 32)
        tensors[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(tensors, bare / "model.safetensors")
    model, _ = load_gpt2(bare)
    ids = torch.randint(0, GPT2_VOCAB, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-4, rtol=0)


def test_gpt2_attention_maps_equal_transformers(tmp_path):
    directory, _ = gpt2_directory(tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(directory, attn_implementation="eager")
    model, _ = load_gpt2(directory)
    ids = torch.randint(0, GPT2_VOCAB, (2, 7))
    with torch.no_grad():
        theirs = hf.eval()(ids, output_attentions=True).attentions
        ours = model.attention_maps(ids).decoder
    for mine, reference in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("scale_attn_by_inverse_layer_idx", True),
        ("reorder_and_upcast_attn", True),
        ("scale_attn_weights", False),
        ("activation_function", "silu"),
        ("add_cross_attention", True),
        ("embd_pdrop", 0.3),
        ("model_type", "gpt_neo"),
    ],
)
def test_gpt2_configurations_not_covered_are_refused_by_name(gpt2, tmp_path, field, value):
    assert_refused_by_name(convert_gpt2, gpt2[0], tmp_path, field, value)


def test_gpt2_converted_directory_loads_as_the_same_model(gpt2, tmp_path):
    directory, hf = gpt2
    out = tmp_path / "converted"
    weights = convert_gpt2(directory, out)
    model = load_model(weights).eval()
    assert isinstance(model, DecoderOnly)
    ids = torch.randint(0, GPT2_VOCAB, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-4, rtol=0)
    for name in ("vocab.json", "merges.txt"):
        assert (out / name).read_bytes() == (directory / name).read_bytes()
    marker = json.loads((out / CONVERTED_FILE).read_text())
    assert marker["format"] == "aiayn-gpt2" and marker["architecture"] == "decoder_only"


def test_a_directory_without_a_tokenizer_is_refused_before_writing(gpt2, tmp_path):
    directory = tmp_path / "no-tokenizer"
    shutil.copytree(gpt2[0], directory)
    (directory / "merges.txt").unlink()
    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError, match=re.escape("merges.txt")):
        convert_gpt2(directory, out)
    assert not out.exists()


def test_a_tensor_the_conversion_does_not_map_is_refused(gpt2, tmp_path):
    directory = tmp_path / "extra"
    shutil.copytree(gpt2[0], directory)
    tensors = load_file(directory / "model.safetensors")
    tensors["transformer.h.0.attn.rotary.weight"] = torch.zeros(3)
    save_file(tensors, directory / "model.safetensors")
    with pytest.raises(HFFormatError, match=re.escape("h.0.attn.rotary.weight")):
        load_gpt2(directory)


# ----- BERT ----------------------------------------------------------------------------


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three sentences of 12, 8 and 5 tokens ([CLS] ... [SEP]), padded; two segments each."""
    ids = torch.zeros((3, 12), dtype=torch.long)
    types = torch.zeros_like(ids)
    for row, length in enumerate((12, 8, 5)):
        ids[row, :length] = torch.randint(5, len(BERT_TOKENS), (length,))
        ids[row, 0], ids[row, length - 1] = 2, 3
        types[row, length // 2 : length] = 1
    return ids, types


def test_bert_logits_and_states_equal_transformers(bert):
    directory, hf = bert
    model, cfg = load_bert(directory)
    assert isinstance(model, EncoderOnly) and (cfg.bos_id, cfg.eos_id, cfg.pad_id) == (2, 3, 0)
    ids, types = padded_batch()
    attention_mask = (ids != 0).long()
    with torch.no_grad():
        theirs = hf(ids, token_type_ids=types, attention_mask=attention_mask)
        torch.testing.assert_close(model(ids, types), theirs.logits, atol=1e-4, rtol=0)
        states = hf.bert(ids, token_type_ids=types, attention_mask=attention_mask)
        torch.testing.assert_close(
            model.encode(ids, types), states.last_hidden_state, atol=1e-4, rtol=0
        )
    assert model.num_parameters() == hf.num_parameters()


def test_bert_fill_mask_top5_is_transformers(bert):
    directory, hf = bert
    model, _ = load_bert(directory)
    ids, types = padded_batch()
    masked = torch.tensor([[0, 3], [0, 6], [1, 2], [1, 5], [2, 1], [2, 3]])
    ids[masked[:, 0], masked[:, 1]] = MASK
    with torch.no_grad():
        theirs = hf(ids, token_type_ids=types, attention_mask=(ids != 0).long()).logits
        ours = model(ids, types)
    for row, position in masked.tolist():
        expected = theirs[row, position].topk(5).indices
        assert torch.equal(ours[row, position].topk(5).indices, expected)


def test_bert_attention_maps_equal_transformers(tmp_path):
    directory, _ = bert_directory(tmp_path)
    hf = transformers.BertForMaskedLM.from_pretrained(directory, attn_implementation="eager")
    model, _ = load_bert(directory)
    ids, types = padded_batch()
    with torch.no_grad():
        theirs = hf.eval()(
            ids, token_type_ids=types, attention_mask=(ids != 0).long(), output_attentions=True
        ).attentions
        ours = model.attention_maps(ids, types).encoder
    for mine, reference in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, reference, atol=1e-5, rtol=0)


def test_bert_checkpoint_with_old_layer_norm_names_loads(bert, tmp_path):
    directory = tmp_path / "old-names"
    shutil.copytree(bert[0], directory)
    tensors = load_file(directory / "model.safetensors")
    renamed = {
        name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ): t
        for name, t in tensors.items()
    }
    save_file(renamed, directory / "model.safetensors")
    model, _ = load_bert(directory)
    ids, types = padded_batch()
    with torch.no_grad():
        expected = bert[1](ids, token_type_ids=types, attention_mask=(ids != 0).long()).logits
        torch.testing.assert_close(model(ids, types), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("position_embedding_type", "relative_key"),
        ("is_decoder", True),
        ("add_cross_attention", True),
        ("hidden_act", "tanh"),
        ("model_type", "roberta"),
    ],
)
def test_bert_configurations_not_covered_are_refused_by_name(bert, tmp_path, field, value):
    assert_refused_by_name(convert_bert, bert[0], tmp_path, field, value)


def test_bert_pretraining_checkpoint_loads_without_its_pooler_and_nsp_head(tmp_path):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(BERT_TOKENS),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    hf = perturbed(transformers.BertForPreTraining(config))
    hf.save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("\n".join(BERT_TOKENS) + "\n", encoding="utf-8")
    model, _ = load_bert(tmp_path)
    ids, types = padded_batch()
    with torch.no_grad():
        theirs = hf(ids, token_type_ids=types, attention_mask=(ids != 0).long())
        torch.testing.assert_close(model(ids, types), theirs.prediction_logits, atol=1e-4, rtol=0)


def test_bert_without_its_masked_lm_head_is_refused(tmp_path):
    directory, _ = bert_directory(tmp_path, head=False)
    with pytest.raises(HFFormatError, match="masked-LM head"):
        load_bert(directory)


def test_bert_converted_directory_loads_as_the_same_model(bert, tmp_path):
    directory, hf = bert
    out = tmp_path / "converted"
    weights = convert_bert(directory, out)
    model = load_model(weights).eval()
    assert isinstance(model, EncoderOnly)
    ids, types = padded_batch()
    with torch.no_grad():
        expected = hf(ids, token_type_ids=types, attention_mask=(ids != 0).long()).logits
        torch.testing.assert_close(model(ids, types), expected, atol=1e-4, rtol=0)
    assert (out / "vocab.txt").read_bytes() == (directory / "vocab.txt").read_bytes()
    marker = json.loads((out / CONVERTED_FILE).read_text())
    assert marker["format"] == "aiayn-bert" and marker["tokenizer_files"] == ["vocab.txt"]
