"""`python -m specdec` (also the `specdec` command and `python main.py`): the command line, specdec/cli/main.py."""

import sys

try:  # NumPy and tiktoken take a moment to import: Ctrl-C then should not print an import traceback
    from specdec.cli.main import main
except KeyboardInterrupt:
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
