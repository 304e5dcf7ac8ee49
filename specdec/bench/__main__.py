"""`python -m specdec.bench`: every benchmark of specdec, as sections of one command.

    python -m specdec.bench                                  # the speed sections on 124M and 355M shapes
    python -m specdec.bench --only decode,verify --repeats 50
    python -m specdec.bench --only tree-r --sizes 124M       # r(N + 1) for tree passes
    python -m specdec.bench --only tree-tau --target stdlib-6L --draft stdlib-2L,ngram
    python -m specdec.bench --only family                    # the shipped stdlib family (offline)
    python -m specdec.bench --only heads                     # Medusa / EAGLE head costs on GPT-2 shapes
    python -m specdec.bench --only suite --target stdlib-6L --drafts stdlib-2L,ngram   # per prompt category
    python -m specdec.bench --only alpha-table               # alpha of every GPT-2 pair on disk (real weights)
    python -m specdec.bench --only real                      # SmolLM2: step time, r(m), each drafter's c
    python -m specdec.bench --only block                     # block against token-wise verification, same drafts
    python -m specdec.bench --only multidraft                # k drafts for one position: the bound against each rule
    python -m specdec.bench --only batch                     # throughput vs batch size, where speculation stops paying
    python -m specdec.bench --only cross-vocab               # SmolLM2 with a stdlib-2L draft: another tokenizer
    python -m specdec.bench --only family --help             # the flags of that group of sections

Sections come in groups that share their flags (speed/, trees.py, family.py, heads.py, suite.py,
real.py, block.py, multidraft.py, batch.py, crossvocab.py in this folder): `--only` may name several sections of one
group, and the other flags are that group's. A script that prints numbers, not a test.
"""

from __future__ import annotations

import sys

from . import batch, block, crossvocab, family, heads, multidraft, real, speed, suite, trees

# section -> (the group's main, the arguments that select the section within it)
SECTIONS = {
    **{name: (speed.main, None) for name in speed.SECTIONS},
    "tree-r": (trees.main, ["--only", "r"]),
    "tree-tau": (trees.main, ["--only", "tau"]),
    "family": (family.main, []),
    "heads": (heads.main, []),
    "heads-accept": (heads.main, ["--accept"]),
    "suite": (suite.main, []),
    "alpha-table": (suite.main, ["--alpha-table"]),
    "real": (real.main, []),
    "block": (block.main, []),
    "multidraft": (multidraft.main, []),
    "batch": (batch.main, []),
    "cross-vocab": (crossvocab.main, []),
}


def split_only(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the sections named by --only, the other arguments)."""
    rest, only = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--only" and i + 1 < len(argv):
            only += argv[i + 1].split(",")
            i += 2
            continue
        if arg.startswith("--only="):
            only += arg.split("=", 1)[1].split(",")
        else:
            rest.append(arg)
        i += 1
    return [s.strip() for s in only if s.strip()], rest


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    only, rest = split_only(argv)
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        print(
            f"python -m specdec.bench: error: unknown section {', '.join(unknown)}; sections: "
            f"{', '.join(SECTIONS)} (see --help)",
            file=sys.stderr,
        )
        return 2
    groups = {SECTIONS[s][0] for s in only} or {speed.main}
    if len(groups) > 1:
        print(
            "python -m specdec.bench: error: --only mixes sections with different flags "
            f"({', '.join(only)}); run them one command each",
            file=sys.stderr,
        )
        return 2
    if not only or SECTIONS[only[0]][0] is speed.main:
        if not only and ("-h" in rest or "--help" in rest):
            print(__doc__)
        speed.main((["--only", ",".join(only)] if only else []) + rest)
        return 0
    if len(only) > 1:  # tree-r,tree-tau: one run of the group with both
        selected = ["--only", ",".join(SECTIONS[s][1][1] for s in only)] if only[0].startswith("tree-") else None
        if selected is None:
            print(f"python -m specdec.bench: error: run {', '.join(only)} one command each", file=sys.stderr)
            return 2
    else:
        selected = SECTIONS[only[0]][1]
    result = SECTIONS[only[0]][0](selected + rest)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
