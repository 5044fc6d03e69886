"""int8 inference: `freeze(model, torch.int8)`, `Int8Linear`, `Translator(dtype=torch.int8)`
and `--dtype int8`, held against float32 and a hand computation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_inference import copy_trained_model, sources
from typer.testing import CliRunner

import aiayn.inference.frozen
import aiayn.inference.frozen_products
import aiayn.io.int8_weights
from aiayn import freeze
from aiayn.apps.serve.engine import model_info
from aiayn.apps.translate import Translator
from aiayn.cli import app
from aiayn.config import Precision, TrainConfig
from aiayn.data.tokenizer import SentencePieceTokenizer
from aiayn.inference.frozen import FrozenLinear, Int8Linear
from aiayn.inference.search import greedy_search
from infer_helpers import make_run

pytestmark = pytest.mark.skipif(
    not {"fbgemm", "onednn"} & set(torch.backends.quantized.supported_engines),
    reason="PyTorch built without an int8 CPU engine",
)


@pytest.fixture
def int8_everywhere(monkeypatch):
    """Quantize every product, however small (the test models are far below the size
    from which freeze quantizes)."""
    monkeypatch.setattr(aiayn.io.int8_weights, "INT8_MIN_ELEMENTS", 0)


def reference_quantized(weight: torch.Tensor) -> torch.Tensor:
    """W rounded to int8 per output channel, symmetric (scale = max |W_o| / 127), as floats."""
    scale = weight.abs().amax(dim=1, keepdim=True) / 127
    return (weight / scale).round().clamp(-127, 127) * scale


def activation_bound(x: torch.Tensor, weight: torch.Tensor, per_token: bool) -> torch.Tensor:
    """The most that quantizing x to uint8 can move each output (..., out): x's range,
    zero included, in 255 steps, rounding moves an element by half a step, and output o
    sums those moves weighted by |W_o|. Per token, each row is first divided by its
    largest |x_i| (and the output multiplied back): its step shrinks with it."""
    scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-30)  # an all-zero row: no error
    scale = scale if per_token else torch.ones_like(scale)
    xs = x / scale
    step = (xs.max().clamp(min=0) - xs.min().clamp(max=0)) / 255
    return scale * step / 2 * weight.abs().sum(dim=1)


@pytest.mark.parametrize("per_token", [True, False])
@pytest.mark.parametrize("engine", ["fbgemm", "onednn"])
@pytest.mark.parametrize(("relu", "bias"), [(False, True), (True, True), (False, False)])
def test_int8_linear_is_the_dequantized_product(engine, relu, bias, per_token):
    if engine not in torch.backends.quantized.supported_engines:
        pytest.skip(f"PyTorch built without {engine}")
    torch.manual_seed(0)
    weight, b = torch.randn(48, 64), torch.randn(48) if bias else None
    layer = Int8Linear(weight, b, relu, engine, per_token)
    assert layer.engine == engine
    dequantized, got_bias = layer.dequantized()
    torch.testing.assert_close(dequantized, reference_quantized(weight), rtol=1e-6, atol=1e-6)
    assert (got_bias is None) == (b is None)
    uneven = torch.randn(6, 64) * torch.tensor([1e-3, 1e-2, 0.1, 1.0, 10.0, 0.0])[:, None]
    for x in (torch.randn(1, 64), torch.randn(3, 5, 64), torch.randn(40, 128)[:, ::2], uneven):
        expected = F.linear(x, dequantized, b)
        got = layer(x)
        assert got.shape == expected.shape and got.dtype == torch.float32
        if relu:  # a single row too: oneDNN's fused ReLU skips it there (torch 2.13)
            assert (got >= 0).all()
            expected = expected.relu()
        bound = activation_bound(x, dequantized, per_token) + 1e-4
        assert ((got - expected).abs() <= bound).all()
    if not per_token:  # one scale for all rows: the small rows lose their resolution
        error = (layer(uneven) - F.linear(uneven, dequantized, b)).abs()
        assert (error > activation_bound(uneven, dequantized, True) + 1e-4).any()


def test_int8_linear_takes_bfloat16_input_and_an_all_zero_row():
    weight = torch.randn(8, 16)
    weight[3] = 0
    layer = Int8Linear(weight, None)
    x = torch.randn(2, 16)
    assert layer(x.bfloat16()).dtype == torch.float32
    assert (layer(x)[:, 3] == 0).all()


def test_int8_linear_refuses_what_it_cannot_run(monkeypatch):
    with pytest.raises(ValueError, match="one of fbgemm, onednn, x86, got 'qnnpack'"):
        Int8Linear(torch.randn(4, 4), None, engine="qnnpack")
    with pytest.raises(ValueError, match="int8 runs on the CPU; this weight is on meta"):
        Int8Linear(torch.randn(4, 4, device="meta"), None)
    monkeypatch.setattr(
        aiayn.inference.frozen_products, "_quantized_engines", lambda: ["qnnpack", "onednn"]
    )
    assert Int8Linear(torch.randn(4, 4), None).engine == "onednn"  # the one built serves
    monkeypatch.setattr(aiayn.inference.frozen_products, "_quantized_engines", lambda: ["qnnpack"])
    with pytest.raises(RuntimeError, match=r"fbgemm or onednn quantized engine.*\['qnnpack'\]"):
        Int8Linear(torch.randn(4, 4), None)


def test_freeze_int8_keeps_small_products_float_and_the_output_as_asked():
    model = copy_trained_model()  # d_model 32: every product is below INT8_MIN_ELEMENTS
    frozen = freeze(model, torch.int8)
    assert not any(isinstance(m, Int8Linear) for m in frozen.modules())


def test_freeze_int8_quantizes_every_product_and_the_output_as_asked(int8_everywhere):
    frozen = freeze(copy_trained_model(), torch.int8)
    layer = frozen.decoder.layers[0]
    products = [layer.self_attn.qkv_proj, layer.cross_attn.kv_proj, layer.feed_forward.linear1]
    assert all(isinstance(p, Int8Linear) and p.engine == "fbgemm" for p in products)
    assert all(p.per_token for p in products)
    per_tensor = freeze(copy_trained_model(), torch.int8, int8_per_token=False)
    assert not per_tensor.decoder.layers[0].feed_forward.linear1.per_token
    assert layer.feed_forward.linear1.relu
    assert isinstance(frozen.output, FrozenLinear) and frozen.output.weight_t is not None
    assert isinstance(freeze(copy_trained_model(), torch.int8, int8_output=True).output, Int8Linear)


@pytest.mark.parametrize("int8_output", [True, False])
def test_int8_logits_stay_close_to_float32(int8_everywhere, int8_output):
    # Each product's output moves by at most half an activation step times |W_o|
    # (about 1% of its range here, test_int8_linear_is_the_dequantized_product); the
    # model chains 5 (encoder) and 8 (decoder) of them with layer norms in between,
    # which keep such errors relative. 5% of the logits' spread leaves room for that
    # chain and still fails a layer that quantizes wrongly (e.g. a lost scale or ReLU
    # moves logits by their whole spread).
    model = copy_trained_model()
    frozen = freeze(model, torch.int8, int8_output=int8_output)
    src, tgt = sources(16), torch.randint(3, 16, (5, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model.decode(tgt, model.encode(src))
        got = frozen.decode(tgt, frozen.encode(src))
    spread = expected.max() - expected.min()
    assert (got - expected).abs().max() <= 0.05 * spread
    assert (got - expected).abs().max() > 0  # it did run in int8


def greedy_margin(model, src: torch.Tensor, tokens: list[int]) -> float:
    """The smallest gap, in nats, between the chosen token and the runner-up over the
    steps of one sentence's greedy output."""
    tgt = torch.tensor([[model.cfg.bos_id, *tokens[:-1]]])
    with torch.no_grad():
        logprobs = model.decode(tgt, model.encode(src[None])).log_softmax(-1)[0]
    top = logprobs.topk(2, dim=-1).values
    return float((top[:, 0] - top[:, 1]).min())


