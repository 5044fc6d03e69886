"""Files on disk: the one atomic writer and the one line reader of aiayn.

Every file aiayn writes goes through `write_file_atomic` (`write_atomic` for text
or bytes in memory) or, for a directory, `write_dir_atomic`: a temporary sibling is
written, fsynced and renamed over the target, so a crash or a full disk never
leaves a half-written file where a whole one was. What the target path leads to is
never replaced by something else: a symbolic link is followed (its target is
replaced atomically, the link stays a link), and a device or a FIFO is written
through, as a shell's `>` would. A write the system refuses (disk
full, permission denied, read-only) raises `WriteFailed`, one line naming the target;
`remove_temporaries` cleans up after a writer that was killed. `exclusive_lock` keeps
a second process out (one trainer per run directory).

Every text file aiayn reads line by line goes through `read_lines` (`decode_lines`
for a stream such as stdin), which refuses a line longer than `MAX_LINE_BYTES`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

# ----- writing ----------------------------------------------------------------------
#   A temporary is named after its target: ".NAME.RANDOM.tmp" beside NAME, and an old
#   directory being replaced is moved aside as ".NAME.PID.old" until the new one is in
#   place. `remove_temporaries` knows these names; nothing else should.

_TMP_SUFFIX = ".tmp"
_OLD_SUFFIX = ".old"


class WriteFailed(OSError):
    """An atomic write that the system refused (disk full, permission denied, read-only
    file system). `filename` is the file or directory that was being written; whatever
    was there before is intact."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


def system_error(err: BaseException) -> OSError | None:
    """The OS error behind a writer's failure, or None if it was not one.

    Writers in other libraries report a full disk in their own ways: the OSError
    itself, a RuntimeError raised while handling one (torch.save to an open file), or
    only in the message (safetensors: "... (os error 28)").
    """
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen
        seen = seen.__cause__ or seen.__context__
    found = re.search(r"\(os error (\d+)\)", str(err))
    if found:
        number = int(found.group(1))
        return OSError(number, os.strerror(number))
    return None


def _refused(err: BaseException, target: Path) -> WriteFailed | None:
    """`err` as a `WriteFailed` naming `target`, if the system refused the write."""
    if isinstance(err, WriteFailed) or not isinstance(err, Exception):
        return None
    cause = system_error(err)
    return None if cause is None else WriteFailed(cause.errno, cause.strerror, str(target))


# What a path may lead to when a file is written there: a regular file (replaced
# atomically) or one of these, written through (opened and written in place: there is
# nothing to rename over, and renaming over it would destroy a device node or a pipe).
_WRITTEN_THROUGH = {
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO",
}
_KIND_NAMES = {**_WRITTEN_THROUGH, stat.S_IFDIR: "a directory", stat.S_IFSOCK: "a socket"}


