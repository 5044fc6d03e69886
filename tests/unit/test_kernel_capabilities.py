"""What a kernel declares is what the rest of aiayn reads (the static step, export, the
config's checks), and each plug-in owns its settings: the sliding window's options, with
the old keys still read from saved runs and recipes."""

from __future__ import annotations

import importlib.metadata
import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from aiayn import ModelConfig, build_model
from aiayn.config.plugins import Registry, UnknownPlugin
from aiayn.inference.static_step import StaticStep
from aiayn.io.checkpoint import CONFIG_KEY, load_model, save_model
from aiayn.io.export.targets import ExportError, hf_target
from aiayn.nn.kernels import KERNELS, Kernel
from aiayn.nn.kernels.sdpa import attend
from aiayn.nn.kernels.sliding_window import SlidingWindowKernel, band_mask
from aiayn.training.recipe import recipe_from_dict


class _Formula(Kernel):
    """softmax(Q K^T / sqrt(d_k) + bias) V, through `attend`'s explicit path."""

    def __call__(self, q, k, v, mask=None, causal=False, dropout_p=0.0, need_weights=False,
                 bias=None):  # fmt: skip
        out, weights = attend(q, k, v, mask, causal, dropout_p, True, bias)
        return out, weights if need_weights else None


@pytest.fixture
def declared():
    """Two test kernels with the same math: one declares all it supports, one nothing."""

    class Declared(_Formula):
        dense_softmax = exact_in_hf = static_step = True

    KERNELS.add("test_declared", Declared)
    KERNELS.add("test_undeclared", _Formula)
    yield
    KERNELS.unregister("test_declared")
    KERNELS.unregister("test_undeclared")


def test_the_dense_kernels_declare_what_they_support_and_the_others_do_not():
    dense = {name for name, kind in KERNELS.items() if kind.capabilities()["dense_softmax"]}
    assert {"sdpa", "explicit"} <= dense
    assert not dense & {"sliding_window", "linear", "performer", "bigbird"}
    for name in ("sdpa", "explicit"):
        assert KERNELS.get(name).capabilities() == {
            "dense_softmax": True, "exact_in_hf": True, "static_step": True,
            "has_causal": True, "takes_bias": True, "takes_full_mask": True,
            "full_scores": True,
        }  # fmt: skip
    assert not KERNELS.get("bigbird").has_causal


def test_the_static_step_and_export_read_the_declarations(declared):
    gpt = dict(d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=16, dropout=0.0)
    model = build_model(ModelConfig.gpt(40, attention="test_declared", **gpt)).eval()
    StaticStep(model, slots=2)  # accepted: it declares static_step
    assert hf_target(model.cfg) == "gpt2"
    refused = build_model(ModelConfig.gpt(40, attention="test_undeclared", **gpt)).eval()
    with pytest.raises(ValueError, match=r"_Formula, which does not declare static_step.*sdpa"):
        StaticStep(refused, slots=2)
    with pytest.raises(ExportError, match=r"test_undeclared \(it does not declare exact_in_hf\)"):
        hf_target(refused.cfg)


def test_the_old_enum_still_imports_with_a_warning():
    with pytest.warns(DeprecationWarning, match="AttentionKernel is deprecated"):
        from aiayn import AttentionKernel
    assert [kind.value for kind in AttentionKernel] == ["sdpa", "explicit", "sliding_window"]
    cfg = ModelConfig.tiny(40, attention=AttentionKernel.EXPLICIT)
    assert cfg.attention == "explicit" and type(cfg.attention) is str


def test_a_plugin_that_failed_to_load_is_named_in_the_refusal(monkeypatch):
    broken = importlib.metadata.EntryPoint("wavelet", "no_such_package_43.kernel", "aiayn.t43")
    real = importlib.metadata.entry_points

    def entry_points(group):
        return [broken] if group == "aiayn.t43" else real(group=group)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    registry = Registry("widget", "aiayn.nn.positions", "aiayn.t43")
    with pytest.raises(UnknownPlugin) as refused:
        registry.get("wavelet")
    message = str(refused.value)
    assert "unknown widget 'wavelet'" in message
    assert "plug-in wavelet failed to load: no_such_package_43.kernel (ModuleNotFoundError" in (
        message
    )


