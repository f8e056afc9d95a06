"""Reading a file an operator names: a regular file only, bounded, never blocking.

A configured path (a policy, a tokenizer, a TLS certificate) may lead to anything a
volume or a mistake puts there: a FIFO (opening it for reading blocks until a writer
comes; reading it, until the writer leaves), a device (``/dev/zero`` never ends), a
directory, a socket, a dangling symlink, or a file still being written. Rules:

1. Only a regular file is read. The kind is checked on the resolved path before it
   is opened (so a device is never opened in the usual case) and again with
   ``fstat`` on the open descriptor, which is opened ``O_NONBLOCK``: a FIFO swapped
   in between the two opens at once and is refused, never read.
2. At most ``max_bytes`` are read: each caller knows how large its file can be.
3. The bytes returned are those of one version: the descriptor's size and times are
   the same before and after the read, and the read got exactly that size. A write
   racing the read raises :class:`FileChangedError`; reading again later may succeed.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

_OPEN_FLAGS = (
    os.O_RDONLY
    | os.O_NONBLOCK
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    # The resolved path has no symlink left: one appearing there is a swap mid-read.
    | getattr(os, "O_NOFOLLOW", 0)
)
_KINDS = (
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
REGULAR = "a regular file"
_READ_CHUNK = 64 * 1024


class FileRefusedError(Exception):
    """The path cannot be read as a regular file of at most the size asked: ``reason``
    says why, in words that follow the path in a message."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class FileChangedError(FileRefusedError):
    """The file changed while it was read (or was being swapped): read it again once it
    holds still. Not a verdict on the file."""


@dataclass(frozen=True)
class FileVersion:
    """The bytes of one version of a file, and that version's ``os.stat``."""

    data: bytes
    resolved: str
    stat: os.stat_result


def kind_of(mode: int) -> str:
    """What an ``st_mode`` is, as a phrase (``"a FIFO"``)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def not_regular(kind: str, resolved: str) -> str:
    """Why a path that resolves to ``kind`` is not read."""
    return f"resolves to {kind} ({resolved}), not a regular file: not read"


def missing(resolved: str, dangling: bool) -> str:
    if dangling:
        return f"is a dangling symlink (to {resolved}, which does not exist)"
    return "does not exist"


def over_size(size: int, max_bytes: int, what: str) -> str:
    return f"is {size:,} bytes: {what} is at most {max_bytes:,} bytes"


def stat_failure(source: str, resolved: str, exc: OSError) -> str:
    """Why ``os.stat`` of the resolved path failed, as a refusal's reason."""
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return missing(resolved, dangling=os.path.islink(source))
    return f"cannot read: {exc.strerror or exc}"


def read_regular_file(
    path: str | os.PathLike[str], *, max_bytes: int, what: str = "such a file"
) -> FileVersion:
    """One version of the regular file at ``path`` (rules above). ``what`` names the
    file in the over-size reason ("a policy file is at most ...")."""
    source = os.fspath(path)
    resolved = os.path.realpath(source)
    try:
        before_open = os.stat(resolved)
    except OSError as exc:
        raise FileRefusedError(stat_failure(source, resolved, exc)) from None
    _check(before_open, resolved, max_bytes, what)
    try:
        fd = os.open(resolved, _OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        raise FileChangedError("gone while opened") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink put where the file was: a swap under way
            raise FileChangedError("re-pointed while opened") from None
        raise FileRefusedError(f"cannot open: {exc.strerror or exc}") from None
    try:
        before = os.fstat(fd)
        _check(before, resolved, max_bytes, what)
        data = _read_at_most(fd, max_bytes + 1)
        after = os.fstat(fd)
    except OSError as exc:
        raise FileRefusedError(f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise FileChangedError(over_size(len(data), max_bytes, what))
    if _identity(before) != _identity(after):
        raise FileChangedError("changed while it was read")
    if len(data) != after.st_size:
        raise FileChangedError("its size changed while it was read")
    return FileVersion(data, resolved, after)


def _check(st: os.stat_result, resolved: str, max_bytes: int, what: str) -> None:
    kind = kind_of(st.st_mode)
    if kind != REGULAR:
        raise FileRefusedError(not_regular(kind, resolved))
    if st.st_size > max_bytes:
        raise FileRefusedError(over_size(st.st_size, max_bytes, what))


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What changes when the file is written or replaced."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    got = 0
    while got < limit:
        chunk = os.read(fd, min(_READ_CHUNK, limit - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
