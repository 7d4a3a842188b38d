"""``python -m taso_egg.bench``: the benchmark command, kept at this name; it lives in
``research.benchmarks``."""

import sys

from .research.benchmarks import main

if __name__ == "__main__":
    sys.exit(main())
