"""Self-distillation data on disk: a folder of shards and its manifest, written, checked and read back.

train/distill.py makes the data (a chat model answering requests, batched); this is its format, shared by
that run, by adopting shards made elsewhere (adopt.py) and by every reader (training, the datastore):

    DIR/manifest.json          settings, model fingerprint, request counts, one entry per shard (its sha256)
    DIR/shard-00000.npz        rows 0 .. shard_rows-1 (see SHARD_ARRAYS)
    DIR/shard-00001.npz        ...

Per row: the request's chat prompt ids, the reply ids (ending with <|im_end|>
unless max_reply cut it), its mode (greedy or sampled, the two ways a drafter
is used) and, at every reply position, the target's top-k tokens and their
probabilities under the target's distribution at T=1 (the softmax of its
logits, whatever the row was decoded with): the labels of distillation.

Hidden states are NOT stored: 576 float16 values per token per layer are about
1.2 kB, 230 MB per layer for 200,000 tokens, against 48 bytes for the top-8
labels. `hidden_states` (features.py) recomputes the layers a head reads with
one teacher-forced batched pass over prompt + reply, which is many times faster
per token than the decoding that made them (a matrix product per layer over
all tokens instead of one token at a time).

Nothing is trusted before it is checked: a shard's sha256 against its manifest
entry, then its arrays' shapes, dtypes and ids (read_shard); the manifest's
settings field by field (settings_of) and every entry (check_entry).
"""

from __future__ import annotations

import dataclasses
import math
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import safe_io
from ..checkpoints.pairs import show
from ..drafters.heads import model_fingerprint

FORMAT = "specdec-distill-1"
MANIFEST = "manifest.json"
LOCK = ".lock"  # held by the run writing the folder (a `data` run, or adopt_shards)
MAX_MANIFEST_BYTES = 64 << 20  # an entry is about 250 bytes: room for 250,000 shards
SHARD_FILE = re.compile(r"shard-(\d{5})\.npz")  # shard_name's form
ENTRY_COUNTS = ("rows", "reply_tokens", "greedy_rows", "ended_rows")  # whole numbers in every shard's entry
MAX_COUNT = 1 << 40
F32 = np.float32

# Every array of a shard: name -> (dtype, what it holds). n_rows rows, n_prompt / n_reply tokens in all.
SHARD_ARRAYS = {
    "row": ("int64", "[n_rows] the row's number in the whole run (its random seed is (seed, row))"),
    "request": ("int64", "[n_rows] the request's index in the pool"),
    "greedy": ("bool", "[n_rows] True: decoded greedily; False: sampled at the run's temperature"),
    "ended": ("bool", "[n_rows] True: the reply ends with <|im_end|>; False: max_reply cut it"),
    "prompt_offsets": ("int64", "[n_rows + 1] row b's prompt is prompt_ids[prompt_offsets[b]:prompt_offsets[b+1]]"),
    "prompt_ids": ("int32", "[n_prompt] the chat prompts (system turn, user turn, open assistant turn)"),
    "reply_offsets": ("int64", "[n_rows + 1] row b's reply is reply_ids[reply_offsets[b]:reply_offsets[b+1]]"),
    "reply_ids": ("int32", "[n_reply] the replies"),
    "top_ids": ("int32", "[n_reply, top_k] the target's top tokens at each reply position, most likely first"),
    "top_probs": ("float16", "[n_reply, top_k] their probabilities (softmax of the target's logits, T=1)"),
    "request_text": ("str", "[n_rows] the request"),
    "reply_text": ("str", "[n_rows] the reply, decoded (without <|im_end|>)"),
}


@dataclass(frozen=True)
class DistillSettings:
    """Everything the data depends on; a resumed run must have the same (manifest.json's "settings")."""

    model: str  # the name it was loaded by (informative)
    model_fingerprint: str  # drafters.heads.model_fingerprint: the data belongs to these weights
    seed: int
    batch: int  # rows decoded side by side (the batch's makeup decides float32 rounding, so it is fixed)
    max_reply: int  # reply tokens at most, <|im_end|> included
    temperature: float  # of the sampled rows
    greedy_frac: float  # chance that a row is greedy
    top_k: int  # target tokens kept per reply position
    shard_rows: int  # rows per shard
    system: str  # the chat system turn
    requests_sha256: str  # RequestPool.sha256: the same requests in the same order
    n_requests: int


