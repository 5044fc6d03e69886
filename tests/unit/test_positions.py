"""Position schemes (aiayn.nn.positions), each against an independent reference: the formula
written out by hand, T5's bucket rule re-implemented from its description, ALiBi's slopes
listed by hand, and RoPE as complex multiplication on the paper's interleaved pairs."""

from __future__ import annotations

import ast
import cmath
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from aiayn.nn.positions import (
    POSITIONS,
    PositionScheme,
    base,
    build_positions,
    register,
    registered,
)
from aiayn.nn.positions.alibi import ALiBiPositions, alibi_slopes
from aiayn.nn.positions.learned import LearnedPositions
from aiayn.nn.positions.none import NoPositions
from aiayn.nn.positions.relative import RelativePositionBias, relative_position_bucket
from aiayn.nn.positions.rotary import RotaryPositions
from aiayn.nn.positions.sinusoidal import SinusoidalPositions, sinusoidal_table

BUILT_IN = ("alibi", "learned", "none", "relative", "rotary", "sinusoidal", "sinusoidal_halves")


@dataclass(frozen=True)
class Sizes:
    """Only the ModelConfig fields a factory may read; a factory reading more fails here."""

    d_model: int = 32
    n_heads: int = 4
    n_kv_heads: int = 2
    d_k: int = 8
    d_v: int = 8
    max_len: int = 64


@pytest.fixture
def scratch_registry() -> Iterator[None]:
    """Registrations made in the test vanish after it."""
    before = set(POSITIONS.names())
    yield
    for name in set(POSITIONS.names()) - before:
        POSITIONS.unregister(name)


# ----- registry ------------------------------------------------------------------------


def test_every_built_in_scheme_is_registered_and_builds_for_both_stacks():
    assert registered() == BUILT_IN
    for name in BUILT_IN:
        for causal in (False, True):
            assert isinstance(build_positions(name, Sizes(), causal), PositionScheme)


def test_unknown_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match="'nope'") as error:
        build_positions("nope", Sizes(), causal=False)
    for name in BUILT_IN:
        assert name in str(error.value)


def test_duplicate_registration_is_refused(scratch_registry):
    with pytest.raises(ValueError, match="'rotary' is already registered"):
        register("rotary")(lambda cfg, causal: NoPositions())


def test_a_new_scheme_is_one_registration_line(scratch_registry):
    class Toy(PositionScheme):
        def embeddings(self, length: int, offset: int = 0) -> torch.Tensor:
            return torch.full((length, 2), float(offset))

    register("toy")(lambda cfg, causal: Toy())

    assert "toy" in registered()
    scheme = build_positions("toy", Sizes(), causal=True)
    assert scheme.embeddings(3, offset=5).tolist() == [[5.0, 5.0]] * 3
    assert scheme.attention_bias(2, 2) is None and not scheme.rotary


def test_registrations_in_a_test_do_not_leak():
    assert "toy" not in registered()


def test_a_factory_that_returns_no_scheme_is_refused(scratch_registry):
    register("broken")(lambda cfg, causal: torch.nn.Identity())
    with pytest.raises(TypeError, match="'broken' returned Identity"):
        build_positions("broken", Sizes(), causal=False)


def test_schemes_do_not_import_config_or_model_at_run_time():
    # aiayn.config imports aiayn.nn.positions to validate `positional`: a run-time import
    # back would be a cycle. Imports under `if TYPE_CHECKING:` are for annotations only.
    forbidden = ("aiayn.config", "aiayn.models.encoder_decoder", "aiayn.nn.attention")

    def runtime_imports(node: ast.AST) -> list[str]:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            return [name for child in node.orelse for name in runtime_imports(child)]
        if isinstance(node, ast.ImportFrom):
            return [node.module or ""]
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        return [name for child in ast.iter_child_nodes(node) for name in runtime_imports(child)]

    package = Path(base.__file__).parent
    for path in sorted(package.glob("*.py")):
        imported = runtime_imports(ast.parse(path.read_text()))
        # The plug-in registry lives in aiayn.config since the layout of issue 43 (the bottom
        # package); `import aiayn` loads aiayn.config before any scheme, so no cycle forms.
        imported = [m for m in imported if m != "aiayn.config.plugins"]
        assert not [m for m in imported if m.startswith(forbidden)], path.name


# ----- sinusoidal (section 3.5) --------------------------------------------------------


