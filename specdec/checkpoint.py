"""GPT-2 checkpoints: model names -> Hub repos, download, safetensors, load_model.

The Hugging Face Hub serves every GPT-2 size as a `model.safetensors` file next
to `config.json`, `vocab.json` and `merges.txt`. This module fetches those four
files into `models/<name>/` (once; afterwards no network is touched), reads the
safetensors file itself with np.memmap (no copy, no torch), checks every tensor
against config.json, and returns a ready `GPT2` with its tokenizer.

Environment variables, read in one place (`HubSettings.from_env`), with the
meanings huggingface_hub gives them:
    HF_ENDPOINT     base URL of the Hub or a mirror (default https://huggingface.co)
    HF_HUB_OFFLINE  1/ON/YES/TRUE: never touch the network; use local files only
    HF_TOKEN        sent as a bearer token, for gated or private repos

safetensors format (https://huggingface.co/docs/safetensors): 8 bytes of
little-endian u64 N, then N bytes of JSON mapping each tensor name to
{"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the byte
after the header), optionally a "__metadata__" entry, then the raw data.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import requests

from .gpt2 import GPT2, Block, HParams, Linear, Weights
from .tokenizer import load_tokenizer

# Short names for the released checkpoints, and the Hub repository of each.
MODEL_REPOS = {
    "124M": "openai-community/gpt2",
    "355M": "openai-community/gpt2-medium",
    "774M": "openai-community/gpt2-large",
    "1558M": "openai-community/gpt2-xl",
    "distilgpt2": "distilbert/distilgpt2",
}
CHECKPOINT_FILES = ("config.json", "model.safetensors", "vocab.json", "merges.txt")
DEFAULT_ENDPOINT = "https://huggingface.co"

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MAX_HEADER_BYTES = 100_000_000  # the reference implementation's own limit


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupt or not a GPT-2."""


class DownloadError(RuntimeError):
    """A checkpoint could not be fetched; the message says what to do."""


# ---------------------------------------------------------------------------
# Where a model comes from.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HubSettings:
    endpoint: str = DEFAULT_ENDPOINT
    offline: bool = False
    token: str | None = None

    @classmethod
    def from_env(cls) -> "HubSettings":
        """The one place that reads the environment, as huggingface_hub does."""
        endpoint = os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        return cls(endpoint.rstrip("/"), offline, os.environ.get("HF_TOKEN") or None)

    def url(self, repo: str, filename: str) -> str:
        return f"{self.endpoint}/{repo}/resolve/main/{filename}"


def resolve_model(name_or_path: str, models_dir: str | os.PathLike = "models") -> tuple[Path, str | None]:
    """Map a name to (local folder, Hub repo or None for a plain local folder).

    "124M" -> (models/124M, "openai-community/gpt2"); "owner/name" ->
    (models/owner--name, "owner/name"); an existing folder -> (folder, None).
    """
    name = str(name_or_path)
    models_dir = Path(models_dir)
    if name in MODEL_REPOS:
        return models_dir / name, MODEL_REPOS[name]
    if Path(name).is_dir():
        return Path(name), None
    if name.startswith(("/", "./", "../", "~")) or "\\" in name:
        raise ValueError(f"{name} is not a folder: a local model needs a folder holding {', '.join(CHECKPOINT_FILES)}")
    if _REPO_ID.match(name) and ".." not in name:
        folder = models_dir / name.replace("/", "--")
        # The pattern already excludes separators and "..", but check the
        # result too: a name must never place files outside models_dir.
        if models_dir.resolve() not in folder.resolve().parents:
            raise ValueError(f"model name {name!r} would place files outside {models_dir}")
        return folder, name
    known = ", ".join(MODEL_REPOS)
    raise ValueError(
        f"unknown model {name!r}: use one of {known}, a Hub repo id such as "
        f"'openai-community/gpt2', or the path of a folder holding {', '.join(CHECKPOINT_FILES)}"
    )


# ---------------------------------------------------------------------------
# Download: streaming, resumable, checked.
# ---------------------------------------------------------------------------


def _progress_bar(total: int | None, initial: int, desc: str, show: bool):
    from tqdm import tqdm  # imported here so that importing specdec stays light

    return tqdm(total=total, initial=initial, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                leave=False, disable=not show)  # fmt: skip


class _Transient(Exception):
    """A failure worth retrying: a 5xx or 429 answer, or a download that stopped short."""


