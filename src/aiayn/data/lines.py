"""Text line by line: the one line reader of aiayn, and the one way lines are joined.

Every text file aiayn reads line by line goes through `read_lines` (`decode_lines`
for a stream such as stdin), which refuses a line longer than `MAX_LINE_BYTES` and
text that is not UTF-8, naming the file, line and byte; `lines_text` joins lines for
a writer (`aiayn.data.files`), so that `read_lines` reads back what it wrote.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO


def lines_text(lines: Iterable[str]) -> str:
    """One line per sentence, each ended by "\\n"; a sentence cannot contain a newline."""
    return "".join(line + "\n" for line in lines)


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
