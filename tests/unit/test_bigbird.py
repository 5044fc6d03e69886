"""BigBird attention, one kernel module and this test: equal to dense masked attention with
the same block pattern (built here as a dense mask, from the paper's rules), values and
gradients, padding; the random pattern's own rules; the pattern saved with the model;
no (T, T) allocation; causal use and bad options refused by name."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from aiayn import ModelConfig, build_model
from aiayn.io.checkpoint import average_checkpoints, load_model, save_model
from aiayn.models.encoder_decoder import normal_initialisation
from aiayn.nn.kernels import KERNELS, build_kernel
from aiayn.nn.kernels.bigbird import BigBirdKernel


def kernel(block_size=3, num_random_blocks=2, num_global_blocks=1, window_blocks=1, seed=0):
    torch.manual_seed(seed)
    return BigBirdKernel(block_size, num_random_blocks, num_global_blocks, window_blocks)


def dense_mask(kernel, t_len, real=None):
    """(B, T, T) or (T, T) bool: query i may attend key j. From the rules, with the
    kernel's random blocks (only its draw is taken from it): query block I attends key
    block J iff J is global, |I - J| <= w, J is one of I's random blocks, or I is
    global; each row's blocks are those up to its last real key (`real`, (B, T) bool)."""
    if real is not None:
        rows = []
        for row in real:
            own = int(row.nonzero().max()) + 1  # up to the last real key
            b = kernel.block_size
            covered = min(t_len, -(-own // b) * b)
            allowed = torch.zeros(t_len, t_len, dtype=torch.bool)
            allowed[:covered, :covered] = dense_mask(kernel, covered)
            rows.append(allowed & row)
        return torch.stack(rows)
    b, g, w = kernel.block_size, kernel.num_global_blocks, kernel.window_blocks
    n = -(-t_len // b)
    index, used = kernel.block_pattern(n)
    random = index[:, g + 2 * w + 1 :]
    random_used = used[:, g + 2 * w + 1 :]
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            chosen = bool(((random[i] == j) & random_used[i]).any())
            allowed[i, j] = j < g or i < g or abs(i - j) <= w or chosen
    blocks = torch.arange(t_len) // b
    return allowed[blocks[:, None], blocks[None, :]]


def reference(q, k, v, allowed):
    """softmax over the allowed keys, written out; rows without a key give 0."""
    heads = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(heads, dim=1), v.repeat_interleave(heads, dim=1)
    scores = (q @ k.transpose(-2, -1)) / q.size(-1) ** 0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.nan_to_num(scores.softmax(-1), nan=0.0)
    return weights @ v, weights


def qkv(batch=2, heads=4, kv_heads=2, t_len=20, dk=6, dv=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, heads, t_len, dk), (batch, kv_heads, t_len, dk), (batch, kv_heads, t_len, dv)]
    return [torch.randn(*s, generator=generator, dtype=torch.float64) for s in shapes]


@pytest.mark.parametrize(
    ("t_len", "options"),
    [
        (20, {}),  # 7 blocks, the last short
        (21, {"num_global_blocks": 2, "window_blocks": 0, "num_random_blocks": 3}),
        (12, {"num_random_blocks": 5}),  # fewer blocks left than asked for
        (18, {"num_global_blocks": 0, "block_size": 4}),
    ],
)
def test_values_and_gradients_equal_dense_attention_with_the_same_pattern(t_len, options):
    attention = kernel(**options)
    q, k, v = qkv(t_len=t_len)
    real = torch.ones(2, t_len, dtype=torch.bool)
    real[1, t_len - 5 :] = False  # a padded row
    for x in (q, k, v):
        x.requires_grad_(True)
    out, _ = attention(q, k, v, mask=real[:, None, None, :])
    expected, _ = reference(q, k, v, dense_mask(attention, t_len, real)[:, None])
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_a_sequence_attends_the_same_keys_whatever_its_batch_is_padded_to():
    attention = kernel()
    q, k, v = qkv(t_len=30)
    alone, _ = attention(q[:1, :, :13], k[:1, :, :13], v[:1, :, :13])  # 5 blocks of 3
    real = torch.zeros(2, 30, dtype=torch.bool)
    real[0, :13], real[1] = True, True  # batched with a row of 10 blocks
    batched, _ = attention(q, k, v, mask=real[:, None, None, :])
    torch.testing.assert_close(batched[:1, :, :13], alone)


def test_the_weights_are_the_dense_patterns_weights():
    attention = kernel()
    q, k, v = qkv(t_len=20)
    real = torch.ones(2, 20, dtype=torch.bool)
    real[0, 17:] = False
    out, weights = attention(q, k, v, mask=real[:, None, None, :], need_weights=True)
    expected, expected_weights = reference(q, k, v, dense_mask(attention, 20, real)[:, None])
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(out, expected)


def test_the_random_blocks_follow_the_rules_and_depend_on_the_seed_only():
    attention = kernel(block_size=2, num_random_blocks=3, num_global_blocks=2, window_blocks=1)
    index, used = attention.block_pattern(30)
    random, random_used = index[:, 5:], used[:, 5:]  # after 2 global, 3 sliding
    assert random_used.all()  # 30 blocks leave plenty to draw from
    for i in range(2, 30):
        drawn = set(random[i].tolist())
        assert len(drawn) == 3  # distinct
        assert all(j >= 2 and abs(j - i) > 1 for j in drawn)  # neither global nor sliding
    assert torch.equal(kernel(block_size=2, num_global_blocks=2, num_random_blocks=3)
                       .block_pattern(30)[0], index)  # fmt: skip
    different = kernel(block_size=2, num_random_blocks=3, num_global_blocks=2, seed=1)
    assert not torch.equal(different.block_pattern(30)[0], index)


def test_no_allocation_grows_as_the_square_of_the_length():
    attention = kernel(block_size=16, num_random_blocks=2)
    t_len = 2048  # a (T, T) float32 matrix would be 16 MiB, a bool mask 4 MiB
    q, k, v = (x[:1, :1].float() for x in qkv(t_len=t_len, kv_heads=4, dk=4, dv=4))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        attention(q, k, v)
    largest = max(event.cpu_memory_usage for event in prof.events())
    assert 0 < largest < t_len * t_len // 8  # the scores are (T, K b) = 2048 x 96 floats
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        attention(q, k, v, need_weights=True)  # the weights to draw are (T, S): seen
    assert max(event.cpu_memory_usage for event in prof.events()) >= t_len * t_len * 4


def small(seed):
    torch.manual_seed(seed)
    cfg = ModelConfig.bert(
        40, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=64, dropout=0.0,
        attention_dropout=0.0, attention="bigbird", type_vocab_size=0,
        attention_options={"block_size": 4, "num_random_blocks": 2},
    )  # fmt: skip
    model = build_model(cfg).eval()
    normal_initialisation(model, std=0.3)
    return model


def test_the_pattern_is_saved_with_the_model_and_survives_averaging(tmp_path):
    model = small(seed=0)
    ids = torch.randint(3, 40, (2, 40))
    with torch.no_grad():
        expected = model(ids)
    path = save_model(model, tmp_path / "model.safetensors")
    seeds = [int(layer.self_attn.kernel.seed) for layer in model.encoder.layers]
    assert seeds != [int(layer.self_attn.kernel.seed) for layer in small(seed=1).encoder.layers]
    loaded = load_model(path).eval()  # built with other seeds, then given the saved ones
    assert [int(layer.self_attn.kernel.seed) for layer in loaded.encoder.layers] == seeds
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), expected)
    averaged = average_checkpoints([path, path, path])  # float64 sums keep a seed < 2^31
    assert [int(averaged[f"encoder.layers.{i}.self_attn.kernel.seed"]) for i in (0, 1)] == seeds