def _expected_size_and_sha256(session: requests.Session, url: str, headers: dict) -> tuple[int | None, str | None]:
    """Ask the server, without following redirects, what the file should be.

    For files stored with git LFS the Hub answers /resolve/ with a redirect
    whose X-Linked-Size and X-Linked-Etag give the size and the sha256; small
    files are served directly with Content-Length and an ETag (a git blob hash,
    40 hex digits, which is not a sha256 and is not used).
    """
    r = session.head(url, headers=headers, allow_redirects=False, timeout=30)
    _check_status(r, url)
    size = r.headers.get("X-Linked-Size") or (r.headers.get("Content-Length") if r.status_code == 200 else None)
    etag = (r.headers.get("X-Linked-Etag") or r.headers.get("ETag") or "").strip()
    etag = etag.removeprefix("W/").strip('"').lower()
    return (int(size) if size else None), (etag if _SHA256.match(etag) else None)


def _check_status(r: requests.Response, url: str) -> None:
    if r.status_code >= 500 or r.status_code == 429:
        raise _Transient(f"HTTP {r.status_code} from {url}")
    if r.status_code == 404:
        raise DownloadError(
            f"{url} does not exist (HTTP 404): check the model name, or set HF_ENDPOINT to a mirror that has it"
        )
    if r.status_code in (401, 403):
        raise DownloadError(
            f"{url} refused access (HTTP {r.status_code}): for a gated or private repo set HF_TOKEN "
            f"to a token that can read it"
        )
    if r.status_code >= 400:
        raise DownloadError(f"{url} answered HTTP {r.status_code}")


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def download_file(
    url: str,
    dest: Path,
    token: str | None = None,
    retries: int = 3,
    retry_delay: float = 1.0,
    progress: bool = True,
) -> Path:
    """Fetch `url` into `dest`, resuming a partial download, checking size and sha256.

    Bytes go to `dest` + ".incomplete", which is renamed to `dest` only once
    complete and verified, so a file under its real name is always whole. After
    an interruption the next attempt (or the next run) continues with a Range
    request from where the partial file ends.
    """
    dest = Path(dest)
    partial = dest.with_name(dest.name + ".incomplete")
    # identity: sizes and Range offsets must count the file's bytes, not gzip's
    # (huggingface_hub asks for the same).
    headers = {"Accept-Encoding": "identity"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    session = requests.Session()
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(retry_delay * 2 ** (attempt - 1))
        try:
            size, sha256 = _expected_size_and_sha256(session, url, headers)
            _fetch_into(session, url, partial, headers, size, progress, dest.name)
            break
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError, _Transient) as e:
            # Transient: retry, resuming from what arrived; but without DNS, retrying will not help.
            if attempt == retries or _is_name_resolution_error(e):
                raise DownloadError(
                    f"could not download {url} ({_one_line(e)}). Check the network, set HF_ENDPOINT "
                    f"to a reachable mirror, or place {', '.join(CHECKPOINT_FILES)} in {dest.parent} by hand"
                ) from e

    if size is not None and partial.stat().st_size != size:  # a server contradicting itself
        raise DownloadError(f"{url}: the server's answers disagree about the file's size; run again later")
    if sha256 is not None and _sha256_of(partial) != sha256:
        partial.unlink()
        raise DownloadError(
            f"{url}: sha256 does not match the server's ({sha256}); the corrupt download was removed, run again"
        )
    os.replace(partial, dest)
    return dest


def _is_name_resolution_error(error: Exception) -> bool:
    text = repr(error)
    return "NameResolutionError" in text or "Name or service not known" in text or "nodename nor servname" in text


