import math

import pytest
import torch
from torch import nn

from aiayn import ModelConfig, Transformer, build_model
from aiayn.inference.decoding import new_cache
from aiayn.models.encoder_decoder import EncoderOutput
from aiayn.nn.layers import EncoderLayer

PAD = 0


def analytic_parameter_count(cfg: ModelConfig) -> int:
    """Count by hand from the paper's shapes (section 3), independent of the modules."""
    d, h, hkv, dk, dv = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_k, cfg.d_v
    attention = (d * h * dk + h * dk) + (d * hkv * dk + hkv * dk) + (d * hkv * dv + hkv * dv)
    attention += h * dv * d + d  # W^O and its bias
    ffn = d * cfg.d_ff + cfg.d_ff + cfg.d_ff * d + d
    layer_norm = 2 * d
    encoder = cfg.n_encoder_layers * (attention + ffn + 2 * layer_norm)
    decoder = cfg.n_decoder_layers * (2 * attention + ffn + 3 * layer_norm)
    embeddings = cfg.vocab_size * d * (1 + (not cfg.tie_embeddings) + (not cfg.tie_output))
    embeddings += cfg.vocab_size if cfg.output_bias else 0
    positions = 2 * cfg.max_len * d if cfg.positional == "learned" else 0
    final_norms = 2 * layer_norm if cfg.norm_first else 0
    return encoder + decoder + embeddings + positions + final_norms


def count_without_allocating(cfg: ModelConfig) -> int:
    with torch.device("meta"):
        return Transformer(cfg).num_parameters()


# Table 3 rows (in millions, as printed in the paper) beside our exact counts at V=37000.
TABLE_3 = {
    "base": ({}, 65),
    "A h=1": ({"n_heads": 1}, 65),
    "A h=16": ({"n_heads": 16}, 65),
    "B d_k=16": ({"d_k": 16}, 58),
    "B d_k=32": ({"d_k": 32}, 60),
    "C N=2": ({"n_layers": 2}, 36),
    "C N=4": ({"n_layers": 4}, 50),
    "C N=8": ({"n_layers": 8}, 80),
    "C d_model=256": ({"d_model": 256, "d_k": 32, "d_v": 32}, 28),
    "C d_model=1024": ({"d_model": 1024, "d_k": 128, "d_v": 128}, 168),
    "C d_ff=1024": ({"d_ff": 1024}, 53),
    "C d_ff=4096": ({"d_ff": 4096}, 90),
    "E learned": ({"positional": "learned"}, 65),
}


@pytest.mark.parametrize("row", list(TABLE_3))
def test_parameter_counts_of_table_3_rows(row):
    overrides, paper_millions = TABLE_3[row]
    cfg = ModelConfig.base(vocab_size=37000, max_len=256, **overrides)
    ours = count_without_allocating(cfg)
    assert ours == analytic_parameter_count(cfg)
    # The paper's counts are rounded, its vocabulary "about 37000", and its rows are not
    # mutually consistent (README); ours stay within 5M of each. Untying the embeddings
    # or a missing sub-layer would be off by 19M or more.
    assert abs(ours / 1e6 - paper_millions) < 5.0


def test_base_and_big_parameter_counts():
    base = ModelConfig.base(vocab_size=37000)
    big = ModelConfig.big(vocab_size=37000)
    assert count_without_allocating(base) == analytic_parameter_count(base) == 63_082_496
    assert count_without_allocating(big) == analytic_parameter_count(big) == 214_245_376


@pytest.mark.parametrize(
    "overrides",
    [
        {"tie_embeddings": False},
        {"tie_output": False},
        {"tie_embeddings": False, "tie_output": False, "output_bias": True},
        {"norm_first": True},
        {"n_kv_heads": 2},
        {"n_kv_heads": 1, "d_k": 8, "d_v": 24},
        {"n_encoder_layers": 3, "n_decoder_layers": 1},
        {"positional": "learned"},
    ],
)
def test_parameter_counts_of_variants(overrides):
    cfg = ModelConfig.tiny(vocab_size=101, **overrides)
    assert Transformer(cfg).num_parameters() == analytic_parameter_count(cfg)