# ---------------------------------------------------------------------------
# Shards: which rows, how written, how checked.
# ---------------------------------------------------------------------------


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.npz"


def shard_rows_of(settings: DistillSettings, index: int) -> range:
    """The run's row numbers that shard `index` holds."""
    return range(index * settings.shard_rows, (index + 1) * settings.shard_rows)


def write_shard(folder: Path, index: int, arrays: dict[str, np.ndarray]) -> dict:
    """Write shard `index` atomically; its manifest entry (file, sha256, counts)."""
    path = folder / shard_name(index)
    with safe_io.replacing(path, mode=0o644) as f:  # the data is for anyone here to train on
        np.savez(f, **arrays)
        sha256 = safe_io.sha256_of(f)  # of the bytes written, read back from the file before it gets its name
    return {
        "file": path.name,
        "sha256": sha256,
        "rows": len(arrays["row"]),
        "reply_tokens": len(arrays["reply_ids"]),
        "greedy_rows": int(arrays["greedy"].sum()),
        "ended_rows": int(arrays["ended"].sum()),
    }


def read_shard(folder: Path, entry: dict, n_vocab: int | None = None) -> dict[str, np.ndarray]:
    """A shard's arrays, checked before trusted: ValueError naming the file when its sha256 is not the
    manifest's (truncated, changed, or another run's), or its arrays are missing or inconsistent.
    entry: checked by check_entry first. The file is opened once (safe_io: a regular file, a link
    followed to what it names and checked there) and everything is read from that open file."""
    path = folder / entry["file"]
    fix = f"delete it (and its entry in {MANIFEST} is ignored: the next run makes it again)"
    try:
        with safe_io.open_regular(path) as f:
            sha256 = safe_io.sha256_of(f)
            if sha256 == entry["sha256"]:
                with safe_io.open_npz(f) as data:
                    arrays = {name: data[name] for name in SHARD_ARRAYS}
    except FileNotFoundError:
        raise ValueError(f"{path}: missing; run the same `data` command again to make it") from None
    except safe_io.Refused as e:
        raise ValueError(f"{path}: {e}; {fix}") from None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: not a readable shard ({show(str(e), 100)}); {fix}") from e
    if sha256 != entry["sha256"]:
        raise ValueError(
            f"{path}: its sha256 is not the one {MANIFEST} records (truncated, changed, or another run's); run the "
            "same `data` command again to make it afresh"
        )
    n_rows, k = entry["rows"], arrays["top_ids"].shape[-1]
    n_prompt, n_reply = int(arrays["prompt_offsets"][-1]), int(arrays["reply_offsets"][-1])
    shapes = {
        "row": (n_rows,),
        "request": (n_rows,),
        "greedy": (n_rows,),
        "ended": (n_rows,),
        "prompt_offsets": (n_rows + 1,),
        "prompt_ids": (n_prompt,),
        "reply_offsets": (n_rows + 1,),
        "reply_ids": (n_reply,),
        "top_ids": (n_reply, k),
        "top_probs": (n_reply, k),
        "request_text": (n_rows,),
        "reply_text": (n_rows,),
    }
    for name, (dtype, _) in SHARD_ARRAYS.items():
        a = arrays[name]
        if a.shape != shapes[name] or (a.dtype.kind != "U" if dtype == "str" else a.dtype != np.dtype(dtype)):
            raise ValueError(
                f"{path}: {name} is {a.dtype} of shape {a.shape}, not {dtype} of shape {shapes[name]}; {fix}"
            )
    for name in ("prompt_offsets", "reply_offsets"):
        if arrays[name][0] != 0 or (np.diff(arrays[name]) < 1).any():
            raise ValueError(f"{path}: {name} do not cut every row a non-empty piece; {fix}")
    if n_vocab is not None:
        for name in ("prompt_ids", "reply_ids", "top_ids"):
            if arrays[name].min() < 0 or arrays[name].max() >= n_vocab:
                raise ValueError(f"{path}: {name} hold ids outside 0..{n_vocab - 1} (another model's data?); {fix}")
    if not np.isfinite(arrays["top_probs"]).all() or (arrays["top_probs"] < 0).any():
        raise ValueError(f"{path}: top_probs are not probabilities; {fix}")
    return arrays


