"""The command line's rules between flags: which combinations are refused, which are noted and run.

A flag that contradicts the others (`--draft_confidence` with --draft ngram, `--k_max 2` with --K 4) is refused
with one line saying why (refuse_ignored); one that is merely redundant (`--seed` or `--top_k` at temperature 0)
is accepted with a note on standard error (note_redundant), so that a script passing it still runs. Beside them,
the checks that need the names of the models but not the models: the pair, layer and shipped head
(check_names), the verification rule (check_cli_verification) and the models folder (check_models_dir).
cli/args.py parses the flags and calls these, before anything is downloaded.
"""

from __future__ import annotations

from pathlib import Path

from ..checkpoints import names
from ..checkpoints.hub import default_models_dir
from ..config import check_verification
from ..drafters.specs import MODEL_FREE
from . import flags
from .defaults import GPT2_PAIR


def check_models_dir(models_dir: str | None) -> None:
    """The models folder (--models_dir, or the default) must be a folder, or a path where one can be made."""
    where = Path(models_dir) if models_dir else default_models_dir()
    named = f"--models_dir {models_dir}" if models_dir else f"the models folder {where} (SPECDEC_HOME moves it)"
    for path in (where, *where.parents):
        if path.exists():
            if not path.is_dir():
                what = "is not a folder" if path == where else f"lies inside {path}, which is not a folder"
                raise ValueError(f"{named} {what}: give a folder (it is made if missing)")
            return


def check_cli_verification(args) -> None:
    """--verification and --siblings against the rest, by request.check_verification (the API's own check)."""
    if args.only == "autoregressive":
        return  # note_redundant says what is ignored there
    if args.batch is not None and args.verification in ("spectr", "traversal"):
        raise ValueError(
            f"--verification {args.verification} judges trees and --batch drafts chains: use token or "
            "block with --batch"
        )
    samples_siblings = args.draft_spec.kind in ("model", "early_exit") and args.cross_vocab is None
    siblings = (args.siblings or "without replacement") if samples_siblings else None
    if args.temperature == 0 and args.verification in ("spectr", "traversal"):
        siblings = "iid"  # greedy: every tree rule follows the target's argmax, whatever the siblings (a note says)
    check_verification(args.verification, args.tree, "exact", siblings)


def check_names(args) -> None:
    """Refuse a pair, layer, length or shipped head that the models' names already rule out (checkpoints/names.py)."""
    spec, speculative = args.draft_spec, args.only != "autoregressive"
    if spec.kind == "lookup_first":
        spec = spec.parts()[1]  # the drafter after the lookup is the one the names can rule out
    widest = max(args.tree if isinstance(args.tree, int) else 0, args.K if isinstance(args.K, int) else args.k_max)
    try:
        names.check_pair(
            args.target_model_size,
            draft_model=spec.arg if speculative and spec.kind == "model" else None,
            early_exit=spec.arg if speculative and spec.kind == "early_exit" else None,
            chat=args.chat,
            n_tokens=args.n_tokens_to_generate,
            k=widest if speculative else 0,
            cross_vocab=args.cross_vocab is not None,
            shipped_head="eagle" if speculative and spec.kind == "eagle" and not spec.arg else None,
        )
    except ValueError as e:
        typed = flags.given(args)
        if "tokenize text differently" in str(e) and "draft" not in typed:
            hint = f"{spec.arg} is the default draft: give --draft (ngram works with any model)"
            raise ValueError(f"{e}; {hint}") from None
        if "tokenize text differently" in str(e) and args.default_run:
            hint = f"{args.target_model_size} is the default target: for GPT-2 give {GPT2_PAIR}"
            raise ValueError(f"{e}; {hint}") from None
        raise


