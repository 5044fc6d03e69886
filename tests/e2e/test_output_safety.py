"""Data-loss and unbounded-input cases of issue 34: outputs that are not plain files,
`convert` into a directory that holds something, and lines without end.

A write never replaces what the path leads to. Every command that writes a file is run with its output path (or a file it writes
inside its output directory) made, in turn, into (`prepare` writes its directory whole,
as `convert` does: a directory holding such a node is refused without --force):

- a FIFO: the bytes must come through the pipe (a reader thread drains it), the same
  bytes the command writes to a plain file, and the FIFO must still be a FIFO;
- a character device made with mknod, a twin of /dev/null (1, 3): exit 0, the node
  still that device;
- a twin of /dev/full (1, 7): the write fails with ENOSPC, reported in one line naming
  the path, exit 1, and the node is still that device;
- a symbolic link to a file elsewhere: the link stays a link and its target gets the
  output.

The device twins live in the test's tmp_path; the tests never point at the machine's
own /dev/null or /dev/full (the old code replaced a device node by a regular file).
Making device nodes needs root; elsewhere those cases skip, saying so.

`aiayn convert` never writes over or inside its source, refuses a non-empty OUT
without --force, and leaves no partial OUT (the source is hashed before and after).
Every reader of lines refuses a line longer than `aiayn.data.lines.MAX_LINE_BYTES` after
reading about that much, never the whole line.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import itertools
import json
import os
import re
import shlex
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import aiayn.data.files as files
import aiayn.data.lines as lines
from aiayn.cli import app
from aiayn.data.files import WriteFailed, check_output, write_atomic, write_dir_atomic
from train_helpers import RECIPE, make_corpus

NULL, FULL = os.makedev(1, 3), os.makedev(1, 7)
TRAIN = f"train {RECIPE} train.max_steps=1 train.valid_every_steps=1 --no-progress"

# ----- the world: a corpus and a run trained for two updates ----------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("output_safety")
    corpus = make_corpus(root / "corpus", train_pairs=120)
    run = root / "run"
    steps = "train.max_steps=2 train.checkpoint_every_steps=1 train.valid_every_steps=2"
    steps += " model.max_len=16"  # short searches: the model is barely trained
    args = [*shlex.split(TRAIN), f"data.corpus={corpus}", *steps.split(), "--run", str(run)]
    args.remove("train.max_steps=1")
    trained = CliRunner().invoke(app, args)
    assert trained.exit_code == 0, trained.output
    return {"root": root, "corpus": corpus, "run": run}


# Every command that writes a file: (id, command line, the file written). {out} is the
# value of the command's output option; the file written is {out} itself or, for a
# directory output, the name given inside it.
WRITERS = [
    ("translate -o", "translate {run} -i {corpus}/test.en -o {out}", None),
    ("attention --html", "attention {run} 'the house' --html {out}", None),
    (
        "shortlist build --out",
        "shortlist build {run} --tokenizer {run}/spm.model --source {corpus}/train.en "
        "--target {corpus}/train.de --min-count 1 --out {out}",
        None,
    ),
    (
        "evaluate --out",
        "evaluate {run} --src {corpus}/test.en --ref {corpus}/test.de --out {out}",
        "hypotheses.txt",
    ),
    ("attention --out", "attention {run} 'the house' --out {out}", "cross.png"),
    ("heads --out", "heads {run} --sentences 4 --out {out}", "heads.json"),
    ("train --run", TRAIN + " data.corpus={corpus} --run {out}", "config.yaml"),
]
IDS = [writer[0] for writer in WRITERS]
# `prepare` writes its OUT whole, as `convert` does (issue 42): a directory holding a
# FIFO, a device or a link is refused without --force, never written into
PREPARE_TEXT = (
    "prepare text --src-train {corpus}/train.en --tgt-train {corpus}/train.de "
    "--src-lang en --tgt-lang de --vocab-size 40 --out {out}"
)
PREPARE_LM = "prepare lm text {corpus}/train.en {out} --vocab-size 40"


@pytest.fixture(autouse=True)
def _no_head_figures(monkeypatch) -> None:
    """`aiayn heads` draws its PNGs with the writer `attention --out` tests already, and
    slowly: here it writes heads.json and report.md only."""
    monkeypatch.setattr("aiayn.analysis.heads.head_figures", lambda report: {})


def _invoke(world, command: str, out: Path):
    words = shlex.split(command.format(run=world["run"], corpus=world["corpus"], out=out))
    return CliRunner().invoke(app, words)


def _target(tmp_path: Path, inside: str | None) -> tuple[Path, Path]:
    """(the value of the output option, the file the command writes) under tmp_path;
    the output directory exists, the file does not yet."""
    if inside is None:
        return tmp_path / "out", tmp_path / "out"
    (tmp_path / "out").mkdir()
    return tmp_path / "out", tmp_path / "out" / inside


_REFERENCE: dict[str, bytes] = {}


def _reference(world, name: str, command: str, inside: str | None) -> bytes:
    """What the command writes to a plain file (computed once per writer)."""
    if name not in _REFERENCE:
        plain = world["root"] / f"plain-{len(_REFERENCE)}"
        plain.mkdir()
        out, written = _target(plain, inside)
        result = _invoke(world, command, out)
        assert result.exit_code == 0, result.output
        _REFERENCE[name] = written.read_bytes()
    return _REFERENCE[name]


def _same_output(got: bytes, expected: bytes) -> bool:
    """Equal bytes; a safetensors file (whose header's order may vary) compares by its
    metadata and tensors."""
    if b'"__metadata__"' not in expected[:4096]:
        return got == expected
    from safetensors.torch import load

    def header(data: bytes) -> dict:
        size = int.from_bytes(data[:8], "little")
        return json.loads(data[8 : 8 + size]).get("__metadata__", {})

    mine, theirs = load(got), load(expected)
    return (
        header(got) == header(expected)
        and mine.keys() == theirs.keys()
        and all(torch.equal(mine[key], theirs[key]) for key in mine)
    )


def _ok(result) -> None:
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output


def _one_line_error(result, *names: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, result.output
    for name in names:
        assert name in errors[0], result.output


def _mknod(path: Path, device: int) -> Path:
    if os.geteuid() != 0:
        pytest.skip("making a character device with mknod needs root")
    os.mknod(path, stat.S_IFCHR | 0o666, device)
    return path


def _is_device(path: Path, device: int) -> bool:
    info = os.lstat(path)
    return stat.S_ISCHR(info.st_mode) and info.st_rdev == device


@contextlib.contextmanager
def _drained(fifo: Path) -> Iterator[bytearray]:
    """Read everything written into `fifo` while inside; the bytes, once outside.

    The read end is opened without blocking, so a writer that never comes (or that
    replaced the FIFO by a file) cannot hang the test.
    """
    got, done = bytearray(), threading.Event()
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)

    def drain() -> None:
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:  # a writer is there but has written nothing yet
                chunk = None
            if chunk:
                got.extend(chunk)
            elif chunk == b"" and done.is_set():  # no writer, and none will come
                return
            else:
                time.sleep(0.005)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        yield got
    finally:
        done.set()
        reader.join(timeout=10)
        os.close(fd)


# ----- a file output that is not a plain file ---------------------------------------


@pytest.mark.parametrize(("name", "command", "inside"), WRITERS, ids=IDS)
def test_a_fifo_is_written_through(world, tmp_path, name, command, inside):
    expected = _reference(world, name, command, inside)
    out, written = _target(tmp_path, inside)
    os.mkfifo(written)
    with _drained(written) as got:
        result = _invoke(world, command, out)
    _ok(result)
    assert stat.S_ISFIFO(os.lstat(written).st_mode)
    assert _same_output(bytes(got), expected)
    assert not [p for p in written.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(("name", "command", "inside"), WRITERS, ids=IDS)
def test_a_character_device_is_written_through_not_replaced(world, tmp_path, name, command, inside):
    out, written = _target(tmp_path, inside)
    _mknod(written, NULL)
    _ok(_invoke(world, command, out))
    assert _is_device(written, NULL)


@pytest.mark.parametrize(("name", "command", "inside"), WRITERS, ids=IDS)
def test_a_full_device_is_one_line_and_stays_a_device(world, tmp_path, name, command, inside):
    out, written = _target(tmp_path, inside)
    _mknod(written, FULL)
    result = _invoke(world, command, out)
    _one_line_error(result, str(written), "No space left on device")
    assert _is_device(written, FULL)


@pytest.mark.parametrize(("name", "command", "inside"), WRITERS, ids=IDS)
def test_a_symlink_is_followed_and_stays_a_link(world, tmp_path, name, command, inside):
    expected = _reference(world, name, command, inside)
    out, written = _target(tmp_path, inside)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "target").write_bytes(b"the old contents\n")
    os.symlink(elsewhere / "target", written)
    _ok(_invoke(world, command, out))
    assert written.is_symlink() and os.readlink(written) == str(elsewhere / "target")
    assert _same_output((elsewhere / "target").read_bytes(), expected)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["target"]


# ----- a directory output that is not a directory -------------------------------------

# Commands whose output is a directory written whole (or refused when it exists), and
# every directory output: given a FIFO or a device, each is refused by name and the node
# stays as it was.
DIRECTORY_WRITERS = [
    ("average", "average {run} --last 1", "{run}/checkpoints/average-last-1"),
    ("prune --out", "prune {run} --heads encoder.0.self:1 --out {out}", "{out}"),
    ("evaluate --out", WRITERS[3][1], "{out}"),
    ("attention --out", WRITERS[4][1], "{out}"),
    ("heads --out", WRITERS[5][1], "{out}"),
    ("prepare text --out", PREPARE_TEXT, "{out}"),
    ("prepare lm text", PREPARE_LM, "{out}"),
    ("train --run", WRITERS[6][1], "{out}"),
    ("quickstart --out", "quickstart --out {out}", "{out}"),
]


@pytest.mark.parametrize(
    ("name", "command", "directory"), DIRECTORY_WRITERS, ids=[w[0] for w in DIRECTORY_WRITERS]
)
@pytest.mark.parametrize("node", ["fifo", "device"])
def test_a_directory_output_that_is_a_fifo_or_device_is_refused(
    world, tmp_path, name, command, directory, node
):
    if name == "average":  # in a copy of the run: the other tests share the run
        run = tmp_path / "run"
        shutil.copytree(world["run"], run, symlinks=True)
        world = {**world, "run": run}
    out = tmp_path / "out"
    path = Path(directory.format(run=world["run"], out=out))
    held = None
    if node == "fifo":
        os.mkfifo(path)
        held = os.open(path, os.O_RDWR | os.O_NONBLOCK)  # so no open of it can block
    else:
        _mknod(path, NULL)
    try:
        result = _invoke(world, command, out)
    finally:
        if held is not None:
            os.close(held)
    _one_line_error(result, str(path))
    assert stat.S_ISFIFO(os.lstat(path).st_mode) if node == "fifo" else _is_device(path, NULL)
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.")] == []


@pytest.mark.parametrize("command", [PREPARE_TEXT, PREPARE_LM], ids=["text", "lm text"])
@pytest.mark.parametrize("node", ["fifo", "link"])
def test_prepare_into_a_directory_holding_a_node_needs_force(world, tmp_path, command, node):
    """The directory is replaced whole or not at all: without --force, a FIFO or a link
    inside it stays as it was, and nothing is written through it."""
    out = tmp_path / "out"
    out.mkdir()
    inside, elsewhere = out / "train.de", tmp_path / "elsewhere"
    elsewhere.write_text("the old contents\n")
    if node == "fifo":
        os.mkfifo(inside)
    else:
        os.symlink(elsewhere, inside)
    _one_line_error(_invoke(world, command, out), str(out), "is not empty", "--force")
    assert stat.S_ISFIFO(os.lstat(inside).st_mode) if node == "fifo" else inside.is_symlink()
    assert elsewhere.read_text() == "the old contents\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "out"]


def test_average_follows_a_symlinked_directory_and_keeps_the_link(world, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(world["run"], run, symlinks=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "old").write_text("an average of long ago\n")
    link = run / "checkpoints" / "average-last-1"
    os.symlink(elsewhere, link)
    _ok(CliRunner().invoke(app, ["average", str(run), "--last", "1"]))
    assert link.is_symlink() and os.readlink(link) == str(elsewhere)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["averaged.json", "model.safetensors"]
    leftovers = [p.name for p in link.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_prune_into_a_dangling_symlink_writes_where_it_points(world, tmp_path):
    link, pruned = tmp_path / "link", tmp_path / "pruned"
    os.symlink(pruned, link)
    args = ["prune", str(world["run"]), "--heads", "encoder.0.self:1", "--out", str(link)]
    _ok(CliRunner().invoke(app, args))
    assert link.is_symlink() and (pruned / "model.safetensors").is_file()


# ----- the writers themselves ---------------------------------------------------------


def test_write_atomic_refuses_a_directory_and_a_socket_by_name(tmp_path):
    import socket

    (tmp_path / "a_dir").mkdir()
    with pytest.raises(WriteFailed, match="a_dir: it is a directory") as refused:
        write_atomic(tmp_path / "a_dir", "text")
    assert refused.value.errno == errno.EISDIR
    listening = socket.socket(socket.AF_UNIX)
    try:
        listening.bind(str(tmp_path / "sock"))
        with pytest.raises(WriteFailed, match="sock: it is a socket"):
            write_atomic(tmp_path / "sock", "text")
        with pytest.raises(ValueError, match=r"-o .*sock is a socket"):
            check_output(tmp_path / "sock", "-o")
    finally:
        listening.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_dir", "sock"]


def test_a_chain_of_links_is_followed_to_the_end(tmp_path):
    (tmp_path / "real.txt").write_text("old\n")
    os.symlink(tmp_path / "real.txt", tmp_path / "one")
    os.symlink("one", tmp_path / "two")  # relative, through another link
    write_atomic(tmp_path / "two", "new\n")
    assert (tmp_path / "real.txt").read_text() == "new\n"
    assert os.readlink(tmp_path / "two") == "one" and (tmp_path / "one").is_symlink()


def test_a_link_loop_is_one_error_naming_the_path(tmp_path):
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    with pytest.raises(WriteFailed, match=f"cannot write {tmp_path / 'a'}"):
        write_atomic(tmp_path / "a", "x")


def test_write_dir_atomic_refuses_a_file_and_keeps_it(tmp_path):
    (tmp_path / "file").write_text("keep me\n")
    with pytest.raises(WriteFailed, match="file: it is a file, not a directory"):
        write_dir_atomic(tmp_path / "file", lambda tmp: (tmp / "x").write_text("x"))
    assert (tmp_path / "file").read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


# ----- convert: never into a model that is there already -----------------------------


def _digest(directory: Path) -> dict[str, str]:
    """Every file under `directory` (links as links), by its sha256."""
    return {
        str(p.relative_to(directory)): (
            f"link:{os.readlink(p)}"
            if p.is_symlink()
            else hashlib.sha256(p.read_bytes()).hexdigest()
        )
        for p in sorted(directory.rglob("*"))
        if p.is_symlink() or p.is_file()
    }


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """Tiny Hugging Face directories, built by transformers as test_hf_models.py and
    test_marian.py build theirs (nothing downloaded)."""
    pytest.importorskip("transformers")
    from test_hf_models import bert_directory, gpt2_directory
    from test_marian import SHAPES, build_marian_directory

    root = tmp_path_factory.mktemp("hf_sources")
    for name in ("gpt2", "bert", "marian"):
        (root / name).mkdir()
    gpt2_directory(root / "gpt2")
    bert_directory(root / "bert")
    build_marian_directory(root / "marian", SHAPES["swish-2x2"])
    return {"gpt2": root / "gpt2", "bert": root / "bert", "marian": root / "marian"}


def _convert(kind: str, source: Path, out: Path, *more: str):
    return CliRunner().invoke(app, ["convert", kind, str(source), str(out), *more])


@pytest.fixture
def source(sources, tmp_path, request) -> tuple[str, Path]:
    """(kind, a private copy of its source directory): a test may try to damage it."""
    kind = request.param
    copy = tmp_path / f"{kind}-source"
    shutil.copytree(sources[kind], copy)
    return kind, copy


KINDS = ["gpt2", "bert", "marian"]


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
def test_convert_never_writes_over_or_inside_its_source(source, tmp_path, force, where, message):
    kind, src = source
    os.symlink(src, tmp_path / "link")
    out = Path(where.format(src=src))
    before = _digest(tmp_path)
    result = _convert(kind, src, out, *(["--force"] if force else []))
    _one_line_error(result, message)
    assert _digest(tmp_path) == before  # the source byte for byte, and nothing new


@pytest.mark.parametrize("source", KINDS, indirect=True)
def test_convert_into_a_non_empty_directory_needs_force_and_then_replaces_it(
    source, world, tmp_path
):
    kind, src = source
    out = tmp_path / "run"
    shutil.copytree(world["run"], out)  # a trained run
    before = _digest(out)
    refused = _convert(kind, src, out)
    _one_line_error(refused, str(out), "is not empty", "--force")
    assert _digest(out) == before

    fresh = tmp_path / "fresh"
    _ok(_convert(kind, src, fresh))
    _ok(_convert(kind, src, out, "--force"))
    assert sorted(_digest(out)) == sorted(_digest(fresh))  # replaced whole: no checkpoint left
    for name in _digest(fresh):
        assert _same_output((out / name).read_bytes(), (fresh / name).read_bytes()), name
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("source", ["gpt2"], indirect=True)
def test_convert_into_an_existing_empty_directory_needs_no_force(source, tmp_path):
    kind, src = source
    (tmp_path / "empty").mkdir()
    _ok(_convert(kind, src, tmp_path / "empty"))
    assert (tmp_path / "empty" / "model.safetensors").is_file()


@pytest.mark.parametrize("source", KINDS, indirect=True)
def test_a_conversion_that_fails_half_way_leaves_no_partial_out(source, tmp_path, monkeypatch):
    """A full disk while the weights are written, after the tokenizer files: OUT does not
    appear, and no temporary is left beside it."""
    kind, src = source
    module = "aiayn.io.marian" if kind == "marian" else "aiayn.io.hf_models"

    def full_disk(model, path, **options):
        Path(path).write_bytes(b"the first bytes of the weights")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(f"{module}.save_model", full_disk)
    out = tmp_path / "out"
    before = _digest(src)
    result = _convert(kind, src, out)
    _one_line_error(result, str(out), "No space left on device")
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [src.name]
    assert _digest(src) == before


# ----- unbounded input: every line reader bounds a line ----------------------------

LIMIT = 1000  # MAX_LINE_BYTES, lowered for the tests


@pytest.fixture
def small_limit(monkeypatch) -> int:
    # raising=False: on code without the bound the tests fail on behaviour, not here
    monkeypatch.setattr(lines, "MAX_LINE_BYTES", LIMIT, raising=False)  # the reader's own
    return LIMIT


class _Endless(io.RawIOBase):
    """A stream of b"x" with no newline, like /dev/zero; it counts what was read and
    gives up (an error) after `cap` bytes, so a reader without a bound fails, not hangs."""

    def __init__(self, cap: int = 64 << 20) -> None:
        self.read_bytes, self.cap = 0, cap

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.read_bytes >= self.cap:
            raise OSError(errno.EFBIG, f"read {self.cap} bytes of one line")
        n = min(len(buffer), 4096)
        buffer[:n] = b"x" * n
        self.read_bytes += n
        return n


def test_a_line_at_the_limit_is_read_and_one_byte_longer_is_refused(tmp_path, small_limit):
    path = tmp_path / "in.txt"
    at_limit = "é" * (LIMIT // 2)  # 2 bytes each: the limit counts bytes, not characters
    path.write_bytes(f"{at_limit}\r\nshort\n{at_limit}\n".encode())
    assert files.read_lines(path) == [at_limit, "short", at_limit]
    path.write_bytes(f"short\n{at_limit}x\nshort\n".encode())
    with pytest.raises(
        ValueError, match=re.escape(f"{path}:2: the line is longer than 1,000 bytes")
    ):
        files.read_lines(path)
    path.write_bytes(f"short\n\n{at_limit}x".encode())  # the last line, without its newline
    with pytest.raises(ValueError, match=re.escape(f"{path}:3: the line is longer than 1,000")):
        files.read_lines(path)


def test_the_limit_is_one_mebibyte(tmp_path):
    limit = 1 << 20
    path = tmp_path / "in.txt"
    path.write_bytes(b"x" * limit + b"\n")
    assert files.read_lines(path) == ["x" * limit]
    path.write_bytes(b"x" * (limit + 1) + b"\n")
    with pytest.raises(ValueError, match=f"{path}:1: the line is longer than 1,048,576 bytes"):
        files.read_lines(path)


def test_a_line_without_end_is_refused_after_a_bounded_read(small_limit):
    """A generator of bytes with no newline ever: refused once a little more than the
    limit has been read, whatever the size of the pieces it comes in."""
    for piece in (1, 7, 4096, 3 * LIMIT):
        consumed = 0

        def endless(piece: int = piece) -> Iterator[bytes]:
            nonlocal consumed
            while consumed < 64 << 20:
                consumed += piece
                yield b"x" * piece

        lines = decode_lines_of(b"one\ntwo\n", endless())
        with pytest.raises(ValueError, match=r"^<gen>:3: the line is longer than 1,000 bytes"):
            list(itertools.islice(lines, 10_000))
        assert consumed <= LIMIT + 2 + 8 + max(piece, 4096), piece


def decode_lines_of(head: bytes, tail: Iterator[bytes]) -> Iterator[str]:
    return files.decode_lines(itertools.chain([head], tail), "<gen>")


def test_translate_refuses_an_endless_stdin_line_after_a_bounded_read(
    world, small_limit, monkeypatch
):
    endless = _Endless()
    # typer's CliRunner takes only str or bytes as stdin: hand it the endless stream
    monkeypatch.setattr("typer.testing.make_input_stream", lambda *_: io.BufferedReader(endless))
    result = CliRunner().invoke(app, ["translate", str(world["run"])])
    _one_line_error(result, "<stdin>:1: the line is longer than 1,000 bytes")
    assert endless.read_bytes < 1 << 20


# Every command that reads text line by line, given a file whose second line is too long
# as the option named: (id, command line with {long} the file, {short} a good one of the
# same length and {out} an output that must not appear).
READERS = [
    ("translate -i", "translate {run} -i {long} -o {out}"),
    ("evaluate --src", "evaluate {run} --src {long} --ref {short} --out {out}"),
    ("evaluate --ref", "evaluate {run} --src {short} --ref {long} --out {out}"),
    (
        "prepare text --src-train",
        "prepare text --src-train {long} --tgt-train {short} --src-lang en --tgt-lang de "
        "--vocab-size 40 --out {out}",
    ),
    (
        "prepare text --tgt-valid",
        "prepare text --src-train {corpus}/train.en --tgt-train {corpus}/train.de "
        "--src-valid {short} --tgt-valid {long} --src-lang en --tgt-lang de --vocab-size 40 "
        "--out {out}",
    ),
    ("prepare tsv --train", "prepare tsv --train {long} --src-lang en --tgt-lang de --out {out}"),
    ("prepare lm text", "prepare lm text {long} {out} --vocab-size 40"),
    ("prepare lm text --valid", "prepare lm text {corpus}/train.en {out} --valid {long}"),
    (
        "shortlist build --source",
        "shortlist build {run} --tokenizer {run}/spm.model --source {long} --target {short} "
        "--out {out}",
    ),
    (
        "shortlist build --target",
        "shortlist build {run} --tokenizer {run}/spm.model --source {short} --target {long} "
        "--out {out}",
    ),
]


@pytest.mark.parametrize(("name", "command"), READERS, ids=[r[0] for r in READERS])
def test_every_line_reader_refuses_a_line_too_long(world, tmp_path, small_limit, name, command):
    long, short, out = tmp_path / "long.txt", tmp_path / "short.txt", tmp_path / "out"
    cell = "house\tcasa" if "tsv" in name else "the house"
    long.write_text(f"{cell}\n{'tree ' * 250}\n{cell}\n")  # line 2: 1,250 bytes
    short.write_text(f"{cell}\n{cell}\n{cell}\n")
    words = command.format(
        run=world["run"], corpus=world["corpus"], long=long, short=short, out=out
    )
    result = CliRunner().invoke(app, shlex.split(words))
    _one_line_error(result, f"{long}:2: the line is longer than 1,000 bytes")
    assert not out.exists() or not [p for p in out.iterdir() if not p.name.startswith(".")]
