"""aiayn.inference.decoding and aiayn.inference.kv_cache: the decoding state lives in
inference/, and the models in models/ and the blocks in nn/ know nothing of it.

`start(model, src, beam)` is what the search runs; `new_cache(model)` the stores a
model decodes with, by the kind each layer's kernel keeps. Greedy decoding through
them is checked against the model run on the whole prefix at every step.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from aiayn import ModelConfig, build_model, freeze
from aiayn.inference.decoding import (
    DecoderOnlyDecoding,
    EncoderDecoderDecoding,
    new_cache,
    start,
)
from aiayn.inference.kv_cache import LayerKV
from aiayn.models.encoder_decoder import normal_initialisation
from aiayn.nn.kernels.linear import LinearAttentionState
from aiayn.nn.kernels.sdpa import SdpaKernel

VOCAB = 40
SRC = Path(__file__).resolve().parents[2] / "src" / "aiayn"
SETTINGS = dict(d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=32, dropout=0.0)


def small(architecture: str, std: float | None = 0.3, **overrides) -> torch.nn.Module:
    """A tiny model of `architecture`, its weights from N(0, `std`) (large, for varied
    outputs), or from its own initialisation with `std` None."""
    preset = {
        "encoder_decoder": ModelConfig.tiny,
        "decoder_only": ModelConfig.gpt,
        "prefix_lm": ModelConfig.gpt,
        "encoder_only": ModelConfig.bert,
    }[architecture]
    cfg = preset(VOCAB, **{**SETTINGS, "architecture": architecture, **overrides})
    model = build_model(cfg).eval()
    if std is not None:
        normal_initialisation(model, std=std)
    return model


# ----- (a) what start takes and refuses ---------------------------------------------


def test_start_refuses_an_encoder_only_model_by_its_class_name():
    model = small("encoder_only")
    with pytest.raises(ValueError, match=r"^EncoderOnly cannot be decoded"):
        start(model, torch.randint(3, VOCAB, (2, 5)))
    with pytest.raises(ValueError, match=r"^EncoderOnly has no decoder"):
        new_cache(model)


@pytest.mark.parametrize(
    ("architecture", "frozen", "expected"),
    [
        ("encoder_decoder", False, EncoderDecoderDecoding),
        ("encoder_decoder", True, EncoderDecoderDecoding),
        ("decoder_only", False, DecoderOnlyDecoding),
        ("decoder_only", True, DecoderOnlyDecoding),
        ("prefix_lm", False, DecoderOnlyDecoding),
    ],
)
def test_start_picks_the_state_by_the_model_shape(architecture, frozen, expected):
    model = small(architecture)
    model = freeze(model) if frozen else model
    with torch.no_grad():
        state = start(model, torch.randint(3, VOCAB, (2, 5)), beam=3)
    assert type(state) is expected
    assert state.model is model
    assert state.input_lengths.tolist() == [5, 5]


def test_start_asks_a_model_that_has_its_own():
    class OwnStart:
        cfg = ModelConfig.tiny(VOCAB)
        asked = None

        def start(self, src, beam=1):
            self.asked = (src, beam)
            return "its own state"

    model, src = OwnStart(), torch.ones(1, 2, dtype=torch.long)
    assert start(model, src, beam=4) == "its own state"
    assert model.asked == (src, 4)


def test_beams_share_the_source_rows_only_in_the_frozen_encoder_decoder():
    model = small("encoder_decoder")
    src = torch.randint(3, VOCAB, (2, 5))
    with torch.no_grad():
        literal, fast = start(model, src, beam=3), start(freeze(model), src, beam=3)
    assert (literal.shared, literal.encoded.hidden.size(0)) == (False, 6)
    assert (fast.shared, fast.encoded.hidden.size(0)) == (True, 2)
    assert [store.group for store in fast.cache.cross_attention] == [3, 3]


# ----- (b) new_cache: each layer's store is of the kind its kernel keeps -------------


@pytest.mark.parametrize("architecture", ["encoder_decoder", "decoder_only"])
@pytest.mark.parametrize("frozen", [False, True])
def test_new_cache_holds_the_linear_kernels_own_state(architecture, frozen):
    model = small(architecture, attention="linear", n_kv_heads=2)
    cache = new_cache(freeze(model) if frozen else model)
    assert len(cache.self_attention) == 2
    assert all(type(store) is LinearAttentionState for store in cache.self_attention)
    assert len({id(store) for store in cache.self_attention}) == 2  # one each
    cross = cache.cross_attention
    if architecture == "encoder_decoder":  # cross-attention is dense: keys and values
        assert len(cross) == 2 and all(type(s) is LayerKV and s.static for s in cross)
    else:
        assert cross == []


@pytest.mark.parametrize(
    ("architecture", "frozen"),
    [
        ("encoder_decoder", False),
        ("encoder_decoder", True),
        ("decoder_only", False),
        ("decoder_only", True),
        ("prefix_lm", False),  # it has no frozen form
    ],
)
def test_new_cache_of_an_sdpa_model_holds_growing_key_value_stores(architecture, frozen):
    model = small(architecture)
    cache = new_cache(freeze(model) if frozen else model, group=2)
    assert len(cache.self_attention) == 2 and cache.length == 0
    assert all(type(s) is LayerKV and not s.static for s in cache.self_attention)
    expected_cross = 2 if architecture == "encoder_decoder" else 0
    assert len(cache.cross_attention) == expected_cross
    assert all(s.static and s.group == 2 for s in cache.cross_attention)


def test_a_key_value_kernel_makes_no_store_of_its_own():
    with pytest.raises(NotImplementedError, match=r"^SdpaKernel makes no decoding store"):
        SdpaKernel().new_cache()


# ----- (c) greedy decoding through start = the whole prefix through the model ---------


def greedy_through_the_state(model, src: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy decoding as the search runs it: bos first, one token per row per step."""
    state = start(model, src)
    last = torch.full((src.size(0),), model.cfg.bos_id)
    found = []
    for _ in range(steps):
        last = state.step(last).argmax(dim=-1)
        found.append(last)
    return torch.stack(found, dim=1)  # (B, steps)