def test_one_matrix_is_source_embedding_target_embedding_and_output_projection():
    model = Transformer(ModelConfig.tiny(vocab_size=50))
    shared = model.encoder.embedding.tokens.weight
    assert model.decoder.embedding.tokens.weight is shared
    assert model.output_proj is None
    hidden = torch.randn(2, 3, 64)
    torch.testing.assert_close(model.project(hidden), hidden @ shared.T)
    untied = Transformer(ModelConfig.tiny(vocab_size=50, tie_embeddings=False))
    assert untied.decoder.embedding.tokens.weight is not untied.encoder.embedding.tokens.weight
    assert untied.output_proj is None  # the output stays tied to the target embedding
    separate = Transformer(ModelConfig.tiny(vocab_size=50, tie_output=False, output_bias=True))
    assert separate.decoder.embedding.tokens.weight is separate.encoder.embedding.tokens.weight
    with torch.no_grad():
        separate.output_bias.normal_()
    torch.testing.assert_close(
        separate.project(hidden),
        hidden @ separate.output_proj.weight.T + separate.output_bias,
    )


def test_embeddings_are_scaled_by_sqrt_d_model_plus_sinusoids():
    cfg = ModelConfig.tiny(vocab_size=50, dropout=0.0)
    model = Transformer(cfg).eval()
    ids = torch.tensor([[4, 9, 7]])
    expected = model.encoder.embedding.tokens.weight[ids] * math.sqrt(cfg.d_model)
    expected = expected + model.encoder.embedding.positions.table[:3]
    torch.testing.assert_close(model.encoder.embedding(ids), expected)


def test_initialisation_scheme():
    cfg = ModelConfig.base(vocab_size=8000, n_layers=1)
    model = Transformer(cfg)
    embedding = model.encoder.embedding.tokens.weight
    assert torch.all(embedding[PAD] == 0)
    assert embedding[1:].std().item() == pytest.approx(cfg.d_model**-0.5, rel=0.02)
    w = model.encoder.layers[
        0
    ].feed_forward.linear1.weight  # Xavier: U(-a, a), a = sqrt(6 / (in + out))
    bound = math.sqrt(6 / (cfg.d_model + cfg.d_ff))
    assert w.abs().max().item() <= bound
    assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.02)
    assert torch.all(model.encoder.layers[0].feed_forward.linear1.bias == 0)


def copy_mha(ours, ref):
    with torch.no_grad():
        ref.in_proj_weight.copy_(
            torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight])
        )
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.load_state_dict(ours.out_proj.state_dict())


def torch_transformer_with_our_weights(model: Transformer) -> nn.Transformer:
    cfg = model.cfg
    ref = nn.Transformer(
        d_model=cfg.d_model,
        nhead=cfg.n_heads,
        num_encoder_layers=cfg.n_encoder_layers,
        num_decoder_layers=cfg.n_decoder_layers,
        dim_feedforward=cfg.d_ff,
        dropout=0.0,
        batch_first=True,
        norm_first=cfg.norm_first,
    )
    for ours, theirs in zip(model.encoder.layers, ref.encoder.layers, strict=True):
        copy_mha(ours.self_attn, theirs.self_attn)
        theirs.linear1.load_state_dict(ours.feed_forward.linear1.state_dict())
        theirs.linear2.load_state_dict(ours.feed_forward.linear2.state_dict())
        theirs.norm1.load_state_dict(ours.attn_residual.norm.state_dict())
        theirs.norm2.load_state_dict(ours.ff_residual.norm.state_dict())
    for ours, theirs in zip(model.decoder.layers, ref.decoder.layers, strict=True):
        copy_mha(ours.self_attn, theirs.self_attn)
        copy_mha(ours.cross_attn, theirs.multihead_attn)
        theirs.linear1.load_state_dict(ours.feed_forward.linear1.state_dict())
        theirs.linear2.load_state_dict(ours.feed_forward.linear2.state_dict())
        theirs.norm1.load_state_dict(ours.self_residual.norm.state_dict())
        theirs.norm2.load_state_dict(ours.cross_residual.norm.state_dict())
        theirs.norm3.load_state_dict(ours.ff_residual.norm.state_dict())
    if cfg.norm_first:
        ref.encoder.norm.load_state_dict(model.encoder.final_norm.state_dict())
        ref.decoder.norm.load_state_dict(model.decoder.final_norm.state_dict())
    else:  # nn.Transformer always ends its stacks with a LayerNorm; the paper's post-norm has none
        ref.encoder.norm = None
        ref.decoder.norm = None
    return ref


