"""The decoder-only model (GPT's shape): causal, cached = uncached, searchable, saved and loaded.

Its agreement with Hugging Face's GPT-2 is in tests/parity/test_hf_models.py.
"""

from __future__ import annotations

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.config import Activation
from aiayn.inference.decoding import new_cache, start
from aiayn.inference.search import beam_search, greedy_search
from aiayn.io.checkpoint import load_model, save_model
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_decoder import normal_initialisation

VOCAB = 40


def small_gpt(**overrides) -> DecoderOnly:
    settings = dict(
        d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=32, dropout=0.0, attention_dropout=0.0
    )
    return build_model(ModelConfig.gpt(VOCAB, **{**settings, **overrides})).eval()


def test_the_gpt_preset_is_gpt2_small():
    cfg = ModelConfig.gpt(50257)
    assert (cfg.architecture, cfg.n_decoder_layers, cfg.d_model, cfg.n_heads, cfg.d_ff) == (
        "decoder_only",
        12,
        768,
        12,
        3072,
    )
    assert (cfg.positional, cfg.max_len, cfg.norm_first, cfg.activation) == (
        "learned",
        1024,
        True,
        Activation.GELU_TANH,
    )
    assert cfg.tie_output and not cfg.scale_embeddings and cfg.dropout == 0.1
    # GPT-2 small has 124,439,808 parameters (the count transformers reports for "gpt2").
    with torch.device("meta"):  # shapes only, no memory
        model = DecoderOnly(cfg)
    assert model.num_parameters() == 124_439_808


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rotary", "alibi"])
def test_cached_decoding_equals_the_whole_sequence_at_once(positional):
    model = small_gpt(positional=positional, n_kv_heads=2)
    ids = torch.randint(0, VOCAB, (3, 9))
    with torch.no_grad():
        whole = model(ids)
        cache = new_cache(model)
        parts = [model(ids[:, :4], cache)] + [model(ids[:, t : t + 1], cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=1e-5, rtol=0)


def test_a_position_sees_no_later_token():
    model = small_gpt()
    ids = torch.randint(0, VOCAB, (1, 10))
    changed = ids.clone()
    changed[0, 6:] = (changed[0, 6:] + 1) % VOCAB
    with torch.no_grad():
        before, after = model(ids), model(changed)
    torch.testing.assert_close(before[:, :6], after[:, :6], atol=0, rtol=0)
    assert not torch.allclose(before[:, 6:], after[:, 6:])


def greedy_by_hand(model: DecoderOnly, prompt: torch.Tensor, steps: int) -> list[list[int]]:
    """The whole sequence through the model at every step: no cache, no search code."""
    cfg = model.cfg
    outputs = []
    for row in prompt:
        ids, out = row[None], []
        for _ in range(steps):
            logits = model(ids)[0, -1]
            logits[[cfg.pad_id, cfg.bos_id]] = float("-inf")  # the search never emits these
            token = int(logits.argmax())
            if token == cfg.eos_id:
                break
            out.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
        outputs.append(out)
    return outputs


def test_search_continues_the_prompt_as_the_model_without_cache_would():
    model = small_gpt(output_bias=True)
    normal_initialisation(model, std=0.3)  # larger than GPT-2's, for varied outputs
    prompt = torch.randint(3, VOCAB, (3, 5))
    with torch.no_grad():
        found = greedy_search(model, prompt, extra_len=None, max_output_len=8)
        expected = greedy_by_hand(model, prompt, steps=7)  # the 8th may only be eos
    assert [h[0].tokens for h in found] == expected
    assert len({token for h in found for token in h[0].tokens}) > 3


def test_beam_search_scores_are_the_model_log_probabilities():
    model = small_gpt()
    normal_initialisation(model, std=0.3)
    prompt = torch.randint(3, VOCAB, (2, 4))
    with torch.no_grad():
        found = beam_search(model, prompt, beam=3, extra_len=None, max_output_len=6, alpha=0.0)
        for row, hypotheses in zip(prompt, found, strict=True):
            best = hypotheses[0]
            sequence = torch.tensor([[*row.tolist(), *best.tokens, model.cfg.eos_id]])
            log_probs = model(sequence)[0].log_softmax(-1)  # (T, V)
            picked = sequence[0, len(row) :]  # each generated token, eos included
            positions = torch.arange(len(row) - 1, sequence.size(1) - 1)
            total = float(log_probs[positions, picked].sum())
            assert best.log_prob == pytest.approx(total, abs=1e-4)


def test_an_empty_prompt_or_one_past_max_len_is_refused():
    model = small_gpt()
    with pytest.raises(ValueError, match="prompt"):
        start(model, torch.zeros((1, 0), dtype=torch.long))
    with pytest.raises(ValueError, match="max_len=32"):
        start(model, torch.ones((1, 33), dtype=torch.long))


def test_attention_maps_are_causal_distributions():
    model = small_gpt()
    ids = torch.randint(0, VOCAB, (2, 7))
    with torch.no_grad():
        maps = model.attention_maps(ids)
    assert maps.encoder == [] and maps.cross == [] and len(maps.decoder) == 2
    for weights in maps.decoder:
        assert weights.shape == (2, 4, 7, 7)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 7))
        assert torch.all(weights.triu(diagonal=1) == 0)


def test_save_and_load_rebuild_the_same_model(tmp_path):
    model = small_gpt(tie_output=False)
    path = save_model(model, tmp_path / "model.safetensors")
    loaded = load_model(path).eval()
    assert type(loaded) is DecoderOnly and loaded.cfg == model.cfg
    ids = torch.randint(0, VOCAB, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), atol=0, rtol=0)
