"""`python -m specdec cache`: what specdec keeps on disk, with sizes, and removing it.

The listing and the removal themselves are checkpoints/store.py's; this is the command's flags and words.
"""

from __future__ import annotations

import sys
from pathlib import Path

from . import flags
from ..checkpoints import store
from ..checkpoints.hub import default_models_dir
from ..checkpoints.sizes import human_size as human


def cache(argv: list[str], prog: str) -> int:
    """`python -m specdec cache`: list what specdec stores, with sizes; remove a model or the kept layouts."""
    p = flags.Parser(
        prog=prog,
        description="List what specdec keeps on disk (models, kept layouts, the fetched "
        "wheel's model, trained heads) with sizes, or remove some of it. Nothing held by another "
        "specdec process (a download, a layout being written, a training) is removed.",
    )
    p.add_argument(
        "--remove",
        metavar="NAME",
        help="remove a model (355M, gpt2-medium, smollm2-135m, a repo id or "
        "its folder name) with its kept layout, or a trained-heads folder",
    )
    p.add_argument(
        "--remove_layouts",
        action="store_true",
        help="remove every kept layout (the transposed copies; "
        "the next load of each model copies its weights again, and keeps them again)",
    )
    p.add_argument("--models_dir", help=f"the models folder to look in (default: {default_models_dir()})")
    args = p.parse_args(argv)
    models_dir = Path(args.models_dir) if args.models_dir else default_models_dir()
    home = models_dir if args.models_dir else models_dir.parent
    try:
        if args.remove:
            for entry in store.remove(args.remove, home, models_dir):
                print(f"removed {entry.name}: {entry.path} ({human(store.size_of(entry.path) or entry.size)})")
            return 0
        if args.remove_layouts:
            removed, skipped = store.remove_layouts(home, models_dir)
            for entry in removed:
                print(f"removed the kept layout of {entry.name} ({human(entry.size)}): {entry.path}")
            for why in skipped:
                print(f"{prog}: kept {why}", file=sys.stderr)
            if not removed and not skipped:
                print("no kept layouts stored")
            return 1 if skipped else 0
    except store.InUse as e:
        print(f"{prog}: error: nothing removed: {e}; try again when it has finished", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a read-only store, or one this user may not write: its lock files cannot even be opened
        what, where = args.remove or "the kept layouts", f" {e.filename}:" if e.filename else ""
        reason = f"{e.strerror or e} (a read-only store, or another user's?)"
        print(f"{prog}: error: cannot remove {what}:{where} {reason}", file=sys.stderr)
        return 1
    found = store.entries(home, models_dir)
    print(f"specdec stores {human(sum(e.size for e in found))} under {home}" + (":" if found else " (nothing)"))
    for entry in found:
        print("  " + entry.line())
    if found:
        print(f"remove one: {prog} --remove NAME; every kept layout: {prog} --remove-layouts")
    print("shipped inside specdec (nothing to fetch or remove):")
    for line in store.shipped():
        print("  " + line)
    return 0