def randomise_norms_and_biases(model: nn.Module) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))


def source_and_target(vocab=50, batch=3, s_len=7, t_len=6):
    src = torch.randint(3, vocab, (batch, s_len))
    src[1, 4:] = PAD
    src[2, 2:] = PAD
    tgt_in = torch.randint(3, vocab, (batch, t_len))
    return src, tgt_in


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm_first", [False, True])
def test_equals_torch_nn_transformer_on_copied_weights(norm_first):
    cfg = ModelConfig.tiny(vocab_size=50, dropout=0.0, n_layers=2, norm_first=norm_first)
    model = Transformer(cfg).eval()
    randomise_norms_and_biases(model)
    ref = torch_transformer_with_our_weights(model).eval()
    src, tgt_in = source_and_target()
    padding = src == PAD
    t_len = tgt_in.size(1)
    hidden = ref(
        model.encoder.embedding(src),
        model.decoder.embedding(tgt_in),
        tgt_mask=nn.Transformer.generate_square_subsequent_mask(t_len),
        src_key_padding_mask=padding,
        memory_key_padding_mask=padding,
        tgt_is_causal=True,
    )
    logits = model(src, tgt_in)
    torch.testing.assert_close(logits, model.project(hidden), rtol=1e-4, atol=1e-5)


def test_post_norm_has_no_final_norm_and_pre_norm_has_one_per_stack():
    post = Transformer(ModelConfig.tiny(vocab_size=20))
    pre = Transformer(ModelConfig.tiny(vocab_size=20, norm_first=True))
    assert isinstance(post.encoder.final_norm, nn.Identity)
    assert isinstance(post.decoder.final_norm, nn.Identity)
    assert isinstance(pre.encoder.final_norm, nn.LayerNorm)
    assert isinstance(pre.decoder.final_norm, nn.LayerNorm)


def test_encoder_layer_is_layernorm_of_x_plus_sublayer_x():
    layer = Transformer(ModelConfig.tiny(vocab_size=20, dropout=0.0)).encoder.layers[0]
    assert isinstance(layer, EncoderLayer)
    layer.eval()
    x = torch.randn(2, 4, 64)
    attn, _ = layer.self_attn(x, x)
    h = layer.attn_residual.norm(x + attn)
    expected = layer.ff_residual.norm(
        h + layer.feed_forward.linear2(torch.relu(layer.feed_forward.linear1(h)))
    )
    out = layer(x, None)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"norm_first": True},
        {"n_kv_heads": 2},
        {"n_kv_heads": 1},
        {"positional": "learned"},
        {"tie_embeddings": False, "tie_output": False, "d_k": 8, "d_v": 24},
        {"positional": "sinusoidal_halves", "activation": "swish", "output_bias": True},
    ],
)
def test_cached_incremental_decoding_equals_the_full_forward_pass(overrides):
    model = Transformer(ModelConfig.tiny(vocab_size=50, **overrides)).eval()
    src, tgt_in = source_and_target()
    with torch.no_grad():
        full = model(src, tgt_in)
        encoded = model.encode(src)
        cache = new_cache(model)
        steps = [model.decode(tgt_in[:, t : t + 1], encoded, cache) for t in range(tgt_in.size(1))]
        assert cache.length == tgt_in.size(1)
        torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5)
        # a prefix of 2 at once, then the rest at once, gives the same too
        cache = new_cache(model)
        first = model.decode(tgt_in[:, :2], encoded, cache)
        rest = model.decode(tgt_in[:, 2:], encoded, cache)
        torch.testing.assert_close(torch.cat([first, rest], dim=1), full, rtol=1e-4, atol=1e-5)


def test_cache_reorder_matches_decoding_the_selected_rows():
    model = Transformer(ModelConfig.tiny(vocab_size=50)).eval()
    src, tgt_in = source_and_target()
    index = torch.tensor([2, 0, 0])
    with torch.no_grad():
        encoded = model.encode(src)
        cache = new_cache(model)
        model.decode(tgt_in[:, :3], encoded, cache)
        cache.reorder(index)
        step = model.decode(tgt_in[index, 3:4], encoded.index_select(index), cache)
        expected = model(src[index], tgt_in[index, :4])[:, 3:4]
    torch.testing.assert_close(step, expected, rtol=1e-4, atol=1e-5)


