"""The logit lens against the model's own logits, a hand computation and transformers."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from test_hf_models import GPT2_VOCAB, gpt2_directory, perturbed

from aiayn import ModelConfig
from aiayn.analysis.logit_lens import logit_lens, residual_stream
from aiayn.io.hf_models import load_gpt2
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_decoder import Transformer
from aiayn.models.encoder_only import EncoderOnly
from aiayn.nn.hooks import run_with_cache

VOCAB = 40
SHAPE = {"d_model": 32, "n_heads": 4, "d_ff": 64, "max_len": 24, "dropout": 0.0}


def encoder_decoder(norm_first: bool, **overrides) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig.tiny(vocab_size=VOCAB, norm_first=norm_first, **SHAPE, **overrides)
    return perturbed(Transformer(cfg))


def decoder_only(norm_first: bool, **overrides) -> DecoderOnly:
    torch.manual_seed(0)
    cfg = ModelConfig.gpt(vocab_size=VOCAB, n_layers=3, norm_first=norm_first, **SHAPE, **overrides)
    return perturbed(DecoderOnly(cfg))


def inputs_of(model: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(4, VOCAB, (2, 7), generator=generator)
    if isinstance(model, Transformer):
        src = torch.randint(4, VOCAB, (2, 9), generator=generator)
        return src, ids
    return (ids,)


MODELS = {
    "encoder-decoder pre-norm": lambda: encoder_decoder(True),
    "encoder-decoder post-norm": lambda: encoder_decoder(False),
    "encoder-decoder untied, output bias": lambda: encoder_decoder(
        True, tie_output=False, tie_embeddings=False, output_bias=True
    ),
    "decoder-only pre-norm": lambda: decoder_only(True),
    "decoder-only post-norm": lambda: decoder_only(False),
}


@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
def test_the_last_layer_is_the_models_own_distribution(build):
    model = build()
    inputs = inputs_of(model)
    with torch.no_grad():
        expected = model(*inputs).softmax(-1)  # (B, T, V)
    result = logit_lens(model, inputs, top_k=VOCAB)
    n_layers = len(model.decoder.layers)
    assert result.layers == ("embed", *(f"layer {i}" for i in range(n_layers)))
    last_ids, last_probs = result.top_ids[-1], result.top_probs[-1]  # (B, T, V) each
    # every token's probability, read back through the ids the lens sorted
    torch.testing.assert_close(expected.gather(-1, last_ids), last_probs, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(
        last_probs, expected.sort(-1, descending=True).values, rtol=1e-6, atol=1e-7
    )
    assert torch.equal(result.predicted, expected.argmax(-1))
    assert torch.equal(result.predicted_ranks[-1], torch.zeros_like(result.predicted))
    torch.testing.assert_close(result.predicted_probs[-1], expected.max(-1).values)


@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
def test_an_intermediate_layer_equals_a_hand_computation(build):
    model = build()
    inputs = inputs_of(model)
    cfg = model.cfg
    names = ["decoder.layers.0.hook_resid_pre", "decoder.layers.1.hook_resid_post"]
    with torch.no_grad():
        _, cache = run_with_cache(model, *inputs, names=names)
    # the output matrix and bias, from the parameters, as section 3.4 ties them
    tokens = model.decoder.embedding.tokens.weight
    weight = tokens if cfg.tie_output else model.output_proj.weight
    bias = model.output_bias if cfg.output_bias else None
    target = torch.randint(0, VOCAB, inputs[-1].shape, generator=torch.Generator().manual_seed(2))
    result = logit_lens(model, inputs, top_k=3, target=target)
    for layer, name in ((0, names[0]), (2, names[1])):  # "embed" and "layer 1"
        hidden = cache[name]
        if cfg.norm_first:  # pre-norm: the decoder's own final LayerNorm
            norm = model.decoder.final_norm
            hidden = F.layer_norm(hidden, (cfg.d_model,), norm.weight, norm.bias, norm.eps)
        with torch.no_grad():
            probs = F.linear(hidden, weight, bias).softmax(-1)  # (B, T, V)
        top = probs.topk(3, dim=-1)
        torch.testing.assert_close(result.top_probs[layer], top.values)
        torch.testing.assert_close(probs.gather(-1, result.top_ids[layer]), top.values)
        chosen = probs.gather(-1, target.unsqueeze(-1))
        torch.testing.assert_close(result.target_probs[layer], chosen.squeeze(-1))
        assert torch.equal(result.target_ranks[layer], (probs > chosen).sum(-1))
        chosen = probs.gather(-1, result.predicted.unsqueeze(-1))
        assert torch.equal(result.predicted_ranks[layer], (probs > chosen).sum(-1))


def test_an_encoder_only_model_is_refused_by_its_shape():
    torch.manual_seed(0)
    bert = EncoderOnly(ModelConfig.bert(vocab_size=VOCAB, n_layers=2, **SHAPE)).eval()
    with pytest.raises(ValueError, match="encoder_only") as err:
        logit_lens(bert, (torch.randint(4, VOCAB, (1, 5)),))
    assert "encoder_decoder or decoder_only" in str(err.value)


def test_bad_arguments_are_refused_by_name():
    model = decoder_only(True)
    (ids,) = inputs_of(model)
    with pytest.raises(ValueError, match=r"\(ids,\); got 2"):
        logit_lens(model, (ids, ids))
    with pytest.raises(ValueError, match="top_k"):
        logit_lens(model, (ids,), top_k=0)
    with pytest.raises(ValueError, match="target has shape"):
        logit_lens(model, (ids,), target=ids[:, 1:])
    with pytest.raises(ValueError, match=f"0..{VOCAB - 1}"):
        logit_lens(model, (ids,), target=ids + VOCAB)


def test_lens_json_holds_every_layer_and_position():
    class Pieces:
        def id_to_piece(self, token_id: int) -> str:
            return f"p{token_id}"

    model = encoder_decoder(True)
    inputs = inputs_of(model)
    result = logit_lens(model, inputs, top_k=2, target=inputs[-1])
    data = json.loads(json.dumps(result.to_dict(Pieces(), row=1, run="r")))
    assert data["run"] == "r"
    assert [p["input"] for p in data["positions"]] == [f"p{i}" for i in inputs[-1][1].tolist()]
    assert len(data["layers"]) == len(model.decoder.layers) + 1
    cell = data["layers"][-1]["positions"][3]
    assert cell["top"][0]["id"] == int(result.predicted[1, 3]) and cell["predicted_rank"] == 0
    assert cell["target_prob"] == pytest.approx(float(result.target_probs[-1, 1, 3]))


# ----- against transformers ---------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A random GPT-2 of transformers (perturbed, LayerNorms included), saved and loaded."""
    directory, hf = gpt2_directory(tmp_path_factory.mktemp("gpt2"), n_layer=3)
    model, _ = load_gpt2(directory)
    return hf, model.eval()


