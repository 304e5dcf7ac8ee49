"""The distilled draft model for SmolLM2-135M, shipped inside specdec: `load_model("smollm2-draft")`.

A draft model in the papers' own sense (Leviathan et al., arXiv 2211.17192; Chen
et al., arXiv 2302.01318): a small separate Llama with its own KV cache and
SmolLM2's tokenizer, distilled on SmolLM2's own replies against SmolLM2's
distributions (DistillSpec, Zhou et al., arXiv 2310.08461; the training is
train/draft_model.py). It is an ordinary `Llama` (a `RestrictedLlama`: its LM
head scores only the draft vocabulary), so every sampler, the race and
`--draft smollm2-draft` take it unchanged.

What the file holds and what it does not:

    weights/smollm2-draft/draft.json             the shape, the draft vocabulary, the target's fingerprint,
                                                 the card (data, steps, held-out figures, the command)
    weights/smollm2-draft/draft-<sha>.safetensors the blocks and the final norm, float16

The token embedding (and with it the tied LM head, 49,152 x 576, 57 MB in
float16) is NOT shipped: it is SmolLM2's own, taken from the loaded target, so
the file stays under MAX_BYTES and the draft scores tokens exactly as the target
embeds them. That is why the file records the fingerprint of the target it was
trained with (fingerprint.py): with another model's embedding the blocks would
read vectors they were never trained on.

What a load checks (one line naming the file and what to do, as checkpoints do):
draft.json is a JSON object of the expected fields and types; the shape fits the
target (width, vocabulary, heads); the target's fingerprint is the recorded one;
the tensors file is the one draft.json names (sha256), at most MAX_BYTES, every
tensor present, float16, of the recorded shape and finite; the draft vocabulary
is distinct ids in range, in increasing order.

Computation is float32: the float16 values are widened once at load.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import safe_io
from ..model.base import CausalLM
from ..model.llama import Llama, LlamaBlock, LlamaHParams, LlamaWeights
from ..model.restricted import RestrictedLlama
from .fingerprint import model_fingerprint
from .pairs import open_weights, read_record, show, tensors_problem, write_pair
from .safetensors import CheckpointError, index_safetensors, read_safetensors

NAME = "smollm2-draft"  # the name load_model, --draft and `specdec cache` know it by
TARGET = "smollm2-135m"  # the model it drafts for, whose embedding it reads
FOLDER = Path(__file__).resolve().parent / "weights" / NAME
CONFIG_FILE, WEIGHTS_STEM = "draft.json", "draft"
FORMAT = "specdec-llama-draft-1"
MAX_BYTES = 10_000_000  # the shipped tensors file at most (10 MB)
F32 = np.float32

# The draft's hyperparameters recorded in draft.json: name -> type. The rest (n_vocab, n_embd, n_ctx,
# rope_theta, rms_eps) are the target's: the draft reads the target's embedding and positions.
SHAPE_FIELDS = {"n_layer": int, "n_head": int, "n_kv_head": int, "n_ff": int}
MAX_LAYERS = 32


def train_command(folder=FOLDER) -> str:
    """How to make the draft that belongs in folder (training writes checkpoints too: train elsewhere, copy two files)."""
    return (
        f"python -m specdec.train draft --model {TARGET} --data DATA --out RUN --vocab-top 8192, then copy "
        f"RUN/{CONFIG_FILE} and RUN/{WEIGHTS_STEM}-*.safetensors into {folder}"
    )


def param_shapes(n_layer: int, n_embd: int, n_head: int, n_kv_head: int, n_ff: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of a draft with these hyperparameters, by the GGUF names model/llama.py uses.

    Matrices as GGUF stores them, [n_out, n_in]; blk.N.* for block N, output_norm the final RMSNorm.
    """
    d_head = n_embd // n_head
    shapes = {}
    for i in range(n_layer):
        shapes.update(
            {
                f"blk.{i}.attn_norm": (n_embd,),
                f"blk.{i}.attn_q": (n_head * d_head, n_embd),
                f"blk.{i}.attn_k": (n_kv_head * d_head, n_embd),
                f"blk.{i}.attn_v": (n_kv_head * d_head, n_embd),
                f"blk.{i}.attn_output": (n_embd, n_head * d_head),
                f"blk.{i}.ffn_norm": (n_embd,),
                f"blk.{i}.ffn_gate": (n_ff, n_embd),
                f"blk.{i}.ffn_up": (n_ff, n_embd),
                f"blk.{i}.ffn_down": (n_embd, n_ff),
            }
        )
    shapes["output_norm"] = (n_embd,)
    return shapes