def test_causality_future_targets_change_no_earlier_logit():
    model = Transformer(ModelConfig.tiny(vocab_size=50)).eval()
    src, tgt_in = source_and_target()
    changed = tgt_in.clone()
    changed[:, 4] = (changed[:, 4] + 1 - 3) % 47 + 3
    with torch.no_grad():
        before, after = model(src, tgt_in), model(src, changed)
    torch.testing.assert_close(before[:, :4], after[:, :4], rtol=0, atol=1e-6)
    assert not torch.allclose(before[:, 4:], after[:, 4:])


@pytest.mark.parametrize("norm_first", [False, True])
def test_padding_the_source_changes_nothing(norm_first):
    model = Transformer(ModelConfig.tiny(vocab_size=50, norm_first=norm_first)).eval()
    src = torch.randint(3, 50, (1, 5))
    tgt_in = torch.randint(3, 50, (1, 4))
    padded = torch.cat([src, torch.full((1, 6), PAD)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, tgt_in), model(src, tgt_in), rtol=1e-5, atol=1e-5)


def test_a_fully_padded_source_gives_finite_logits_and_gradients():
    model = Transformer(ModelConfig.tiny(vocab_size=50))
    src, tgt_in = source_and_target()
    src[0] = PAD
    logits = model(src, tgt_in)
    logits.sum().backward()
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_dropout_is_active_in_training_only():
    model = Transformer(ModelConfig.tiny(vocab_size=50, dropout=0.5))
    src, tgt_in = source_and_target()
    model.train()
    assert not torch.equal(model(src, tgt_in), model(src, tgt_in))
    model.eval()
    assert torch.equal(model(src, tgt_in), model(src, tgt_in))


def test_attention_maps_have_every_layer_and_head_and_rows_sum_to_one():
    cfg = ModelConfig.tiny(vocab_size=50, n_encoder_layers=3, n_decoder_layers=2)
    model = Transformer(cfg).eval()
    src, tgt_in = source_and_target()
    with torch.no_grad():
        maps = model.attention_maps(src, tgt_in)
    assert [m.shape for m in maps.encoder] == [(3, 4, 7, 7)] * 3
    assert [m.shape for m in maps.decoder] == [(3, 4, 6, 6)] * 2
    assert [m.shape for m in maps.cross] == [(3, 4, 6, 7)] * 2
    for m in (*maps.encoder, *maps.decoder, *maps.cross):
        torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:-1]))
    assert torch.all(maps.cross[0][2, :, :, 2:] == 0)  # padding gets no attention
    assert torch.all(torch.triu(maps.decoder[0][0, 0], diagonal=1) == 0)  # causal


def test_sequences_longer_than_max_len_are_refused():
    model = Transformer(ModelConfig.tiny(vocab_size=50, max_len=8))
    with pytest.raises(ValueError, match="max_len=8"):
        model(torch.randint(3, 50, (1, 9)), torch.randint(3, 50, (1, 3)))
    encoded = EncoderOutput(torch.zeros(1, 2, 64), torch.ones(1, 2, dtype=torch.bool))
    cache = new_cache(model)
    model.decode(torch.randint(3, 50, (1, 8)), encoded, cache)
    with pytest.raises(ValueError, match="9 tokens"):
        model.decode(torch.randint(3, 50, (1, 1)), encoded, cache)


def test_gqa_with_as_many_kv_heads_as_heads_is_plain_mha():
    mha = Transformer(ModelConfig.tiny(vocab_size=20))
    gqa = Transformer(ModelConfig.tiny(vocab_size=20, n_kv_heads=4))
    assert mha.cfg == gqa.cfg
    gqa.load_state_dict(mha.state_dict())
    src, tgt_in = source_and_target(vocab=20)
    mha.eval()
    gqa.eval()
    torch.testing.assert_close(gqa(src, tgt_in), mha(src, tgt_in))


# ----- positions and attention kernels as plug-ins -----------------------------------

