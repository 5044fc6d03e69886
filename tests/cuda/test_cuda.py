"""The CUDA paths, checked against the same code on the CPU (issue 35).

Each test builds a model on the CPU, copies it to the GPU and asserts that the GPU
gives what the CPU gives: logits within float32 tolerances, and the same tokens from
greedy and beam search. Matrix products run in true float32 here (TF32 off, PyTorch's
default for matmuls), so the tolerances are float32's, not TF32's.

They need a CUDA device and skip without one; CI has none (tests/conftest.py allows
this one skip). Run them on a GPU machine with:

    python -m pytest tests/cuda -q
"""

from __future__ import annotations

import pytest
import torch
from test_decoding_state import VOCAB, small  # tiny models with large random weights

from aiayn import build_model, freeze
from aiayn.inference.search import DecodeConfig, search
from aiayn.inference.static_step import StaticDecoder, StaticStep

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: no CUDA device here"
)

KERNEL_OPTIONS = {
    "sdpa": {},
    "explicit": {},
    "sliding_window": {"attention_window": 4, "global_tokens": 1},
    "linear": {},
    "performer": {"attention_options": {"num_features": 16}},
    "bigbird": {"attention_options": {"block_size": 4, "num_random_blocks": 1}},
}
CAUSAL_KERNELS = ["sdpa", "explicit", "sliding_window", "linear", "performer"]


