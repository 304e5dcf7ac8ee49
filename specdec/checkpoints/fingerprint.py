"""Which model a trained file belongs to: a short fingerprint of a model's weights.

Trained heads (drafters/heads.py), distillation data (train/distill.py) and the
shipped distilled draft (checkpoints/draft.py) each record the fingerprint of the
target they were made from, and their loaders refuse a target whose weights
differ. It is computed from the loaded model, so it does not depend on the file
format the target came in (GGUF, safetensors, the kept layout).
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..model.base import CausalLM
from ..model.linear import Linear
from ..model.llama import LlamaBlock

F32 = np.float32

FINGERPRINT = "v2"  # what model_fingerprint hashes; bump when that changes
FINGERPRINT_SAMPLES = 4096  # values read from each tensor


def model_fingerprint(target: CausalLM) -> str:
    """A short hash that tells models apart: "v2-" + 16 hex digits.

    Every tensor of the model goes in, by name and shape, with FINGERPRINT_SAMPLES
    of its values, evenly spaced from its first to its last, as float32 (a float64
    copy of a model has the same fingerprint, and so has a load through the kept
    layout). Two checkpoints that differ anywhere but in a few unsampled values
    therefore differ here: another model, a fine-tune, every block changed.
    Measured (docs/checkpoints.md): 18 ms for GPT-2 124M, 28 ms for 355M, where
    sha256 over every byte takes 0.44 s and 1.2 s.
    NOTE: a fingerprint, not a signature: heads for the wrong model could only
    draft badly, never change the output (the target verifies every token).
    """
    w = target.weights
    # Every weight outside the blocks (GPT-2: wte, wpe, ln_f; Llama: wte, norm_f), the LM head when it is its own.
    named = [
        (name.replace("ln_f_", "ln_f."), value) for name, value in vars(w).items() if name not in ("blocks", "lm_head")
    ]
    if w.lm_head.w_t is not w.wte:
        named.append(("lm_head.w_t", w.lm_head.w_t))
    for i, block in enumerate(w.blocks):
        # A Llama's fused matrices go in as the checkpoint's own (LlamaBlock.checkpoint_tensors), as they are stored.
        tensors = block.checkpoint_tensors() if isinstance(block, LlamaBlock) else vars(block)
        for field, value in tensors.items():
            if isinstance(value, Linear):  # w_t: [n_out, n_in], however it was loaded
                named += [(f"h.{i}.{field}.w_t", value.w_t), (f"h.{i}.{field}.b", value.b)]
            else:
                named.append((f"h.{i}.{field}", value))
    digest = hashlib.sha256(FINGERPRINT.encode())
    for name, array in named:
        if array is None:  # a Linear without bias
            continue
        flat = np.asarray(array).reshape(-1)
        at = np.linspace(0, flat.size - 1, min(flat.size, FINGERPRINT_SAMPLES)).astype(np.int64)
        digest.update(f"{name}{array.shape}".encode())
        digest.update(np.ascontiguousarray(flat[at], dtype=F32).tobytes())
    return f"{FINGERPRINT}-{digest.hexdigest()[:16]}"
