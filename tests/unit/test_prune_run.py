"""`aiayn.analysis.pruning.prune_run`: all of `aiayn prune`, callable from Python (issue 28
part 4), writing what the command writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_pruning import write_heads_json
from typer.testing import CliRunner

from aiayn.analysis.pruning import PrunedRun, parse_heads, prune_run
from aiayn.cli import app
from aiayn.io.checkpoint import load_model, resolve_weights
from aiayn.models.encoder_decoder import attention_sublayers
from infer_helpers import make_run


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("prune-run"))


def test_prune_run_returns_what_it_wrote(run: Path, tmp_path: Path) -> None:
    model = load_model(resolve_weights(run))
    sublayers = attention_sublayers(model)
    done = prune_run(run, tmp_path / "p", heads=["encoder.0.self:1,3", "decoder.1.cross:0"])
    pruned = load_model(tmp_path / "p" / "model.safetensors")
    assert done == PrunedRun(
        out=tmp_path / "p",
        removed={"encoder.0.self": [1, 3], "decoder.1.cross": [0]},
        removed_by_kind={"encoder.self": 2, "decoder.self": 0, "decoder.cross": 1},
        heads_before=sum(module.n_heads for module in sublayers.values()),
        parameters_before=model.num_parameters(),
        parameters_after=pruned.num_parameters(),
        architecture=model.cfg.architecture,
    )
    record = json.loads((tmp_path / "p" / "pruning.json").read_text())
    assert record["heads"] == ["encoder.0.self:1,3", "decoder.1.cross:0"]
    assert record["removed"] == done.removed


def test_prune_run_reads_the_runs_own_scores_by_default(run: Path, tmp_path: Path) -> None:
    """With neither --scores nor scores=: RUN/heads/heads.json, as the command reads it."""
    model = load_model(resolve_weights(run))
    scores = {name: [0.5, 0.4, 0.3, 0.2] for name in attention_sublayers(model)}
    scores["decoder.1.cross"] = [0.0, 0.1, 0.9, 0.9]
    copy = tmp_path / "run"
    copy.mkdir()
    for path in run.rglob("*"):
        target = copy / path.relative_to(run)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.write_bytes(path.read_bytes())
    write_heads_json(copy / "heads" / "heads.json", scores)
    done = prune_run(copy, tmp_path / "lib", fraction=0.1)
    assert done.removed == {"decoder.1.cross": [0, 1]}
    result = CliRunner().invoke(
        app, ["prune", str(copy), "--out", str(tmp_path / "cli"), "--fraction", "0.1"]
    )
    assert result.exit_code == 0, result.output
    lib, cli = (json.loads((tmp_path / d / "pruning.json").read_text()) for d in ("lib", "cli"))
    assert lib == cli


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "give either --heads"),
        ({"heads": ["encoder.0.self:1"], "fraction": 0.5}, "give either --heads"),
        ({"heads": ["encoder.0.self:1"], "seed": 3}, "go with --fraction"),
        ({"fraction": 1.5}, "got 1.5"),
        ({"fraction": 0.5, "by": "sideways"}, "--by must be one of importance, random"),
        ({"heads": ["encoder"]}, "expected SUBLAYER:HEAD"),
    ],
)
def test_prune_run_refuses_by_name_and_writes_nothing(run, tmp_path, options, message) -> None:
    with pytest.raises(ValueError, match=message):
        prune_run(run, tmp_path / "p", **options)
    assert not (tmp_path / "p").exists()
    (tmp_path / "p").mkdir()
    with pytest.raises(FileExistsError, match="exists; name a new directory"):
        prune_run(run, tmp_path / "p", fraction=0.5, by="random")


def test_parse_heads_merges_per_sub_layer() -> None:
    values = ["encoder.0.self:1,3", "decoder.1.cross:0", "encoder.0.self:2"]
    assert parse_heads(values) == {"encoder.0.self": [1, 3, 2], "decoder.1.cross": [0]}
