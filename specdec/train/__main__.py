"""`python -m specdec.train medusa|eagle ...`: see specdec/train/cli.py."""

import sys

from .cli import main

sys.exit(main())
