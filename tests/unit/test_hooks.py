"""Hook points: named activations read or replaced during a forward pass, checked against
independent references (the head mask, the explicit weights, a hand computation)."""

from __future__ import annotations

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.nn.attention import MultiHeadAttention, merge_heads, split_heads
from aiayn.nn.hooks import HookPoint, hook_points, hooks, run_with_cache

VOCAB = 30


def model_and_batch(architecture: str = "encoder_decoder"):
    preset = {"encoder_decoder": ModelConfig.tiny, "decoder_only": ModelConfig.gpt}[architecture]
    cfg = preset(VOCAB, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=32, dropout=0.0)
    model = build_model(cfg).eval()
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(3, VOCAB, (2, 6), generator=generator)
    src[1, 4:] = cfg.pad_id
    tgt = torch.randint(3, VOCAB, (2, 5), generator=generator)
    return model, src, tgt


def test_every_layer_names_its_places_after_its_path():
    model, _, _ = model_and_batch()
    names = set(hook_points(model))
    for name in (
        "encoder.layers.0.hook_resid_pre",
        "encoder.layers.1.hook_resid_post",
        "encoder.layers.0.self_attn.hook_weights",
        "decoder.layers.1.hook_resid_cross",
        "decoder.layers.0.cross_attn.hook_z",
        "decoder.layers.0.feed_forward.hook_hidden",
    ):
        assert name in names


def test_reading_changes_nothing_and_gives_what_the_blocks_compute():
    model, src, tgt = model_and_batch()
    with torch.no_grad():
        plain = model(src, tgt)
        logits, cache = run_with_cache(model, src, tgt)
        maps = model.attention_maps(src, tgt)
        embedded = model.encoder.embedding(src)
    # equal up to rounding: reading the weights takes the explicit path instead of SDPA's
    torch.testing.assert_close(logits, plain)
    torch.testing.assert_close(cache["encoder.layers.0.hook_resid_pre"], embedded)
    torch.testing.assert_close(cache["encoder.layers.0.self_attn.hook_weights"], maps.encoder[0])
    torch.testing.assert_close(cache["decoder.layers.1.cross_attn.hook_weights"], maps.cross[1])
    # the next layer reads what the previous one leaves
    torch.testing.assert_close(
        cache["encoder.layers.1.hook_resid_pre"], cache["encoder.layers.0.hook_resid_post"]
    )


def test_silencing_a_head_at_its_output_equals_the_head_mask():
    model, src, tgt = model_and_batch()
    attention = model.encoder.layers[1].self_attn

    def silence_head_2(z: torch.Tensor, name: str) -> torch.Tensor:
        z = z.clone()
        z[:, 2] = 0.0  # (B, H, T, Dv)
        return z

    with torch.no_grad():
        with hooks(model, {"encoder.layers.1.self_attn.hook_z": silence_head_2}):
            patched = model(src, tgt)
        attention.head_mask = torch.tensor([1.0, 1.0, 0.0, 1.0])
        masked = model(src, tgt)
        attention.head_mask = None
        plain = model(src, tgt)
    torch.testing.assert_close(patched, masked)
    assert not torch.allclose(patched, plain)


def test_replaced_weights_give_their_weighted_values():
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=16, n_heads=4, n_kv_heads=2).eval()
    x = torch.randn(2, 5, 16)
    uniform = lambda weights, name: torch.full_like(weights, 1 / weights.size(-1))  # noqa: E731
    with torch.no_grad(), hooks(mha, {"hook_weights": uniform}):
        out, _ = mha(x)
        v = split_heads(mha.v_proj(x), 2).repeat_interleave(2, dim=1)  # (B, H, S, Dv)
        by_hand = mha.out_proj(merge_heads(v.mean(dim=2, keepdim=True).expand(-1, -1, 5, -1)))
    torch.testing.assert_close(out, by_hand)


def test_a_decoder_only_model_has_the_same_places_and_caches_them():
    model, src, _ = model_and_batch("decoder_only")
    with torch.no_grad():
        _, cache = run_with_cache(model, src, names="decoder.layers.*.self_attn.hook_q")
    assert list(cache) == [f"decoder.layers.{i}.self_attn.hook_q" for i in range(2)]
    assert cache["decoder.layers.0.self_attn.hook_q"].shape == (2, 4, 6, 8)  # (B, H, T, Dk)


def test_unheard_points_are_never_called(monkeypatch):
    model, src, tgt = model_and_batch()

    def called(self, x):
        raise AssertionError("a hook point without hooks was called")

    monkeypatch.setattr(HookPoint, "forward", called)
    with torch.no_grad():
        model(src, tgt)  # hooks off: no hook point runs, so speed is unchanged
    assert not any(point.listened() for point in hook_points(model).values())


def test_a_pattern_that_matches_nothing_is_refused_by_name():
    model, src, tgt = model_and_batch()
    nothing = {"encoder.*.hook_nothing": lambda x, name: None}
    refused = pytest.raises(ValueError, match=r"no hook point matches 'encoder\.\*\.hook_nothing'")
    with refused, hooks(model, nothing):
        model(src, tgt)
    assert not any(point.listened() for point in hook_points(model).values())
