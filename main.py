"""Race autoregressive and speculative decoding: the same command as `python -m specdec`.

    python main.py --prompt "Alan Turing theorized that" --draft_model_size 124M --target_model_size 355M --K 4

Kept so that the documented `python main.py ...` commands work from a checkout; the
command line itself lives in specdec/__main__.py.
"""

import sys

try:  # Ctrl-C while NumPy is imported: exit quietly, as the command itself does
    from specdec.__main__ import main
except KeyboardInterrupt:
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main(prog="main.py"))