def on_gpu(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` on the GPU (the CPU model stays where it is)."""
    copy = build_model(model.cfg).eval()
    copy.load_state_dict(model.state_dict())
    return copy.cuda()


def sources(batch: int, length: int = 12, seed: int = 1) -> torch.Tensor:
    """(batch, length) random sources ending in eos, padded to different lengths."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.zeros(batch, length, dtype=torch.long)
    for i in range(batch):
        n = length - (i * 3) % (length // 2)
        src[i, : n - 1] = torch.randint(3, VOCAB, (n - 1,), generator=generator)
        src[i, n - 1] = 2
    return src


def outputs(model, src: torch.Tensor, **settings) -> list[list[int]]:
    with torch.no_grad():
        return [hyps[0].tokens for hyps in search(model, src, DecodeConfig(**settings))]


@pytest.fixture(autouse=True)
def _true_float32():
    """TF32 off for matmuls (PyTorch's default; asserted, so a change elsewhere shows)."""
    assert not torch.backends.cuda.matmul.allow_tf32
    yield


@pytest.mark.parametrize("scheme", ["sinusoidal", "learned", "rotary", "relative", "alibi"])
def test_the_encoder_decoder_gives_the_cpus_logits_on_the_gpu(scheme):
    model = small("encoder_decoder", positional=scheme, n_kv_heads=2)
    src = sources(3)
    tgt = torch.randint(3, VOCAB, (3, 9))
    with torch.no_grad():
        expected = model(src, tgt)
        got = on_gpu(model)(src.cuda(), tgt.cuda())
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kernel", list(KERNEL_OPTIONS))
def test_every_kernel_gives_the_cpus_values_and_gradients_on_the_gpu(kernel):
    model = small("encoder_only", attention=kernel, **KERNEL_OPTIONS[kernel])
    ids = torch.randint(3, VOCAB, (2, 24))
    losses, grads = [], []
    for m, device in ((model, "cpu"), (on_gpu(model), "cuda")):
        m.zero_grad()
        logits = m(ids.to(device))
        loss = logits.float().logsumexp(-1).mean()
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.cpu() for n, p in m.named_parameters() if p.grad is not None})
    assert losses[0] == pytest.approx(losses[1], rel=1e-4, abs=1e-4)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-4, rtol=1e-3, msg=name)


@pytest.mark.parametrize("kernel", CAUSAL_KERNELS)
def test_causal_kernels_decode_on_the_gpu_as_on_the_cpu(kernel):
    model = small("decoder_only", std=0.5, attention=kernel, **KERNEL_OPTIONS[kernel])
    prompt = torch.randint(3, VOCAB, (3, 5))
    settings = dict(extra_len=None, max_output_len=16)
    for beam in (1, 3):
        expected = outputs(model, prompt, beam=beam, **settings)
        assert outputs(on_gpu(model), prompt.cuda(), beam=beam, **settings) == expected


@pytest.mark.parametrize(
    "settings",
    [dict(beam=1), dict(beam=4, alpha=0.6)],
    ids=["greedy", "beam"],
)
@pytest.mark.parametrize("frozen", [False, True])
def test_search_on_the_gpu_gives_the_cpus_tokens(settings, frozen):
    model = small("encoder_decoder", std=0.5, tie_output=False, positional="rotary")
    src = sources(6, seed=4)
    expected = outputs(model, src, extra_len=8, **settings)
    assert len({tuple(o) for o in expected}) >= 4  # several distinct outputs
    gpu = on_gpu(model)
    gpu = freeze(gpu) if frozen else gpu
    assert outputs(gpu, src.cuda(), extra_len=8, **settings) == expected


def test_bf16_frozen_weights_stay_close_to_float32_on_the_gpu():
    model = small("encoder_decoder", d_model=64, d_ff=256, std=0.1)
    src, tgt = sources(2), torch.randint(3, VOCAB, (2, 8))
    gpu = on_gpu(model)
    with torch.no_grad():
        exact = gpu.decode(tgt.cuda(), gpu.encode(src.cuda())).float()
        bf16 = freeze(gpu, torch.bfloat16)
        approx = bf16.decode(tgt.cuda(), bf16.encode(src.cuda())).float()
    assert next(bf16.parameters()).dtype == torch.bfloat16
    # bf16 keeps 8 bits of mantissa: errors of a few parts in a hundred of the logits' scale
    assert (approx - exact).abs().max() <= 0.05 * exact.abs().max()


def test_int8_weights_are_refused_on_the_gpu_with_the_reason():
    with pytest.raises(ValueError, match="int8"):
        freeze(on_gpu(small("encoder_decoder")), torch.int8)


@pytest.mark.parametrize("architecture", ["encoder_decoder", "decoder_only"])
def test_the_static_step_on_the_gpu_equals_the_literal_model(architecture):
    model = on_gpu(small(architecture, positional="rotary"))
    batch, steps = 2, 10
    tgt = torch.randint(3, VOCAB, (batch, steps), device="cuda")
    tgt[:, 0] = model.cfg.bos_id
    step = StaticStep(model, slots=batch, max_target=16)
    slots = torch.tensor([1, 0], device="cuda")
    with torch.no_grad():
        if architecture == "encoder_decoder":
            src = sources(batch).cuda()
            expected = model(src, tgt)
            step.load_source(slots, src)
            start = 0
        else:
            expected = model(tgt)
            first = step.load_prompt(slots, tgt[:, :3])
            torch.testing.assert_close(first, expected[:, 2], atol=1e-4, rtol=1e-4)
            start = 3
    for t in range(start, steps):
        tokens = torch.zeros(batch, dtype=torch.long, device="cuda")
        tokens[slots] = tgt[:, t]
        logits = step.logits(tokens, torch.full((batch,), t, device="cuda"))
        torch.testing.assert_close(logits[slots], expected[:, t], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"], ids=["inductor", "cuda-graph"])
def test_the_compiled_static_step_searches_as_the_eager_model_on_the_gpu(mode):
    model = on_gpu(small("encoder_decoder", std=0.5, tie_output=False))
    src = sources(4, seed=4).cuda()
    expected = outputs(model, src, beam=2, extra_len=6)
    static = StaticDecoder(model, slots=4 * 2 + 1)
    static.step.compile(log_probs=False, mode=mode)
    assert outputs(static, src, beam=2, extra_len=6) == expected


def test_a_bf16_autocast_training_step_lowers_the_loss_on_the_gpu():
    from aiayn.training.precision import Precision, autocast

    model = small("encoder_decoder", std=0.05).train().cuda()
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    src = sources(8).cuda()
    tgt_in = torch.randint(3, VOCAB, (8, 10), device="cuda")
    tgt_out = torch.roll(tgt_in, -1, dims=1)
    losses = []
    for _ in range(60):
        with autocast(Precision.BF16, torch.device("cuda")):
            logits = model(src, tgt_in)
        assert logits.dtype == torch.bfloat16
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tgt_out.flatten())
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.6 * losses[0]  # it memorises the 80 random tokens