def encoder_decoder_by_hand(model, src: torch.Tensor, steps: int) -> torch.Tensor:
    """No cache: the whole target prefix through the model at every step."""
    tgt = torch.full((src.size(0), 1), model.cfg.bos_id)
    for _ in range(steps):
        next_ids = model(src, tgt)[:, -1].argmax(dim=-1)  # (B,)
        tgt = torch.cat([tgt, next_ids[:, None]], dim=1)
    return tgt[:, 1:]


def decoder_only_by_hand(model, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    """No cache: the prompt and every token so far through the model at every step."""
    ids = prompt
    for _ in range(steps):
        next_ids = model(ids)[:, -1].argmax(dim=-1)  # (B,)
        ids = torch.cat([ids, next_ids[:, None]], dim=1)
    return ids[:, prompt.size(1) :]


@pytest.mark.parametrize("frozen", [False, True])
def test_greedy_encoder_decoder_decoding_equals_the_full_pass_argmax(frozen):
    torch.manual_seed(0)
    model = small("encoder_decoder", std=None)  # its own: N(0, 0.3) repeats one token
    src = torch.randint(3, VOCAB, (3, 6))
    src[1, 4:] = model.cfg.pad_id  # a padded source row
    with torch.no_grad():
        found = greedy_through_the_state(freeze(model) if frozen else model, src, steps=8)
        expected = encoder_decoder_by_hand(model, src, steps=8)
    assert torch.equal(found, expected)
    assert len(set(expected.flatten().tolist())) > 3  # varied, so a wrong step shows
    assert all(len(set(row)) > 1 for row in expected.tolist())  # and along each row


@pytest.mark.parametrize(
    ("architecture", "frozen"),
    [("decoder_only", False), ("decoder_only", True), ("prefix_lm", False)],
)
def test_greedy_decoder_only_decoding_equals_the_full_pass_argmax(architecture, frozen):
    torch.manual_seed(0)
    model = small(architecture, tie_output=False)  # tied, it repeats its input token
    prompt = torch.randint(3, VOCAB, (3, 5))
    if architecture == "prefix_lm":  # source + separator: the prefix sees itself both ways
        prompt[:, -1] = model.cfg.bos_id
    with torch.no_grad():
        found = greedy_through_the_state(freeze(model) if frozen else model, prompt, steps=8)
        expected = decoder_only_by_hand(model, prompt, steps=8)
    assert torch.equal(found, expected)
    assert len(set(expected.flatten().tolist())) > 3
    assert all(len(set(row)) > 1 for row in expected.tolist())


# ----- (d) nn/ and models/ hold no decoding state -------------------------------------


def _definitions_and_imports(path: Path) -> tuple[set[str], set[str]]:
    """The names of the functions a module defines (methods included) and the modules
    (and `from` names) it imports, read from its text."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    defined, imported = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            defined.add(node.name)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
            imported.update(f"{node.module}.{alias.name}" for alias in node.names)
    return defined, imported


def test_no_model_or_block_defines_decoding_state_or_imports_the_cache():
    found = []
    for package in ("nn", "models"):
        for path in sorted((SRC / package).rglob("*.py")):
            name = path.relative_to(SRC).as_posix()
            defined, imported = _definitions_and_imports(path)
            # A kernel that keeps a state of its own makes it (`Kernel.new_cache`); no
            # other module of nn/ or models/ makes a store.
            own_state = name.startswith("nn/kernels/")
            for function in sorted(defined & {"start", "new_cache"}):
                if not (function == "new_cache" and own_state):
                    found.append(f"{name} defines {function}")
            found += [f"{name} imports {m}" for m in sorted(imported) if "kv_cache" in m]
    assert found == []


def test_the_check_above_reads_what_it_should(tmp_path):
    """The reader finds a method and an import of the cache (the check can fail)."""
    module = tmp_path / "m.py"
    module.write_text(
        "from aiayn.inference import kv_cache\nclass M:\n    def start(self, src, beam=1): ...\n"
    )
    defined, imported = _definitions_and_imports(module)
    assert "start" in defined and "aiayn.inference.kv_cache" in imported
