"""How fast `extproc index-check` gets through a sample: ``python -m bench.index_check_speed``.

It writes a BEIR sample (testing_support/beir_sample.py: ``--documents`` of 60 to 150
words, ``--queries`` each a document's first words, judged relevant to it), starts two
fake upstreams in this process (testing_support/fake_upstream.py, the Qwen3 tokenizer
and made-up vectors: they answer in well under a millisecond per input, so the figure
is the tool's own), runs the command as a user does and prints one line: documents,
queries, wall seconds, documents per second, the verdict and the exit code. Loopback
only; the upstreams stop with the run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

from extproc.commands import index_check as index_check_command
from extproc.commands.cli import _parser
from testing_support.beir_sample import write_sample
from testing_support.fake_upstream import FakeUpstream
from testing_support.qwen import QWEN_MODEL, qwen_tokenizer_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=500)
    args = parser.parse_args(argv)
    tokenizer = qwen_tokenizer_dir()
    with (
        tempfile.TemporaryDirectory(prefix="index-check-speed-") as folder,
        FakeUpstream(flavour="vllm", tokenizer_dir=tokenizer) as baseline,
        FakeUpstream(flavour="dynamo", tokenizer_dir=tokenizer) as candidate,
    ):
        files = write_sample(Path(folder), args.documents, args.queries, lengths=(60, 150))
        command = ["index-check", "--baseline", baseline.url, "--candidate", candidate.url]
        command += ["--corpus", str(files["corpus"]), "--queries", str(files["queries"])]
        command += ["--qrels", str(files["qrels"]), "--model", QWEN_MODEL]
        command += ["--out", str(Path(folder) / "report")]
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # the report: read from its file
            code = index_check_command.run(_parser().parse_args(command))
        seconds = time.perf_counter() - started
        verdict = (Path(folder) / "report" / "report.md").read_text(encoding="utf-8")
        label = next((w for w in ("KEEP INDEX", "RE-INDEX", "INCONCLUSIVE") if w in verdict), "?")
    print(
        f"index-check: {args.documents:,} documents, {args.queries} queries in {seconds:.1f} s "
        f"({args.documents / seconds:,.0f} documents/s), {label}, exit {code}",
        flush=True,
    )
    return code


if __name__ == "__main__":
    raise SystemExit(main())
