"""GPT-2 checkpoints: a folder of Hub files (config.json, model.safetensors, vocab.json, merges.txt) -> a `GPT2`.

`load_gpt2_folder` reads model.safetensors (see safetensors.py), checks every
tensor against config.json, and returns a `GPT2` with its tokenizer; it is one of
the readers load.load_model dispatches to. `save_folder` writes a model back in
the same layout, for tests, the benchmark and offline demo models.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from .. import safe_io
from ..model.gpt2 import GPT2, Block, HParams, Weights
from ..model.fast.kernels import transposed_copy
from ..model.linear import Linear
from ..model.tokenizer import load_tokenizer
from . import layout
from .folders import CHECKPOINT_FILES
from .safetensors import CheckpointError, check_finite, read_safetensors, release_pages, write_safetensors

# ---------------------------------------------------------------------------
# From tensors to a model.
# ---------------------------------------------------------------------------

# Buffers some exports include that are not weights: the causal mask
# (h.N.attn.bias, h.N.attn.masked_bias) and the LM head, which GPT-2 ties to wte.
# The four linear layers of a block: checkpoint key "h.N.<name>.weight" <-> Block field <name> with "_" for ".".
LINEARS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
_LINEAR_WEIGHTS = tuple(f".{name}.weight" for name in LINEARS)
_IGNORED = re.compile(r"^(h\.\d+\.attn\.(bias|masked_bias)|lm_head\.weight)$")
_MAX_DIM = 1 << 24  # far above any GPT-2 (n_vocab 50257); keeps shape arithmetic small


def read_hparams(config_path: Path) -> HParams:
    """GPT-2's hyperparameters from config.json, each checked for type and range."""
    redownload = _redownload_hint(config_path)
    try:
        config = safe_io.read_json(config_path, expect=None)
    except FileNotFoundError as e:
        raise CheckpointError(f"{config_path} is missing; a model folder needs {', '.join(CHECKPOINT_FILES)}") from e
    except (OSError, ValueError) as e:  # safe_io.Refused: not a regular file, too large, not UTF-8, not JSON
        raise CheckpointError(f"{config_path}: cannot read it as JSON ({e}); {redownload}") from e
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path}: expected a JSON object of GPT-2 hyperparameters; {redownload}")
    activation = config.get("activation_function", "gelu_new")
    if activation != "gelu_new":
        raise CheckpointError(f"{config_path}: activation_function {activation!r:.80}; GPT-2 uses 'gelu_new'")
    values = {"n_ctx": config.get("n_positions", config.get("n_ctx"))}
    for field, key in (("n_vocab", "vocab_size"), ("n_embd", "n_embd"), ("n_head", "n_head"), ("n_layer", "n_layer")):
        if key not in config:
            raise CheckpointError(f"{config_path}: {key!r} is missing; is this a GPT-2 config.json? {redownload}")
        values[field] = config[key]
    for field, value in values.items():
        # NOTE: `type(v) is int`, not isinstance: JSON's true is a Python int (1).
        if type(value) is not int or not 1 <= value <= _MAX_DIM:
            raise CheckpointError(
                f"{config_path}: {field} must be a whole number from 1 to {_MAX_DIM}, got {value!r:.80}; {redownload}"
            )
    epsilon = config.get("layer_norm_epsilon", 1e-5)
    if type(epsilon) not in (int, float) or not 0 < epsilon < 1:  # NaN fails both comparisons
        raise CheckpointError(
            f"{config_path}: layer_norm_epsilon must be a number between 0 and 1, got {epsilon!r:.80}; {redownload}"
        )
    n_inner = config.get("n_inner")
    if n_inner not in (None, 4 * values["n_embd"]):
        raise CheckpointError(f"{config_path}: n_inner={n_inner!r:.80}; only the standard 4*n_embd MLP is supported")
    try:
        return HParams(**values, layer_norm_epsilon=float(epsilon))
    except ValueError as e:  # n_embd not divisible by n_head
        raise CheckpointError(f"{config_path}: not a usable GPT-2 config ({e})") from e


