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

Before the work, every writer checks its output with `check_output`: never a run,
corpus or input the command reads, nor inside one or around one, and a directory that
holds something replaced only with --force. Every JSON file is strict (`strict_json`:
NaN as null).

Every text file aiayn reads line by line goes through `read_lines` (`decode_lines`
for a stream such as stdin), which refuses a line longer than `MAX_LINE_BYTES`: the
reader is `aiayn.data.lines`'s, its names importable from here too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from aiayn.data.lines import (
    MAX_LINE_BYTES,
    LineTooLong,
    TextEncodingError,
    decode_lines,
    lines_text,
    read_lines,
)

# The line reader's names are importable from here, as they were before `aiayn.data.lines`.
__all__ = [
    "MAX_LINE_BYTES",
    "LineTooLong",
    "LockHeld",
    "TextEncodingError",
    "WriteFailed",
    "check_output",
    "decode_lines",
    "exclusive_lock",
    "fsync_dir",
    "lines_text",
    "protected_root",
    "read_lines",
    "remove_temporaries",
    "strict_json",
    "system_error",
    "write_atomic",
    "write_dir_atomic",
    "write_file_atomic",
    "write_fresh_dir",
]

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


def _sibling(target: Path, tag: str, suffix: str) -> Path:
    """ ".NAME.TAG.SUFFIX" beside `target`, NAME cut short where the whole would pass the
    file system's limit on a name (255 bytes on most): a target whose name is near the
    limit still gets a temporary, named after the start of its name."""
    try:
        limit = os.pathconf(target.parent if target.parent.exists() else ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    name = os.fsencode(target.name)
    room = limit - len(os.fsencode(f"..{tag}{suffix}"))
    return target.parent / os.fsdecode(b"." + name[:room] + os.fsencode(f".{tag}{suffix}"))


def _temporary_beside(target: Path, directory: bool) -> Path:
    """Create an empty temporary file or directory beside `target` (`tempfile` would
    make it private; this one gets the user's umask)."""
    while True:
        tmp = _sibling(target, secrets.token_hex(4), _TMP_SUFFIX)
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
            old = _sibling(real, str(os.getpid()), _OLD_SUFFIX)
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


# ----- checking outputs before the work ----------------------------------------------
#   One rule for every writer (export, convert, prepare, translate -o, patch, lens,
#   induction, align): `check_output`, before any work. An output is never a run, corpus
#   or input the command reads, never inside one and never around one, whatever --force
#   says; a directory output replaced whole needs --force where it holds something, and
#   is written under a temporary name (`write_fresh_dir`), so that a refusal or a failure
#   leaves no partial output.

_CHECKPOINTS = "checkpoints"  # RUN/checkpoints/NAME/...: what lies there belongs to RUN
_CORPUS_MARK = "corpus.json"  # aiayn.data.corpus.CORPUS_FILE: its directory is a corpus
_WEIGHTS_FILE = "model.safetensors"  # aiayn.io.checkpoint.WEIGHTS_FILE: in a checkpoint


def protected_root(path: str | Path) -> Path:
    """What a path a command reads belongs to, and is protected as a whole with it
    (symbolic links resolved):

    - the run RUN, for RUN/checkpoints, a checkpoint directory RUN/checkpoints/NAME, or a
      file inside one (the layout `aiayn.io.checkpoint.find_in_run` reads);
    - the directory of any other weights file (model.safetensors): a checkpoint or a
      converted model;
    - the corpus, for a file of a directory that holds a corpus.json;
    - else `path` itself: a run directory, a corpus, an input file.
    """
    real = Path(os.path.realpath(path))
    for ancestor in [real, *real.parents][:3]:  # RUN/checkpoints[/NAME[/FILE]]
        if ancestor.name == _CHECKPOINTS:
            return ancestor.parent
    if real.is_file() and (real.name == _WEIGHTS_FILE or (real.parent / _CORPUS_MARK).is_file()):
        return real.parent
    return real


def _as_paths(reads: str | Path | Iterable[str | Path] | None) -> list[Path]:
    if reads is None:
        return []
    if isinstance(reads, str | os.PathLike):
        return [Path(reads)]
    return [Path(read) for read in reads if read is not None]


def _refuse_protected(path: Path, where: str, reads: list[Path], directory: bool) -> None:
    """Refuse an output that is, lies inside or holds what the command reads."""
    real = Path(os.path.realpath(path))
    for read in reads:
        if not (read.is_file() or read.is_dir()):
            continue  # missing (reported by the command), or a pipe or device: no file
        root = protected_root(read)
        what = (
            "the run"
            if (root / _CHECKPOINTS).is_dir()
            else "the corpus"
            if (root / _CORPUS_MARK).is_file()
            else "the source directory"
            if root.is_dir()
            else "the input file"
        )
        read_itself = root == Path(os.path.realpath(read))
        named = f"{what} {read}" if read_itself else f"{what} {root}, which holds {read},"
        if real == root:
            kind = "directory" if directory else "file"
            raise ValueError(f"{where} is {named} read by this command; name another {kind}")
        if root in real.parents:
            raise ValueError(
                f"{where} lies inside {named} read by this command; aiayn never writes "
                "there, whatever --force says: name a path outside it"
            )
        if real in root.parents:
            raise ValueError(
                f"{where} holds {named} read by this command; replacing it would delete "
                "it: name another directory"
            )


def check_output(
    path: str | Path,
    option: str,
    directory: bool = False,
    *,
    reads: str | Path | Iterable[str | Path] | None = None,
    force: bool | None = None,
) -> Path:
    """Refuse, before any work, an output path that could not be written, or whose
    writing would destroy something: the one rule of every writer.

    A file output must not be a directory or a socket, nor an existing file that is
    read-only (a device or a FIFO is fine: it is written through); a directory output
    must not be an existing file, device or FIFO. Either must be writable where it
    is, or, if it does not exist yet, creatable in its nearest existing ancestor.

    Neither may be, lie inside or hold what the command reads (`reads`, each protected
    with all it belongs to: `protected_root`), whatever `force` says; symbolic links are
    resolved first, so a link into a run is refused as the run's own path is.

    Args:
        path: the output file or directory.
        option: how the user named it ("-o", "--out", "OUT"), for the message.
        directory: whether `path` is a directory to create or fill.
        reads: the runs, checkpoints, corpora and input files the command reads.
        force: for a directory replaced whole (`write_fresh_dir`): whether one that
            exists and holds something may be replaced; None for an output written
            file by file (a file output, or a directory whose files of the same names
            are replaced, as `aiayn patch --out` does).

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
    _refuse_protected(path, where, _as_paths(reads), directory)
    if force is False and path.is_dir() and any(path.iterdir()):
        held = ", ".join(sorted(p.name for p in path.iterdir())[:3])
        raise ValueError(
            f"{where} exists and is not empty (it holds {held}, ...); name a new or empty "
            "directory, or give --force to replace it"
        )
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{where}: cannot write in it (read-only or permission denied)")
    if path.exists() and not directory and not os.access(path, os.W_OK):
        raise ValueError(f"{where}: the existing file is read-only")
    if path.is_dir() and force is None:
        return path
    ancestor = path.parent  # where a new file or a replacing directory is made
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{where}: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{where}: cannot write in {ancestor} (read-only or permission denied)")
    return path


def write_fresh_dir(
    source: str | Path | Iterable[str | Path] | None,
    out: str | Path,
    fill: Callable[[Path], None],
    force: bool = False,
    option: str = "OUT",
) -> Path:
    """Write directory `out` from what the command reads, destroying neither: refuse an
    `out` that could not be written or would destroy something (`check_output`: never
    the source, inside it or holding it; not one that holds something, unless `force`),
    then let `fill(tmp)` fill a temporary that replaces `out` when whole
    (`write_dir_atomic`). A refusal or a failure, a full disk included, leaves `out` as it was.

    Args:
        source: what `out` is made from: a run, checkpoint or directory, input files,
            or None.
        out: the directory to write.
        fill: writes the files into the directory it is given.
        force: whether an existing, non-empty `out` may be replaced.
        option: how the user named `out`, for messages.

    Returns:
        `out`.

    Raises:
        ValueError: an `out` refused (naming `option` and why), or a file of `source`
            that cannot be read (naming it).
        WriteFailed: (an OSError) the system refused a write to `out`.
    """
    reads, out = _as_paths(source), Path(out)
    check_output(out, option, directory=True, reads=reads, force=force)

    def checked_fill(tmp: Path) -> None:
        try:
            fill(tmp)
        except OSError as err:  # reading the source: not a write to `out` that failed
            if err.errno is None or err.filename is None or tmp in Path(err.filename).parents:
                raise
            raise ValueError(f"cannot read {err.filename}: {err.strerror}") from None

    return write_dir_atomic(out, checked_fill)


# ----- what an output may hold: JSON as the standard has it ------------------------


def strict_json(data: Any, **options: Any) -> str:
    """`data` as JSON text ending in a newline; NaN and infinities become null.

    Python's `json` writes them as bare NaN and Infinity, which is not JSON: other
    readers (browsers, jq, `JSON.parse`) refuse the whole file. Every JSON file aiayn
    writes is made here.

    Args:
        data: dicts, lists, tuples, strings, numbers, booleans and None.
        options: for `json.dumps` (indent=2 unless given; ensure_ascii, separators).

    Raises:
        TypeError: a value JSON cannot hold.
    """
    return json.dumps(_finite(data), allow_nan=False, **{"indent": 2, **options}) + "\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
