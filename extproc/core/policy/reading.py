"""Reading a policy file: one stable version of a regular file, never blocking.

The rules are those of :mod:`extproc.core.regular_file` (a regular file only, opened
so that nothing can block, the bytes of one version), with a policy's own bound
(:data:`MAX_POLICY_BYTES`: a policy is a few KiB of YAML) and its errors: a
:class:`PolicyError` naming the file and the field ``<file>``, or its subclass
:class:`PolicyFileChangedError` for a write racing the read, which callers retry
(later: the reload's watch; at once, a few times: start-up), never load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from extproc.core.policy.errors import PolicyError
from extproc.core.regular_file import FileChangedError, FileRefusedError, read_regular_file

MAX_POLICY_BYTES = 1024 * 1024
FILE_FIELD = "<file>"


class PolicyFileChangedError(PolicyError):
    """The file changed while it was read (or since it was last looked at): read it
    again once it holds still. Not a verdict on the file."""


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
    try:
        version = read_regular_file(source, max_bytes=MAX_POLICY_BYTES, what="a policy file")
    except FileChangedError as exc:
        raise PolicyFileChangedError(source, FILE_FIELD, exc.reason) from None
    except FileRefusedError as exc:
        raise PolicyError(source, FILE_FIELD, exc.reason) from None
    try:
        text = version.data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(source, FILE_FIELD, f"not UTF-8 (at byte {exc.start})") from None
    st = version.stat
    return PolicyFileVersion(
        text=text,
        resolved=version.resolved,
        device=st.st_dev,
        inode=st.st_ino,
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        ctime_ns=st.st_ctime_ns,
    )
