"""Reading a policy file: one stable version of a regular file, never blocking, then
its text loaded (:func:`~extproc.core.policy.loader.load_policy_text`).

The rules are those of :mod:`extproc.service.regular_file` (a regular file only, opened
so that nothing can block, the bytes of one version), with a policy's own bound
(:data:`MAX_POLICY_BYTES`: a policy is a few KiB of YAML) and its errors: a
:class:`PolicyError` naming the file and the field ``<file>``, or its subclass
:class:`PolicyFileChangedError` for a write racing the read, which callers retry
(later: the reload's watch; at once, a few times: :func:`load_policy_file`, at
start-up), never load.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from extproc.core.policy.errors import PolicyError
from extproc.core.policy.loader import load_policy_text
from extproc.core.policy.model import GatewayPolicy
from extproc.service.regular_file import FileChangedError, FileRefusedError, read_regular_file

MAX_POLICY_BYTES = 1024 * 1024
FILE_FIELD = "<file>"
# A file being written while read at start is read again after a pause, at most so often.
READ_ATTEMPTS = 5
READ_RETRY_S = 0.1


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


def load_policy_file(
    path: str | os.PathLike[str],
    *,
    tokenizer_overrides: Mapping[str, Path] | None = None,
) -> GatewayPolicy:
    """The policy in a file, read by :func:`read_policy_file` (a regular file only, one
    version of it: a write racing the read is read again, a few times)."""
    for attempt in range(READ_ATTEMPTS):
        try:
            version = read_policy_file(path)
            break
        except PolicyFileChangedError:
            if attempt == READ_ATTEMPTS - 1:
                raise
            time.sleep(READ_RETRY_S)
    return load_policy_text(version.text, source=str(path), tokenizer_overrides=tokenizer_overrides)