def _one_line(error: Exception) -> str:
    """A short description of a requests/urllib3 error, whose str() can run to several lines."""
    if _is_name_resolution_error(error):
        return "the host name could not be resolved: no network, or no DNS"
    if isinstance(error, requests.ConnectionError) and "Connection refused" in repr(error):
        return "connection refused"
    if isinstance(error, requests.exceptions.ChunkedEncodingError):
        return "the connection broke mid-file; what arrived is kept and the next run resumes"
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _fetch_into(session, url, partial: Path, headers, size, progress: bool, desc: str) -> None:
    """Append what is missing to `partial`; raise _Transient if it stays short."""
    have = partial.stat().st_size if partial.exists() else 0
    if size is not None and have > size:
        partial.unlink()  # longer than the real file: not ours to resume
        have = 0
    if size is not None and have == size:
        return
    request_headers = dict(headers)
    if have:
        request_headers["Range"] = f"bytes={have}-"
    with session.get(url, headers=request_headers, stream=True, timeout=30) as r:
        if r.status_code == 416:  # nothing past `have`: the size checks decide
            return
        _check_status(r, url)
        if have and r.status_code != 206:
            have = 0  # the server ignored the Range header: start over
        total = size
        if total is None and r.headers.get("Content-Length"):
            total = have + int(r.headers["Content-Length"])
        mode = "ab" if have else "wb"
        with open(partial, mode) as f, _progress_bar(total, have, desc, progress) as bar:
            for chunk in r.iter_content(chunk_size=1 << 16):
                f.write(chunk)
                bar.update(len(chunk))
    got = partial.stat().st_size
    if total is not None and got < total:
        # Some urllib3 versions end a dropped stream quietly: keep what came, resume.
        raise _Transient(f"the connection closed after {got} of {total} bytes")
    if total is not None and got > total:
        partial.unlink()
        raise _Transient(f"received {got} bytes, more than the expected {total}")


def ensure_files(folder: Path, repo: str | None, settings: HubSettings, progress: bool = True) -> Path:
    """Make sure the four checkpoint files are in `folder`, downloading what is missing."""
    missing = [f for f in CHECKPOINT_FILES if not (folder / f).is_file()]
    if not missing:
        return folder
    if repo is None:
        raise CheckpointError(
            f"{folder} is missing {', '.join(missing)}; a model folder needs {', '.join(CHECKPOINT_FILES)}"
        )
    if settings.offline:
        raise DownloadError(
            f"{folder} is missing {', '.join(missing)} and HF_HUB_OFFLINE is set, so nothing can be "
            f"downloaded: unset HF_HUB_OFFLINE, or place the files there by hand"
        )
    folder.mkdir(parents=True, exist_ok=True)
    for filename in missing:
        download_file(settings.url(repo, filename), folder / filename, token=settings.token, progress=progress)
    return folder


# ---------------------------------------------------------------------------
# safetensors, read with np.memmap.
# ---------------------------------------------------------------------------

