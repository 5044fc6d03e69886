"""Files on disk: the one atomic writer and the one line reader of aiayn.

Every file aiayn writes goes through `write_file_atomic` (`write_atomic` for text
or bytes in memory) or, for a directory, `write_dir_atomic`: a temporary sibling is
written, fsynced and renamed over the target, so a crash or a full disk never
leaves a half-written file where a whole one was.

Every text file aiayn reads line by line goes through `read_lines` (`decode_lines`
for a stream such as stdin).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

# ----- writing ----------------------------------------------------------------------


def fsync_dir(directory: str | Path) -> None:
    """Make a rename inside `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as file:
        os.fsync(file.fileno())


def _usual_mode(directory: bool = False) -> int:
    """The mode `open` (or `mkdir`) would give under the current umask."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def write_file_atomic(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Let `write(tmp)` fill a temporary file beside `path`; fsync it, rename it to `path`.

    For writers that want a file name rather than bytes (safetensors, matplotlib,
    torch.save). A failure anywhere, `write` included, leaves an earlier file at
    `path` as it was and no temporary file behind.

    Args:
        path: the file to (re)place; its directory is created if missing.
        write: writes the whole file at the path it is given (which ends in ".tmp",
            so name the format explicitly where a writer guesses it from the suffix).

    Returns:
        `path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    tmp = Path(name)
    try:
        write(tmp)
        _fsync_file(tmp)
        os.chmod(tmp, _usual_mode())  # mkstemp makes it private
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write `data` (text as UTF-8) to `path` atomically; see `write_file_atomic`."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return write_file_atomic(path, lambda tmp: tmp.write_bytes(raw))


def write_dir_atomic(target: str | Path, fill: Callable[[Path], None]) -> Path:
    """Let `fill(tmp)` fill a temporary sibling directory of `target`; fsync it, rename it.

    An existing `target` is replaced: moved aside first, deleted after the rename.
    A failure in `fill` or in the fsyncs leaves `target` as it was.

    Returns:
        `target`.
    """
    target = Path(target)
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        fill(tmp)
        for path in sorted(tmp.rglob("*"), reverse=True):  # files before their directories
            if path.is_dir():
                fsync_dir(path)
            else:
                _fsync_file(path)
        fsync_dir(tmp)
        os.chmod(tmp, _usual_mode(directory=True))  # mkdtemp makes it private
        old = None
        if target.exists():
            old = parent / f".{target.name}.{os.getpid()}.old"
            os.replace(target, old)
        os.replace(tmp, target)
        fsync_dir(parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def lines_text(lines: Iterable[str]) -> str:
    """One line per sentence, each ended by "\\n"; a sentence cannot contain a newline."""
    return "".join(line + "\n" for line in lines)


# ----- reading ----------------------------------------------------------------------


class TextEncodingError(ValueError):
    """Text input that is not valid UTF-8; the message names the file, line and byte."""


def decode_lines(stream: Iterable[bytes], name: str) -> Iterator[str]:
    """Lines of a byte stream (a file opened "rb", `sys.stdin.buffer`) as text.

    Only "\\n" ends a line, not the other Unicode line separators a sentence may
    contain; a "\\r" before it is dropped too ("\\r\\n" files). A final newline
    does not start another line.

    Args:
        stream: yields the raw lines, each with its "\\n" (the last may lack it).
        name: what to call the stream in an error ("<stdin>", the file's path).

    Raises:
        TextEncodingError: at the first line that is not valid UTF-8, naming
            `name`, the line number and the byte offset in that line.
    """
    for number, raw in enumerate(stream, start=1):
        raw = raw.removesuffix(b"\n").removesuffix(b"\r")
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise TextEncodingError(
                f"{name}:{number}: invalid UTF-8 at byte {err.start + 1} of the line "
                f"({err.reason}); the input must be UTF-8 text"
            ) from None


def read_lines(path: str | Path) -> list[str]:
    """All lines of a UTF-8 text file, without their line ends; see `decode_lines`.

    Raises:
        FileNotFoundError: if the file is missing.
        TextEncodingError: (a ValueError) on invalid UTF-8, naming file, line and byte.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    with path.open("rb") as stream:
        return list(decode_lines(stream, str(path)))
