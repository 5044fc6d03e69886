"""The encoder-only model (BERT's shape): padding, token types, attention maps, save and load.

Its agreement with Hugging Face's BERT is in tests/parity/test_hf_models.py.
"""

from __future__ import annotations

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.config import Activation
from aiayn.io.checkpoint import load_model, save_model
from aiayn.models.encoder_decoder import normal_initialisation
from aiayn.models.encoder_only import EncoderOnly

VOCAB = 40
PAD = 0


def small_bert(**overrides) -> EncoderOnly:
    settings = dict(
        d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=32, dropout=0.0, attention_dropout=0.0
    )
    model = build_model(ModelConfig.bert(VOCAB, **{**settings, **overrides})).eval()
    normal_initialisation(model, std=0.3)  # larger than BERT's, so that every part matters
    return model


def test_the_bert_preset_is_bert_base():
    cfg = ModelConfig.bert(30522)
    assert (cfg.architecture, cfg.n_encoder_layers, cfg.d_model, cfg.n_heads, cfg.d_ff) == (
        "encoder_only",
        12,
        768,
        12,
        3072,
    )
    assert (cfg.positional, cfg.max_len, cfg.norm_first, cfg.activation) == (
        "learned",
        512,
        False,
        Activation.GELU,
    )
    assert (cfg.type_vocab_size, cfg.embedding_norm, cfg.layer_norm_eps) == (2, True, 1e-12)
    # BertForMaskedLM("bert-base-uncased") has 109,514,298 parameters: BERT-base without
    # the pooler and next-sentence head (transformers' num_parameters()).
    with torch.device("meta"):  # shapes only, no memory
        model = EncoderOnly(cfg)
    assert model.num_parameters() == 109_514_298


def test_a_padded_batch_gives_each_sentence_what_it_gets_alone():
    model = small_bert()
    lengths = [7, 4, 2]
    rows = [torch.randint(3, VOCAB, (n,)) for n in lengths]
    batch = torch.full((3, 7), PAD)
    types = torch.zeros((3, 7), dtype=torch.long)
    for i, row in enumerate(rows):
        batch[i, : len(row)] = row
        types[i, len(row) // 2 : len(row)] = 1  # a second segment
    with torch.no_grad():
        together = model(batch, types)
        for i, row in enumerate(rows):
            alone = model(row[None], types[i : i + 1, : len(row)])
            torch.testing.assert_close(together[i, : len(row)], alone[0], atol=1e-5, rtol=0)


def test_token_types_change_the_output_and_are_refused_without_them():
    model = small_bert()
    ids = torch.randint(3, VOCAB, (2, 6))
    with torch.no_grad():
        first = model(ids)  # type 0 everywhere
        torch.testing.assert_close(model(ids, torch.zeros_like(ids)), first, atol=0, rtol=0)
        assert not torch.allclose(model(ids, torch.ones_like(ids)), first)
    without = small_bert(type_vocab_size=0)
    with pytest.raises(ValueError, match="type_vocab_size"):
        without(ids, torch.zeros_like(ids))
    with pytest.raises(ValueError, match="shape"):
        model(ids, torch.zeros((2, 5), dtype=torch.long))


def test_the_mlm_head_is_dense_activation_norm_then_the_tied_embedding():
    model = small_bert()
    ids = torch.randint(3, VOCAB, (2, 6))
    head = model.mlm_head
    with torch.no_grad():
        hidden = model.encode(ids)
        by_hand = torch.nn.functional.layer_norm(
            torch.nn.functional.gelu(hidden @ head.dense.weight.T + head.dense.bias),
            (32,),
            head.norm.weight,
            head.norm.bias,
            eps=1e-12,
        )
        logits = by_hand @ model.encoder.embedding.tokens.weight.T + model.output_bias
        torch.testing.assert_close(model(ids), logits, atol=1e-5, rtol=0)


def test_attention_maps_give_padding_no_weight():
    model = small_bert()
    ids = torch.randint(3, VOCAB, (2, 6))
    ids[1, 4:] = PAD
    with torch.no_grad():
        maps = model.attention_maps(ids)
    assert maps.decoder == [] and maps.cross == [] and len(maps.encoder) == 2
    for weights in maps.encoder:
        assert weights.shape == (2, 4, 6, 6)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 6))
        assert torch.all(weights[1, :, :, 4:] == 0)


def test_a_sequence_past_max_len_is_refused():
    with pytest.raises(ValueError, match="max_len=32"):
        small_bert()(torch.ones((1, 33), dtype=torch.long))


def test_save_and_load_rebuild_the_same_model(tmp_path):
    model = small_bert(tie_output=False)
    path = save_model(model, tmp_path / "model.safetensors")
    loaded = load_model(path).eval()
    assert type(loaded) is EncoderOnly and loaded.cfg == model.cfg
    ids = torch.randint(0, VOCAB, (2, 6))
    types = torch.randint(0, 2, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, types), model(ids, types), atol=0, rtol=0)


def test_a_config_written_before_these_fields_loads_with_their_defaults():
    written = ModelConfig.tiny(VOCAB).to_dict()
    for newer in ("type_vocab_size", "embedding_norm"):
        del written[newer]
    cfg = ModelConfig.from_dict(written)
    assert cfg.type_vocab_size == 0 and cfg.embedding_norm is False
    with pytest.raises(ValueError, match="type_vocab_size"):
        ModelConfig.tiny(VOCAB, type_vocab_size=-1)
