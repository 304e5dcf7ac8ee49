"""The draft spec, the small language a user types to name a drafter, parsed in one place.

    draft spec   "ngram" | "ngram:N" | "early_exit:L" | "medusa:DIR" | "eagle:DIR" (trained heads)
                 | "eagle" (the EAGLE head shipped for the target: checkpoints/registry.SHIPPED_HEADS)
                 | "suffix" | "suffix:DIR": suffix decoding over the text and earlier outputs, and the datastore
                   in DIR (suffix.py, datastore.py)
                 | a model (a name such as 124M, a Hub repo id owner/name, or a local folder)
                 | "ngram+X" | "ngram:N+X" | "suffix+X" | "suffix:DIR+X": the lookup first, X (early_exit:L,
                   medusa:DIR, eagle[:DIR]) where it proposes nothing (lookup_first.py); a draft model after
                   the lookup is built in Python

The CLI parses flags with this before it downloads anything; make_drafter turns
the parsed spec into a drafter. (The K spec is parsed in costmodel.parse_k.)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..words import plural
from .lookup_first import SHORTEST_MATCH

NGRAM_DEFAULT = 3  # "ngram" alone matches suffixes of up to 3 tokens
HEADS = {"medusa": "Medusa", "eagle": "EAGLE"}  # draft specs kind:DIR for heads trained on the target
LOOKUP_FIRST = "+"  # "ngram+eagle": prompt lookup first, the EAGLE head where it finds nothing
MODEL_FREE = ("ngram", "suffix")  # drafts looked up, not drawn (no confidence bar), or none: a cascade's first


@dataclass(frozen=True)
class DraftSpec:
    """A parsed draft spec: kind "ngram" (arg = n_max), "early_exit" (arg = L), "medusa" or "eagle"
    (arg = the heads' folder), "suffix" (arg = a datastore's folder, or ""), "model" (arg = the name) or
    "lookup_first" (arg = the whole spec, whose two parts are `parts()`)."""

    kind: str
    arg: int | str

    def __str__(self) -> str:
        if self.kind in ("model", "lookup_first"):
            return self.arg
        return f"{self.kind}:{self.arg}" if self.arg != "" else self.kind

    def parts(self) -> tuple[DraftSpec, DraftSpec]:
        """A lookup-first spec's two drafters: the lookup (n-gram or suffix), then the drafter used where it
        proposes nothing."""
        first, _, then = str(self.arg).partition(LOOKUP_FIRST)
        return parse_draft(first), parse_draft(then)

    def describe(self) -> str:
        """In words, for a report header."""
        if self.kind == "lookup_first":
            lookup, then = self.parts()
            if lookup.kind == "suffix":
                return f"{lookup.describe()}, else {then.describe()}"
            return f"n-gram lookup ({min(SHORTEST_MATCH, lookup.arg)} <= n <= {lookup.arg}), else {then.describe()}"
        if self.kind == "ngram":
            return f"n-gram lookup (n <= {self.arg})"
        if self.kind == "suffix":
            where = "the text and earlier outputs" + (f", the datastore in {self.arg}" if self.arg else "")
            return f"suffix decoding ({where})"
        if self.kind == "early_exit":
            return f"the target's first {plural(self.arg, 'layer')}"
        if self.kind in HEADS:
            return f"{HEADS[self.kind]} heads from {self.arg}" if self.arg else f"the {HEADS[self.kind]} head shipped for the target"
        return str(self.arg)


def parse_draft(spec: str) -> DraftSpec:
    """Parse a draft spec; anything that is neither n-gram nor early exit names a model.

    >>> parse_draft("ngram:4"), parse_draft("early_exit:6"), parse_draft("124M")
    (DraftSpec(kind='ngram', arg=4), DraftSpec(kind='early_exit', arg=6), DraftSpec(kind='model', arg='124M'))
    >>> parse_draft("ngram+eagle").parts()
    (DraftSpec(kind='ngram', arg=3), DraftSpec(kind='eagle', arg=''))
    >>> parse_draft("suffix+eagle").parts()
    (DraftSpec(kind='suffix', arg=''), DraftSpec(kind='eagle', arg=''))
    """
    first, plus, then = str(spec).partition(LOOKUP_FIRST)
    if plus and first.partition(":")[0] in MODEL_FREE:
        return _lookup_first(spec, parse_draft(first), then)
    kind, sep, arg = str(spec).partition(":")
    if kind == "ngram":
        n_max = _positive(arg, "ngram:N needs N >= 1, the longest suffix matched") if sep else NGRAM_DEFAULT
        return DraftSpec("ngram", n_max)
    if kind == "early_exit":
        return DraftSpec("early_exit", _positive(arg, "early_exit:L needs L >= 1, the target layers the draft uses"))
    if kind == "eagle" and not sep:
        return DraftSpec("eagle", "")  # the head shipped for the target (make_drafter finds it)
    if kind == "suffix":
        if sep and not arg:
            raise ValueError("suffix:DIR needs the folder of a datastore made by `python -m specdec.train datastore`")
        return DraftSpec("suffix", arg)
    if kind in HEADS:
        if not arg:
            raise ValueError(f"{kind}:DIR needs the folder of heads trained by `python -m specdec.train {kind}`")
        return DraftSpec(kind, arg)
    if not spec:
        raise ValueError("the draft spec is empty: use a model name, 'ngram', 'ngram:N' or 'early_exit:L'")
    return DraftSpec("model", str(spec))


def _lookup_first(spec: str, lookup: DraftSpec, then: str) -> DraftSpec:
    """ngram[:N]+X or suffix[:DIR]+X, checked: X must be a drafter that needs no model loaded by name (the CLI
    loads one model)."""
    kind = parse_draft(then).kind if then else "nothing"
    if kind not in ("early_exit", "medusa", "eagle"):
        what = {"model": "a model name", **dict.fromkeys([*MODEL_FREE, "lookup_first"], "another lookup")}
        first = "NgramDrafter(n_vocab, 3, 2)" if lookup.kind == "ngram" else "SuffixDrafter(n_vocab)"
        raise ValueError(
            f"{spec!r}: after '{lookup.kind}+' comes the drafter used where the lookup proposes nothing, "
            f"early_exit:L, medusa:DIR, eagle or eagle:DIR (not {what.get(kind, kind)}); for a draft model, build "
            f"LookupFirst({first}, ModelDrafter(model)) in Python"
        )
    return DraftSpec("lookup_first", f"{lookup}{LOOKUP_FIRST}{then}")


def _positive(text: str, need: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{need}, got {text!r}")
    return int(text)
