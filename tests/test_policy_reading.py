"""Reading a policy file (extproc/service/policy_file.py): only a regular file of at
most 1 MiB, never blocking, one stable version of it.

Every read runs in a thread joined with a deadline: a read that blocked (a FIFO opened
for reading waits for a writer) fails the test instead of hanging it.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from extproc.core.policy import PolicyError
from extproc.service import policy_file
from extproc.service.policy_file import (
    MAX_POLICY_BYTES,
    PolicyFileChangedError,
    load_policy_file,
    read_policy_file,
)

TEXT = "models:\n  - {name: m, preset: e5}\n"
# What a policy path can lead to that is no regular file: how to make it at a path,
# and what its refusal says.
NOT_REGULAR_FILES: dict[str, tuple[Callable[[Path], object], str]] = {
    "fifo": (os.mkfifo, "resolves to a FIFO"),
    "dev-zero": (lambda p: p.symlink_to("/dev/zero"), "resolves to a character device (/dev/zero)"),
    "dev-null": (lambda p: p.symlink_to("/dev/null"), "resolves to a character device (/dev/null)"),
    "directory": (lambda p: p.mkdir(), "resolves to a directory"),
    "dangling-symlink": (
        lambda p: p.symlink_to(p.parent / "gone.yaml"),
        "is a dangling symlink (to ",
    ),
    "missing": (lambda p: None, "does not exist"),
}
DEADLINE_S = 5.0


def within_deadline(work: Callable[[], object]) -> object:
    """``work()``'s result or exception, or a failure if it has not returned in time."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), f"still blocked after {DEADLINE_S} s"
    return outcome[0]


def refusal(path: Path) -> PolicyError:
    got = within_deadline(lambda: read_policy_file(path))
    assert isinstance(got, PolicyError), got
    assert got.source == str(path) and got.field == "<file>"
    return got


def reads_policy(fd: int, path: Path) -> bool:
    """Whether ``fd`` is the policy file (os.read and os.open are patched for the whole
    process: only the policy's own calls get the injected write)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == str(path)
    except OSError:
        return False


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "policy.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        yield path


def test_a_regular_file_is_read_with_its_identity(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(TEXT)
    link = tmp_path / "link.yaml"
    link.symlink_to(path.name)
    version = read_policy_file(link)
    st = path.stat()
    assert version.text == TEXT and version.resolved == str(path)
    assert (version.inode, version.size, version.mtime_ns) == (
        st.st_ino,
        st.st_size,
        st.st_mtime_ns,
    )


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "policy.yaml"
    link.symlink_to(fifo)
    assert "resolves to a FIFO" in refusal(link).reason


def test_a_fifo_swapped_in_after_the_check_is_refused_without_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race between the kind check and the open: a FIFO put in place of the
    checked file in between opens at once (O_NONBLOCK) and fstat refuses it."""
    path = tmp_path / "policy.yaml"
    path.write_text(TEXT)
    real_open = os.open

    def swap_then_open(name: str, flags: int, *args: int) -> int:
        if name == str(path) and path.is_file():
            path.unlink()
            os.mkfifo(path)
        return real_open(name, flags, *args)

    monkeypatch.setattr(policy_file.os, "open", swap_then_open)
    assert "resolves to a FIFO" in refusal(path).reason


@pytest.mark.parametrize("kind", NOT_REGULAR_FILES)
def test_what_is_not_a_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    make, phrase = NOT_REGULAR_FILES[kind]
    path = tmp_path / "policy.yaml"
    make(path)
    assert phrase in refusal(path).reason


def test_a_socket_is_refused(unix_socket: Path) -> None:
    assert "resolves to a socket" in refusal(unix_socket).reason


def test_a_file_over_1_mib_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"#" * (MAX_POLICY_BYTES + 1))
    assert refusal(path).reason == (
        f"is {MAX_POLICY_BYTES + 1:,} bytes: a policy file is at most {MAX_POLICY_BYTES:,} bytes"
    )
    path.write_bytes(b"#" * MAX_POLICY_BYTES)
    assert len(read_policy_file(path).text) == MAX_POLICY_BYTES


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"models: \xff\n")
    assert refusal(path).reason == "not UTF-8 (at byte 8)"


def test_a_write_racing_the_read_is_never_returned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real write lands between the open and the read: the bytes read are of no one
    version, so they are refused as changed (to be read again), never returned."""
    path = tmp_path / "policy.yaml"
    path.write_text(TEXT)
    real_read = os.read
    written: list[bool] = []

    def write_then_read(fd: int, size: int) -> bytes:
        if not written and reads_policy(fd, path):
            written.append(True)
            with path.open("a") as writer:
                writer.write("  - {name: half-written")
        return real_read(fd, size)

    monkeypatch.setattr(policy_file.os, "read", write_then_read)
    got = within_deadline(lambda: read_policy_file(path))
    assert isinstance(got, PolicyFileChangedError), got


def test_start_up_reads_a_file_again_when_a_write_raced_the_first_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("models: [\n")  # would not parse: only the final version must be read
    real_read = os.read
    raced: list[bool] = []

    def write_once_then_read(fd: int, size: int) -> bytes:
        if not raced and reads_policy(fd, path):
            raced.append(True)
            path.write_text(TEXT)  # in place: the same inode, new size and times
        return real_read(fd, size)

    monkeypatch.setattr(policy_file.os, "read", write_once_then_read)
    assert list(load_policy_file(path).models) == ["m"]


def test_start_up_fails_fast_on_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "policy.yaml"
    os.mkfifo(fifo)
    got = within_deadline(lambda: load_policy_file(fifo))
    assert isinstance(got, PolicyError) and "FIFO" in got.reason
