"""`python -m bench.run`: the benchmark (bench/benchmark.py; bench/README.md).

Also runs as a file, `python bench/run.py`: the checkout's ``bench`` package is then
imported from the directory above this one, as ``-m`` does from the working directory.
"""

import sys
from pathlib import Path

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
