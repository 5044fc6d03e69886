"""The prefix LM, added as one shape module (aiayn/models/prefix_lm.py), its recipe and
this test: its attention pattern, cached decoding against the whole sequence, and what
the rest of aiayn does with it through its spec alone (build, save and load, train,
refuse to freeze)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aiayn import ModelConfig, build_model, freeze
from aiayn.config.recipes import find_recipe
from aiayn.inference.search import greedy_search
from aiayn.io.checkpoint import load_model, save_model
from aiayn.models import spec_of
from aiayn.models.encoder_decoder import normal_initialisation
from aiayn.models.prefix_lm import PrefixLM
from aiayn.nn.masks import prefix_mask
from aiayn.training.recipe import load_recipe
from aiayn.training.tasks.lm_translation import DecoderOnlyTranslationTask, SeparatedSource

VOCAB, SEP = 40, 1  # the separator is cfg.bos_id


def small(**overrides) -> PrefixLM:
    settings = dict(d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=32, dropout=0.0)
    cfg = ModelConfig.gpt(VOCAB, architecture="prefix_lm", **{**settings, **overrides})
    model = build_model(cfg).eval()
    normal_initialisation(model, std=0.3)  # varied outputs
    return model


def test_the_mask_lets_the_prefix_see_itself_both_ways_and_the_rest_causally():
    mask = prefix_mask(torch.tensor([3, 0]), 5, 5)[:, 0]  # (B, T, S)
    by_hand = torch.tensor(
        [
            [1, 1, 1, 0, 0],
            [1, 1, 1, 0, 0],
            [1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask[0], by_hand)
    assert torch.equal(mask[1], torch.ones(5, 5, dtype=torch.bool).tril())  # no prefix: causal
    # the last 2 queries of 5 positions (after a cache of 3) see what they saw in the whole
    assert torch.equal(prefix_mask(torch.tensor([3]), 2, 5)[0, 0], by_hand[3:])


def test_a_prefix_position_sees_later_prefix_tokens_and_a_target_position_does_not():
    model = small()
    ids = torch.tensor([[5, 6, 7, SEP, 8, 9, 10]])
    assert model.prefix_lengths(ids).tolist() == [4]
    changed_prefix, changed_target = ids.clone(), ids.clone()
    changed_prefix[0, 2] = 20  # a later prefix token
    changed_target[0, 6] = 20  # the last target token
    with torch.no_grad():
        out = model(ids)
        assert not torch.allclose(model(changed_prefix)[0, 0], out[0, 0])  # bidirectional
        torch.testing.assert_close(model(changed_target)[0, :6], out[0, :6])  # causal after


def test_without_a_separator_it_is_the_decoder_only_model_with_the_same_weights():
    model = small()
    gpt = build_model(
        ModelConfig.gpt(VOCAB, **{**vars_of(model.cfg), "architecture": "decoder_only"})
    )
    gpt.load_state_dict(model.state_dict())
    ids = torch.randint(3, VOCAB, (2, 8))  # no separator: a plain causal LM
    with torch.no_grad():
        torch.testing.assert_close(model(ids), gpt.eval()(ids))


def vars_of(cfg: ModelConfig) -> dict:
    keep = ("d_model", "n_heads", "d_ff", "n_layers", "max_len", "dropout")
    return {name: getattr(cfg, name) for name in keep}


def greedy_by_hand(model: PrefixLM, sources: torch.Tensor, steps: int) -> list[list[int]]:
    """Each step recomputes the whole sequence: no cache, no search code."""
    outputs = []
    for row in sources:
        ids, out = torch.tensor([[*row.tolist(), SEP]]), []
        for _ in range(steps):
            logits = model(ids)[0, -1]
            logits[[model.cfg.pad_id, model.cfg.bos_id]] = float("-inf")
            token = int(logits.argmax())
            if token == model.cfg.eos_id:
                break
            out.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
        outputs.append(out)
    return outputs


def test_cached_greedy_translation_equals_recomputing_the_whole_sequence():
    model = small(output_bias=True)
    torch.nn.init.normal_(model.output_bias, std=1.0)
    sources = torch.randint(3, VOCAB, (3, 5))
    with torch.no_grad():
        found = greedy_search(SeparatedSource(model, SEP), sources, None, max_output_len=8)
        expected = greedy_by_hand(model, sources, steps=7)
    assert [h[0].tokens for h in found] == expected
    assert len({token for h in found for token in h[0].tokens}) > 3


def test_its_spec_is_its_own_so_freeze_refuses_it_by_name(tmp_path):
    model = small()
    assert spec_of(model).name == "prefix_lm" and spec_of(model).task == "lm_translation"
    with pytest.raises(TypeError, match=r"prefix_lm .*PrefixLM.* no frozen form"):
        freeze(model)
    save_model(model, tmp_path / "model.safetensors")
    loaded = load_model(tmp_path / "model.safetensors")
    assert type(loaded) is PrefixLM
    ids = torch.tensor([[5, 6, SEP, 8]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(ids), model(ids))


@pytest.mark.trains
def test_the_lm_translation_task_trains_it():
    """A few updates of the task's loss on one batch lower it: the shape plugs into the
    task unchanged (the prefix comes from the separator the task puts in each row)."""
    model = small(d_model=16, n_heads=2, d_ff=32)
    model.train()
    task = DecoderOnlyTranslationTask(model.cfg)
    sequences = [[5, 6, 7, SEP, 7, 6, 5, 2], [8, 9, SEP, 9, 8, 2]]
    batch = task.make_batch(sequences, None)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        optimizer.zero_grad()
        output = task.loss(model, batch, label_smoothing=0.0)
        (output.loss / output.n_tokens).backward()
        losses.append(float(output.loss.detach()))
        optimizer.step()
    assert losses[-1] < 0.5 * losses[0]


def test_its_recipe_is_the_decoder_only_translation_recipe_with_the_prefix_pattern():
    prefix = load_recipe(
        find_recipe(Path("prefix-lm-translate-bible-en-es-cpu")), ["data.corpus=/c"]
    )
    gpt = load_recipe(find_recipe(Path("gpt-translate-bible-en-es-cpu")), ["data.corpus=/c"])
    assert prefix.model == {**gpt.model, "architecture": "prefix_lm"}
    assert prefix.train == gpt.train and prefix.task == gpt.task == "lm_translation"