_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor in a safetensors file as a float32 array.

    F32 tensors are read-only views into one np.memmap of the file: opening a
    1.4 GB checkpoint costs a header parse, and pages are read from disk (or
    shared from the page cache) only when used. F16 and BF16 are converted to
    float32, which does copy.
    """
    path = Path(path)
    file_size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: {file_size} bytes is too short for a safetensors file")
        header_len = int.from_bytes(prefix, "little")
        if header_len > min(_MAX_HEADER_BYTES, file_size - 8):
            raise CheckpointError(
                f"{path}: header length {header_len} does not fit in a {file_size}-byte file; "
                f"the file is truncated or not safetensors, delete it and download again"
            )
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(
                f"{path}: the header is not valid JSON ({e}); delete the file and download again"
            ) from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the header is not a JSON object")
    header.pop("__metadata__", None)

    data_start = 8 + header_len
    data_size = file_size - data_start
    entries = sorted((_check_entry(path, name, info) for name, info in header.items()), key=lambda e: e[3])
    # The data section must be tiled exactly: each tensor starts where the last
    # ended, and the last ends at the end of the file. This rules out
    # truncation, overlap (two names reading the same bytes) and gaps.
    for name, _, _, begin, stop in entries:
        if stop > data_size:
            raise CheckpointError(
                f"{path}: tensor {name!r} needs bytes {begin}..{stop} but the data section has {data_size}; "
                f"the file is truncated or corrupt, delete it and download again"
            )
    end = 0
    for name, _, _, begin, stop in entries:
        if begin != end:
            raise CheckpointError(
                f"{path}: tensor {name!r} (bytes {begin}..{stop}) overlaps another tensor or leaves a gap "
                f"before it; the file is corrupt, delete it and download again"
            )
        end = stop
    if end != data_size:
        raise CheckpointError(
            f"{path}: {data_size - end} bytes after the last tensor; the file is corrupt, delete it and download again"
        )

    data = (
        np.memmap(path, dtype=np.uint8, mode="r", offset=data_start, shape=(data_size,))
        if data_size
        else np.empty(0, np.uint8)
    )
    return {
        name: _to_float32(data[begin:stop].view(_DTYPES[dtype]).reshape(shape), dtype)
        for name, dtype, shape, begin, stop in entries
    }


def _check_entry(path: Path, name: str, info) -> tuple[str, str, tuple[int, ...], int, int]:
    """One header entry as (name, dtype, shape, begin, end), or a CheckpointError."""
    try:
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        ok = (
            isinstance(dtype, str) and isinstance(shape, list) and isinstance(offsets, list) and len(offsets) == 2
            and all(type(d) is int and d >= 0 for d in shape) and all(type(o) is int and o >= 0 for o in offsets)
        )  # fmt: skip
    except (TypeError, KeyError):
        ok = False
    if not ok:
        raise CheckpointError(f"{path}: tensor {name!r} has a malformed header entry {info!r}; the file is corrupt")
    if dtype not in _DTYPES:
        raise CheckpointError(f"{path}: tensor {name!r} has dtype {dtype}; only F32, F16 and BF16 are supported")
    begin, end = offsets
    n_bytes = int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype].itemsize
    if end - begin != n_bytes:
        raise CheckpointError(
            f"{path}: tensor {name!r} claims bytes {begin}..{end} for shape {shape} {dtype}; "
            f"the file is corrupt, delete it and download again"
        )
    return name, dtype, tuple(shape), begin, end


def _to_float32(raw: np.ndarray, dtype_name: str) -> np.ndarray:
    if dtype_name == "F32":
        return raw
    if dtype_name == "F16":
        converted = raw.astype(np.float32)
    else:  # BF16 is the top half of a float32: shift the 16 bits back into place.
        converted = (raw.astype(np.uint32) << 16).view(np.float32)
    release_pages(raw)
    return converted


def release_pages(array: np.ndarray) -> None:
    """Tell the kernel this process no longer needs the file pages behind a
    memory-mapped array it has copied from.

    Pages read through a mapping count in the process's resident memory for as
    long as they stay mapped. Without this, loading (which copies the linear
    weights into a transposed layout) would briefly hold every weight twice. The
    array stays valid: touching it again just reads the file (or page cache).
    """
    mm = getattr(array, "_mmap", None)  # set on np.memmap and its views
    if mm is None or array.nbytes == 0 or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = array.ctypes.data - np.frombuffer(mm, np.uint8).ctypes.data
    first_page = start // mmap.PAGESIZE * mmap.PAGESIZE
    try:
        mm.madvise(mmap.MADV_DONTNEED, first_page, start + array.nbytes - first_page)
    except (OSError, ValueError):
        pass  # only advice: memory use is higher, nothing else changes


# ---------------------------------------------------------------------------
# From tensors to a model.
# ---------------------------------------------------------------------------

# Buffers some exports include that are not weights: the causal mask
# (h.N.attn.bias, h.N.attn.masked_bias) and the LM head, which GPT-2 ties to wte.
_IGNORED = re.compile(r"^(h\.\d+\.attn\.(bias|masked_bias)|lm_head\.weight)$")


def read_hparams(config_path: Path) -> HParams:
    try:
        config = json.loads(Path(config_path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{config_path}: cannot read it as JSON ({e})") from e
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path}: expected a JSON object of GPT-2 hyperparameters")
    activation = config.get("activation_function", "gelu_new")
    if activation != "gelu_new":
        raise CheckpointError(f"{config_path}: activation_function {activation!r}; GPT-2 uses 'gelu_new'")
    n_inner = config.get("n_inner")
    try:
        hparams = HParams(
            n_vocab=config["vocab_size"],
            n_ctx=config.get("n_positions", config.get("n_ctx")),
            n_embd=config["n_embd"],
            n_head=config["n_head"],
            n_layer=config["n_layer"],
            layer_norm_epsilon=float(config.get("layer_norm_epsilon", 1e-5)),
        )
    except KeyError as e:
        raise CheckpointError(f"{config_path}: {e.args[0]!r} is missing; is this a GPT-2 config.json?") from e
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{config_path}: not a usable GPT-2 config ({e})") from e
    if n_inner not in (None, 4 * hparams.n_embd):
        raise CheckpointError(f"{config_path}: n_inner={n_inner}; only the standard 4*n_embd MLP is supported")
    return hparams


def expected_shapes(h: HParams) -> dict[str, tuple[int, ...]]:
    """Every GPT-2 tensor name (without the "transformer." prefix) and its shape."""
    e = h.n_embd
    shapes = {"wte.weight": (h.n_vocab, e), "wpe.weight": (h.n_ctx, e), "ln_f.weight": (e,), "ln_f.bias": (e,)}
    for i in range(h.n_layer):
        shapes.update({
            f"h.{i}.ln_1.weight": (e,), f"h.{i}.ln_1.bias": (e,),
            f"h.{i}.attn.c_attn.weight": (e, 3 * e), f"h.{i}.attn.c_attn.bias": (3 * e,),
            f"h.{i}.attn.c_proj.weight": (e, e), f"h.{i}.attn.c_proj.bias": (e,),
            f"h.{i}.ln_2.weight": (e,), f"h.{i}.ln_2.bias": (e,),
            f"h.{i}.mlp.c_fc.weight": (e, 4 * e), f"h.{i}.mlp.c_fc.bias": (4 * e,),
            f"h.{i}.mlp.c_proj.weight": (4 * e, e), f"h.{i}.mlp.c_proj.bias": (e,),
        })  # fmt: skip
    return shapes


def weights_from_tensors(tensors: dict[str, np.ndarray], hparams: HParams, source: str = "checkpoint") -> Weights:
    """Check names and shapes against the config, then arrange them as `Weights`.

    Accepts keys with or without the "transformer." prefix (distilgpt2 and
    files saved from GPT2LMHeadModel have it; openai-community/gpt2 does not).
    """
    named = {}
    for key, array in tensors.items():
        name = key.removeprefix("transformer.")
        if not _IGNORED.match(name):
            named[name] = array
    expected = expected_shapes(hparams)
    missing = [name for name in expected if name not in named]
    if missing:
        raise CheckpointError(
            f"{source}: tensor {missing[0]!r} is missing ({len(missing)} missing in all); is this a GPT-2 checkpoint matching its config.json?"
        )
    unexpected = sorted(set(named) - set(expected))
    if unexpected:
        raise CheckpointError(
            f"{source}: unexpected tensor {unexpected[0]!r} ({len(unexpected)} in all); config.json says n_layer={hparams.n_layer}"
        )
    for name, shape in expected.items():
        if tuple(named[name].shape) != shape:
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {tuple(named[name].shape)}, config.json implies {shape}"
            )

    def block(i: int) -> Block:
        def w(suffix):
            return named[f"h.{i}.{suffix}"]

        def linear(name):  # stored transposed for speed: a one-time copy (see gpt2.Linear)
            weight = w(f"{name}.weight")
            lin = Linear.from_checkpoint(weight, w(f"{name}.bias"))
            release_pages(weight)  # the copy is what we keep: do not hold the file's pages too
            return lin

        return Block(
            ln_1_weight=w("ln_1.weight"), ln_1_bias=w("ln_1.bias"),
            attn_c_attn=linear("attn.c_attn"), attn_c_proj=linear("attn.c_proj"),
            ln_2_weight=w("ln_2.weight"), ln_2_bias=w("ln_2.bias"),
            mlp_c_fc=linear("mlp.c_fc"), mlp_c_proj=linear("mlp.c_proj"),
        )  # fmt: skip

    return Weights(
        wte=named["wte.weight"],
        wpe=named["wpe.weight"],
        blocks=[block(i) for i in range(hparams.n_layer)],
        ln_f_weight=named["ln_f.weight"],
        ln_f_bias=named["ln_f.bias"],
    )


def load_model(
    name_or_path: str = "124M",
    models_dir: str | os.PathLike = "models",
    progress: bool = True,
    settings: HubSettings | None = None,
) -> GPT2:
    """Load a GPT-2 by short name ("124M", "355M", "774M", "1558M", "distilgpt2"),
    Hub repo id ("owner/name") or local folder, downloading it on first use.

    >>> model = load_model("124M")          # doctest: +SKIP
    >>> model.n_layer, model.tokenizer.encode("Hello world")  # doctest: +SKIP
    (12, [15496, 995])
    """
    settings = HubSettings.from_env() if settings is None else settings
    folder, repo = resolve_model(name_or_path, models_dir)
    ensure_files(folder, repo, settings, progress)
    return load_folder(folder, name=str(name_or_path))


def load_folder(folder: str | os.PathLike, name: str | None = None, with_tokenizer: bool = True) -> GPT2:
    """Load config.json + model.safetensors (+ vocab.json, merges.txt) from a folder."""
    folder = Path(folder)
    hparams = read_hparams(folder / "config.json")
    weights_path = folder / "model.safetensors"
    weights = weights_from_tensors(read_safetensors(weights_path), hparams, str(weights_path))
    tokenizer = None
    if with_tokenizer:
        tokenizer = load_tokenizer(folder / "vocab.json", folder / "merges.txt")
        if tokenizer.n_vocab != hparams.n_vocab:
            raise CheckpointError(
                f"{folder}: the tokenizer has {tokenizer.n_vocab} tokens but config.json says "
                f"vocab_size={hparams.n_vocab}"
            )
    return GPT2(hparams, weights, tokenizer, name=name or folder.name)


# ---------------------------------------------------------------------------
# Writing checkpoints: for tests, the benchmark and offline demo models.
# ---------------------------------------------------------------------------


def checkpoint_tensors(model: GPT2, prefix: str = "", with_mask_buffers: bool = False):
    """(name, array) pairs under the Hub's key names, in the checkpoint's layout.

    with_mask_buffers adds the h.N.attn.bias causal-mask buffers that the real
    openai-community/gpt2 file carries (and the loader must ignore).
    """
    w, h = model.weights, model.hparams
    yield f"{prefix}wte.weight", w.wte  # [n_vocab, n_embd]
    yield f"{prefix}wpe.weight", w.wpe  # [n_ctx, n_embd]
    for i, b in enumerate(w.blocks):
        p = f"{prefix}h.{i}."
        yield p + "ln_1.weight", b.ln_1_weight
        yield p + "ln_1.bias", b.ln_1_bias
        for name, lin in (("attn.c_attn", b.attn_c_attn), ("attn.c_proj", b.attn_c_proj),
                          ("mlp.c_fc", b.mlp_c_fc), ("mlp.c_proj", b.mlp_c_proj)):  # fmt: skip
            yield p + name + ".weight", lin.weight  # [n_in, n_out], GPT-2's Conv1D layout
            yield p + name + ".bias", lin.b
        yield p + "ln_2.weight", b.ln_2_weight
        yield p + "ln_2.bias", b.ln_2_bias
        if with_mask_buffers:
            yield p + "attn.bias", np.tril(np.ones((1, 1, h.n_ctx, h.n_ctx), np.float32))
    yield f"{prefix}ln_f.weight", w.ln_f_weight
    yield f"{prefix}ln_f.bias", w.ln_f_bias


def _encode(array: np.ndarray, dtype_name: str) -> np.ndarray:
    array = np.ascontiguousarray(array, dtype=np.float32)
    if dtype_name == "BF16":  # keep the top 16 bits (truncation; fine for test files)
        return (array.view(np.uint32) >> 16).astype("<u2")
    return array.astype(_DTYPES[dtype_name], copy=False)


def write_safetensors(path: str | os.PathLike, tensors, dtype: str = "F32") -> int:
    """Write tensors as safetensors; returns the file size.

    tensors: a dict, or a function returning (name, array) pairs (called twice,
    once for the header and once for the data, so only one tensor is in memory
    at a time). dtype: "F32", "F16" or "BF16" for every tensor.
    """
    pairs = tensors.items if isinstance(tensors, dict) else tensors
    itemsize = _DTYPES[dtype].itemsize
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, array in pairs():
        n_bytes = int(np.prod(array.shape, dtype=np.int64)) * itemsize
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + n_bytes]}
        offset += n_bytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for _, array in pairs():
            f.write(_encode(array, dtype).data)
    return Path(path).stat().st_size


def save_folder(
    model: GPT2, folder: str | os.PathLike, dtype: str = "F32", prefix: str = "", with_mask_buffers: bool = False
) -> int:
    """Write config.json and model.safetensors as the Hub has them (no tokenizer
    files); returns the safetensors file's size."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    h = model.hparams
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
        "vocab_size": h.n_vocab, "n_positions": h.n_ctx, "n_embd": h.n_embd, "n_head": h.n_head,
        "n_layer": h.n_layer, "layer_norm_epsilon": h.layer_norm_epsilon,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return write_safetensors(
        folder / "model.safetensors", lambda: checkpoint_tensors(model, prefix, with_mask_buffers), dtype
    )