def test_sinusoids_follow_the_papers_formula():
    d_model = 16
    table = sinusoidal_table(n_positions=40, d_model=d_model)
    assert table.dtype == torch.float32
    for pos in (0, 1, 7, 39):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_halves_layout_puts_the_same_sines_first():
    d_model = 6
    table = sinusoidal_table(n_positions=10, d_model=d_model, halves=True)
    for pos in (0, 3, 9):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, d_model // 2 + i].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_schemes_slice_by_offset_and_save_nothing():
    sizes = Sizes()
    for name, halves in (("sinusoidal", False), ("sinusoidal_halves", True)):
        scheme = build_positions(name, sizes, causal=False)
        assert isinstance(scheme, SinusoidalPositions)
        full = sinusoidal_table(sizes.max_len, sizes.d_model, halves)
        torch.testing.assert_close(scheme.embeddings(3, offset=5), full[5:8], rtol=0, atol=0)
        assert scheme.attention_bias(2, 2) is None and not scheme.rotary
        assert scheme.state_dict() == {}  # a buffer derived from the formula


def test_positions_past_max_len_are_refused():
    scheme = SinusoidalPositions(max_len=10, d_model=4)
    assert scheme.embeddings(10).shape == (10, 4)
    with pytest.raises(ValueError, match=r"max_len=10.*length=3 at offset=8"):
        scheme.embeddings(3, offset=8)


# ----- learned (Table 3, row E) --------------------------------------------------------


def test_learned_positions_are_one_parameter_per_position_and_dimension():
    scheme = build_positions("learned", Sizes(), causal=False)
    assert isinstance(scheme, LearnedPositions)
    assert [name for name, _ in scheme.named_parameters()] == ["weight"]
    assert sum(p.numel() for p in scheme.parameters()) == Sizes.max_len * Sizes.d_model
    torch.testing.assert_close(scheme.embeddings(2, offset=3), scheme.weight[3:5])
    assert scheme.weight.std().item() == pytest.approx(Sizes.d_model**-0.5, rel=0.1)
    with pytest.raises(ValueError, match="max_len=64"):
        scheme.embeddings(2, offset=63)


# ----- none ----------------------------------------------------------------------------


def test_none_adds_no_position_information():
    scheme = build_positions("none", Sizes(), causal=True)
    assert isinstance(scheme, NoPositions)
    x = torch.randn(1, 2, 3, 8)
    assert scheme.embeddings(3) is None
    assert scheme.attention_bias(3, 3) is None
    assert scheme.rotate(x, offset=4) is x
    assert not scheme.rotary and list(scheme.parameters()) == []


# ----- rotary (RoFormer) ---------------------------------------------------------------


def rope_by_complex_numbers(x: torch.Tensor, position: int) -> torch.Tensor:
    """RoFormer's rotation written independently: pair (x_i, x_{i+Dk/2}) as one complex
    number and multiply it by exp(i * position * 10000^(-2i/Dk))."""
    d_k = x.shape[-1]
    half = d_k // 2
    out = []
    for i in range(half):
        z = complex(x[i].item(), x[i + half].item()) * cmath.exp(
            1j * position * 10000 ** (-2 * i / d_k)
        )
        out.append(z)
    return torch.tensor([z.real for z in out] + [z.imag for z in out], dtype=torch.float64)


def test_rotary_matches_complex_multiplication():
    scheme = RotaryPositions(d_k=8, max_len=64)
    x = torch.randn(1, 1, 4, 8)
    rotated = scheme.rotate(x, offset=30)  # positions 30 .. 33
    for row in range(4):
        expected = rope_by_complex_numbers(x[0, 0, row].double(), 30 + row)
        torch.testing.assert_close(rotated[0, 0, row].double(), expected, rtol=0, atol=1e-5)


def test_rotary_keeps_norms():
    scheme = RotaryPositions(d_k=16, max_len=64)
    x = torch.randn(2, 3, 5, 16)
    torch.testing.assert_close(scheme.rotate(x, offset=7).norm(dim=-1), x.norm(dim=-1))


def test_rotary_scores_depend_only_on_the_relative_position():
    scheme = RotaryPositions(d_k=16, max_len=256)
    q, k = torch.randn(2, 16)

    def score(m: int, n: int) -> float:
        q_m = scheme.rotate(q.view(1, 1, 1, 16), offset=m)
        k_n = scheme.rotate(k.view(1, 1, 1, 16), offset=n)
        return (q_m * k_n).sum().item()

    for difference in (0, 3, -5):
        pairs = [(m, m - difference) for m in (10, 37, 120, 200)]
        scores = [score(m, n) for m, n in pairs]
        assert scores == pytest.approx([scores[0]] * len(pairs), abs=1e-5), difference
    assert abs(score(10, 7) - score(10, 5)) > 1e-3  # difference 3 vs 5
    assert abs(score(10, 7) - score(7, 10)) > 1e-3  # difference 3 vs -3


