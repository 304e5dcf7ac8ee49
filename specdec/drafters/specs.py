"""The draft spec, the small language a user types to name a drafter, parsed in one place.

    draft spec   "ngram" | "ngram:N" | "ngram:M..N" (lookup of suffixes of M..N tokens)
                 | "early_exit:L" | "medusa:DIR" | "eagle:DIR" (trained heads)
                 | "eagle" (the EAGLE head shipped for the target: checkpoints/registry.SHIPPED_HEADS)
                 | "suffix" | "suffix:DIR": suffix decoding over the text and earlier outputs, and the datastore
                   in DIR (suffix.py, datastore.py)
                 | a model (a name such as 124M, a Hub repo id owner/name, or a local folder)
                 | "ngram+X" | "ngram:N+X" | "ngram:M..N+X" | "suffix+X" | "suffix:DIR+X": the lookup first, X
                   (early_exit:L, medusa:DIR, eagle[:DIR]) where it proposes nothing (lookup_first.py); a draft
                   model after the lookup is built in Python

The CLI parses flags with this before it downloads anything; make_drafter turns
the parsed spec into a drafter. (K is parsed in config.parse_k.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .lookup_first import SHORTEST_MATCH

NGRAM_DEFAULT = 3  # "ngram" alone matches suffixes of up to 3 tokens
HEADS = {"medusa": "Medusa", "eagle": "EAGLE"}  # draft specs kind:DIR for heads trained on the target
LOOKUP_FIRST = "+"  # "ngram+eagle": prompt lookup first, the EAGLE head where it finds nothing
MODEL_FREE = ("ngram", "suffix")  # drafts looked up, not drawn (no confidence bar), or none: a cascade's first


@dataclass(frozen=True)
class DraftSpec:
    """A parsed draft spec: kind "ngram" (arg = n_max; n_min the shortest suffix matched, None for the
    drafter's own default), "early_exit" (arg = L), "medusa" or "eagle" (arg = the heads' folder), "suffix"
    (arg = a datastore's folder, or ""), "model" (arg = the name) or "lookup_first" (arg = the whole spec,
    whose two parts are `parts()`)."""

    kind: str
    arg: int | str
    n_min: int | None = None

    def __str__(self) -> str:
        if self.kind in ("model", "lookup_first"):
            return self.arg
        if self.n_min is not None:
            return f"{self.kind}:{self.n_min}..{self.arg}"
        return f"{self.kind}:{self.arg}" if self.arg != "" else self.kind

    def with_shortest(self, n_min: int) -> DraftSpec:
        """The same spec with its lookup matching suffixes of n_min tokens or more (--prompt_lookup_min).

        >>> str(parse_draft("ngram+eagle").with_shortest(1)), str(parse_draft("ngram:4").with_shortest(2))
        ('ngram:1..3+eagle', 'ngram:2..4')
        """
        if self.kind == "lookup_first":
            lookup, then = self.parts()
            return DraftSpec("lookup_first", f"{lookup.with_shortest(n_min)}{LOOKUP_FIRST}{then}")
        if self.kind != "ngram":
            raise ValueError(f"a shortest n-gram applies to prompt lookup (ngram, ngram+X), not to {self}")
        if not 1 <= n_min <= self.arg:
            raise ValueError(f"the shortest n-gram matched must be 1..{self.arg} (the longest), got {n_min}")
        return replace(self, n_min=n_min)

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
            return f"n-gram lookup ({lookup_shortest(lookup)} <= n <= {lookup.arg}), else {then.describe()}"
        if self.kind == "ngram":
            shortest = f"{self.n_min} <= " if self.n_min is not None else ""
            return f"n-gram lookup ({shortest}n <= {self.arg})"
        if self.kind == "suffix":
            store = {"": " and the datastore shipped for the target", "none": ""}.get(
                self.arg, f" and the datastore in {self.arg}"
            )
            return f"suffix decoding (the text, earlier outputs{store})"
        if self.kind == "early_exit":
            return f"the target's first {self.arg} layer{'' if self.arg == 1 else 's'}"
        if self.kind in HEADS:
            return (
                f"{HEADS[self.kind]} heads from {self.arg}"
                if self.arg
                else f"the {HEADS[self.kind]} head shipped for the target"
            )
        return str(self.arg)


def parse_draft(spec: str) -> DraftSpec:
    """Parse a draft spec; anything that is neither n-gram nor early exit names a model.

    >>> parse_draft("ngram:4"), parse_draft("ngram:2..4")
    (DraftSpec(kind='ngram', arg=4, n_min=None), DraftSpec(kind='ngram', arg=4, n_min=2))
    >>> parse_draft("early_exit:6"), parse_draft("124M")
    (DraftSpec(kind='early_exit', arg=6, n_min=None), DraftSpec(kind='model', arg='124M', n_min=None))
    >>> parse_draft("ngram+eagle").parts()
    (DraftSpec(kind='ngram', arg=3, n_min=None), DraftSpec(kind='eagle', arg='', n_min=None))
    >>> parse_draft("suffix+eagle").parts()
    (DraftSpec(kind='suffix', arg='', n_min=None), DraftSpec(kind='eagle', arg='', n_min=None))
    """
    first, plus, then = str(spec).partition(LOOKUP_FIRST)
    if plus and first.partition(":")[0] in MODEL_FREE:
        return _lookup_first(spec, parse_draft(first), then)
    kind, sep, arg = str(spec).partition(":")
    if kind == "ngram":
        low, dots, high = arg.partition("..")  # "ngram:N" or "ngram:M..N"
        longest = high if dots else arg
        n_max = _positive(longest, "ngram:N needs N >= 1, the longest suffix matched") if sep else NGRAM_DEFAULT
        if not dots:
            return DraftSpec("ngram", n_max)
        n_min = _positive(low, "ngram:M..N needs M >= 1, the shortest suffix matched")
        if n_min > n_max:
            raise ValueError(f"ngram:M..N needs M <= N (the shortest suffix matched, then the longest), got {arg!r}")
        return DraftSpec("ngram", n_max, n_min)
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


def lookup_shortest(lookup: DraftSpec) -> int:
    """The shortest suffix the lookup of "ngram+X" matches: as given (ngram:M..N+X), else SHORTEST_MATCH."""
    return lookup.n_min if lookup.n_min is not None else min(SHORTEST_MATCH, lookup.arg)


def _positive(text: str, need: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{need}, got {text!r}")
    return int(text)
