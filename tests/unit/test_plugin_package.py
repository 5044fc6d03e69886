"""A plug-in package from outside aiayn (tests/plugin_package: its own pyproject.toml and
entry points), installed at test time: its dense kernel and its position scheme reach
training, cached decoding, freeze, the static and compiled step, the continuous engine
and export, with no edit to aiayn."""

from __future__ import annotations

import functools
import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn import ModelConfig, build_model, freeze
from aiayn.inference.decoding import start
from aiayn.inference.engine import Engine
from aiayn.inference.search import DecodeConfig, search
from aiayn.inference.static_step import StaticStep
from aiayn.models.encoder_decoder import normal_initialisation
from aiayn.nn.kernels import KERNELS
from aiayn.nn.kernels.sdpa import attend
from aiayn.nn.positions import POSITIONS

PACKAGE = Path(__file__).parents[1] / "plugin_package"
VOCAB = 40
SIZES = dict(d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=2, max_len=16, dropout=0.0)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The package installed into a folder of its own, which is put on sys.path; the
    registries then find its entry points as they would a pip-installed package's."""
    work = tmp_path_factory.mktemp("plugin")
    source, target = work / "source", work / "site"
    shutil.copytree(PACKAGE, source)  # setuptools builds in the source tree: not ours
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", "--target", str(target), str(source)],
        check=True, capture_output=True,
    )  # fmt: skip
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    KERNELS.refresh()
    POSITIONS.refresh()
    yield target
    KERNELS.unregister("plain_softmax")
    POSITIONS.unregister("log_distance")
    sys.path.remove(str(target))


def model_of(architecture: str, seed: int = 0, **overrides) -> torch.nn.Module:
    preset = ModelConfig.tiny if architecture == "encoder_decoder" else ModelConfig.gpt
    cfg = preset(VOCAB, **{**SIZES, "architecture": architecture, **overrides})
    torch.manual_seed(seed)
    model = build_model(cfg).eval()
    normal_initialisation(model, std=0.3)
    return model


def plugged(architecture: str = "encoder_decoder", **overrides) -> torch.nn.Module:
    """A model on the package's kernel and position scheme."""
    return model_of(architecture, attention="plain_softmax", positional="log_distance",
                    position_options={"scale": 2.0}, **overrides)  # fmt: skip


def sources(batch: int = 3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(3, VOCAB, (batch, 7), generator=generator)
    src[:, -1] = 2
    src[1, 4], src[1, 5:] = 2, 0
    return src


def test_the_package_registers_through_entry_points_only(installed):
    files = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*") if p.is_file())
    assert files == [
        "aiayn_fixture_plugins/__init__.py", "aiayn_fixture_plugins/kernel.py",
        "aiayn_fixture_plugins/positions.py", "pyproject.toml",
    ]  # fmt: skip
    kernel = KERNELS.get("plain_softmax")
    assert kernel.__module__ == "aiayn_fixture_plugins.kernel"
    assert (installed / "aiayn_fixture_plugins" / "kernel.py").exists()
    assert kernel.capabilities()["static_step"] and kernel.capabilities()["exact_in_hf"]
    assert POSITIONS.get("log_distance").options == ("scale",)


def test_its_kernel_is_softmax_attention(installed):
    kernel = KERNELS.get("plain_softmax")()
    q, bias = torch.randn(2, 4, 3, 8), torch.randn(4, 3, 6)
    k, v = torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    mask = torch.rand(2, 1, 3, 6) > 0.3
    mask[0, 0, 1] = False  # a query with no key: zeros
    for causal in (False, True):
        out, weights = kernel(q, k, v, mask, causal, 0.0, True, bias)
        expected, expected_weights = attend(q, k, v, mask, causal, 0.0, True, bias)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)


