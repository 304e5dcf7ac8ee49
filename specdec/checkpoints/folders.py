"""What a model folder holds: config.json says the kind of model, and so which files the rest are.

The Hugging Face Hub serves every GPT-2 size as a `model.safetensors` file next
to `config.json`, `vocab.json` and `merges.txt`; a Llama (SmolLM2) as
`model.safetensors` (or shards listed in `model.safetensors.index.json`) next to
`config.json` and `tokenizer.json`. `checkpoint_files` names what a complete
folder of either kind holds; `check_download` is the cheap check each file
passes before the downloader gives it its real name (hub.py, download.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .. import safe_io
from .safetensors import CheckpointError, index_safetensors

CHECKPOINT_FILES = ("config.json", "model.safetensors", "vocab.json", "merges.txt")  # a GPT-2 folder
LLAMA_FILES = ("config.json", "model.safetensors", "tokenizer.json")  # a Llama folder (or shards: see below)
WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
MAX_INDEX_BYTES = 16 << 20  # an index names each tensor once: a few hundred kB for the largest models
MAX_TEXT_BYTES = 64 << 20  # vocab.json, merges.txt, tokenizer.json: 1-10 MB for real models

_SHARD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}\.safetensors")


def model_kind(folder: Path) -> str:
    """ "gpt2" or "llama", from config.json's model_type (or architectures), as transformers decides.

    A config.json that is missing or not a JSON object counts as GPT-2, whose
    reader (gpt2_folder.read_hparams) then says what is wrong with it.
    """
    try:
        config = safe_io.read_json(Path(folder) / "config.json", expect=None)
    except (OSError, ValueError):
        return "gpt2"
    if not isinstance(config, dict):
        return "gpt2"
    model_type, architectures = config.get("model_type"), config.get("architectures")
    if model_type == "llama" or (isinstance(architectures, list) and "LlamaForCausalLM" in architectures):
        return "llama"
    if model_type not in (None, "gpt2"):
        raise CheckpointError(
            f"{Path(folder) / 'config.json'}: model_type {model_type!r:.60}; specdec loads GPT-2 "
            "('gpt2') and Llama ('llama') checkpoints"
        )
    return "gpt2"


def shard_files(index_path: Path) -> list[str]:
    """The shard file names a model.safetensors.index.json lists, in order, each a plain file name."""
    try:
        index = safe_io.read_json(index_path, expect=None, max_bytes=MAX_INDEX_BYTES)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{index_path}: cannot read it as JSON ({e}); delete it and load again") from e
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_path}: no weight_map of tensor names to shard files; delete it and load again")
    shards = []
    for tensor, shard in weight_map.items():
        # NOTE: the downloader writes each shard under this name: never a path, never outside the folder.
        if not isinstance(shard, str) or not _SHARD.fullmatch(shard) or ".." in shard:
            raise CheckpointError(
                f"{index_path}: tensor {tensor!r:.80} is mapped to {shard!r:.80}, not a plain *.safetensors file name"
            )
        if shard not in shards:
            shards.append(shard)
    return shards


def checkpoint_files(folder: Path) -> tuple[str, ...]:
    """The files a complete model folder holds, by its kind (model_kind): GPT-2's four, or a Llama's
    config.json, weights and tokenizer.json, the weights being model.safetensors or, when the folder
    holds an index, the index and every shard it lists."""
    folder = Path(folder)
    if model_kind(folder) == "gpt2":
        return CHECKPOINT_FILES
    if (folder / INDEX).is_file() and not (folder / WEIGHTS).is_file():
        return ("config.json", INDEX, *shard_files(folder / INDEX), "tokenizer.json")
    return LLAMA_FILES


def missing_files(folder: Path) -> list[str]:
    """What `folder` lacks of checkpoint_files(folder); [] for a complete model folder."""
    return [f for f in checkpoint_files(folder) if not (Path(folder) / f).is_file()]


# ---------------------------------------------------------------------------
# What each file must look like before it gets its real name.
# ---------------------------------------------------------------------------


def check_download(path: Path, filename: str) -> None:
    """Raise ValueError unless `path` parses as the checkpoint file `filename`.

    Cheap format checks only (the loader does the full ones): enough to refuse
    an HTML page, a truncated body or a file of another kind.
    """
    if filename.endswith(".safetensors"):  # model.safetensors, or one shard of it
        index_safetensors(path)
        return
    try:
        text = safe_io.read_bytes(path, MAX_TEXT_BYTES).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{filename} is not UTF-8 text") from e
    except OSError as e:
        raise ValueError(f"{filename}: {e.strerror or e}") from e
    if filename.endswith(".json"):
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise ValueError(f"{filename} is not valid JSON ({e})") from e
        if not isinstance(value, dict):
            raise ValueError(f"{filename} is not a JSON object")
    elif filename == "merges.txt":
        for line_no, line in enumerate(text.splitlines(), 1):
            if line and not line.startswith("#version") and len(line.split(" ")) != 2:
                raise ValueError(f"merges.txt line {line_no} is not two tokens separated by a space: {line[:80]!r}")