def test_rotary_at_an_offset_equals_slicing_a_longer_rotation():
    scheme = build_positions("rotary", Sizes(), causal=True)
    assert scheme.rotary and scheme.embeddings(4) is None and scheme.attention_bias(4, 4) is None
    x = torch.randn(2, 4, 10, Sizes.d_k)
    torch.testing.assert_close(scheme.rotate(x[:, :, 6:], offset=6), scheme.rotate(x)[:, :, 6:])
    assert scheme.state_dict() == {}


def test_rotary_computes_in_float32_and_returns_the_input_dtype():
    scheme = RotaryPositions(d_k=8, max_len=16)
    x = torch.randn(1, 2, 3, 8).to(torch.bfloat16)
    rotated = scheme.rotate(x, offset=2)
    assert rotated.dtype == torch.bfloat16
    expected = scheme.rotate(x.float(), offset=2).to(torch.bfloat16)
    torch.testing.assert_close(rotated, expected, rtol=0, atol=0)


def test_rotary_refuses_bad_sizes():
    with pytest.raises(ValueError, match="d_k must be even, got 7"):
        RotaryPositions(d_k=7, max_len=16)
    scheme = RotaryPositions(d_k=8, max_len=16)
    with pytest.raises(ValueError, match=r"d_k=8, got x of shape \(1, 1, 2, 6\)"):
        scheme.rotate(torch.zeros(1, 1, 2, 6))
    with pytest.raises(ValueError, match="max_len=16"):
        scheme.rotate(torch.zeros(1, 1, 2, 8), offset=15)


# ----- relative (T5) -------------------------------------------------------------------


def t5_bucket(relative: int, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128):
    """T5's rule from its description: half the buckets per direction if bidirectional;
    distances below half a side's buckets are exact, larger ones logarithmic up to
    max_distance, then all in the last bucket."""
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        if relative > 0:
            bucket = num_buckets
        distance = abs(relative)
    else:
        distance = max(-relative, 0)
    max_exact = num_buckets // 2
    if distance < max_exact:
        return bucket + distance
    log_part = math.log(distance / max_exact) / math.log(max_distance / max_exact)
    return bucket + min(num_buckets - 1, max_exact + int(log_part * (num_buckets - max_exact)))


@pytest.mark.parametrize("bidirectional", [True, False])
def test_bucket_function_follows_t5s_rule(bidirectional):
    relative = torch.arange(-300, 301)
    buckets = relative_position_bucket(relative, bidirectional)
    assert buckets.dtype == torch.long
    assert buckets.tolist() == [t5_bucket(r, bidirectional) for r in relative.tolist()]


def test_bucket_function_at_hand_picked_positions():
    def bucket(r: int, bidirectional: bool) -> int:
        return relative_position_bucket(torch.tensor(r), bidirectional).item()

    # bidirectional: 16 buckets a side, 8 exact; later keys (r > 0) from bucket 16 on
    assert [bucket(r, True) for r in (0, -1, -7, -8, -127, -128, -5000)] == [0, 1, 7, 8, 15, 15, 15]
    assert [bucket(r, True) for r in (1, 7, 8, 5000)] == [17, 23, 24, 31]
    # causal: 32 buckets for earlier keys, 16 exact; later keys all in bucket 0
    assert [bucket(r, False) for r in (5, 0, -15, -16, -127, -128)] == [0, 0, 15, 16, 31, 31]


@pytest.mark.parametrize("causal", [False, True])
def test_relative_bias_looks_up_each_heads_bucket(causal):
    scheme = build_positions("relative", Sizes(), causal=causal)
    assert isinstance(scheme, RelativePositionBias)
    table = scheme.bias.weight  # (buckets, H)
    bias = scheme.attention_bias(5, 5)
    assert bias.shape == (Sizes.n_heads, 5, 5)
    for i, j in [(0, 0), (4, 1), (1, 4), (3, 0)]:
        expected = table[t5_bucket(j - i, bidirectional=not causal)]
        torch.testing.assert_close(bias[:, i, j], expected)