def draft_hparams(target: CausalLM, shape: dict) -> LlamaHParams:
    """The draft's LlamaHParams: its own depth, heads and MLP width; the target's vocabulary, width,
    context, rotary base and RMSNorm epsilon (it reads the target's embedding)."""
    h = target.hparams
    return LlamaHParams(
        n_vocab=h.n_vocab,
        n_ctx=h.n_ctx,
        n_embd=h.n_embd,
        n_head=shape["n_head"],
        n_kv_head=shape["n_kv_head"],
        n_layer=shape["n_layer"],
        n_ff=shape["n_ff"],
        rope_theta=h.rope_theta,
        rms_eps=h.rms_eps,
    )


def build_draft(
    target: CausalLM, shape: dict, params: dict[str, np.ndarray], vocab_ids: np.ndarray | None, name: str = NAME
) -> Llama:
    """A ready draft from its tensors (param_shapes' names, float32) and the target's embedding (shared, no copy):
    a Llama, restricted to vocab_ids when given (its logits -inf elsewhere)."""
    h = draft_hparams(target, shape)
    blocks = [
        LlamaBlock.fuse(*(params[f"blk.{i}.{field}"] for field in LlamaBlock.CHECKPOINT_NAMES))
        for i in range(h.n_layer)
    ]
    model = Llama(h, LlamaWeights(target.weights.wte, blocks, params["output_norm"]), target.tokenizer, name=name)
    if vocab_ids is None:
        return model
    restricted = RestrictedLlama(model, vocab_ids)
    restricted.name = name
    return restricted


def save_draft(
    folder, target: CausalLM, shape: dict, params: dict[str, np.ndarray], vocab_ids: np.ndarray | None, card: dict
) -> Path:
    """Write draft.json and the float16 tensors it names, as one pair (pairs.write_pair). Refuses (ValueError)
    tensors that are not finite or do not fit float16, and a tensors file over MAX_BYTES (nothing is written)."""
    folder = Path(folder).expanduser()
    for name, a in params.items():
        if not np.isfinite(a).all() or np.abs(a).max() > np.finfo(np.float16).max:
            raise ValueError(f"the draft's tensor {name!r} is not finite in float16; nothing was saved")
    n_bytes = 2 * sum(a.size for a in params.values())
    if n_bytes > MAX_BYTES:
        raise ValueError(
            f"the draft's tensors take {n_bytes:,} bytes in float16, over the {MAX_BYTES:,} a shipped "
            f"draft may; use fewer blocks or a narrower MLP (--n-ff)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": FORMAT,
        "target": target.name,
        "target_fingerprint": model_fingerprint(target),
        "n_embd": target.n_embd,
        "n_vocab": target.n_vocab,
        **{field: int(shape[field]) for field in SHAPE_FIELDS},
        "vocab_ids": None if vocab_ids is None else [int(i) for i in vocab_ids],
        "card": card,
    }
    return write_pair(folder, CONFIG_FILE, WEIGHTS_STEM, params, meta, dtype="F16")


