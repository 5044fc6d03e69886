"""The one atomic writer and the one line reader: whole files or none, named errors."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pytest

from aiayn.data.files import (
    TextEncodingError,
    decode_lines,
    lines_text,
    read_lines,
    write_atomic,
    write_dir_atomic,
    write_file_atomic,
)


def usual_mode(directory: bool = False) -> int:
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def failing_fsync(_fd: int) -> None:
    raise OSError("disk full")


# ----- writing ----------------------------------------------------------------------


def test_write_atomic_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "f.txt"
    assert write_atomic(path, "old\n") == path
    assert path.stat().st_mode & 0o777 == usual_mode()  # not mkstemp's private 0o600
    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


def test_write_atomic_writes_text_as_utf8_and_bytes_as_they_are(tmp_path):
    write_atomic(tmp_path / "deep" / "t.txt", "año\n")  # the directory is created
    assert (tmp_path / "deep" / "t.txt").read_bytes() == "año\n".encode()
    write_atomic(tmp_path / "b.bin", b"\x00\xff")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff"


def test_write_file_atomic_keeps_the_old_file_when_the_writer_fails(tmp_path):
    path = tmp_path / "model.bin"
    write_file_atomic(path, lambda tmp: tmp.write_bytes(b"whole"))
    assert path.read_bytes() == b"whole"

    def half(tmp: Path) -> None:
        tmp.write_bytes(b"ha")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        write_file_atomic(path, half)
    assert path.read_bytes() == b"whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bin"]


def test_write_dir_atomic_replaces_a_directory_whole(tmp_path):
    target = tmp_path / "checkpoints" / "best"

    def fill(version: str):
        def write(tmp: Path) -> None:
            (tmp / "weights").write_text(version)
            (tmp / "sub").mkdir()
            (tmp / "sub" / "info").write_text(version)

        return write

    assert write_dir_atomic(target, fill("1")) == target
    assert target.stat().st_mode & 0o777 == usual_mode(directory=True)  # not mkdtemp's 0o700
    write_dir_atomic(target, fill("2"))
    assert (target / "weights").read_text() == (target / "sub" / "info").read_text() == "2"
    assert [p.name for p in target.parent.iterdir()] == ["best"]  # the old one is gone

    def broken(tmp: Path) -> None:
        (tmp / "weights").write_text("3, half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_dir_atomic(target, broken)
    assert (target / "weights").read_text() == "2"
    assert [p.name for p in target.parent.iterdir()] == ["best"]


# ----- reading ----------------------------------------------------------------------


def test_read_lines_endings(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes("one\r\ntwo\n\nfour\u2028still four\rx\r".encode())
    # only "\n" ends a line; a "\r" before it (or at the very end) goes with it
    assert read_lines(path) == ["one", "two", "", "four\u2028still four\rx"]
    path.write_bytes(b"one\n\n")  # a final newline starts no line; an empty last line stays
    assert read_lines(path) == ["one", ""]
    path.write_bytes(b"")
    assert read_lines(path) == []


def test_lines_text_is_what_read_lines_reads_back(tmp_path):
    lines = ["one", "", "three\u2028still three", ""]
    write_atomic(tmp_path / "l.txt", lines_text(lines))
    assert read_lines(tmp_path / "l.txt") == lines


def test_invalid_utf8_names_file_line_and_byte(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"house.\n\ntree \xff\xfe river.\n")
    with pytest.raises(TextEncodingError, match=re.escape(f"{path}:3: invalid UTF-8 at byte 6")):
        read_lines(path)
    assert issubclass(TextEncodingError, ValueError)  # callers catch ValueError


def test_decode_lines_reads_a_stream_lazily():
    stream = io.BytesIO(b"ok\r\nalso ok\nbad \xc3\x28\n")
    lines = decode_lines(stream, "<stdin>")
    assert next(lines) == "ok" and next(lines) == "also ok"
    with pytest.raises(TextEncodingError, match=r"<stdin>:3: invalid UTF-8 at byte 5"):
        next(lines)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        read_lines(tmp_path / "nope")