@pytest.mark.parametrize("causal", [False, True])
def test_relative_bias_of_cached_queries_is_the_last_rows_of_the_full_bias(causal):
    scheme = RelativePositionBias(n_heads=3, d_model=16, bidirectional=not causal)
    full = scheme.attention_bias(12, 12)
    torch.testing.assert_close(scheme.attention_bias(4, 12), full[:, 8:], rtol=0, atol=0)
    torch.testing.assert_close(scheme.attention_bias(1, 12), full[:, 11:], rtol=0, atol=0)


def test_relative_bias_init_and_errors():
    scheme = RelativePositionBias(n_heads=64, d_model=16, bidirectional=True)
    assert scheme.bias.weight.std().item() == pytest.approx(16**-0.5, rel=0.1)
    with pytest.raises(ValueError, match="q_len=3, k_len=2"):
        scheme.attention_bias(3, 2)
    with pytest.raises(ValueError, match="num_buckets=3"):
        RelativePositionBias(n_heads=2, d_model=16, bidirectional=True, num_buckets=3)


# ----- ALiBi ---------------------------------------------------------------------------


def test_alibi_slopes_for_a_power_of_two_are_a_geometric_sequence():
    assert alibi_slopes(8) == [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
    assert alibi_slopes(1) == [1 / 256]


def test_alibi_slopes_for_other_head_counts_follow_the_papers_rule():
    # 4 heads' slopes 2^-2, 2^-4, 2^-6, 2^-8, then the first two of 8 heads' every other slope
    assert alibi_slopes(6) == [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]
    # 8 heads' slopes, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 from 16 heads
    odd_halves = [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    assert alibi_slopes(12) == pytest.approx(alibi_slopes(8) + odd_halves, rel=1e-12)
    with pytest.raises(ValueError, match="n_heads=0"):
        alibi_slopes(0)


def test_alibi_bias_by_hand():
    # 2 heads: slopes 2^-4 and 2^-8; row = query position, column = key position
    causal = ALiBiPositions(n_heads=2, causal=True).attention_bias(3, 3)
    distances_before = torch.tensor([[0.0, 0, 0], [1, 0, 0], [2, 1, 0]])
    torch.testing.assert_close(
        causal, -torch.stack([distances_before / 16, distances_before / 256])
    )
    symmetric = ALiBiPositions(n_heads=2, causal=False).attention_bias(3, 3)
    distances = torch.tensor([[0.0, 1, 2], [1, 0, 1], [2, 1, 0]])
    torch.testing.assert_close(symmetric, -torch.stack([distances / 16, distances / 256]))


@pytest.mark.parametrize("causal", [False, True])
def test_alibi_bias_of_cached_queries_is_the_last_rows_of_the_full_bias(causal):
    scheme = build_positions("alibi", Sizes(), causal=causal)
    assert list(scheme.parameters()) == [] and scheme.state_dict() == {}
    assert scheme.embeddings(3) is None and not scheme.rotary
    full = scheme.attention_bias(9, 9)
    assert full.shape == (Sizes.n_heads, 9, 9)
    torch.testing.assert_close(scheme.attention_bias(3, 9), full[:, 6:], rtol=0, atol=0)


# ----- The docs' "Extend aiayn" example (docs/how-to/extend.md), run as written ----------


def test_docs_example_scheme_trains_decodes_with_a_cache_and_freezes(scratch_registry):
    import re
    from pathlib import Path

    from aiayn import ModelConfig, Transformer, freeze
    from aiayn.inference.decoding import new_cache

    page = (Path(__file__).parents[2] / "docs" / "how-to" / "extend.md").read_text(encoding="utf-8")
    (code,) = re.findall(
        r"```python\n(# src/aiayn/nn/positions/previous_token.py\n.*?)```", page, re.S
    )
    exec(compile(code, "docs/how-to/extend.md", "exec"), {})  # registers "previous_token"
    model = Transformer(ModelConfig.tiny(vocab_size=30, positional="previous_token")).eval()
    bonus = model.decoder.embedding.positions.bonus
    with torch.no_grad():
        bonus.fill_(3.0)
    src, tgt = torch.randint(3, 30, (2, 6)), torch.randint(3, 30, (2, 5))
    with torch.no_grad():
        full = model(src, tgt)
        encoded, cache = model.encode(src), new_cache(model)
        steps = [model.decode(tgt[:, t : t + 1], encoded, cache) for t in range(5)]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(freeze(model)(src, tgt), full, rtol=1e-5, atol=1e-5)
        bonus.zero_()
        assert not torch.allclose(model(src, tgt), full)  # the bias took part