def _kind_at(path: Path) -> int | None:
    """The file type (`stat.S_IFMT`) of what `path` leads to, symbolic links followed;
    None if nothing is there (a dangling link included, or a file where a directory of
    the path belongs)."""
    try:
        return stat.S_IFMT(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _link_target(path: Path) -> Path:
    """Where a write to `path` lands: `path`, or, if it is a symbolic link, the file the
    chain of links leads to (which need not exist yet)."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _temporary_beside(target: Path, directory: bool) -> Path:
    """Create an empty temporary file or directory beside `target` (`tempfile` would
    make it private; this one gets the user's umask)."""
    while True:
        tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}{_TMP_SUFFIX}"
        try:
            if directory:
                tmp.mkdir()
            else:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def _umask() -> int:
    """The process's umask; read from /proc where it can be, not set and reset."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _usual_modes(paths: Iterable[Path]) -> None:
    """Give `paths` the modes `open` and `mkdir` give under the umask: some writers
    (safetensors) create their files private (0o600)."""
    umask = _umask()
    for path in paths:
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


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


def write_file_atomic(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Let `write(tmp)` fill a temporary file beside `path`; fsync it, rename it to `path`.

    For writers that want a file name rather than bytes (safetensors, matplotlib,
    torch.save). A failure anywhere, `write` included, leaves an earlier file at
    `path` as it was and no temporary file behind. The file gets the mode the user's
    umask gives.

    What `path` leads to is never replaced by something else. A symbolic link is
    followed: the file it leads to is replaced atomically and the link stays a link.
    A device or a FIFO is written through, as a shell's `>` would: see `_write_through`.

    Args:
        path: the file to (re)place; its directory is created if missing.
        write: writes the whole file at the path it is given (which ends in ".tmp",
            so name the format explicitly where a writer guesses it from the suffix).

    Returns:
        `path`.

    Raises:
        WriteFailed: (an OSError) the system refused a write (disk full, permission
            denied, read-only file system, a device that refuses it such as
            /dev/full), or `path` leads to a directory or a socket; it names `path`.
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        kind = _kind_at(path)
        if kind in _WRITTEN_THROUGH:
            _write_through(path, write)
            return path
        if kind is not None and kind != stat.S_IFREG:
            raise WriteFailed(
                errno.EISDIR if kind == stat.S_IFDIR else errno.EINVAL,
                f"it is {_KIND_NAMES.get(kind, 'not a regular file')}; name a file to write",
                str(path),
            )
        target = _link_target(path)
        tmp = _temporary_beside(target, directory=False)
        write(tmp)
        _usual_modes([tmp])
        _fsync_file(tmp)
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException as err:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        refused = _refused(err, path)
        if refused is None:
            raise
        raise refused from err
    return path


def _write_through(path: Path, write: Callable[[Path], None]) -> None:
    """Write into the device or FIFO at `path` in place: no temporary beside it and no
    rename, which would replace the node by a regular file. `write` fills a private
    temporary file first (writers may need to seek, and `shutil.copyfile` refuses
    pipes); its bytes are then written into `path`, opened without O_CREAT so that a
    node gone meanwhile is an error rather than a new file. There is nothing to fsync.
    A failure may leave part of the output in the device or the pipe."""
    with tempfile.TemporaryDirectory(prefix="aiayn-") as scratch:
        tmp = Path(scratch) / path.name
        write(tmp)
        fd = os.open(path, os.O_WRONLY)
        try:
            with open(tmp, "rb") as file:
                while chunk := file.read(1 << 20):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
        finally:
            os.close(fd)


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write `data` (text as UTF-8) to `path` atomically; see `write_file_atomic`."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return write_file_atomic(path, lambda tmp: tmp.write_bytes(raw))


def write_dir_atomic(target: str | Path, fill: Callable[[Path], None]) -> Path:
    """Let `fill(tmp)` fill a temporary sibling directory of `target`; fsync it, rename it.

    An existing `target` is replaced: moved aside first, deleted after the rename.
    A failure in `fill` or in the fsyncs leaves `target` as it was; a crash leaves at
    most a temporary that `remove_temporaries` cleans up. The directory gets the mode
    the user's umask gives. A symbolic link is followed: the directory it leads to is
    replaced and the link stays a link. Anything else that is not a directory (a file,
    a device, a FIFO) is refused, not replaced.

    Returns:
        `target`.

    Raises:
        WriteFailed: (an OSError) the system refused a write, or `target` leads to
            something that is not a directory; it names `target`.
    """
    target = Path(target)
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        kind = _kind_at(target)
        if kind is not None and kind != stat.S_IFDIR:
            raise WriteFailed(
                errno.ENOTDIR,
                f"it is {_KIND_NAMES.get(kind, 'a file')}, not a directory; "
                "name a directory to write",
                str(target),
            )
        real = _link_target(target)
        parent = real.parent
        tmp = _temporary_beside(real, directory=True)
        fill(tmp)
        written = sorted(tmp.rglob("*"), reverse=True)  # files before their directories
        _usual_modes(written)
        for path in written:
            if path.is_dir():
                fsync_dir(path)
            else:
                _fsync_file(path)
        fsync_dir(tmp)
        old = None
        if real.exists():
            old = parent / f".{real.name}.{os.getpid()}{_OLD_SUFFIX}"
            os.replace(real, old)
        os.replace(tmp, real)
        fsync_dir(parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as err:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        refused = _refused(err, target)
        if refused is None:
            raise
        raise refused from err
    return target


def remove_temporaries(directory: str | Path, names: Iterable[str]) -> list[Path]:
    """Clean up after writers that were killed: `write_file_atomic` / `write_dir_atomic`
    temporaries of the targets `names` (glob patterns: "step-*", "config.yaml") in
    `directory` are deleted; a directory moved aside while being replaced comes back
    when its replacement never arrived.

    Call it only while no other process writes these targets (under the run's lock).

    Returns:
        The temporaries deleted.
    """
    directory = Path(directory)
    removed = []
    for pattern in names:
        for old in directory.glob(f".{pattern}.*{_OLD_SUFFIX}"):
            target = directory / old.name[1:].rsplit(".", 2)[0]
            if not target.exists():
                os.replace(old, target)
                log.warning("restored %s, which a killed write had moved aside", target)
        leftovers = [
            *directory.glob(f".{pattern}.*{_TMP_SUFFIX}"),
            *directory.glob(f".{pattern}.*{_OLD_SUFFIX}"),
        ]
        for leftover in leftovers:
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover)
            else:
                leftover.unlink()
            removed.append(leftover)
    return removed


# ----- one process at a time ----------------------------------------------------------


class LockHeld(RuntimeError):
    """Another process holds the lock.

    Attributes:
        path: the lock file.
        holder: the process id written in it, or None if unknown.
    """

    def __init__(self, path: Path, holder: int | None) -> None:
        super().__init__(f"{path} is locked by process {holder or '(unknown)'}")
        self.path, self.holder = path, holder


@contextlib.contextmanager
def exclusive_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) while inside.

    An advisory `fcntl.flock` lock: the system releases it when the process ends,
    however it ends, so a killed holder never leaves a run locked. This process's id
    is written in the file for the message of the next would-be holder. The file
    stays (deleting it would race with a process that has just opened it).

    Raises:
        LockHeld: another process (or another open in this one) holds it.
        WriteFailed: (an OSError) the file cannot be created or written; it names it.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as err:
        raise WriteFailed(err.errno, err.strerror, str(path)) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            raise LockHeld(path, int(text) if text.isdigit() else None) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        except OSError as err:
            raise WriteFailed(err.errno, err.strerror, str(path)) from None
        yield
    finally:
        os.close(fd)  # releases the lock


def lines_text(lines: Iterable[str]) -> str:
    """One line per sentence, each ended by "\\n"; a sentence cannot contain a newline."""
    return "".join(line + "\n" for line in lines)


# ----- reading ----------------------------------------------------------------------


# The longest line a reader accepts, in bytes, its line end not counted. A sentence is
# far shorter, and a document of a monolingual corpus (one per line) is too, with room to
# spare; what is longer is not line-based text (a binary file, /dev/zero, a file with no
# newlines), and reading it whole could take all the memory there is.
MAX_LINE_BYTES = 1 << 20  # 1 MiB
_CHUNK_BYTES = 1 << 16  # read this much at a time, so no line is ever read whole first


class TextEncodingError(ValueError):
    """Text input that is not valid UTF-8; the message names the file, line and byte."""


class LineTooLong(ValueError):
    """A line longer than `MAX_LINE_BYTES`; the message names the file, line and limit."""


def _chunks(stream: BinaryIO | Iterable[bytes]) -> Iterator[bytes]:
    """The bytes of `stream` in pieces of at most `_CHUNK_BYTES` (for a file), or as an
    iterable yields them, wherever its lines end."""
    read = getattr(stream, "read1", None) or getattr(stream, "read", None)
    if read is None:
        yield from stream
        return
    while chunk := read(_CHUNK_BYTES):
        yield chunk


def decode_lines(stream: BinaryIO | Iterable[bytes], name: str) -> Iterator[str]:
    """Lines of a byte stream (a file opened "rb", `sys.stdin.buffer`) as text.

    Only "\\n" ends a line, not the other Unicode line separators a sentence may
    contain; a "\\r" before it is dropped too ("\\r\\n" files). A final newline
    does not start another line. The stream is read in chunks, and a line longer than
    `MAX_LINE_BYTES` is refused as soon as that many bytes of it have come, so memory
    stays bounded whatever the input (/dev/zero, a binary file).

    Args:
        stream: a binary file, or an iterable of its bytes in pieces of any size.
        name: what to call the stream in an error ("<stdin>", the file's path).

    Raises:
        TextEncodingError: at the first line that is not valid UTF-8, naming
            `name`, the line number and the byte offset in that line.
        LineTooLong: (a ValueError) at the first line longer than `MAX_LINE_BYTES`,
            naming `name`, the line number and the limit.
    """
    limit = MAX_LINE_BYTES  # read now: tests lower it
    number, pending = 0, bytearray()

    def line(raw: bytes) -> str:
        raw = raw.removesuffix(b"\r")
        if len(raw) > limit:
            raise _too_long(name, number, limit)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise TextEncodingError(
                f"{name}:{number}: invalid UTF-8 at byte {err.start + 1} of the line "
                f"({err.reason}); the input must be UTF-8 text"
            ) from None

    for chunk in _chunks(stream):
        pending += chunk
        start = 0
        while (end := pending.find(b"\n", start)) >= 0:
            number += 1
            yield line(bytes(pending[start:end]))
            start = end + 1
        del pending[:start]
        if len(pending) > limit + 1:  # the line so far, and room for a "\r" before "\n"
            raise _too_long(name, number + 1, limit)
    if pending:
        number += 1
        yield line(bytes(pending))


def _too_long(name: str, number: int, limit: int) -> LineTooLong:
    return LineTooLong(
        f"{name}:{number}: the line is longer than {limit:,} bytes, the most a line may "
        "hold; the input must be text, one sentence or document per line"
    )


def read_lines(path: str | Path) -> list[str]:
    """All lines of a UTF-8 text file, without their line ends; see `decode_lines`.

    Any file that is not a directory will do, pipes included (a FIFO, the /dev/fd/N
    of a shell's `<(...)`): it is read once, from start to end.

    Raises:
        FileNotFoundError: if the file is missing.
        IsADirectoryError: if it is a directory.
        TextEncodingError: (a ValueError) on invalid UTF-8, naming file, line and byte.
        LineTooLong: (a ValueError) on a line longer than `MAX_LINE_BYTES`, naming
            file, line and the limit.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"input file not found: {path}")
    if path.is_dir():
        raise IsADirectoryError(f"input {path} is a directory; give a file")
    with path.open("rb") as stream:
        return list(decode_lines(stream, str(path)))


# ----- checking outputs before the work ----------------------------------------------


def check_output(path: str | Path, option: str, directory: bool = False) -> Path:
    """Refuse, before any work, an output path that could not be written.

    A file output must not be a directory or a socket, nor an existing file that is
    read-only (a device or a FIFO is fine: it is written through); a directory output
    must not be an existing file, device or FIFO. Either must be writable where it
    is, or, if it does not exist yet, creatable in its nearest existing ancestor.

    Args:
        path: the output file or directory.
        option: how the user named it ("-o", "--out"), for the message.
        directory: whether `path` is a directory to create or fill.

    Returns:
        `path`.

    Raises:
        ValueError: naming `option`, `path` and what is wrong with it.
    """
    path = Path(path)
    where = f"{option} {path}"
    kind = _kind_at(path)
    if path.is_dir() and not directory:
        raise ValueError(f"{where} is a directory; name a file to write")
    if kind == stat.S_IFSOCK and not directory:
        raise ValueError(f"{where} is a socket; name a file, a device or a FIFO to write")
    if path.exists() and not path.is_dir() and directory:
        what = "an existing file" if kind == stat.S_IFREG else _KIND_NAMES.get(kind, "a file")
        raise ValueError(f"{where} is {what}; name a directory to write")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{where}: cannot write in it (read-only or permission denied)")
    if path.exists() and not directory and not os.access(path, os.W_OK):
        raise ValueError(f"{where}: the existing file is read-only")
    if path.is_dir():
        return path
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{where}: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{where}: cannot write in {ancestor} (read-only or permission denied)")
    return path


def check_fresh_output(out: str | Path, option: str, source: str | Path, force: bool) -> Path:
    """Refuse, before any work, a directory output that would destroy something: one that
    holds files already (unless `force`), or one that is, lies inside or holds `source`
    (even with `force`: replacing it would delete the input). Symbolic links are
    resolved first. Check the path itself with `check_output`.

    Args:
        out: the directory to write (replaced whole, see `write_dir_atomic`).
        option: how the user named it ("OUT"), for the message.
        source: the directory the output is made from.
        force: whether an existing, non-empty `out` may be replaced.

    Returns:
        `out`.

    Raises:
        ValueError: naming `option`, `out` and what it would destroy.
    """
    out, source = Path(out), Path(source)
    where, real_out, real_source = f"{option} {out}", out.resolve(), source.resolve()
    if real_out == real_source:
        raise ValueError(f"{where} is the source directory {source}; name another directory")
    if real_source in real_out.parents:
        raise ValueError(f"{where} lies inside the source directory {source}; name one outside it")
    if real_out in real_source.parents:
        raise ValueError(
            f"{where} holds the source directory {source}; replacing it would delete the "
            "source: name another directory"
        )
    if not force and out.is_dir() and any(out.iterdir()):
        held = ", ".join(sorted(p.name for p in out.iterdir())[:3])
        raise ValueError(
            f"{where} exists and is not empty (it holds {held}, ...); name a new or empty "
            "directory, or give --force to replace it"
        )
    return out


def write_fresh_dir(
    source: str | Path,
    out: str | Path,
    fill: Callable[[Path], None],
    force: bool = False,
    option: str = "OUT",
) -> Path:
    """Write directory `out` from directory `source`, destroying neither: refuse an `out`
    that could not be written (`check_output`) or that would destroy something
    (`check_fresh_output`: not empty unless `force`; never the source, inside it or
    holding it), then let `fill(tmp)` fill a temporary that replaces `out` when whole
    (`write_dir_atomic`). A failure, a full disk included, leaves `out` as it was.

    Args:
        source: the directory `out` is made from.
        out: the directory to write.
        fill: writes the files into the directory it is given.
        force: whether an existing, non-empty `out` may be replaced.
        option: how the user named `out`, for messages.

    Returns:
        `out`.

    Raises:
        ValueError: an `out` refused (naming `option` and why), or a file of
            `source` that cannot be read (naming it).
        WriteFailed: (an OSError) the system refused a write to `out`.
    """
    source, out = Path(source), Path(out)
    check_output(out, option, directory=True)
    check_fresh_output(out, option, source, force)

    def checked_fill(tmp: Path) -> None:
        try:
            fill(tmp)
        except OSError as err:  # reading the source: not a write to `out` that failed
            if err.errno is None or err.filename is None or tmp in Path(err.filename).parents:
                raise
            raise ValueError(f"cannot read {err.filename}: {err.strerror}") from None

    return write_dir_atomic(out, checked_fill)
