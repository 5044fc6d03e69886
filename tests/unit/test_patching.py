"""Activation patching (`aiayn.analysis.patching`), checked against hand computations with
plain PyTorch forward hooks on the layer modules, the clean run itself, causality, and a
head whose W^O columns are zero."""

from __future__ import annotations

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.analysis.patching import (
    ResidualPoint,
    Stack,
    check_aligned,
    log_probability,
    logit_difference,
    metric_values,
    patch_heads,
    patch_residual,
    run_patched,
)
from aiayn.analysis.patching_text import plot_patching
from aiayn.analysis.viz import AttentionKind

VOCAB = 30


def tiny(architecture: str):
    preset = {"encoder_decoder": ModelConfig.tiny, "decoder_only": ModelConfig.gpt}[architecture]
    cfg = preset(VOCAB, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=32, dropout=0.0)
    torch.manual_seed(0)
    return build_model(cfg).eval()


def translation_pair():
    """A model and clean, corrupted (src, tgt_in): the sources differ at positions 1 and 3."""
    model = tiny("encoder_decoder")
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (1, 6), generator=generator)
    corrupted = src.clone()
    corrupted[0, 1], corrupted[0, 3] = (src[0, 1] + 1 - 4) % (VOCAB - 4) + 4, 3
    tgt_in = torch.randint(4, VOCAB, (1, 5), generator=generator)
    return model, (src, tgt_in), (corrupted, tgt_in)


def gpt_pair():
    """A GPT and clean, corrupted (ids,) differing at position 2."""
    model = tiny("decoder_only")
    ids = torch.randint(4, VOCAB, (1, 7), generator=torch.Generator().manual_seed(2))
    corrupted = ids.clone()
    corrupted[0, 2] = (ids[0, 2] + 5 - 4) % (VOCAB - 4) + 4
    return model, (ids,), (corrupted,)


# ----- the metrics, by hand ----------------------------------------------------------


def test_the_metrics_are_what_they_say():
    logits = torch.randn(2, 4, VOCAB, generator=torch.Generator().manual_seed(3))
    by_hand = (logits[:, 2, 7] - logits[:, 2, 9]).mean()
    torch.testing.assert_close(logit_difference(2, 7, 9)(logits), by_hand)
    target = [5, 6, 8]
    log_probs = torch.log_softmax(logits, -1)
    by_hand = sum(log_probs[:, 1 + i, t] for i, t in enumerate(target)).mean()
    torch.testing.assert_close(log_probability(target, start=1)(logits), by_hand)
    with pytest.raises(ValueError, match="run past"):
        log_probability(target, start=2)(logits)


# ----- (a) the mechanism ---------------------------------------------------------------


def test_patching_every_position_of_the_first_layer_gives_the_clean_run():
    for model, clean, corrupt, name in (
        (*translation_pair(), "encoder.layers.0.hook_resid_pre"),
        (*gpt_pair(), "decoder.layers.0.hook_resid_pre"),
    ):
        metric = logit_difference(-1, 5, 6)
        clean_value, corrupt_value = metric_values(model, clean, corrupt, metric)
        assert clean_value != corrupt_value  # the corruption matters
        with torch.no_grad():
            expected = model(*clean)
        patched = run_patched(model, clean, corrupt, name)  # positions None: all of them
        torch.testing.assert_close(patched, expected, rtol=0, atol=0)
        assert metric(patched).item() == clean_value


def test_a_patch_in_a_causal_model_changes_nothing_before_its_position():
    model, clean, corrupt = gpt_pair()
    last = clean[0].size(1) - 1
    corrupt = (corrupt[0].clone(),)
    corrupt[0][0, last] = (clean[0][0, last] + 1 - 4) % (VOCAB - 4) + 4  # differs there too
    with torch.no_grad():
        unpatched = model(*corrupt)
    patched = run_patched(model, clean, corrupt, "decoder.layers.0.hook_resid_pre", [last])
    torch.testing.assert_close(patched[:, :last], unpatched[:, :last], rtol=0, atol=0)
    assert not torch.allclose(patched[:, last], unpatched[:, last])
    # and one position earlier, from that position on
    patched = run_patched(model, clean, corrupt, "decoder.layers.1.hook_resid_pre", [3])
    torch.testing.assert_close(patched[:, :3], unpatched[:, :3], rtol=0, atol=0)
    assert not torch.allclose(patched[:, 3:], unpatched[:, 3:])


