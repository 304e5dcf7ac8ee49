"""`python -m specdec.train datastore`: a datastore for suffix decoding, from the replies in distillation shards.

The shards of `python -m specdec.train data` (distill.py) hold replies the target wrote itself. This reads
every shard its manifest lists and that checks out (sha256, shapes, ids: shards.read_shard; a run still going
is read as far as its whole shards go), takes the replies in row order up to --max-tokens, and writes the
datastore (drafters/datastore.py: the replies end to end and their backward order) with a card saying where
they came from. Paths are recorded by their last part only, so a card can be committed as it is.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

from ..drafters.datastore import SEPARATOR, Datastore
from ..drafters.heads import model_fingerprint
from .shards import MANIFEST, read_manifest, read_shard, split_rows


def shard_replies(
    folder: str | Path, n_vocab: int, max_tokens: int | None = None, log: Callable[[str], None] | None = None
) -> tuple[list, dict]:
    """(replies, source): the replies of every trusted shard, in row order, while the datastore (one separator
    per reply, and one before the first) stays within max_tokens; and what the card says about them."""
    folder, log = Path(folder), log or (lambda line: None)
    manifest = read_manifest(folder)
    if manifest is None:
        raise ValueError(f"{folder}: no {MANIFEST}; make replies with `python -m specdec.train data --out DIR ...`")
    replies, shards, rows, skipped, full = [], [], 0, 0, False
    size = 1  # the separator before the first reply
    for entry in manifest["shards"]:
        if entry is None or full:
            continue
        try:
            arrays = read_shard(folder, entry, n_vocab)
        except (ValueError, KeyError, TypeError) as e:
            log(f"skipped a shard that is not trusted ({e})")
            skipped += 1
            continue
        shards.append(entry["sha256"])
        for reply in split_rows(arrays["reply_ids"], arrays["reply_offsets"]):
            if max_tokens is not None and size + len(reply) + 1 > max_tokens:
                full = True
                break
            replies.append(reply)
            size += len(reply) + 1
            rows += 1
    if not replies:
        raise ValueError(f"{folder}: no trusted shard holds a reply; run the `data` command that made it again")
    settings = manifest.get("settings") or {}
    source = {
        "data": folder.name,
        "model": settings.get("model"),
        "model_fingerprint": settings.get("model_fingerprint"),
        "requests_sha256": settings.get("requests_sha256"),
        "greedy_frac": settings.get("greedy_frac"),
        "shards": len(shards),
        "shards_sha256": hashlib.sha256("".join(shards).encode()).hexdigest(),  # of the shards' own sha256s
        "shards_skipped": skipped,
        "rows": rows,
        "cut_at_max_tokens": full,
    }
    return replies, source


def make_datastore(
    model, data: str | Path, out: str | Path, max_tokens: int | None = None, command: str = "", log=None
) -> Datastore:
    """Build the datastore of the target's replies in `data` and save it in `out`; ValueError saying what to do."""
    if model.n_vocab > SEPARATOR:
        raise ValueError(f"{model.name} has {model.n_vocab:,} tokens: a datastore stores ids below {SEPARATOR:,}")
    if max_tokens is not None and max_tokens < 3:
        raise ValueError(f"--max-tokens must be at least 3 (a reply and its separators), got {max_tokens}")
    replies, source = shard_replies(data, model.n_vocab, max_tokens, log)
    if source["model_fingerprint"] != model_fingerprint(model):
        raise ValueError(
            f"{data}: its replies were written by another model ({source['model']!r}); give that --model, or make "
            "replies with this one"
        )
    start = time.perf_counter()
    store = Datastore.build(replies, model.n_vocab, {"model": model.name, "source": source, "command": command})
    store.card["build_seconds"] = round(time.perf_counter() - start, 1)
    store.save(out)
    return store


def portable_command(argv: list[str]) -> str:
    """The command as typed, each path given to --data or --out by its last part (no machine's folders in a card).

    >>> portable_command(["datastore", "--model", "m", "--data", "/home/me/ds-data", "--out=/srv/x/ds"])
    'python -m specdec.train datastore --model m --data ds-data --out=ds'
    """
    out, path_next = [], False
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if path_next:
            arg = Path(arg).name
        elif eq and flag in ("--data", "--out"):
            arg = f"{flag}={Path(value).name}"
        out.append(arg)
        path_next = arg in ("--data", "--out")
    return " ".join(["python -m specdec.train", *out])