def test_residual_stream_and_lens_equal_transformers_hidden_states(gpt2):
    hf, model = gpt2
    ids = torch.randint(0, GPT2_VOCAB, (2, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        hidden = hf(ids, output_hidden_states=True).hidden_states  # embed, then each layer
    _, points, residual = residual_stream(model, (ids,))
    n_layers = hf.config.n_layer
    assert len(hidden) == len(points) == n_layers + 1
    for i in range(n_layers):  # transformers applies ln_f to its last one; ours is raw
        torch.testing.assert_close(residual[i], hidden[i], rtol=0, atol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(hf.transformer.ln_f(residual[-1]), hidden[-1], atol=1e-4, rtol=0)
        expected = [hf.lm_head(hf.transformer.ln_f(h)).softmax(-1) for h in hidden[:-1]]
        expected.append(hf.lm_head(hidden[-1]).softmax(-1))
    result = logit_lens(model, (ids,), top_k=GPT2_VOCAB)
    for i, probs in enumerate(expected):
        torch.testing.assert_close(
            probs.gather(-1, result.top_ids[i]), result.top_probs[i], rtol=0, atol=1e-5
        )
        torch.testing.assert_close(
            result.top_probs[i], probs.sort(-1, descending=True).values, rtol=0, atol=1e-5
        )