# ---------------------------------------------------------------------------
# The manifest: the run's settings and one entry per shard.
# ---------------------------------------------------------------------------


def read_manifest(folder: Path) -> dict | None:
    """DIR/manifest.json, or None when there is none; ValueError when it is not one (its format, its
    "settings" (settings_of) and its "shards" list are checked; each entry is checked where it is used,
    check_entry)."""
    path = folder / MANIFEST
    try:
        manifest = safe_io.read_json(path, dict, MAX_MANIFEST_BYTES)
        if manifest.get("format") != FORMAT or not isinstance(manifest.get("shards"), list):
            raise ValueError(f"format is not {FORMAT!r}")
        settings_of(manifest.get("settings"))
        return manifest
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{path}: not a distillation manifest ({' '.join(str(e).split())[:200]}); use another --out, or delete "
            "the folder to start again"
        ) from e


def write_manifest(folder: Path, manifest: dict) -> None:
    safe_io.write_json(folder / MANIFEST, manifest, mode=0o644)


def settings_of(record) -> DistillSettings:
    """A manifest's (or made.json's) "settings", checked field by field: ValueError saying what is wrong."""
    fields = {f.name: f.type for f in dataclasses.fields(DistillSettings)}
    if not isinstance(record, dict):
        raise ValueError(f"'settings' is {show(record)}, not an object")
    if record.keys() != fields.keys():
        odd = sorted(record.keys() ^ fields.keys())
        raise ValueError(f"'settings' {'lacks' if odd[0] in fields else 'has an unknown'} field {show(odd[0])}")
    for name, kind in fields.items():
        value = record[name]
        if kind == "str":
            ok = isinstance(value, str)
        elif kind == "int":
            ok = type(value) is int  # (JSON's true is no int here)
        else:
            ok = type(value) in (int, float) and math.isfinite(value)
        if not ok:
            raise ValueError(f"'settings' field {name!r} is {show(value)}, not of type {kind}")
    return DistillSettings(**record)


def check_entry(entry, index: int | None = None) -> dict:
    """One shard's entry (write_shard's), checked before the file it names is opened: an object naming a
    shard file in the same folder (shard_name(index) when the index is known), its sha256, and whole
    counts that fit together. ValueError saying what is wrong."""
    where = "an entry" if index is None else f"entry {index}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is {show(entry)}, not an object")
    name = entry.get("file")
    named = isinstance(name, str) and SHARD_FILE.fullmatch(name)
    if not named or (index is not None and name != shard_name(index)):
        want = "a shard file beside it (shard-NNNNN.npz)" if index is None else shard_name(index)
        raise ValueError(f"{where} names {show(name)}, not {want}")
    if not (isinstance(entry.get("sha256"), str) and re.fullmatch("[0-9a-f]{64}", entry["sha256"])):
        raise ValueError(f"{where} ({name}) has sha256 {show(entry.get('sha256'))}, not 64 hex digits")
    for count in ENTRY_COUNTS:
        value = entry.get(count)
        if type(value) is not int or not 0 <= value <= MAX_COUNT or (count == "rows" and value < 1):
            raise ValueError(f"{where} ({name}) has {count} {show(value)}, not a whole number in range")
    if entry["greedy_rows"] > entry["rows"] or entry["ended_rows"] > entry["rows"]:
        raise ValueError(f"{where} ({name}) counts more greedy or ended rows than its {entry['rows']} rows")
    return entry


def trusted_shards(folder: Path, manifest: dict, n_vocab: int, log: Callable[[str], None]) -> dict[int, dict]:
    """{index: entry} of the manifest's shards that check out; the others are reported and will be made again."""
    good = {}
    for index, entry in enumerate(manifest["shards"]):
        if entry is None:
            continue
        try:
            read_shard(folder, check_entry(entry, index), n_vocab)
            good[index] = entry
        except ValueError as e:
            log(f"shard {index} is not trusted ({e}); it is made again")
    return good