# ----- (b) one cell against a hand computation --------------------------------------------


def _by_hand(model, clean, corrupt, layer_module, position, metric, before: bool) -> float:
    """The corrupted run with one row of a layer's input (before) or output taken from the
    clean run, by plain `register_forward_(pre_)hook` on the layer module."""
    kept = {}
    if before:
        grab = layer_module.register_forward_pre_hook(lambda m, args: kept.update(x=args[0]))
    else:
        grab = layer_module.register_forward_hook(lambda m, args, out: kept.update(x=out))
    with torch.no_grad():
        model(*clean)
    grab.remove()

    def swap(x):
        x = x.clone()
        x[:, position] = kept["x"][:, position]
        return x

    if before:
        handle = layer_module.register_forward_pre_hook(lambda m, args: (swap(args[0]), *args[1:]))
    else:
        handle = layer_module.register_forward_hook(lambda m, args, out: swap(out))
    try:
        with torch.no_grad():
            return float(metric(model(*corrupt)))
    finally:
        handle.remove()


def test_a_cell_of_patch_residual_equals_a_hand_computation():
    model, clean, corrupt = gpt_pair()
    metric = logit_difference(-1, 5, 6)
    result = patch_residual(model, clean, corrupt, metric, point=ResidualPoint.POST)
    assert result.shape == (2, 7)
    for layer, position in ((0, 2), (1, 6), (1, 4)):
        module = model.decoder.layers[layer]
        expected = _by_hand(model, clean, corrupt, module, position, metric, before=False)
        assert result[layer, position].item() == pytest.approx(expected, abs=1e-5)

    model, clean, corrupt = translation_pair()
    metric = log_probability(torch.tensor([7, 8, 9, 10, 11]))
    result = patch_residual(model, clean, corrupt, metric, stack=Stack.ENCODER)
    assert result.shape == (2, 6)  # layers x source positions
    for layer, position in ((1, 1), (0, 3), (1, 5)):
        module = model.encoder.layers[layer]
        expected = _by_hand(model, clean, corrupt, module, position, metric, before=True)
        assert result[layer, position].item() == pytest.approx(expected, abs=1e-5)


def test_normalised_patching_is_0_at_the_corrupted_metric_and_1_at_the_clean_one():
    model, clean, corrupt = gpt_pair()
    metric = logit_difference(-1, 5, 6)
    raw = patch_residual(model, clean, corrupt, metric)
    clean_value, corrupt_value = metric_values(model, clean, corrupt, metric)
    scaled = patch_residual(model, clean, corrupt, metric, normalize=True)
    torch.testing.assert_close(scaled, (raw - corrupt_value) / (clean_value - corrupt_value))
    # the residual stream entering layer 0 at the one changed position is the whole difference
    assert scaled[0, 2].item() == pytest.approx(1.0, abs=1e-5)
    assert scaled[0, :2].abs().max().item() < 1e-6  # the same token there: no change


# ----- (c) a head that writes nothing -----------------------------------------------------


@pytest.mark.parametrize("kind", [AttentionKind.DECODER, AttentionKind.CROSS])
def test_a_head_whose_output_matrix_is_zero_has_no_patching_effect(kind):
    model, clean, corrupt = translation_pair()
    sublayer = model.decoder.layers[1].self_attn if kind is AttentionKind.DECODER else None
    sublayer = sublayer or model.decoder.layers[1].cross_attn
    d_v, head = sublayer.d_v, 2
    with torch.no_grad():
        sublayer.out_proj.weight[:, head * d_v : (head + 1) * d_v] = 0.0
    metric = log_probability(torch.tensor([7, 8, 9, 10, 11]))
    _, corrupt_value = metric_values(model, clean, corrupt, metric)
    effect = patch_heads(model, clean, corrupt, metric, kind=kind) - corrupt_value
    assert effect.shape == (2, 4)
    assert effect[1, head].item() == 0.0
    if kind is AttentionKind.CROSS:  # the source differs: other heads move the metric
        assert effect[1].abs().max().item() > 0


