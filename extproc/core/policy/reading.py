"""Reading a policy file: one stable version of a regular file, never blocking.

The policy path is the operator's, but what it resolves to may be anything a volume
or a mistake puts there: a FIFO (opening it for reading blocks until a writer comes;
reading it, until the writer leaves), a device (``/dev/zero`` never ends), a
directory, a socket, a dangling symlink, or a file still being written. Rules:

1. Only a regular file is read. The kind is checked on the resolved path before it
   is opened (so a device is never opened in the usual case) and again with
   ``fstat`` on the open descriptor, which is opened ``O_NONBLOCK``: a FIFO swapped
   in between the two opens at once and is refused, never read.
2. At most :data:`MAX_POLICY_BYTES` are read: a policy is a few KiB of YAML.
3. The bytes returned are those of one version: the descriptor's size and times are
   the same before and after the read, and the read got exactly that size. A write
   racing the read raises :class:`PolicyFileChangedError`, which callers retry (later:
   the reload's watch; at once, a few times: start-up), never load.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from extproc.core.policy.errors import PolicyError

MAX_POLICY_BYTES = 1024 * 1024
FILE_FIELD = "<file>"
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


class PolicyFileChangedError(PolicyError):
    """The file changed while it was read (or since it was last looked at): read it
    again once it holds still. Not a verdict on the file."""


def kind_of(mode: int) -> str:
    """What an ``st_mode`` is, as a phrase (``"a FIFO"``)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def not_regular(kind: str, resolved: str) -> str:
    """Why a path that resolves to ``kind`` is not read (the reason of its PolicyError)."""
    return f"resolves to {kind} ({resolved}), not a regular file: not read"


def missing(resolved: str, dangling: bool) -> str:
    if dangling:
        return f"is a dangling symlink (to {resolved}, which does not exist)"
    return "does not exist"


def over_size(size: int) -> str:
    return f"is {size:,} bytes: a policy file is at most {MAX_POLICY_BYTES:,} bytes"


@dataclass(frozen=True)
class PolicyFileVersion:
    """The text of one version of the file, and that version's identity (what
    ``os.stat`` of the resolved path says while it is unchanged)."""

    text: str
    resolved: str
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


def read_policy_file(path: str | os.PathLike[str]) -> PolicyFileVersion:
    """The file's text; raises PolicyError (field ``<file>``) for what cannot be
    read, and its subclass PolicyFileChangedError for a version that changed while read."""
    source = os.fspath(path)
    resolved = os.path.realpath(source)
    try:
        before_open = os.stat(resolved)
    except OSError as exc:
        raise PolicyError(source, FILE_FIELD, stat_failure(source, resolved, exc)) from None
    kind = kind_of(before_open.st_mode)
    if kind != REGULAR:
        raise PolicyError(source, FILE_FIELD, not_regular(kind, resolved))
    if before_open.st_size > MAX_POLICY_BYTES:
        raise PolicyError(source, FILE_FIELD, over_size(before_open.st_size))
    try:
        fd = os.open(resolved, _OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        raise PolicyFileChangedError(source, FILE_FIELD, "gone while opened") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink put where the file was: a swap under way
            raise PolicyFileChangedError(source, FILE_FIELD, "re-pointed while opened") from None
        raise PolicyError(source, FILE_FIELD, f"cannot open: {exc.strerror or exc}") from None
    try:
        before = os.fstat(fd)
        kind = kind_of(before.st_mode)
        if kind != REGULAR:
            raise PolicyError(source, FILE_FIELD, not_regular(kind, resolved))
        if before.st_size > MAX_POLICY_BYTES:
            raise PolicyError(source, FILE_FIELD, over_size(before.st_size))
        data = _read_at_most(fd, MAX_POLICY_BYTES + 1)
        after = os.fstat(fd)
    except OSError as exc:
        raise PolicyError(source, FILE_FIELD, f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_POLICY_BYTES:
        raise PolicyFileChangedError(source, FILE_FIELD, over_size(len(data)))
    if _identity(before) != _identity(after):
        raise PolicyFileChangedError(source, FILE_FIELD, "changed while it was read")
    if len(data) != after.st_size:
        raise PolicyFileChangedError(source, FILE_FIELD, "its size changed while it was read")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(source, FILE_FIELD, f"not UTF-8 (at byte {exc.start})") from None
    return PolicyFileVersion(
        text=text,
        resolved=resolved,
        device=after.st_dev,
        inode=after.st_ino,
        size=after.st_size,
        mtime_ns=after.st_mtime_ns,
        ctime_ns=after.st_ctime_ns,
    )


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What changes when the file is written or replaced."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    got = 0
    while got < limit:
        chunk = os.read(fd, min(64 * 1024, limit - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def stat_failure(source: str, resolved: str, exc: OSError) -> str:
    """Why ``os.stat`` of the resolved path failed, as a PolicyError's reason."""
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return missing(resolved, dangling=os.path.islink(source))
    return f"cannot read: {exc.strerror or exc}"
