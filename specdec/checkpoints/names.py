"""What every named model is, known before a byte is fetched: layers, width, tokenizer, context, chat, disk.

A draft/target pair that cannot work (different tokenizers), an early-exit layer
the target does not have, or a request longer than the context are decided by the
names alone, so the command line refuses them before downloading gigabytes
(`check_pair`). A name not in this table (a Hub repo id of someone else's model,
a local folder, a GGUF file) is checked after it is loaded.

    card("355M")            # ModelCard(layers=24, width=1024, tokenizer='gpt2', n_ctx=1024, chat=False, download=...)
    card("gpt2-medium")     # the same: the Hub's short names are accepted too
    footprint(["355M", "124M"])   # (download bytes, kept-layout bytes) of a first run

Disk: a GPT-2 checkpoint of 64 MB or more gets a second file beside it on first
load, its linear weights transposed to float32 (layout.py): 12 * width^2 weights
per layer, 4 bytes each. A Llama (SmolLM2) keeps no such file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..model.gpt2 import block_linear_weights
from . import draft, family, layout, wheel
from .hub import DOWNLOAD_SIZES, HUB_SHORT_NAMES, LLAMA_REPOS, MODEL_REPOS

# Tokenizer families: two models speculate together only within one.
TOKENIZERS = {
    "gpt2": "GPT-2's 50,257-token BPE",
    "stdlib": "the stdlib family's 4,096-token BPE",
    "smollm2": "SmolLM2's 49,152-token BPE",
}


@dataclass(frozen=True)
class ModelCard:
    layers: int
    width: int  # n_embd
    tokenizer: str  # a key of TOKENIZERS
    n_ctx: int  # the context window, in tokens
    chat: bool  # has a chat template (--chat)
    download: int  # bytes fetched on first use (0: shipped inside specdec)

    @property
    def kept_layout(self) -> int:
        """Bytes of the transposed float32 weights kept beside a GPT-2 checkpoint (layout.py), 0 if none."""
        if self.tokenizer == "smollm2":
            return 0  # a Llama is stored in the layout Linear wants: nothing is kept
        kept = 4 * self.layers * block_linear_weights(self.width)  # float32: 4 bytes per weight
        return kept if self.download >= layout.MIN_BYTES else 0


def _gpt2(layers: int, width: int, repo: str) -> ModelCard:
    return ModelCard(layers, width, "gpt2", 1024, False, DOWNLOAD_SIZES[repo])


def _smollm2(size: str, repo: str | None, chat: bool, download: int | None = None) -> ModelCard:
    layers, width = {"135m": (30, 576), "360m": (32, 960), "1.7b": (24, 2048)}[size]
    return ModelCard(layers, width, "smollm2", 8192, chat, DOWNLOAD_SIZES[repo] if repo else download)


CARDS: dict[str, ModelCard] = {
    "124M": _gpt2(12, 768, MODEL_REPOS["124M"]),
    "355M": _gpt2(24, 1024, MODEL_REPOS["355M"]),
    "774M": _gpt2(36, 1280, MODEL_REPOS["774M"]),
    "1558M": _gpt2(48, 1600, MODEL_REPOS["1558M"]),
    "distilgpt2": _gpt2(6, 768, MODEL_REPOS["distilgpt2"]),
    family.TARGET: ModelCard(6, 128, "stdlib", 256, False, 0),
    family.DRAFT: ModelCard(2, 96, "stdlib", 256, False, 0),
    "smollm2-135m": _smollm2("135m", None, True, wheel.SMOLLM2_135M.size),
    # The shipped draft: one block, SmolLM2's tokenizer; its first use fetches smollm2-135m (its embedding).
    draft.NAME: ModelCard(1, 576, "smollm2", 8192, True, wheel.SMOLLM2_135M.size),
    **{name: _smollm2(name.split("-")[1], repo, not name.endswith("-base")) for name, repo in LLAMA_REPOS.items()},
}
_BY_REPO = {repo: name for name, repo in {**MODEL_REPOS, **LLAMA_REPOS}.items()}


# Draft heads shipped inside specdec for a named target, in checkpoints/weights/<folder>/ (heads.json and its
# safetensors, float16): `--draft eagle` (API: draft="eagle") drafts with the target's shipped EAGLE head.
SHIPPED_HEADS: dict[tuple[str, str], str] = {("smollm2-135m", "eagle"): "eagle-smollm2-135m"}


def shipped_heads(target: str, kind: str) -> Path:
    """The folder of the `kind` head shipped for the target named `target`; ValueError (one line) if none is."""
    folder = SHIPPED_HEADS.get((canonical(target), kind))
    if folder is None:
        have = ", ".join(f"{t}" for t, k in SHIPPED_HEADS if k == kind) or "none"
        raise ValueError(f"no {kind} head is shipped for {target} (shipped for: {have}); train one with "
                         f"`python -m specdec.train {kind} ...` and pass '{kind}:DIR'")  # fmt: skip
    return family.WEIGHTS_DIR / folder


def canonical(name: str) -> str:
    """specdec's name for a Hub short name ("gpt2-medium" -> "355M"); anything else unchanged."""
    return HUB_SHORT_NAMES.get(str(name), str(name))


def card(name: str) -> ModelCard | None:
    """The card of a short name, a Hub short name or a known repo id; None for anything else (a folder...)."""
    name = canonical(name)
    return CARDS.get(name) or CARDS.get(_BY_REPO.get(name, ""))


def footprint(names) -> tuple[int, int]:
    """(bytes downloaded, bytes of kept layout) on a first run with these models (unknown names count 0)."""
    cards = {canonical(n): card(n) for n in names}
    known = [c for c in cards.values() if c is not None]
    return sum(c.download for c in known), sum(c.kept_layout for c in known)


def check_pair(target: str, draft_model: str | None = None, early_exit: int | None = None, chat: bool = False,
               n_tokens: int = 1, k: int = 1, cross_vocab: bool = False) -> None:  # fmt: skip
    """Refuse, by names alone, what cannot work: ValueError with one sentence. Unknown names pass.

    draft_model: the draft's name when the draft is a model; early_exit: L for early_exit:L;
    n_tokens: new tokens asked for; k: the widest draft a round may verify (K, k_max or a tree's nodes).
    cross_vocab: the draft model may have another tokenizer (its drafts are re-spelt, drafters/crossvocab.py).
    """
    t = card(target)
    if t is None:
        return
    d = card(draft_model) if draft_model is not None else None
    if d is not None and d.tokenizer != t.tokenizer and not cross_vocab:
        raise ValueError(
            f"the draft {draft_model} ({TOKENIZERS[d.tokenizer]}) and the target {target} ({TOKENIZERS[t.tokenizer]}) "
            "tokenize text differently; give --cross_vocab tli (any temperature) or slem (temperature 0), or a draft "
            "with the target's tokenizer"
        )
    if early_exit is not None and not 1 <= early_exit < t.layers:
        raise ValueError(f"early exit needs 1 <= L < {t.layers} (the layers of {target}), got L={early_exit}")
    if chat and not t.chat:
        chats = ", ".join(n for n, c in CARDS.items() if c.chat)
        raise ValueError(f"--chat needs a chat model ({chats}); {target} has no chat template")
    if n_tokens >= t.n_ctx:
        raise ValueError(f"{n_tokens} new tokens do not fit {target}'s context of {t.n_ctx} tokens with a prompt")
    if k + 1 > t.n_ctx:
        raise ValueError(f"a round of {k} drafts cannot be verified in {target}'s context of {t.n_ctx} tokens")