def test_it_is_registered_and_refuses_causal_use_and_bad_options_by_name():
    assert KERNELS.get("bigbird") is BigBirdKernel
    cfg = ModelConfig.bert(40, attention="bigbird", attention_options={"block_size": 8})
    assert build_kernel(cfg).block_size == 8
    for option in ("block_size", "num_random_blocks", "num_global_blocks", "window_blocks"):
        bad = {option: -1}
        with pytest.raises(ValueError, match=f"bigbird's {option} must be an integer"):
            build_kernel(ModelConfig.bert(40, attention="bigbird", attention_options=bad))
    with pytest.raises(ValueError, match=r"takes no option 'window'.*block_size"):
        build_kernel(ModelConfig.bert(40, attention="bigbird", attention_options={"window": 3}))
    q, k, v = qkv()
    with pytest.raises(ValueError, match="bigbird attention has no causal form"):
        kernel()(q, k, v, causal=True)
    gpt = build_model(ModelConfig.gpt(40, d_model=16, n_heads=2, n_layers=1, attention="bigbird"))
    with pytest.raises(ValueError, match="no causal form"):
        gpt(torch.randint(3, 40, (1, 5)))
    with pytest.raises(ValueError, match="no score bias"):
        kernel()(q, k, v, bias=torch.zeros(4, 20, 20))
