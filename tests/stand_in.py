"""A fake server in a process of its own: ``python -m tests.stand_in KIND TOKENIZER_DIR``
serves FakeLegacy (``legacy``) or the fake Dynamo (``dynamo``) on a free port of
127.0.0.1, logs ``stand-in ready: URL`` and serves until SIGTERM. For tests that time
a path the fake is on: its CPU work must not hold the test process's GIL
(tests/harness.py, :func:`start_stand_in`)."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from testing_support.fake_upstream import FakeUpstream
from tests.fake_legacy import FakeLegacy
from tests.harness import STAND_IN_READY


def main() -> None:
    kind, tokenizer_dir = sys.argv[1], Path(sys.argv[2])
    server = (
        FakeLegacy(tokenizer_dir=tokenizer_dir)
        if kind == "legacy"
        else FakeUpstream(flavour="dynamo", tokenizer_dir=tokenizer_dir)
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    print(STAND_IN_READY, server.url, flush=True)
    stop.wait()
    server.stop()


if __name__ == "__main__":
    main()
