import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aiayn.inference.kv_cache import KVCache, LayerKV
from aiayn.nn.attention import MultiHeadAttention, attend
from aiayn.nn.kernels import sdpa as sdpa_module
from aiayn.nn.masks import causal_mask, key_mask, padding_mask


def reference_attention(q, k, v, mask=None):
    """softmax(QK^T / sqrt(d_k)) V written out, one head at a time, in float64."""
    q, k, v = q.double(), k.double(), v.double()
    batch, heads, t_len, _ = q.shape
    out = torch.zeros(batch, heads, t_len, v.size(-1), dtype=torch.float64)
    weights = torch.zeros(batch, heads, t_len, k.size(2), dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            scores = q[b, h] @ k[b, h].T / math.sqrt(q.size(-1))
            if mask is not None:
                allowed = mask.expand(batch, heads, t_len, k.size(2))[b, h]
                scores = scores.masked_fill(~allowed, float("-inf"))
            w = torch.softmax(scores, dim=-1)
            weights[b, h] = w
            out[b, h] = w @ v[b, h]
    return out, weights


def random_qkv(batch=2, heads=3, t_len=4, s_len=5, d_k=6, d_v=7):
    return (
        torch.randn(batch, heads, t_len, d_k),
        torch.randn(batch, heads, s_len, d_k),
        torch.randn(batch, heads, s_len, d_v),
    )


@pytest.mark.parametrize("need_weights", [False, True])
def test_attend_equals_the_formula_with_a_padding_mask(need_weights):
    q, k, v = random_qkv()
    real = torch.tensor([[True] * 5, [True, True, True, False, False]])
    mask = key_mask(real)
    out, weights = attend(q, k, v, mask, need_weights=need_weights)
    expected_out, expected_weights = reference_attention(q, k, v, mask)
    torch.testing.assert_close(out.double(), expected_out, rtol=1e-5, atol=1e-5)
    if need_weights:
        torch.testing.assert_close(weights.double(), expected_weights, rtol=1e-5, atol=1e-6)
        assert torch.all(weights[1, :, :, 3:] == 0)
    else:
        assert weights is None


@pytest.mark.parametrize("need_weights", [False, True])
def test_attend_causal_equals_the_formula_with_a_triangular_mask(need_weights):
    q, k, v = random_qkv(t_len=5, s_len=5)
    out, _ = attend(q, k, v, causal=True, need_weights=need_weights)
    tril = torch.tril(torch.ones(5, 5, dtype=torch.bool))
    expected, _ = reference_attention(q, k, v, tril)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_queries_after_a_cache_see_every_earlier_key(need_weights):
    # 2 new queries at absolute positions 3 and 4 of a 5-key sequence.
    q, k, v = random_qkv(t_len=2, s_len=5)
    out, _ = attend(q, k, v, causal=True, need_weights=need_weights)
    allowed = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    expected, _ = reference_attention(q, k, v, allowed)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_sdpa_and_explicit_paths_agree_in_values_and_gradients():
    q, k, v = (t.requires_grad_() for t in random_qkv(t_len=5, s_len=5))
    real = torch.tensor([[True] * 5, [True, True, False, False, False]])
    mask = key_mask(real) & causal_mask(5, 5)
    grads = []
    for need_weights in (False, True):
        out, _ = attend(q, k, v, mask, need_weights=need_weights)
        grads.append((out, *torch.autograd.grad((out * out.detach()).sum(), (q, k, v))))
    for fast, explicit in zip(*grads, strict=True):
        torch.testing.assert_close(fast, explicit, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("need_weights", [False, True])
def test_a_fully_padded_row_gives_zeros_not_nan(need_weights):
    q, k, v = (t.requires_grad_() for t in random_qkv())
    real = torch.tensor([[True] * 5, [False] * 5])
    out, weights = attend(q, k, v, key_mask(real), need_weights=need_weights)
    assert torch.all(out[1] == 0) and torch.isfinite(out).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    if need_weights:
        assert torch.all(weights[1] == 0)
        torch.testing.assert_close(weights[0].sum(-1), torch.ones(3, 4))


@pytest.mark.parametrize("need_weights", [False, True])
def test_grouped_query_attention_equals_mha_with_repeated_kv_heads(need_weights):
    q = torch.randn(2, 6, 4, 8)
    k, v = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    out, _ = attend(q, k, v, need_weights=need_weights)
    # query heads 0-2 share kv head 0, heads 3-5 share kv head 1
    k_full, v_full = k[:, [0, 0, 0, 1, 1, 1]], v[:, [0, 0, 0, 1, 1, 1]]
    expected, _ = reference_attention(q, k_full, v_full)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def copy_into_torch_mha(ours: MultiHeadAttention, d_model: int, n_heads: int):
    ref = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(
            torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight])
        )
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ref


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_multi_head_attention_equals_torch_nn_multihead_attention(kind):
    d_model, n_heads = 16, 4
    ours = MultiHeadAttention(d_model, n_heads, n_heads, d_model // n_heads, d_model // n_heads)
    for p in ours.parameters():  # non-zero biases too
        nn.init.normal_(p, std=0.3)
    ref = copy_into_torch_mha(ours, d_model, n_heads)
    query = torch.randn(3, 5, d_model, requires_grad=True)
    source = query if kind == "self" else torch.randn(3, 7, d_model, requires_grad=True)
    ids = torch.tensor([[5] * 7, [5] * 4 + [0] * 3, [5] * 2 + [0] * 5])[:, : source.size(1)]
    real = padding_mask(ids, pad_id=0)

    out, weights = ours(query, source, key_mask(real), need_weights=True)
    expected, expected_weights = ref(
        query, source, source, key_padding_mask=~real, average_attn_weights=False
    )
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-5, atol=1e-6)

    fast, _ = ours(query, source, key_mask(real))
    torch.testing.assert_close(fast, expected, rtol=1e-5, atol=1e-5)
    grad_ours = torch.autograd.grad(fast.square().sum(), [query, ours.q_proj.weight])
    grad_ref = torch.autograd.grad(expected.square().sum(), [query, ref.in_proj_weight])
    torch.testing.assert_close(grad_ours[0], grad_ref[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grad_ours[1], grad_ref[1][:d_model], rtol=1e-4, atol=1e-5)


def test_separate_d_k_and_d_v_and_the_output_projection_shape():
    mha = MultiHeadAttention(d_model=32, n_heads=4, n_kv_heads=4, d_k=5, d_v=11)
    assert mha.q_proj.weight.shape == (20, 32)
    assert mha.v_proj.weight.shape == (44, 32)
    assert mha.out_proj.weight.shape == (32, 44)  # W^O: (h d_v) x d_model
    out, weights = mha(torch.randn(2, 3, 32), torch.randn(2, 6, 32), need_weights=True)
    assert out.shape == (2, 3, 32) and weights.shape == (2, 4, 3, 6)


@pytest.mark.parametrize(
    ("n_kv_heads", "kv_params"),
    [(8, 2 * (64 * 64 + 64)), (2, 2 * (64 * 16 + 16)), (1, 2 * (64 * 8 + 8))],
)
def test_gqa_and_mqa_parameter_counts(n_kv_heads, kv_params):
    mha = MultiHeadAttention(d_model=64, n_heads=8, n_kv_heads=n_kv_heads, d_k=8, d_v=8)
    q_and_out = 2 * (64 * 64 + 64)
    assert sum(p.numel() for p in mha.parameters()) == q_and_out + kv_params
    out, _ = mha(torch.randn(2, 3, 64), torch.randn(2, 3, 64))
    assert out.shape == (2, 3, 64)


def test_n_heads_must_be_a_multiple_of_n_kv_heads():
    with pytest.raises(ValueError, match="multiple"):
        MultiHeadAttention(d_model=16, n_heads=4, n_kv_heads=3, d_k=4, d_v=4)


def test_cache_appends_self_keys_and_computes_cross_keys_once():
    mha = MultiHeadAttention(d_model=8, n_heads=2, n_kv_heads=1, d_k=4, d_v=4)
    x = torch.randn(2, 3, 8)
    growing = LayerKV(static=False)
    for t in range(3):
        mha(x[:, t : t + 1], x[:, t : t + 1], causal=True, cache=growing)
    assert growing.key.shape == (2, 1, 3, 4)
    full_k = mha.k_proj(x).view(2, 3, 1, 4).transpose(1, 2)
    torch.testing.assert_close(growing.key, full_k)

    static = LayerKV(static=True)
    memory = torch.randn(2, 5, 8)
    mha(x[:, :1], memory, cache=static)
    first_key = static.key
    mha(x[:, 1:2], torch.zeros(2, 5, 8), cache=static)  # source ignored once filled
    assert static.key is first_key


def test_cache_reorder_follows_the_index():
    cache = KVCache.empty(n_layers=2)
    assert cache.length == 0
    for store in (*cache.self_attention, *cache.cross_attention):
        store.key = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 1, 4, 2).clone()
        store.value = store.key.clone()
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.length == 4
    for store in (*cache.self_attention, *cache.cross_attention):
        assert store.key[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]


