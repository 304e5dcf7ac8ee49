"""Sizes on disk, in words: what a download, a kept layout or the store takes.

A leaf of checkpoints/: imports nothing of specdec.
"""

from __future__ import annotations


def human_size(n: int) -> str:
    """A byte count in decimal units, one decimal from kB up.

    >>> human_size(512), human_size(1_536_000), human_size(7_100_000_000_000)
    ('512 bytes', '1.5 MB', '7100.0 GB')
    """
    if n < 1000:
        return f"{n} bytes"
    for unit in ("kB", "MB"):
        n /= 1000
        if n < 1000:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} GB"
