"""`python -m specdec.bench`: see specdec/bench/speed.py."""

import sys

from .speed import main

if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