# ---------------------------------------------------------------------------
# Reading it back, for training.
# ---------------------------------------------------------------------------


def split_rows(values: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """A shard's rows laid end to end, cut apart: row b is values[offsets[b] : offsets[b + 1]]."""
    return [values[offsets[b] : offsets[b + 1]] for b in range(len(offsets) - 1)]


@dataclass
class DistillData:
    """Every row of a distillation folder, in row order (load_distill_data)."""

    settings: dict  # manifest.json's settings (model_fingerprint: the weights the data belongs to)
    prompts: list[np.ndarray]  # per row, [n_prompt] int32 chat prompt ids
    replies: list[np.ndarray]  # per row, [n_reply] int32 reply ids
    top_ids: list[np.ndarray]  # per row, [n_reply, top_k] int32
    top_probs: list[np.ndarray]  # per row, [n_reply, top_k] float32 (stored as float16)
    greedy: np.ndarray  # [n_rows] bool
    ended: np.ndarray  # [n_rows] bool
    request_text: list[str]
    reply_text: list[str]
    shard_sha256: list[str] = field(default_factory=list)  # the shards read, in order (what the rows came from)

    @property
    def n_tokens(self) -> int:
        """Reply tokens in all."""
        return sum(len(r) for r in self.replies)


def load_distill_data(folder: str | Path, model=None, complete: bool = True) -> DistillData:
    """The data in `folder`, every shard checked first (sha256 against the manifest, shapes, dtypes, ids).

    model: when given, the data must have been made with it (same fingerprint) and its
    ids must lie in its vocabulary. complete: refuse a folder whose run has not reached
    its --tokens yet (complete=False reads whatever whole shards there are).
    Raises ValueError with a sentence saying what to do.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        raise ValueError(f"{folder}: no {MANIFEST}; make the data with `python -m specdec.train data --out DIR ...`")
    for index, entry in enumerate(manifest["shards"]):  # every entry, before any shard is opened
        if entry is not None:
            try:
                check_entry(entry, index)
            except ValueError as e:
                raise ValueError(f"{folder / MANIFEST}: {e}; run the same `data` command again to remake it") from None
    if complete and not manifest.get("complete"):
        raise ValueError(
            f"{folder}: the run has not finished (complete is false in {MANIFEST}); run the same `data` "
            f"command again to finish it, or pass complete=False"
        )
    if model is not None and manifest["settings"].get("model_fingerprint") != model_fingerprint(model):
        raise ValueError(
            f"{folder}: made with another model ({manifest['settings'].get('model')!r}, fingerprint "
            f"{manifest['settings'].get('model_fingerprint')}); make data with this one"
        )
    n_vocab = None if model is None else model.n_vocab
    data = DistillData(manifest["settings"], [], [], [], [], np.zeros(0, bool), np.zeros(0, bool), [], [])
    greedy_rows, ended_rows = [], []
    for entry in manifest["shards"]:
        if entry is None:
            if complete:
                raise ValueError(f"{folder}: a shard is missing from {MANIFEST}; run the same `data` command again")
            continue
        a = read_shard(folder, entry, n_vocab)
        data.shard_sha256.append(entry["sha256"])
        data.prompts += split_rows(a["prompt_ids"], a["prompt_offsets"])
        data.replies += split_rows(a["reply_ids"], a["reply_offsets"])
        data.top_ids += split_rows(a["top_ids"], a["reply_offsets"])
        data.top_probs += [p.astype(F32) for p in split_rows(a["top_probs"], a["reply_offsets"])]
        greedy_rows.append(a["greedy"])
        ended_rows.append(a["ended"])
        data.request_text += [str(t) for t in a["request_text"]]
        data.reply_text += [str(t) for t in a["reply_text"]]
    if greedy_rows:
        data.greedy, data.ended = np.concatenate(greedy_rows), np.concatenate(ended_rows)
    return data
