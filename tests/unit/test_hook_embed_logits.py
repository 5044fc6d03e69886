"""The two hook points at the ends of every shape: the embeddings with positions
(`...embedding.hook_embed`) and the pre-softmax logits (`hook_logits`)."""

from __future__ import annotations

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.nn.hooks import hook_points, hooks, run_with_cache

VOCAB = 30


def build(architecture: str):
    preset = {
        "encoder_decoder": ModelConfig.tiny,
        "decoder_only": ModelConfig.gpt,
        "encoder_only": ModelConfig.bert,
    }[architecture]
    cfg = preset(VOCAB, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=32, dropout=0.0)
    model = build_model(cfg).eval()
    ids = torch.randint(5, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    inputs = (ids, ids[:, :5]) if architecture == "encoder_decoder" else (ids,)
    return model, inputs


@pytest.mark.parametrize("architecture", ["encoder_decoder", "decoder_only", "encoder_only"])
def test_the_embedding_and_logit_points_hold_what_the_model_computes(architecture):
    model, inputs = build(architecture)
    embeds = [name for name in hook_points(model) if name.endswith("hook_embed")]
    assert embeds and "hook_logits" in hook_points(model)
    with torch.no_grad():
        plain = model(*inputs)
        logits, cache = run_with_cache(model, *inputs, names=["*hook_embed", "hook_logits"])
    torch.testing.assert_close(logits, plain)
    torch.testing.assert_close(cache["hook_logits"], plain)
    # the embedding of the first stack, by hand: scaled tokens plus what the scheme adds
    first = embeds[0]
    embedding = model.get_submodule(first.rpartition(".")[0])
    ids = inputs[0]
    with torch.no_grad():
        by_hand = embedding(ids)  # eval: dropout is the identity
    torch.testing.assert_close(cache[first], by_hand)
    # and the first layer of that stack reads it
    stack = first.split(".")[0]
    layer0 = f"{stack}.layers.0.hook_resid_pre"
    _, resid = run_with_cache(model, *inputs, names=[layer0])
    torch.testing.assert_close(resid[layer0], cache[first])


def test_replacing_the_logits_replaces_the_output():
    model, inputs = build("decoder_only")
    with torch.no_grad(), hooks(model, {"hook_logits": lambda x, name: torch.zeros_like(x)}):
        out = model(*inputs)
    assert out.abs().sum() == 0


def test_replacing_the_embedding_changes_every_later_activation():
    model, inputs = build("decoder_only")
    name = next(n for n in hook_points(model) if n.endswith("hook_embed"))
    with torch.no_grad():
        plain = model(*inputs)
        with hooks(model, {name: lambda x, _: x * 0}):
            zeroed = model(*inputs)
    assert not torch.allclose(plain, zeroed)