def test_growing_store_equals_concatenation_across_growth_reorder_and_shrinking():
    torch.manual_seed(0)
    store = LayerKV(static=False)
    keys, values = torch.empty(4, 2, 0, 3), torch.empty(4, 2, 0, 5)  # the torch.cat reference
    for step in range(40):  # beyond the first capacity (16), so the buffers grow
        new_k, new_v = torch.randn(4 if step < 25 else 2, 2, 1 + step % 2, 3), None
        new_v = torch.randn(new_k.size(0), 2, new_k.size(2), 5)
        k, v = store.append(new_k, new_v)
        keys, values = torch.cat([keys, new_k], dim=2), torch.cat([values, new_v], dim=2)
        torch.testing.assert_close(k, keys, rtol=0, atol=0)
        torch.testing.assert_close(v, values, rtol=0, atol=0)
        # Same number of rows: every row moves, none, some (beam search's parents).
        same_size = ([3, 3, 0, 1], [0, 1, 2, 3], [0, 0, 2, 1], [1, 0, 2, 3])[step % 4]
        index = torch.tensor(same_size) if step < 24 else torch.tensor([1, 0])
        if step == 24:
            index = torch.tensor([2, 0])  # two sentences leave: the batch shrinks
        store.reorder(index)
        keys, values = keys[index], values[index]
        torch.testing.assert_close(store.key, keys, rtol=0, atol=0)
        torch.testing.assert_close(store.value, values, rtol=0, atol=0)


