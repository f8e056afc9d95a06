"""Tokenizing a bulk batch on one core and on every core: the limits figure
of docs/operations.md.

512 documents of 4,000 characters of English (2 MB; each over 1,023 bytes, so each is
counted) go through the gateway's own ModelTokenizer.encode, as a request does (calls
of ~64 KiB under a budget). Hugging Face tokenizers runs each encode_batch call on a
rayon thread pool: RAYON_NUM_THREADS=1 pins it to one core. Each setting runs in its
own process, alternating, and the best and median of the repetitions are printed.

    .venv/bin/python bench/tokenize_batch.py [--repeat 5] [--docs 512] [--chars 4000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENGLISH = "The quick brown fox jumps over the lazy dog while the cat sleeps. "


def english(chars: int, salt: int) -> str:
    return (f"{salt} " + ENGLISH * (chars // len(ENGLISH) + 1))[:chars]


def one_run(docs: int, chars: int) -> None:
    """Child: tokenize the batch once, print wall and CPU seconds."""
    sys.path.insert(0, str(REPO))
    from tokenizers import Tokenizer

    from extproc.core.policy.model import SpecialTokens
    from extproc.core.tokens import ModelTokenizer, TokenizeBudget
    from testing_support.qwen import QWEN_EOS, qwen_tokenizer_dir

    texts = [english(chars, i) for i in range(docs)]
    tokenizer = ModelTokenizer(
        Tokenizer.from_file(str(qwen_tokenizer_dir() / "tokenizer.json")),
        SpecialTokens(append_ids=(QWEN_EOS,)),
    )
    tokenizer.encode(texts[:8])  # warm the thread pool
    cpu, wall = time.process_time(), time.perf_counter()
    tokenizer.encode(texts, TokenizeBudget(64 * 1024 * 1024, 600.0, clock=time.monotonic))
    print(f"{time.perf_counter() - wall:.3f} {time.process_time() - cpu:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--docs", type=int, default=512)
    parser.add_argument("--chars", type=int, default=4000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        one_run(args.docs, args.chars)
        return
    settings = {"one core": "1", "every core": ""}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in settings}
    argv = [sys.executable, __file__, "--child", "--docs", str(args.docs)]
    argv += ["--chars", str(args.chars)]
    for _ in range(args.repeat):
        for name, threads in settings.items():
            env = {k: v for k, v in os.environ.items() if k != "RAYON_NUM_THREADS"}
            if threads:
                env["RAYON_NUM_THREADS"] = threads
            out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            wall, cpu = (float(x) for x in out.stdout.split())
            runs[name].append((wall, cpu))
    mb = args.docs * args.chars / 1e6
    print(f"{args.docs} x {args.chars} characters ({mb:.1f} MB), {os.cpu_count()} CPUs:")
    for name, got in runs.items():
        walls = [w for w, _ in got]
        cpus = [c for _, c in got]
        print(
            f"  {name:10}: wall best {min(walls):.2f} s, median {statistics.median(walls):.2f} s;"
            f" CPU median {statistics.median(cpus):.2f} s"
        )
    best = {name: min(w for w, _ in got) for name, got in runs.items()}
    print(f"  speed-up (best wall): {best['one core'] / best['every core']:.2f}x")


if __name__ == "__main__":
    main()