@pytest.mark.parametrize("int8_output", [True, False])
def test_int8_picks_the_float32_greedy_tokens(int8_everywhere, int8_output):
    # int8 moves this model's log-probabilities by up to 0.45 nats (every product
    # quantized, even 32 x 32 ones: harsher than freeze's default). Where float32 is
    # sure (every step's choice ahead of the runner-up by more than twice that, 1 nat),
    # int8 must choose alike; a near-tie may flip (one of these 40 sentences has a
    # 0.06-nat step). In all, the goal: at least 90% of the sentences identical.
    # (40, not 20: how many are sure depends on the tiny model's training, whose
    # digits differ with the CPU's kernels and attention's path.)
    model = copy_trained_model()
    frozen = freeze(model, torch.int8, int8_output=int8_output)
    src = torch.cat([sources(16, seed) for seed in range(1, 9)])  # 40 sentences, some padded
    expected = [r[0].tokens for r in greedy_search(model, src, extra_len=6)]
    got = [r[0].tokens for r in greedy_search(frozen, src, extra_len=6)]
    sure = [i for i, tokens in enumerate(expected) if greedy_margin(model, src[i], tokens) > 1.0]
    assert len(sure) >= 10  # 13 of 40 on two kernel sets here
    assert [got[i] for i in sure] == [expected[i] for i in sure]
    assert sum(a == b for a, b in zip(got, expected, strict=True)) >= 0.9 * len(expected)


