"""The two small languages a user types, each parsed in exactly one place.

    draft spec   "ngram" | "ngram:N" | "early_exit:L" | "medusa:DIR" | "eagle:DIR" (trained heads)
                 | a model (a name such as 124M, a Hub repo id owner/name, or a local folder)
    K spec       an integer 1..K_LIMIT | "adaptive" | "auto"  (or a KPolicy object)

main.py parses flags with these before it downloads anything; the harness and
the samplers turn the parsed specs into drafters and K policies.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Callable

from .costmodel import AdaptiveK, CostModelK, FixedK
from .interfaces import KPolicy

K_LIMIT = 32  # the most drafts a round may ask for: a verification pass over 33 tokens is far past any gain
NGRAM_DEFAULT = 3  # "ngram" alone matches suffixes of up to 3 tokens
K_NAMES = ("adaptive", "auto")
HEADS = {"medusa": "Medusa", "eagle": "EAGLE"}  # draft specs kind:DIR for heads trained on the target


@dataclass(frozen=True)
class DraftSpec:
    """A parsed draft spec: kind "ngram" (arg = n_max), "early_exit" (arg = L), "medusa" or "eagle"
    (arg = the heads' folder) or "model" (arg = the name)."""

    kind: str
    arg: int | str

    def __str__(self) -> str:
        return self.arg if self.kind == "model" else f"{self.kind}:{self.arg}"

    def describe(self) -> str:
        """In words, for a report header."""
        if self.kind == "ngram":
            return f"n-gram lookup (n <= {self.arg})"
        if self.kind == "early_exit":
            return f"the target's first {self.arg} layer" + ("s" if self.arg != 1 else "")
        if self.kind in HEADS:
            return f"{HEADS[self.kind]} heads from {self.arg}"
        return str(self.arg)


def parse_draft(spec: str) -> DraftSpec:
    """Parse a draft spec; anything that is neither n-gram nor early exit names a model.

    >>> parse_draft("ngram:4"), parse_draft("early_exit:6"), parse_draft("124M")
    (DraftSpec(kind='ngram', arg=4), DraftSpec(kind='early_exit', arg=6), DraftSpec(kind='model', arg='124M'))
    """
    kind, sep, arg = str(spec).partition(":")
    if kind == "ngram":
        n_max = _positive(arg, "ngram:N needs N >= 1, the longest suffix matched") if sep else NGRAM_DEFAULT
        return DraftSpec("ngram", n_max)
    if kind == "early_exit":
        return DraftSpec("early_exit", _positive(arg, "early_exit:L needs L >= 1, the target layers the draft uses"))
    if kind in HEADS:
        if not arg:
            raise ValueError(f"{kind}:DIR needs the folder of heads trained by `python -m specdec.train {kind}`")
        return DraftSpec(kind, arg)
    if not spec:
        raise ValueError("the draft spec is empty: use a model name, 'ngram', 'ngram:N' or 'early_exit:L'")
    return DraftSpec("model", str(spec))


def _positive(text: str, need: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{need}, got {text!r}")
    return int(text)


def parse_k(spec) -> int | str:
    """An int in 1..K_LIMIT, "adaptive" or "auto", from a string, an int or a NumPy int.

    >>> parse_k("4"), parse_k(6), parse_k("auto")
    (4, 6, 'auto')
    """
    if isinstance(spec, str):
        if spec in K_NAMES:
            return spec
        spec = int(spec) if spec.strip().lstrip("-").isdigit() else spec
    if isinstance(spec, bool) or not isinstance(spec, numbers.Integral):
        raise ValueError(f"K must be an integer >= 1, 'adaptive' or 'auto', not {spec!r}")
    if spec < 1:
        raise ValueError(f"K must be at least 1 (it is the number of draft tokens per round), got {spec}")
    if spec > K_LIMIT:
        raise ValueError(f"K must be at most {K_LIMIT} (a verification pass over K+1 tokens), got {spec}")
    return int(spec)


def make_k_policy(spec, k_max: int = 8, costs: Callable | None = None) -> KPolicy:
    """A fresh K policy for one run.

    spec: an int (FixedK), "adaptive" (AdaptiveK from min(4, k_max) within 1..k_max),
    "auto" (CostModelK: best predicted speedup for the measured costs and the running
    acceptance rate; `costs()` is called to measure them), or a KPolicy, used as it is.
    """
    if isinstance(spec, KPolicy):
        return spec
    spec = parse_k(spec)
    if not 1 <= k_max <= K_LIMIT:
        raise ValueError(f"k_max must be in 1..{K_LIMIT}, got {k_max}")
    if spec == "adaptive":
        return AdaptiveK(min(4, k_max), 1, k_max)
    if spec == "auto":
        if costs is None:
            raise ValueError("K='auto' needs measured costs (c, r): pass costs=, or use race(), which measures them")
        measured = costs()
        return CostModelK(measured.c, measured.r, k_max=k_max)
    return FixedK(spec)
