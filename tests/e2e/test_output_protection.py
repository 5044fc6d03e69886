"""Issue 42: one protected-paths rule for every writer, and the classes of fault it closes.

Every writer (export, convert, prepare text / lm text, translate -o, patch, lens,
induction, align) is given, in turn, an output that is:

- inside a run it reads (an older checkpoint of it; a file inside it for translate -o),
- the parent of that run or corpus,
- the input's own place (the run, the corpus whose files are read; the input file
  itself for translate -o),
- a symbolic link pointing into the run,
- a FIFO,
- /dev/full;

with --force wherever the command has it. Each is refused in one line (exit 1), except
a FIFO or /dev/full given to translate -o, which is written through as a shell's `>`
would (the bytes arrive; /dev/full reports the full disk); and nothing that was there
changes, byte for byte (`aiayn.data.files.check_output`, `aiayn.data.files.write_fresh_dir`).

Then one test per class of the issue: a run's own files replaced by export; prepare
writing over an existing corpus without --force, or leaving a partial OUT when refused;
NaN in patching.json and lens.json; non-finite weights exported or converted silently;
misleading messages (no spm.model, a 255-character OUT, prepare's "error:").
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from test_output_safety import _digest, _drained
from typer.testing import CliRunner

import aiayn.data.files as files
from aiayn.cli import app
from infer_helpers import shape_runs
from train_helpers import make_corpus

transformers = pytest.importorskip("transformers")  # convert's source is built by it
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

STEP1, STEP2 = "step-00000001", "step-00000002"


def _strict(text: str):
    """JSON as the standard has it: a bare NaN or Infinity is an error."""

    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _older_checkpoint(run: Path) -> None:
    """Give `run` two step checkpoints: the newest (read by default) and an older one."""
    checkpoints = run / "checkpoints"
    os.replace(checkpoints / STEP1, checkpoints / STEP2)
    shutil.copytree(checkpoints / STEP2, checkpoints / STEP1)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """A translation run and a GPT run (two checkpoints each), a prepared corpus and a
    GPT-2 directory as transformers saves it."""
    from test_hf_models import gpt2_directory

    root = tmp_path_factory.mktemp("protection")
    runs = shape_runs(root / "runs")
    for name in ("mt", "gpt"):
        _older_checkpoint(runs[name])
    corpus = make_corpus(root / "corpus", train_pairs=60)
    (corpus / "sub").mkdir()
    hf = root / "gpt2-hf"
    hf.mkdir()
    gpt2_directory(hf)
    (hf / "sub").mkdir()
    return {"root": root, "mt": runs["mt"], "gpt": runs["gpt"], "corpus": corpus, "hf": hf}


def _invoke(words: list[str]):
    return CliRunner().invoke(app, words)


def _one_line_error(result, *phrases: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("aiayn: error:")]
    assert len(errors) == 1, result.output
    for phrase in phrases:
        assert phrase in errors[0], result.output


# ----- every writer, every kind of path ----------------------------------------------

# (id, command line with {out}, what it reads as a whole: "mt", "gpt", "corpus" or "hf",
# its input's own place, and whether OUT is a file)
WRITERS = [
    ("export", "export {mt} {out} --force", "mt", "{mt}", False),
    ("convert gpt2", "convert gpt2 {hf} {out} --force", "hf", "{hf}", False),
    (
        "prepare text",
        "prepare text --src-train {corpus}/train.en --tgt-train {corpus}/train.de "
        "--src-lang en --tgt-lang de --vocab-size 40 --out {out} --force",
        "corpus",
        "{corpus}",
        False,
    ),
    (
        "prepare lm text",
        "prepare lm text {corpus}/train.en {out} --vocab-size 40 --force",
        "corpus",
        "{corpus}",
        False,
    ),
    ("translate -o", "translate {mt} -i {corpus}/test.en -o {out}", "mt", "{corpus}/test.en", True),
    (
        "patch --out",
        "patch {gpt} --clean 'das haus.' --corrupt 'ein haus.' --out {out}",
        "gpt",
        "{gpt}",
        False,
    ),
    ("lens --out", "lens {gpt} 'the house' --out {out}", "gpt", "{gpt}", False),
    ("induction --out", "induction {gpt} --length 4 --batch 2 --out {out}", "gpt", "{gpt}", False),
    (
        "align --out",
        "align {mt} --src {corpus}/test.en --ref {corpus}/test.de --pairs 2 "
        "--model1-pairs 0 --out {out}",
        "mt",
        "{mt}",
        False,
    ),
]
KINDS = ["run-subdirectory", "parent", "input-itself", "symlink-into-run", "fifo", "dev-full"]


def _inside(world, source: str, file_output: bool) -> Path:
    """A path inside what the writer reads: an older checkpoint of a run (its weights,
    for a file output), or an empty subdirectory of a corpus or a Hugging Face directory."""
    if source in ("mt", "gpt"):
        older = world[source] / "checkpoints" / STEP1
        return older / "model.safetensors" if file_output else older
    return world[source] / "sub"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("name", "command", "source", "itself", "file_output"), WRITERS, ids=[w[0] for w in WRITERS]
)
def test_no_writer_writes_inside_over_or_around_what_it_reads(
    world, tmp_path, name, command, source, itself, file_output, kind
):
    paths = {key: value for key, value in world.items() if key != "root"}
    if kind == "run-subdirectory":
        out = _inside(world, source, file_output)
    elif kind == "parent":
        out = world[source].parent
    elif kind == "input-itself":
        out = Path(itself.format(**paths))
    elif kind == "symlink-into-run":
        out = tmp_path / "link"
        os.symlink(_inside(world, source, file_output), out)
    elif kind == "fifo":
        out = tmp_path / "fifo"
        os.mkfifo(out)
    else:
        out = Path("/dev/full")
    before, around = _digest(world["root"]), sorted(tmp_path.iterdir())
    words = shlex.split(command.format(out=out, **paths))
    if kind == "fifo" and file_output:  # written through, as `>` would
        with _drained(out) as got:
            result = _invoke(words)
        assert result.exit_code == 0, result.output
        assert got.count(b"\n") == len((world["corpus"] / "test.en").read_text().splitlines())
    elif kind == "fifo":  # held open for writing, so that no open of it can block
        held = os.open(out, os.O_RDWR | os.O_NONBLOCK)
        try:
            _one_line_error(_invoke(words), str(out))
        finally:
            os.close(held)
    elif kind == "dev-full" and file_output:
        _one_line_error(_invoke(words), "/dev/full", "No space left on device")
    else:
        _one_line_error(_invoke(words), str(out))
    assert _digest(world["root"]) == before  # every file, byte for byte, and nothing new
    assert sorted(tmp_path.iterdir()) == around
    if kind == "fifo":
        assert stat.S_ISFIFO(os.lstat(out).st_mode)
    if kind == "dev-full":
        assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)
    if kind == "symlink-into-run":
        assert out.is_symlink()


def test_the_protected_root_of_what_is_read(world):
    """A checkpoint and its weights belong to the run, a corpus's file to the corpus, an
    input file elsewhere to itself."""
    mt, corpus = world["mt"], world["corpus"]
    weights = mt / "checkpoints" / STEP2 / "model.safetensors"
    for read in (mt, mt / "checkpoints", mt / "checkpoints" / STEP2, weights):
        assert files.protected_root(read) == mt.resolve()
    assert files.protected_root(corpus / "train.en") == corpus.resolve()
    assert (
        files.protected_root(world["hf"] / "config.json") == (world["hf"] / "config.json").resolve()
    )


# ----- damage: a run's own files replaced ----------------------------------------------


def test_export_never_replaces_a_checkpoint_of_its_run(world, tmp_path):
    """The issue's case: `export RUN RUN/checkpoints/<older step> --force` replaced that
    checkpoint (its trainer state too); `average --last 2` then failed."""
    run = tmp_path / "run"
    shutil.copytree(world["mt"], run)
    before = _digest(run)
    for out in (run / "checkpoints" / STEP1, run / "checkpoints" / "exported", run / "x"):
        result = _invoke(["export", str(run), str(out), "--force"])
        _one_line_error(result, f"lies inside the run {run}", "whatever --force says")
    assert _digest(run) == before
    result = _invoke(["average", str(run), "--last", "2"])
    assert result.exit_code == 0, result.output


# ----- prepare: no overwrite without --force, no partial OUT ---------------------------


def test_prepare_lm_into_an_existing_corpus_needs_force(world, tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(world["corpus"], corpus)
    text = tmp_path / "text.txt"
    shutil.copy(world["corpus"] / "train.de", text)
    before = _digest(corpus)
    words = ["prepare", "lm", "text", str(text), str(corpus), "--lang", "en", "--vocab-size", "40"]
    _one_line_error(_invoke(words), str(corpus), "is not empty", "--force")
    assert _digest(corpus) == before
    result = _invoke([*words, "--force"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in corpus.iterdir()) == [
        "corpus.json",
        "spm.model",
        "stats.json",
        "test.en",
        "train.en",
        "valid.en",
    ]  # fmt: skip  (replaced whole: none of the translation corpus's files is left)
    assert (corpus / "train.en").read_text() == text.read_text()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("command", ["prepare lm text", "prepare text"])
def test_a_refused_prepare_leaves_no_partial_out(world, tmp_path, command):
    corpus = world["corpus"]
    out = tmp_path / "out"
    words = {
        "prepare lm text": f"prepare lm text {corpus}/train.en {out} --vocab-size 5000",
        "prepare text": f"prepare text --src-train {corpus}/train.en --tgt-train "
        f"{corpus}/train.de --src-lang en --tgt-lang de --vocab-size 5000 --out {out}",
    }[command]
    result = _invoke(shlex.split(words))
    _one_line_error(result, "Vocabulary size too high", "--vocab-size")
    assert list(tmp_path.iterdir()) == []  # no OUT, and no temporary beside it


def test_prepare_errors_read_aiayn_error(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\n")
    (tmp_path / "a.de").write_text("eins\n")
    result = _invoke(
        ["prepare", "text", "--src-train", str(tmp_path / "a.en"), "--tgt-train",
         str(tmp_path / "a.de"), "--src-lang", "en", "--tgt-lang", "de", "--out",
         str(tmp_path / "out")]
    )  # fmt: skip
    _one_line_error(result, "has 2 lines", "has 1")
    assert result.output.startswith("aiayn: error:")


# ----- invalid output: strict JSON, finite weights --------------------------------------


def test_strict_json_writes_null_for_nan_and_infinities():
    data = {"a": float("nan"), "b": [1.5, float("inf"), (float("-inf"), 2)], "c": "NaN"}
    text = files.strict_json(data)
    assert text == (
        '{\n  "a": null,\n  "b": [\n    1.5,\n    null,\n    [\n      null,\n      2\n'
        '    ]\n  ],\n  "c": "NaN"\n}\n'
    )
    assert _strict(text) == {"a": None, "b": [1.5, None, [None, 2]], "c": "NaN"}


def _poisoned(weights: Path, name: str) -> None:
    """Set every value of tensor `name` in the safetensors file to NaN, keeping its metadata."""
    with safe_open(str(weights), framework="pt") as file:
        metadata = file.metadata()
    tensors = load_file(str(weights))
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    tensors[name].view(-1)[0] = float("inf")
    save_file(tensors, str(weights), metadata=metadata)


@pytest.fixture(scope="module")
def nan_gpt(world, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("nan") / "gpt"
    shutil.copytree(world["gpt"], run)
    for step in (STEP1, STEP2):
        _poisoned(run / "checkpoints" / step / "model.safetensors", "decoder.final_norm.weight")
    return run


def test_patching_and_lens_json_hold_no_nan(nan_gpt, tmp_path):
    patch = ["patch", str(nan_gpt), "--clean", "das haus.", "--corrupt", "ein haus."]
    patch += ["--metric", "logprob", "--target", "by the river", "--out", str(tmp_path / "p")]
    result = _invoke(patch)
    assert result.exit_code == 0, result.output
    patching = _strict((tmp_path / "p" / "patching.json").read_text())
    assert patching["clean_metric"] is None and patching["corrupt_metric"] is None
    result = _invoke(["lens", str(nan_gpt), "the house", "--out", str(tmp_path / "l")])
    assert result.exit_code == 0, result.output
    lens = _strict((tmp_path / "l" / "lens.json").read_text())
    assert None in [entry["prob"] for entry in lens["layers"][0]["positions"][0]["top"]]


def test_export_refuses_non_finite_weights_by_tensor(nan_gpt, tmp_path):
    out = tmp_path / "out"
    result = _invoke(["export", str(nan_gpt), str(out)])
    _one_line_error(result, "tensor decoder.final_norm.weight holds NaN or infinite values")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_convert_refuses_non_finite_weights_by_tensor(world, tmp_path):
    source = tmp_path / "gpt2"
    shutil.copytree(world["hf"], source)
    _poisoned(source / "model.safetensors", "transformer.h.1.mlp.c_fc.weight")
    out = tmp_path / "out"
    result = _invoke(["convert", "gpt2", str(source), str(out)])
    _one_line_error(result, "tensor h.1.mlp.c_fc.weight holds NaN or infinite", str(source))
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2"]


# ----- messages that mislead ------------------------------------------------------------


def test_export_without_spm_model_names_the_file_and_the_option(world, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(world["mt"], run)
    spm = tmp_path / "elsewhere.model"
    os.replace(run / "spm.model", spm)
    result = _invoke(["export", str(run), str(tmp_path / "out")])
    _one_line_error(result, "no spm.model", "--tokenizer")
    assert "spm=" not in result.output
    result = _invoke(["export", str(run), str(tmp_path / "out"), "--tokenizer", str(spm)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "source.spm").read_bytes() == spm.read_bytes()


@pytest.mark.parametrize("command", ["export", "prepare lm text"])
def test_an_out_of_255_characters_is_written(world, tmp_path, command):
    out = tmp_path / ("o" * 255)
    words = {
        "export": ["export", str(world["mt"]), str(out)],
        "prepare lm text": ["prepare", "lm", "text", str(world["corpus"] / "train.en"),
                            str(out), "--vocab-size", "40"],
    }[command]  # fmt: skip
    result = _invoke(words)
    assert result.exit_code == 0, result.output
    assert (out / ("model.safetensors" if command == "export" else "corpus.json")).is_file()
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary left


def test_prepare_listops_keeps_its_own_data_set_and_replaces_another_only_with_force(tmp_path):
    out = tmp_path / "listops"
    args = ["prepare", "listops", "--out", str(out), "--scale", "0.0005"]
    assert _invoke(args).exit_code == 0
    before = _digest(out)
    assert _invoke(args).exit_code == 0  # the same settings: kept, nothing written
    assert _digest(out) == before
    _one_line_error(_invoke([*args, "--seed", "1"]), str(out), "is not empty", "--force")
    assert _digest(out) == before
    assert _invoke([*args, "--seed", "1", "--force"]).exit_code == 0
    assert _digest(out) != before