def test_growing_store_accepts_keys_assigned_directly():
    store = LayerKV(static=False)
    store.append(torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 3, 4))
    store.key = store.value = torch.ones(2, 1, 5, 4)  # replaces the buffered prefix
    k, v = store.append(torch.full((2, 1, 1, 4), 2.0), torch.full((2, 1, 1, 4), 2.0))
    assert k[0, 0, :, 0].tolist() == [1.0] * 5 + [2.0]
    assert v.shape == (2, 1, 6, 4)


def test_multi_head_attention_as_a_textbook_reader_builds_it():
    mha = MultiHeadAttention(d_model=512, n_heads=8)
    assert (mha.n_kv_heads, mha.d_k, mha.d_v) == (8, 64, 64)
    x = torch.randn(2, 10, 512)
    out, weights = mha(x, x, need_weights=True)
    assert out.shape == (2, 10, 512) and weights.shape == (2, 8, 10, 10)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 8, 10))
    alone, _ = mha(x)  # the source defaults to the query: self-attention
    torch.testing.assert_close(alone, out, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="d_k and d_v"):
        MultiHeadAttention(d_model=10, n_heads=4)


def test_a_head_mask_silences_heads_as_zeroed_output_columns_would():
    mha = MultiHeadAttention(d_model=16, n_heads=4, n_kv_heads=2, d_v=6).eval()
    x = torch.randn(2, 5, 16)
    mha.head_mask = torch.tensor([1.0, 0.0, 1.0, 0.0])
    masked, _ = mha(x)
    mha.head_mask = None
    with torch.no_grad():  # by hand: heads 1 and 3 contribute nothing through W^O
        mha.out_proj.weight[:, 6:12] = 0.0
        mha.out_proj.weight[:, 18:24] = 0.0
    torch.testing.assert_close(masked, mha(x)[0])