def _redownload_hint(path: Path) -> str:
    """What to do about a damaged file: the same advice for every file of a model folder."""
    return (
        f"if the model was downloaded, delete {path} and load it again to download a fresh copy; "
        f"otherwise replace the file"
    )


def block_linear(block: Block, name: str) -> Linear:
    """A block's linear layer by its checkpoint name: "attn.c_attn" -> block.attn_c_attn."""
    return getattr(block, name.replace(".", "_"))


def expected_shapes(h: HParams) -> dict[str, tuple[int, ...]]:
    """Every GPT-2 tensor name (without the "transformer." prefix) and its shape."""
    e = h.n_embd
    shapes = {"wte.weight": (h.n_vocab, e), "wpe.weight": (h.n_ctx, e), "ln_f.weight": (e,), "ln_f.bias": (e,)}
    for i in range(h.n_layer):
        shapes.update(
            {
                f"h.{i}.ln_1.weight": (e,),
                f"h.{i}.ln_1.bias": (e,),
                f"h.{i}.attn.c_attn.weight": (e, 3 * e),
                f"h.{i}.attn.c_attn.bias": (3 * e,),
                f"h.{i}.attn.c_proj.weight": (e, e),
                f"h.{i}.attn.c_proj.bias": (e,),
                f"h.{i}.ln_2.weight": (e,),
                f"h.{i}.ln_2.bias": (e,),
                f"h.{i}.mlp.c_fc.weight": (e, 4 * e),
                f"h.{i}.mlp.c_fc.bias": (4 * e,),
                f"h.{i}.mlp.c_proj.weight": (4 * e, e),
                f"h.{i}.mlp.c_proj.bias": (e,),
            }
        )
    return shapes


def weights_from_tensors(
    tensors: dict[str, np.ndarray], hparams: HParams, source: str = "checkpoint", transposed: dict | None = None
) -> Weights:
    """Check names and shapes against the config, then arrange them as `Weights`.

    Accepts keys with or without the "transformer." prefix (distilgpt2 and
    files saved from GPT2LMHeadModel have it; openai-community/gpt2 does not).
    transposed: {"h.N.<linear>.weight": W.T} from layout.read, used instead of
    copying (layout.read checked them against their checksums and for NaN).
    """
    named = {}
    for key, array in tensors.items():
        name = key.removeprefix("transformer.")
        if not _IGNORED.match(name):
            named[name] = array
    if hparams.n_layer > len(named):  # do not build a name list for a billion layers
        raise CheckpointError(
            f"{source}: {len(named)} tensors cannot hold the n_layer={hparams.n_layer} of config.json"
        )
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
        if transposed is None or name not in transposed:
            check_finite(named[name], name, source)

    def block(i: int) -> Block:
        def w(suffix):
            return named[f"h.{i}.{suffix}"]

        def linear(name):  # stored transposed for speed: a one-time copy (model/linear.py)
            if transposed is not None:  # or kept from an earlier load (layout.py)
                return Linear(transposed[f"h.{i}.{name}.weight"], w(f"{name}.bias"))
            weight = w(f"{name}.weight")
            lin = Linear(transposed_copy(weight), w(f"{name}.bias"))
            release_pages(weight)  # the copy is what we keep: do not hold the file's pages too
            return lin

        return Block(
            ln_1_weight=w("ln_1.weight"),
            ln_1_bias=w("ln_1.bias"),
            attn_c_attn=linear("attn.c_attn"),
            attn_c_proj=linear("attn.c_proj"),
            ln_2_weight=w("ln_2.weight"),
            ln_2_bias=w("ln_2.bias"),
            mlp_c_fc=linear("mlp.c_fc"),
            mlp_c_proj=linear("mlp.c_proj"),
        )

    return Weights(
        wte=named["wte.weight"],
        wpe=named["wpe.weight"],
        blocks=[block(i) for i in range(hparams.n_layer)],
        ln_f_weight=named["ln_f.weight"],
        ln_f_bias=named["ln_f.bias"],
    )