def test_training_gives_the_gradients_of_the_same_model_on_the_explicit_kernel(installed):
    model = plugged().train()
    twin = model_of("encoder_decoder", attention="explicit", positional="log_distance",
                    position_options={"scale": 2.0}).train()  # fmt: skip
    twin.load_state_dict(model.state_dict())
    src, tgt = sources(), torch.randint(3, VOCAB, (3, 6))
    for each in (model, twin):
        torch.nn.functional.cross_entropy(each(src, tgt).flatten(0, 1), tgt.flatten()).backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_cached_frozen_static_and_engine_decoding_equal_the_full_pass(installed):
    model = plugged()
    src = sources()
    tgt = torch.randint(3, VOCAB, (3, 6))
    tgt[:, 0] = model.cfg.bos_id
    with torch.no_grad():
        expected = model(src, tgt)  # (B, T, V), no cache
        torch.testing.assert_close(freeze(model)(src, tgt), expected, atol=1e-5, rtol=1e-5)
        cached = start(model, src)
        step = StaticStep(freeze(model), slots=3)
        step.load_source(torch.arange(3), src)
        for t in range(tgt.size(1)):
            torch.testing.assert_close(cached.step(tgt[:, t]), expected[:, t], atol=1e-5, rtol=1e-5)
            logits = step.logits(tgt[:, t], torch.full((3,), t))
            torch.testing.assert_close(logits, expected[:, t], atol=1e-5, rtol=1e-5)
        config = DecodeConfig(beam=2, extra_len=5)
        done = Engine(model, config, sentences=2).run(src.tolist())
        engine = {d.request: [h.tokens for h in d.hypotheses] for d in done}
        searched = search(model, src, config)
    assert engine == {i: [h.tokens for h in hypotheses] for i, hypotheses in enumerate(searched)}


def test_the_compiled_step_equals_the_eager_one(installed, monkeypatch):
    # TorchDynamo traces the step, the kernel's einsums included, through AOTAutograd;
    # Inductor's code generation (a minute on the CPU) is tests/unit/test_static_step.py's
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    model = plugged("decoder_only", n_layers=1)
    prompt = torch.randint(3, VOCAB, (2, 3))
    eager, compiled = (StaticStep(model, slots=2, max_target=8) for _ in range(2))
    compiled.compile(log_probs=False)
    assert compiled.compile_seconds is not None
    for step in (eager, compiled):
        step.load_prompt(torch.arange(2), prompt)
    for t in range(3, 6):
        tokens = torch.randint(3, VOCAB, (2,))
        positions = torch.full((2,), t)
        torch.testing.assert_close(
            compiled.logits(tokens, positions), eager.logits(tokens, positions),
            atol=1e-5, rtol=1e-5,
        )  # fmt: skip


def test_a_model_on_its_kernel_exports_and_transformers_computes_the_same(installed, tmp_path):
    transformers = pytest.importorskip("transformers")
    from aiayn.data.tokenizer import train_tokenizer
    from aiayn.io.export import export_hf
    from infer_helpers import sentences

    spm = tmp_path / "spm.model"
    train_tokenizer(sentences(200), spm, vocab_size=VOCAB)
    model = model_of("decoder_only", attention="plain_softmax", n_kv_heads=4)
    out = export_hf(model, tmp_path / "hf", spm=spm)
    hf = transformers.GPT2LMHeadModel.from_pretrained(out, local_files_only=True).eval()
    ids = torch.randint(3, VOCAB, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-4, rtol=1e-4)


def test_the_extension_how_to_shows_the_package_as_it_is():
    page = (PACKAGE.parents[1] / "docs" / "how-to" / "extend.md").read_text(encoding="utf-8")
    for name in ("kernel.py", "positions.py"):
        path = f"aiayn_fixture_plugins/{name}"
        (shown,) = re.findall(rf"```python\n# tests/plugin_package/{path}\n(.*?)```", page, re.S)
        assert shown == (PACKAGE / path).read_text(encoding="utf-8")
    (entry_points,) = re.findall(r"```toml\n(.*?)```", page, re.S)
    assert entry_points in (PACKAGE / "pyproject.toml").read_text(encoding="utf-8")
    files = sum(1 for p in PACKAGE.rglob("*") if p.is_file())
    assert f"in\n{['', 'one', 'two', 'three', 'four', 'five'][files]} files" in page