def test_the_sliding_windows_settings_are_its_options():
    cfg = ModelConfig.tiny(40, attention="sliding_window",
                           attention_options={"window": 3, "global_tokens": 1})  # fmt: skip
    kernel = build_model(cfg).encoder.layers[0].self_attn.kernel
    assert (kernel.window, kernel.n_global) == (3, 1)
    q, k, v = torch.randn(3, 1, 2, 9, 8).unbind(0)
    expected, _ = attend(q, k, v, band_mask(9, 9, 3, False, 1, q.device))
    torch.testing.assert_close(kernel(q, k, v)[0], expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="sliding_window's window must be an integer >= 1, got 0"):
        build_model(
            ModelConfig.tiny(40, attention="sliding_window", attention_options={"window": 0})
        )
    with pytest.raises(ValueError, match="kernel 'sliding_window' takes no option 'width'"):
        ModelConfig.tiny(40, attention="sliding_window", attention_options={"width": 3})
    assert SlidingWindowKernel.from_config(cfg).window == 256  # its own default


def _old_format(cfg: ModelConfig, window: int, global_tokens: int) -> dict:
    """The config as a run saved before the options moved wrote it: the two fields beside
    the others (every run had them, whatever its kernel)."""
    values = cfg.to_dict()
    assert "attention_window" not in values and "global_tokens" not in values
    return {**values, "attention_window": window, "global_tokens": global_tokens}


def test_a_checkpoint_saved_with_the_old_keys_loads(tmp_path):
    cfg = ModelConfig.tiny(40, attention="sliding_window",
                           attention_options={"window": 5, "global_tokens": 2})  # fmt: skip
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    path = save_model(model, tmp_path / "model.safetensors")
    tensors = load_file(str(path))
    with open(path, "rb") as f:  # safetensors: 8-byte length, then the JSON header
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    metadata = header["__metadata__"]
    old = _old_format(ModelConfig.tiny(40, attention="sliding_window"), 5, 2)
    metadata[CONFIG_KEY] = json.dumps(old)
    save_file(tensors, str(path), metadata=metadata)
    loaded = load_model(path).eval()
    assert dict(loaded.cfg.attention_options) == {"window": 5, "global_tokens": 2}
    assert loaded.cfg == cfg
    src = torch.randint(3, 40, (2, 12))
    tgt = torch.randint(3, 40, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(loaded(src, tgt), model(src, tgt), atol=0, rtol=0)


def test_old_keys_are_read_from_a_recipe_and_ignored_by_other_kernels():
    values = {"data": {"corpus": "/c"}, "train": {"max_steps": 1},
              "model": {"preset": "tiny", "attention": "sliding_window"}}  # fmt: skip
    recipe = recipe_from_dict(values, ["model.attention_window=7", "model.global_tokens=1"])
    cfg = recipe.model_config(40, 0, 1, 2)
    assert dict(cfg.attention_options) == {"window": 7, "global_tokens": 1}
    without_preset = {**values, "model": {"attention": "sliding_window", "attention_window": 9}}
    assert dict(recipe_from_dict(without_preset).model_config(40, 0, 1, 2).attention_options) == {
        "window": 9
    }
    old = _old_format(ModelConfig.tiny(40), 256, 0)  # an sdpa run saved before
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ModelConfig.from_dict(old) == ModelConfig.tiny(40)
    with pytest.raises(ValueError, match="attention_window is the old spelling of"):
        ModelConfig.tiny(40, attention="sliding_window", attention_window=3,
                         attention_options={"window": 3})  # fmt: skip
