"""What a benchmark section is doing, as it goes: one line on stderr per step, with the seconds since the
section started, so a run of minutes is never silent. The tables stay on stdout; `--quiet` (every group
has it) turns the lines off.

    progress = Progress("family", quiet=args.quiet)
    progress("table 1: T=0, prompt 3 of 32")     # [family   12 s] table 1: T=0, prompt 3 of 32
"""

from __future__ import annotations

import sys
import time


class Progress:
    """Called with a line of text: prints it on stderr (unless quiet), prefixed by the section and its time."""

    def __init__(self, section: str, quiet: bool = False):
        self.section, self.quiet, self.start = section, quiet, time.perf_counter()

    def __call__(self, text: str) -> None:
        if not self.quiet:
            seconds = time.perf_counter() - self.start
            print(f"[{self.section} {seconds:4.0f} s] {text}", file=sys.stderr, flush=True)


def add_quiet(parser) -> None:
    """The --quiet flag every group's parser takes."""
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr (the tables are unchanged)")