def load_draft(target: CausalLM, folder=FOLDER, name: str = NAME) -> Llama:
    """The draft in `folder` for `target`, every part checked (see the module docstring); CheckpointError of
    one line otherwise."""
    folder = Path(folder).expanduser()
    config_path = folder / CONFIG_FILE
    retrain = f"train it with: {train_command(folder)}"
    missing = f"{folder}: no trained draft here (no {CONFIG_FILE}); {retrain}"
    config = read_record(config_path, missing, CheckpointError, f"; {retrain}")

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{config_path}: {what}; {retrain}")

    if config.get("format") != FORMAT:
        raise bad(f"'format' is {show(config.get('format'))}, not {FORMAT!r}: not a draft written by specdec")
    for field, want in (("n_embd", target.n_embd), ("n_vocab", target.n_vocab)):
        if type(config.get(field)) is not int or config[field] != want:  # (NOTE: JSON's true is no int here)
            raise CheckpointError(
                f"{config_path}: this draft was trained for {show(config.get('target'))} with "
                f"{field}={show(config.get(field))}, but the target {target.name!r} has "
                f"{field}={want}; load it with {TARGET}"
            )
    shape = {}
    for field in SHAPE_FIELDS:
        value = config.get(field)
        if type(value) is not int or not 1 <= value <= (MAX_LAYERS if field == "n_layer" else 1 << 16):
            raise bad(f"{field!r} is {show(value)}, not a whole number in range")
        shape[field] = value
    try:
        draft_hparams(target, shape)
    except ValueError as e:
        raise bad(str(e)) from e
    if config.get("target_fingerprint") != model_fingerprint(target):
        raise CheckpointError(
            f"{config_path}: this draft was trained for {show(config.get('target'))}, whose weights "
            f"differ from the target {target.name!r} (it reads the target's embedding); load it "
            f"with the model it was trained for"
        )
    vocab_ids = config.get("vocab_ids")
    if vocab_ids is not None:
        if not (isinstance(vocab_ids, list) and vocab_ids and all(type(i) is int for i in vocab_ids)):
            raise bad("'vocab_ids' is not a list of whole numbers")
        # NOTE: checked as Python ints before NumPy sees them: 2**63 does not fit an int64 (OverflowError)
        if vocab_ids[0] < 0 or vocab_ids[-1] >= target.n_vocab or any(a >= b for a, b in zip(vocab_ids, vocab_ids[1:])):
            raise bad(f"'vocab_ids' must be distinct increasing ids in 0..{target.n_vocab - 1}")
        vocab_ids = np.array(vocab_ids, dtype=np.int64)
    try:
        weights_path, file = open_weights(folder, config, WEIGHTS_STEM, MAX_BYTES)  # a draft's tensors are small
    except ValueError as e:
        raise bad(str(e)) from e
    try:
        with file:  # the file whose sha256 was checked is the file read
            stored = {entry[0]: entry[1] for entry in index_safetensors(weights_path, file)[0]}  # name -> stored dtype
            tensors = read_safetensors(weights_path, file)  # widened to float32
    except (CheckpointError, OSError) as e:
        raise bad(f"{weights_path.name} is not a readable safetensors file") from e
    shapes = param_shapes(n_embd=target.n_embd, **shape)
    problem = tensors_problem(tensors, shapes, f"{CONFIG_FILE} implies")
    if problem:
        raise bad(f"{weights_path.name}: {problem}")
    for tensor in shapes:
        if stored[tensor] != "F16":
            raise bad(f"{weights_path.name}: tensor {tensor!r} is stored as {stored[tensor]}, not F16")
    return build_draft(
        target, shape, {k: np.ascontiguousarray(v, dtype=F32) for k, v in tensors.items()}, vocab_ids, name
    )


def card(folder=FOLDER) -> dict | None:
    """How the shipped draft was made (draft.json's "card"), or None when none is shipped."""
    try:
        return safe_io.read_json(Path(folder) / CONFIG_FILE).get("card")
    except FileNotFoundError:
        return None
