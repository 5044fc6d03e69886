"""Hook points against TransformerLens (issue 32, item 7): the same random-weight GPT-2,
loaded into aiayn (`aiayn.io.hf_models.load_gpt2`) and into TransformerLens's bridge
(`TransformerBridge.boot_transformers`, raw HF numerics), gives the same activations at
the corresponding hook points: the residual stream, the attention pattern, each head's
output before W^O and the MLP's hidden layer."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
bridge_module = pytest.importorskip("transformer_lens.model_bridge")

from test_hf_models import GPT2_EOS, GPT2_VOCAB, gpt2_directory  # noqa: E402

from aiayn.io.hf_models import load_gpt2  # noqa: E402
from aiayn.nn.hooks import run_with_cache  # noqa: E402

# ours -> TransformerLens's, per layer I; a transpose where the layouts differ
POINTS = {
    "decoder.layers.{i}.hook_resid_pre": ("blocks.{i}.hook_resid_pre", None),
    "decoder.layers.{i}.hook_resid_mid": ("blocks.{i}.hook_resid_mid", None),
    "decoder.layers.{i}.hook_resid_post": ("blocks.{i}.hook_resid_post", None),
    "decoder.layers.{i}.self_attn.hook_weights": ("blocks.{i}.attn.hook_pattern", None),
    "decoder.layers.{i}.self_attn.hook_z": ("blocks.{i}.attn.hook_z", (1, 2)),  # (B, H, T, D)
    "decoder.layers.{i}.feed_forward.hook_hidden": ("blocks.{i}.mlp.hook_post", None),
}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    path, hf = gpt2_directory(tmp_path_factory.mktemp("gpt2"))
    # a tokenizer TransformerLens can load offline: one character per id
    letters = [chr(c) for c in range(ord("a"), ord("a") + GPT2_VOCAB - 1)]
    vocab = {t: i for i, t in enumerate(letters)} | {"<|endoftext|>": GPT2_EOS}
    (path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (path / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    tokenizer = transformers.GPT2TokenizerFast.from_pretrained(str(path))
    lens = bridge_module.TransformerBridge.boot_transformers(
        str(path), tokenizer=tokenizer, hf_model=hf.eval(), device="cpu"
    )
    ours, cfg = load_gpt2(path)
    return ours.eval(), lens, cfg


def test_every_corresponding_hook_point_agrees_within_1e_4(both):
    ours, lens, cfg = both
    ids = torch.randint(0, GPT2_VOCAB - 1, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits, cache = run_with_cache(ours, ids)
        lens_logits, lens_cache = lens.run_with_cache(ids)
    torch.testing.assert_close(logits, lens_logits, atol=1e-4, rtol=1e-4)
    compared = 0
    for i in range(cfg.n_decoder_layers):
        for name, (theirs, transpose) in POINTS.items():
            mine = cache[name.format(i=i)]
            other = lens_cache[theirs.format(i=i)]
            if transpose is not None:
                other = other.transpose(*transpose)
            assert mine.shape == other.shape, name
            torch.testing.assert_close(mine, other, atol=1e-4, rtol=1e-4, msg=name.format(i=i))
            compared += 1
    assert compared == len(POINTS) * cfg.n_decoder_layers == 12


def test_the_points_differ_between_layers(both):
    """The comparison above is not vacuous: layer 0's and layer 1's activations differ."""
    ours, _, _ = both
    ids = torch.randint(0, GPT2_VOCAB - 1, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, cache = run_with_cache(ours, ids, names="*.hook_resid_post")
    first, second = (
        cache["decoder.layers.0.hook_resid_post"],
        cache["decoder.layers.1.hook_resid_post"],
    )
    assert not torch.allclose(first, second, atol=1e-3)