def test_the_gradient_on_a_head_mask_is_each_heads_first_order_importance():
    mha = MultiHeadAttention(d_model=8, n_heads=2).double()
    x = torch.randn(3, 4, 8, dtype=torch.float64)

    def loss(mask: torch.Tensor) -> torch.Tensor:
        mha.head_mask = mask
        return mha(x)[0].square().sum()

    ones = torch.ones(2, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(loss(ones), ones)
    with torch.no_grad():
        for head in range(2):  # d loss / d m_h at m = 1, by a central difference
            step = torch.zeros(2, dtype=torch.float64)
            step[head] = 1e-4
            expected = (loss(1 + step) - loss(1 - step)) / 2e-4
            assert float(grad[head]) == pytest.approx(float(expected), rel=1e-6)


@pytest.mark.parametrize("with_bias", [False, True])
def test_under_cpu_bf16_autocast_the_fused_path_attends_in_float32(with_bias, monkeypatch):
    """CPU autocast hands attend() bfloat16 projections; the fused path computes the
    attention of those very values in float32 (faster there) and returns bfloat16."""
    monkeypatch.setattr(sdpa_module, "EXPLICIT_MAX_SCORES", {})  # the fused path throughout
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8).bfloat16().requires_grad_() for _ in range(3))
    mask = padding_mask(torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]), 0)[:, None, None]
    bias = torch.randn(4, 5, 5) if with_bias else None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = attend(q, k, v, mask, bias=bias)
    expected, _ = attend(q.float(), k.float(), v.float(), mask, bias=bias)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected.bfloat16())
    out.float().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.bfloat16 for t in (q, k, v))
    # without autocast a bfloat16 model (inference) attends in bfloat16 as given
    plain, _ = attend(q.detach(), k.detach(), v.detach(), mask, bias=bias)
    assert plain.dtype == torch.bfloat16


def _count_fused_calls(monkeypatch) -> list[int]:
    """Patch SDPA in aiayn's kernel module to count its calls."""
    calls = []
    fused = F.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(sdpa_module.F, "scaled_dot_product_attention", counted)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cpu_training_step_takes_the_faster_path_by_length(dtype, monkeypatch):
    """Gradients wanted on the CPU: the explicit path up to EXPLICIT_MAX_SCORES scores per
    head, SDPA above it; without gradients (inference) always SDPA."""
    calls = _count_fused_calls(monkeypatch)
    limit = sdpa_module.EXPLICIT_MAX_SCORES[dtype]
    short = int(limit**0.5)
    for length, want_grad, fused in (
        (short, True, False),
        (short + 1, True, True),
        (8, False, True),
    ):
        q, k, v = (
            torch.randn(1, 1, length, 4, dtype=dtype, requires_grad=want_grad) for _ in range(3)
        )
        calls.clear()
        attend(q, k, v, causal=True)
        assert bool(calls) == fused, (length, want_grad)


@pytest.mark.parametrize("causal", [False, True])
def test_the_explicit_training_path_equals_sdpa_in_outputs_and_gradients(causal, monkeypatch):
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 7, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = padding_mask(torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4]), 0)
    mask = mask[:, None, None]  # (B, 1, 1, S)
    results = []
    for limit in ({torch.float64: 7 * 7}, {}):  # explicit, then fused
        monkeypatch.setattr(sdpa_module, "EXPLICIT_MAX_SCORES", limit)
        calls = _count_fused_calls(monkeypatch)
        out, _ = attend(q, k, v, mask, causal=causal)
        assert bool(calls) == (not limit)
        results.append((out, *torch.autograd.grad(out.square().sum(), (q, k, v))))
    for explicit, fused in zip(*results, strict=True):
        torch.testing.assert_close(explicit, fused)
