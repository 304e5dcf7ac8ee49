"""Plain words for messages: counts with their nouns, and sizes on disk.

A leaf: imports nothing of specdec, so any layer may use it (tests/test_imports.py).
"""

from __future__ import annotations


def plural(n: int, word: str) -> str:
    """n and the noun, in the plural unless n is 1; a noun ending in s takes es.

    >>> plural(1, "token"), plural(3, "round"), plural(2, "pass")
    ('1 token', '3 rounds', '2 passes')
    """
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("s") else "s")


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