def test_patch_heads_of_the_encoder_is_a_hand_computation_too():
    model, clean, corrupt = translation_pair()
    metric = log_probability(torch.tensor([7, 8, 9, 10, 11]))
    result = patch_heads(model, clean, corrupt, metric, kind="encoder")
    attention = model.encoder.layers[0].self_attn
    kept = {}
    handle = attention.hook_z.register_forward_hook(lambda m, a, out: kept.update(z=out))
    with torch.no_grad():
        model(*clean)
    handle.remove()

    def swap(m, a, out):
        out = out.clone()
        out[:, 1] = kept["z"][:, 1]
        return out

    handle = attention.hook_z.register_forward_hook(swap)
    try:
        with torch.no_grad():
            expected = float(metric(model(*corrupt)))
    finally:
        handle.remove()
    assert result[0, 1].item() == pytest.approx(expected, abs=1e-5)


# ----- (d) nothing to patch -------------------------------------------------------------


def test_clean_equal_to_corrupt_gives_no_effect_anywhere():
    model, clean, _ = translation_pair()
    metric = logit_difference(-1, 5, 6)
    _, corrupt_value = metric_values(model, clean, clean, metric)
    for stack in Stack:
        effect = patch_residual(model, clean, clean, metric, stack=stack) - corrupt_value
        assert effect.abs().max().item() == 0.0
    for kind in AttentionKind:
        effect = patch_heads(model, clean, clean, metric, kind=kind) - corrupt_value
        assert effect.abs().max().item() == 0.0
    with pytest.raises(ValueError, match="cannot normalise"):
        patch_residual(model, clean, clean, metric, normalize=True)


# ----- refusals and the picture -------------------------------------------------------------


def test_inputs_of_different_lengths_are_refused_naming_both():
    model, clean, corrupt = translation_pair()
    shorter = (corrupt[0][:, :5], corrupt[1])
    with pytest.raises(ValueError, match="source have 6 and 5 tokens"):
        patch_residual(model, clean, shorter, logit_difference(-1, 5, 6))
    with pytest.raises(ValueError, match="input have 7 and 6 tokens"):
        check_aligned(gpt_pair()[1], (gpt_pair()[2][0][:, :6],))
    gpt, clean, corrupt = gpt_pair()
    with pytest.raises(ValueError, match="no encoder"):
        patch_residual(gpt, clean, corrupt, logit_difference(-1, 5, 6), stack="encoder")
    with pytest.raises(ValueError, match="resid_cross"):
        patch_residual(gpt, clean, corrupt, logit_difference(-1, 5, 6), point="resid_cross")
    with pytest.raises(ValueError, match="point must be one of"):
        patch_residual(gpt, clean, corrupt, logit_difference(-1, 5, 6), point="resid")


def test_plot_patching_writes_a_png_with_a_colormap_centred_at_zero(tmp_path):
    result = torch.tensor([[0.0, 1.0, -0.5], [2.0, 0.0, float("nan")]])
    path = plot_patching(result, ["a", "b", "c"], ["layer 0", "layer 1"], tmp_path / "p.png")
    assert path.read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="labels"):
        plot_patching(result, ["a", "b"], ["layer 0", "layer 1"], tmp_path / "q.png")
    assert not (tmp_path / "q.png").exists()


def test_a_model_in_training_mode_is_patched_without_dropout_and_left_training():
    cfg = ModelConfig.gpt(
        VOCAB, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=32, dropout=0.5
    )
    torch.manual_seed(0)
    model = build_model(cfg).train()
    ids = (torch.randint(4, VOCAB, (1, 6), generator=torch.Generator().manual_seed(4)),)
    metric = logit_difference(-1, 5, 6)
    _, corrupt_value = metric_values(model, ids, ids, metric)
    assert (patch_residual(model, ids, ids, metric) - corrupt_value).abs().max().item() == 0.0
    assert model.training