def test_int8_products_hold_no_float_weight(int8_everywhere):
    frozen = freeze(copy_trained_model(), torch.int8, int8_output=True)
    int8 = [m for m in frozen.modules() if isinstance(m, Int8Linear)]
    assert len(int8) == 2 * 4 + 2 * 7 + 1  # encoder 2 x 4, decoder 2 x (3 + 4), output
    for layer in int8:  # the packed weight (an opaque kernel object), and the bias
        held = [v for v in vars(layer).values() if isinstance(v, torch.Tensor)]
        assert [tuple(t.shape) for t in held] in ([], [(layer.out_features,)])
        assert not list(layer.parameters()) and not list(layer.buffers())
    shapes = {(m.out_features, m.in_features) for m in int8}
    shapes |= {s[::-1] for s in shapes}
    others = [m for m in frozen.modules() if not isinstance(m, torch.nn.Embedding)]
    tensors = [t for m in others for t in vars(m).values() if isinstance(t, torch.Tensor)]
    tensors += [t for m in others for t in (*m.parameters(False), *m.buffers(False))]
    # what float tensors remain: the embeddings (the tied output projection's int8
    # copy aside), norms, positions; none shaped as an int8 product's weight
    assert tensors and not [tuple(t.shape) for t in tensors if tuple(t.shape) in shapes]


def test_float_frozen_linear_holds_one_layout():
    small = FrozenLinear(torch.randn(8, 16), torch.randn(8))
    assert small.weight_t is not None and small.packed is None and small.weight is None
    if not aiayn.inference.frozen._ONEDNN:
        pytest.skip("PyTorch built without oneDNN")
    weight, bias = torch.randn(512, 512), torch.randn(512)
    large = FrozenLinear(weight, bias)
    assert large.packed is not None and large.weight_t is None and large.weight is None
    output = FrozenLinear(weight, None, keep_transposed=True)
    assert output.packed is not None and output.weight_t is not None
    for rows in (1, 3, 40):  # every row count runs the one packed layout
        x = torch.randn(rows, 512)
        torch.testing.assert_close(large(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-4)


def test_int8_is_refused_off_the_cpu_and_in_training(tmp_path):
    model = copy_trained_model()
    with pytest.raises(ValueError, match=r"int8 runs on the CPU.*meta"):
        freeze(model.to("meta"), torch.int8)
    with pytest.raises(ValueError, match=r"floating-point dtype or torch\.int8"):
        freeze(copy_trained_model(), torch.int32)
    run = make_run(tmp_path)
    tokenizer = SentencePieceTokenizer.load(run / "spm.model")
    from aiayn.io.checkpoint import load_model, resolve_weights

    with pytest.raises(ValueError, match="int8 runs on the CPU, not on cuda"):
        Translator(load_model(resolve_weights(run)), tokenizer, device="cuda", dtype=torch.int8)
    with pytest.raises(ValueError, match=r"precision must be .*int8 is for inference only"):
        TrainConfig(max_steps=1, precision="int8")
    assert Precision("int8").dtype == torch.int8


def test_translator_int8_runs_int8_beside_a_float32_model(tmp_path, int8_everywhere):
    run = make_run(tmp_path)
    translator = Translator.load(run, dtype=torch.int8)
    assert next(translator.model.parameters()).dtype == torch.float32  # for attention maps
    assert any(isinstance(m, Int8Linear) for m in translator.engine.modules())
    assert translator.dtype == torch.int8
    assert model_info(translator, run)["dtype"] == "int8"
    assert len(translator.translate(["house.", "", "das haus."], beam=2)) == 3


def test_cli_dtype_int8(tmp_path, int8_everywhere):
    run = make_run(tmp_path)
    result = CliRunner().invoke(app, ["translate", str(run), "--dtype", "int8"], input="house.\n")
    assert result.exit_code == 0, result.output
    expected = Translator.load(run, dtype=torch.int8).translate(["house."])[0]
    assert result.stdout == expected + "\n"
    refused = CliRunner().invoke(
        app, ["train", "tiny-test", "--run", str(tmp_path / "t"), "train.precision=int8"]
    )
    assert refused.exit_code == 1
    assert "int8 is for inference only" in refused.output and "Traceback" not in refused.output
    assert not (tmp_path / "t").exists()
    generate = CliRunner().invoke(app, ["generate", str(run), "a", "--dtype", "int8"])
    assert (
        generate.exit_code == 1 and "int8 is for translate, evaluate and serve" in generate.output
    )


@pytest.mark.parametrize("dtype", [None, torch.int8])
def test_frozen_model_keeps_no_link_to_the_weights_it_shares_while_freezing(int8_everywhere, dtype):
    # freeze lets its working copy share the products' weights (they are re-laid out,
    # not copied twice): the frozen model must still not see later changes to them
    model = copy_trained_model(tie_output=False, output_bias=True)
    frozen = freeze(model, dtype, int8_output=True)
    assert all(p.requires_grad for p in model.parameters())  # the model is left as it was
    assert not any(p.requires_grad for p in frozen.parameters())
    src, tgt = sources(16), torch.randint(3, 16, (5, 4))
    with torch.no_grad():
        before = frozen(src, tgt)
        for p in model.parameters():
            p.add_(1.0)
        torch.testing.assert_close(frozen(src, tgt), before, rtol=0, atol=0)
