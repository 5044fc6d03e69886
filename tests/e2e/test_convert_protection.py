"""The library's converters protect OUT as `aiayn convert` does (issue 34 item 8): called
from Python, `convert_marian`, `convert_gpt2` and `convert_bert` refuse an OUT that is
not empty (unless force=True), that is the source, lies inside it or holds it, and build
OUT atomically. The fixtures are tests/test_output_safety.py's."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import test_output_safety
from test_output_safety import _digest

from aiayn.io import hf_models, marian
from infer_helpers import make_run

# test_output_safety's fixtures: tiny Hugging Face directories, and a private copy of one
sources, source = test_output_safety.sources, test_output_safety.source

KINDS = ["gpt2", "bert", "marian"]
CONVERT = {
    "gpt2": hf_models.convert_gpt2,
    "bert": hf_models.convert_bert,
    "marian": marian.convert_marian,
}


@pytest.mark.parametrize("source", KINDS, indirect=True)
@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("{src}", "is the source directory"),
        ("{src}/converted", "lies inside the source directory"),
        ("{src}/../link", "is the source directory"),  # a link to the source
        ("{src}/..", "holds the source directory"),
    ],
    ids=["same", "inside", "link-to-it", "around-it"],
)
def test_never_writes_over_or_inside_its_source(source, tmp_path, force, where, message):
    kind, src = source
    os.symlink(src, tmp_path / "link")
    before = _digest(tmp_path)
    with pytest.raises(ValueError, match=message):
        CONVERT[kind](src, Path(where.format(src=src)), force=force)
    assert _digest(tmp_path) == before  # the source byte for byte, and nothing new


@pytest.mark.parametrize("source", KINDS, indirect=True)
def test_a_non_empty_out_needs_force_and_is_then_replaced_whole(source, tmp_path):
    kind, src = source
    run = make_run(tmp_path / "made")  # a trained-looking run: its checkpoints must survive
    before = _digest(run)
    with pytest.raises(ValueError, match=rf"{run} exists and is not empty.*force"):
        CONVERT[kind](src, run)
    assert _digest(run) == before

    fresh = tmp_path / "fresh"
    assert CONVERT[kind](src, fresh) == fresh / "model.safetensors"
    assert CONVERT[kind](src, run, force=True) == run / "model.safetensors"
    assert sorted(_digest(run)) == sorted(_digest(fresh))  # no checkpoint of the run left
    assert not (run / "checkpoints").exists()
    assert [p.name for p in run.parent.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("source", ["gpt2"], indirect=True)
def test_an_empty_directory_or_a_file_as_out(source, tmp_path):
    kind, src = source
    (tmp_path / "empty").mkdir()
    CONVERT[kind](src, tmp_path / "empty")
    assert (tmp_path / "empty" / "model.safetensors").is_file()
    (tmp_path / "file").write_text("keep me")
    with pytest.raises(ValueError, match="is an existing file; name a directory"):
        CONVERT[kind](src, tmp_path / "file", force=True)
    assert (tmp_path / "file").read_text() == "keep me"


@pytest.mark.parametrize("source", KINDS, indirect=True)
def test_a_full_disk_half_way_leaves_no_partial_out(source, tmp_path, monkeypatch):
    """The weights fail after the tokenizer files are written: OUT does not appear, no
    temporary is left beside it, and an OUT given with force stays as it was."""
    kind, src = source
    module = marian if kind == "marian" else hf_models

    def full_disk(model, path, **options):
        Path(path).write_bytes(b"the first bytes of the weights")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(module, "save_model", full_disk)
    out = tmp_path / "out"
    with pytest.raises(OSError, match="No space left on device"):
        CONVERT[kind](src, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == [src.name]

    out.mkdir()
    (out / "notes.txt").write_text("kept")
    with pytest.raises(OSError, match="No space left on device"):
        CONVERT[kind](src, out, force=True)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([src.name, "out"])