SCHEMES = ["sinusoidal", "sinusoidal_halves", "learned", "rotary", "relative", "alibi", "none"]


def test_every_registered_scheme_is_covered_here():
    from aiayn.nn.positions import registered

    assert sorted(registered()) == sorted(SCHEMES)


@pytest.mark.parametrize("positional", SCHEMES)
def test_cached_decoding_equals_uncached_for_every_position_scheme(positional):
    model = Transformer(ModelConfig.tiny(vocab_size=50, positional=positional)).eval()
    src, tgt_in = source_and_target()
    with torch.no_grad():
        full = model(src, tgt_in)
        encoded = model.encode(src)
        cache = new_cache(model)
        steps = [model.decode(tgt_in[:, t : t + 1], encoded, cache) for t in range(tgt_in.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("positional", SCHEMES)
def test_sdpa_and_explicit_kernels_agree_for_every_position_scheme(positional):
    sdpa = Transformer(ModelConfig.tiny(vocab_size=50, positional=positional))
    explicit = Transformer(
        ModelConfig.tiny(vocab_size=50, positional=positional, attention="explicit")
    )
    explicit.load_state_dict(sdpa.state_dict())
    src, tgt_in = source_and_target()
    sdpa.eval(), explicit.eval()
    out = sdpa(src, tgt_in)
    torch.testing.assert_close(explicit(src, tgt_in), out, rtol=1e-5, atol=1e-5)
    grads = [
        torch.autograd.grad(
            m(src, tgt_in).square().sum(), m.encoder.layers[0].self_attn.q_proj.weight
        )
        for m in (sdpa, explicit)
    ]
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-5)
    maps = sdpa.attention_maps(src, tgt_in)  # the explicit path of the sdpa model
    assert all(torch.isfinite(m).all() for m in (*maps.encoder, *maps.decoder, *maps.cross))


@pytest.mark.parametrize("positional", ["sinusoidal", "rotary", "none"])
def test_a_window_covering_the_sequence_equals_dense_attention(positional):
    dense = Transformer(ModelConfig.tiny(vocab_size=50, positional=positional))
    windowed = Transformer(
        ModelConfig.tiny(
            vocab_size=50, positional=positional, attention="sliding_window", attention_window=64
        )
    )
    windowed.load_state_dict(dense.state_dict())
    src, tgt_in = source_and_target()
    dense.eval(), windowed.eval()
    torch.testing.assert_close(windowed(src, tgt_in), dense(src, tgt_in), rtol=1e-5, atol=1e-5)


def test_a_narrow_window_changes_the_output_and_decodes_with_a_cache():
    cfg = ModelConfig.tiny(vocab_size=50, attention="sliding_window", attention_window=2)
    windowed = Transformer(cfg).eval()
    dense = Transformer(ModelConfig.tiny(vocab_size=50)).eval()
    dense.load_state_dict(windowed.state_dict())
    src, tgt_in = source_and_target()
    with torch.no_grad():
        full = windowed(src, tgt_in)
        assert not torch.allclose(full, dense(src, tgt_in))
        encoded = windowed.encode(src)
        cache = new_cache(windowed)
        steps = [
            windowed.decode(tgt_in[:, t : t + 1], encoded, cache) for t in range(tgt_in.size(1))
        ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("positional", ["alibi", "relative"])
def test_sliding_window_refuses_a_bias_scheme(positional):
    """The kernel declares it takes no score bias; the scheme's bias is found by its override."""
    cfg = ModelConfig.tiny(vocab_size=50, attention="sliding_window", positional=positional)
    with pytest.raises(ValueError, match=f"positional '{positional}'.*'sliding_window'"):
        build_model(cfg)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"positional": "relative"}, {"positional": "rotary", "attention": "sliding_window"}],
)
def test_the_training_step_traces_without_graph_breaks(overrides):
    from aiayn.training.loss import label_smoothed_cross_entropy

    model = Transformer(ModelConfig.tiny(vocab_size=50, **overrides)).train()  # dropout 0.1
    src, tgt_in = source_and_target()

    def step(src, tgt_in):
        logits = model(src, tgt_in)
        return label_smoothed_cross_entropy(logits, tgt_in, PAD, 0.1).loss

    explanation = torch._dynamo.explain(step)(src, tgt_in)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
