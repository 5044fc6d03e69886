"""Attention maps and their heat maps: rows sum to 1, one panel per layer and head."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import pytest
import torch
from typer.testing import CliRunner

from aiayn.analysis.viz import AttentionKind, plot_attention, translation_attention
from aiayn.apps.translate import Translator
from aiayn.cli import app
from infer_helpers import make_run


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("viz"), max_len=12)  # short outputs: small PNGs


@pytest.fixture(scope="module")
def translator(run: Path) -> Translator:
    return Translator.load(run)


def test_every_attention_row_sums_to_one(translator: Translator) -> None:
    maps, src_pieces, tgt_pieces = translation_attention(translator, "house by the river.")
    cfg = translator.model.cfg
    for kind, weights, shape in (
        ("encoder", maps.encoder, (len(src_pieces), len(src_pieces))),
        ("decoder", maps.decoder, (len(tgt_pieces), len(tgt_pieces))),
        ("cross", maps.cross, (len(tgt_pieces), len(src_pieces))),
    ):
        assert len(weights) == cfg.n_layers, kind
        for w in weights:
            assert w.shape == (1, cfg.n_heads, *shape), kind
            assert torch.allclose(w.sum(-1), torch.ones(()), atol=1e-5), kind
    assert torch.all(maps.decoder[0][0].triu(diagonal=1) == 0)  # causal
    assert src_pieces[-1] == "</s>" and tgt_pieces[0] == "<s>"


def test_grid_has_a_panel_per_layer_and_head(translator: Translator) -> None:
    maps, src_pieces, _ = translation_attention(translator, "garden light.")
    cfg = translator.model.cfg
    fig = plot_attention(maps.encoder, src_pieces, src_pieces, "encoder")
    assert len(fig.axes) == cfg.n_layers * cfg.n_heads
    fig = plot_attention(maps.encoder, src_pieces, src_pieces, "encoder", layers=[1], heads=[0, 3])
    assert [ax.get_title() for ax in fig.axes] == ["layer 1 head 0", "layer 1 head 3"]
    with pytest.raises(ValueError, match="head"):
        plot_attention(maps.encoder, src_pieces, src_pieces, "encoder", heads=[9])


def test_cli_attention_writes_pngs(tmp_path: Path, run: Path, translator: Translator) -> None:
    cfg = translator.model.cfg
    result = CliRunner().invoke(
        app, ["attention", str(run), "water night.", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    sizes = {}
    for kind in AttentionKind:
        image = matplotlib.image.imread(tmp_path / f"{kind.value}.png")
        sizes[kind] = image.shape[:2]
    # Panels are square and equal, so the image's aspect ratio is layers : heads.
    height, width = sizes[AttentionKind.ENCODER]
    assert width / height == pytest.approx(cfg.n_heads / cfg.n_layers, rel=0.02)

    one = CliRunner().invoke(
        app, ["attention", str(run), "water.", "--out", str(tmp_path / "one"), "--layer", "0"]
    )
    assert one.exit_code == 0, one.output
    height, width = matplotlib.image.imread(tmp_path / "one" / "cross.png").shape[:2]
    assert width / height == pytest.approx(cfg.n_heads, rel=0.02)

    bad_args = ["attention", str(run), "water.", "--out", str(tmp_path / "bad"), "--layer", "7"]
    bad = CliRunner().invoke(app, bad_args)
    assert bad.exit_code == 1 and "layer [7] out of range" in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_grid_draws_weights_that_still_carry_gradients() -> None:
    """Maps taken outside no_grad (tutorial 7 computes them so) draw as they are."""
    weights = torch.softmax(torch.randn(1, 2, 3, 3, requires_grad=True), -1)
    fig = plot_attention([weights], ["a", "b", "c"], ["a", "b", "c"], "encoder")
    assert len(fig.axes) == 2