def load_gpt2_folder(
    folder: str | os.PathLike, name: str | None = None, with_tokenizer: bool = True, keep_layout: bool | None = None
) -> GPT2:
    """A GPT2 from config.json + model.safetensors (+ vocab.json, merges.txt) in a folder.

    For a checkpoint of 64 MB or more, the first load also writes its linear weights,
    transposed, to specdec-transposed.safetensors in the folder, and later loads
    memory-map that file instead of copying (layout.py). keep_layout=False, or
    SPECDEC_NO_LAYOUT_CACHE=1 when keep_layout is None, turns this off.

    NOTE: a first (copying) load gives writable weight arrays; a later one gives
    read-only memory maps. Change weights through copies (GPT2.astype), not in place.
    """
    folder = Path(folder)
    needed = CHECKPOINT_FILES if with_tokenizer else ("config.json", "model.safetensors")
    missing = [f for f in needed if not (folder / f).is_file()]
    if missing:
        raise CheckpointError(f"{folder} is missing {', '.join(missing)}; a model folder needs {', '.join(needed)}")
    hparams = read_hparams(folder / "config.json")
    weights_path = folder / "model.safetensors"
    # The transposed copies of an earlier load, if any, still matching this checkpoint (layout.py).
    stamp = layout.stamp(weights_path) if layout.enabled(weights_path, keep_layout) else None
    shapes = {key: shape for key, shape in expected_shapes(hparams).items() if key.endswith(_LINEAR_WEIGHTS)}
    transposed, problem = layout.read(weights_path, stamp, shapes) if stamp else (None, None)
    tensors = read_safetensors(weights_path)
    if stamp and layout.stamp(weights_path) != stamp:  # replaced while we read: trust neither, copy
        stamp = transposed = None
    weights = weights_from_tensors(tensors, hparams, str(weights_path), transposed)
    if stamp and transposed is None:
        blocks = enumerate(weights.blocks)
        kept = {f"h.{i}.{name}.weight": block_linear(b, name).w_t for i, b in blocks for name in LINEARS}
        layout.write(weights_path, stamp, kept, problem)
    tokenizer = None
    if with_tokenizer:
        try:
            tokenizer = load_tokenizer(folder / "vocab.json", folder / "merges.txt")
        except ValueError as e:
            raise CheckpointError(f"{e}; {_redownload_hint(folder / 'vocab.json')} (and merges.txt)") from e
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
        for name in LINEARS:
            lin = block_linear(b, name)
            yield p + name + ".weight", lin.weight  # [n_in, n_out], GPT-2's Conv1D layout
            yield p + name + ".bias", lin.b
        yield p + "ln_2.weight", b.ln_2_weight
        yield p + "ln_2.bias", b.ln_2_bias
        if with_mask_buffers:
            yield p + "attn.bias", np.tril(np.ones((1, 1, h.n_ctx, h.n_ctx), np.float32))
    yield f"{prefix}ln_f.weight", w.ln_f_weight
    yield f"{prefix}ln_f.bias", w.ln_f_bias


def save_folder(
    model: GPT2, folder: str | os.PathLike, dtype: str = "F32", prefix: str = "", with_mask_buffers: bool = False
) -> int:
    """Write config.json and model.safetensors as the Hub has them (no tokenizer
    files); returns the safetensors file's size."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    h = model.hparams
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "vocab_size": h.n_vocab,
        "n_positions": h.n_ctx,
        "n_embd": h.n_embd,
        "n_head": h.n_head,
        "n_layer": h.n_layer,
        "layer_norm_epsilon": h.layer_norm_epsilon,
    }
    safe_io.write_json(folder / "config.json", config)
    return write_safetensors(
        folder / "model.safetensors", lambda: checkpoint_tensors(model, prefix, with_mask_buffers), dtype
    )