def refuse_ignored(p, args) -> None:
    """A flag the user typed that contradicts the others (it asks for what this run cannot do, or for a mechanism
    the chosen drafter does not have) is an error saying why; a merely redundant one is noted (note_redundant)."""
    spec, draft, tree, batch = args.draft_spec, args.draft, args.tree is not None, args.batch is not None
    samples_children = spec.kind in ("model", "early_exit") and args.cross_vocab is None
    speculative = [
        (
            "k_max",
            isinstance(args.K, int) and args.k_max < args.K,
            f"{args.k_max} is below --K {args.K}: it bounds --K auto or adaptive; with a fixed K leave it out",
        ),
        (
            "cross_vocab",
            spec.kind != "model",
            f"verifies a draft model with another tokenizer; the draft here is {draft}",
        ),
        ("cross_vocab", batch, "is not offered with --batch"),
        (
            "draft_confidence",
            spec.kind in MODEL_FREE,
            f"cuts the chains of a draft that draws from a distribution (a model, early_exit:L, eagle, medusa:DIR); "
            f"--draft {draft} proposes certain tokens, which it would never cut",
        ),
        (
            "draft_confidence",
            args.cross_vocab is not None,
            "is not offered with --cross_vocab (the drafts are re-spelt in the target's vocabulary after they are "
            "drawn)",
        ),
        (
            "draft_confidence",
            tree,
            "cuts chains; a tree is already grown by the draft's confidence (EAGLE-2's expansion): give one or "
            "the other",
        ),
        ("draft_confidence", batch, "is not offered with --batch"),
        ("ngram_max", spec.kind != "ngram", f"only applies to --draft ngram; the draft here is {draft}"),
        (
            "ngram_max",
            spec.kind == "ngram" and draft != "ngram" and spec.arg != args.ngram_max,
            f"and --draft {draft} both set the n-gram length; give one",
        ),
        ("siblings", not tree, "shapes a tree's children: give --tree N"),
        (
            "siblings",
            not samples_children,
            f"only applies to a draft model or early_exit:L (they sample a tree's children); the draft here is "
            f"{draft}" + (" with --cross_vocab" if args.cross_vocab else ""),
        ),
    ]
    flags.refuse_ignored(
        p,
        args,
        (speculative if args.only != "autoregressive" else [])
        + [
            ("prompt", batch, "is one prompt; --batch reads its prompts from --prompt_file"),
            ("no_warmup", batch, "is not offered with --batch (the batch always runs untimed first)"),
        ],
    )


def note_redundant(p, args) -> None:
    """A flag the user typed that changes nothing in this run (`--seed` at temperature 0) is accepted, with one
    note on standard error, and the run uses the value it would have used without it (flags.note_redundant)."""
    greedy, only_ar = args.temperature == 0, args.only == "autoregressive"
    tree_rule = args.verification in ("spectr", "traversal")
    flags.note_redundant(
        p,
        args,
        [
            ("top_k", greedy, "has no effect at temperature 0 (greedy decoding takes the top token)", None),
            ("top_p", greedy, "has no effect at temperature 0 (greedy decoding takes the top token)", None),
            ("seed", greedy, "has no effect at temperature 0 (greedy decoding draws nothing)", 0),
            *(
                (dest, only_ar, "is about the speculative decoder, which --only autoregressive does not run", used)
                for dest, used in (
                    ("draft", args.draft),
                    ("K", 4),
                    ("tree", None),
                    ("k_max", 8),
                    ("ngram_max", 3),
                    ("prompt_lookup_min", None),
                    ("verification", "token"),
                    ("cross_vocab", None),
                    ("siblings", None),
                    ("draft_confidence", None),
                )
            ),
            ("k_max", isinstance(args.K, int), f"only bounds --K auto or adaptive, and --K is {args.K}", 8),
            (
                "ngram_max",
                args.draft_spec.kind == "ngram" and args.draft != "ngram",
                f"repeats the n-gram length of --draft {args.draft}",
                args.ngram_max,
            ),
            (
                "verification",
                greedy and tree_rule,
                "has no effect at temperature 0 (every tree rule follows the target's argmax, as 'token' does)",
                "token",
            ),
            ("siblings", greedy, "has no effect at temperature 0 (a tree's children are the draft's top tokens)", None),
        ],
    )
