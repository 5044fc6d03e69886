import pytest

from aiayn import ModelConfig
from aiayn.config import Activation


def test_base_and_big_presets_are_the_papers_table_3_rows():
    base = ModelConfig.base(vocab_size=37000)
    assert (base.n_layers, base.d_model, base.d_ff, base.n_heads) == (6, 512, 2048, 8)
    assert (base.d_k, base.d_v, base.dropout) == (64, 64, 0.1)
    assert base.n_encoder_layers == base.n_decoder_layers == 6
    assert base.n_kv_heads == 8
    assert base.positional == "sinusoidal"
    assert base.activation is Activation.RELU
    assert base.tie_embeddings and not base.norm_first
    big = ModelConfig.big(vocab_size=37000)
    assert (big.n_layers, big.d_model, big.d_ff, big.n_heads) == (6, 1024, 4096, 16)
    assert (big.d_k, big.d_v, big.dropout) == (64, 64, 0.3)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"n_heads": 1}, {"d_k": 512, "d_v": 512}),  # row (A)
        ({"n_heads": 4}, {"d_k": 128, "d_v": 128}),
        ({"n_heads": 16}, {"d_k": 32, "d_v": 32}),
        ({"n_heads": 32}, {"d_k": 16, "d_v": 16}),
        ({"d_k": 16}, {"d_k": 16, "d_v": 64}),  # row (B)
        ({"d_k": 32}, {"d_k": 32, "d_v": 64}),
        ({"n_layers": 2}, {"n_encoder_layers": 2, "n_decoder_layers": 2}),  # row (C)
        ({"d_model": 256, "d_k": 32, "d_v": 32}, {"d_model": 256, "n_heads": 8}),
        ({"d_model": 1024, "d_k": 128, "d_v": 128}, {"d_model": 1024}),
        ({"d_ff": 1024}, {"d_ff": 1024}),
        ({"dropout": 0.0}, {"dropout": 0.0}),  # row (D)
        ({"positional": "learned"}, {"positional": "learned"}),  # row (E)
    ],
)
def test_table_3_rows_are_keyword_overrides(overrides, expected):
    cfg = ModelConfig.base(vocab_size=37000, **overrides)
    for name, value in expected.items():
        assert getattr(cfg, name) == value


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"d_model": 500}, "d_model"),  # not divisible by 8 heads
        ({"n_kv_heads": 3}, "n_kv_heads"),  # 8 heads not a multiple of 3
        ({"d_ff": -1}, "d_ff"),
        ({"n_heads": 0}, "n_heads"),
        ({"d_k": 0}, "d_k"),
        ({"n_layers": -2}, "n_layers"),
        ({"dropout": 1.0}, "dropout"),
        ({"attention_dropout": -0.1}, "attention_dropout"),
        ({"activation": "tanh"}, "activation"),
        ({"pad_id": 37000}, "pad_id"),
        ({"pad_id": 2}, "pad_id"),  # equals eos_id
        ({"pad_id": 5, "eos_id": 5}, "eos_id"),
        ({"max_len": 0}, "max_len"),
    ],
)
def test_invalid_configs_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig.base(vocab_size=37000, **overrides)


def test_explicit_head_sizes_lift_the_divisibility_rule():
    cfg = ModelConfig.base(vocab_size=100, d_model=500, d_k=60, d_v=70)
    assert (cfg.d_k, cfg.d_v) == (60, 70)


def test_separate_encoder_and_decoder_depths():
    cfg = ModelConfig.tiny(vocab_size=100, n_encoder_layers=3, n_decoder_layers=1)
    assert (cfg.n_encoder_layers, cfg.n_decoder_layers) == (3, 1)


def test_dict_round_trip_is_plain_and_lossless():
    cfg = ModelConfig.big(vocab_size=123, positional="learned", n_kv_heads=4)
    values = cfg.to_dict()
    assert values["positional"] == "learned" and values["activation"] == "relu"
    assert ModelConfig.from_dict(values) == cfg


def test_unknown_keys_are_refused():
    with pytest.raises(ValueError, match="heads_count"):
        ModelConfig.from_dict({"vocab_size": 10, "heads_count": 3})


def test_config_is_frozen():
    cfg = ModelConfig.tiny(vocab_size=10)
    with pytest.raises(AttributeError):
        cfg.d_model = 3


def test_the_decoder_may_start_from_the_pad_id_as_marian_does():
    cfg = ModelConfig.tiny(vocab_size=10, pad_id=9, bos_id=9, eos_id=0)
    assert cfg.bos_id == cfg.pad_id


def test_precision_takes_both_spellings_and_names_its_dtype():
    import torch

    from aiayn.config import Precision, TrainConfig

    assert Precision("bfloat16") is Precision("bf16") is Precision.BF16
    assert [p.dtype for p in (Precision.FP32, Precision.BF16, Precision.FP16)] == [
        torch.float32,
        torch.bfloat16,
        torch.float16,
    ]
    with pytest.raises(ValueError, match="auto has no fixed dtype"):
        _ = Precision.AUTO.dtype
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(max_steps=1, precision="float64")


@pytest.mark.parametrize(
    ("overrides", "setting", "registered"),
    [
        ({"positional": "wavelet"}, "ModelConfig.positional", "sinusoidal"),
        ({"attention": "wavelet"}, "ModelConfig.attention", "sliding_window"),
        ({"architecture": "wavelet"}, "ModelConfig.architecture", "decoder_only"),
    ],
)
def test_unknown_plugin_names_are_refused_when_the_config_is_made(overrides, setting, registered):
    """Plug-in names are the registries' to check, through `aiayn.config.plugins`, as the config is
    made: a misspelled name never reaches a run."""
    with pytest.raises(ValueError, match=rf"'wavelet' \({setting}\); registered: .*{registered}"):
        ModelConfig.tiny(vocab_size=50, **overrides)
