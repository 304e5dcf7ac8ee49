"""What a model's name rules out before a byte is fetched (the rows are registry.py's).

A draft/target pair that cannot work (different tokenizers), an early-exit layer
the target does not have, or a request longer than the context are decided by the
names alone, so the command line refuses them before downloading gigabytes
(`check_pair`); `footprint` says what a first run will put on disk. A name not in
the registry (a Hub repo id of someone else's model, a local folder, a GGUF file)
is checked after it is loaded.

    footprint(["355M", "124M"])   # (download bytes, kept-layout bytes) of a first run
"""

from __future__ import annotations

from .registry import MODELS, TOKENIZERS, canonical, card, shipped_heads


def footprint(names) -> tuple[int, int]:
    """(bytes downloaded, bytes of kept layout) on a first run with these models (unknown names count 0)."""
    cards = {canonical(n): card(n) for n in names}
    known = [c for c in cards.values() if c is not None]
    return sum(c.download for c in known), sum(c.kept_layout for c in known)


def check_pair(
    target: str,
    draft_model: str | None = None,
    early_exit: int | None = None,
    chat: bool = False,
    n_tokens: int = 1,
    k: int = 1,
    cross_vocab: bool = False,
    shipped_head: str | None = None,
) -> None:
    """Refuse, by names alone, what cannot work: ValueError with one sentence. Unknown names pass.

    draft_model: the draft's name when the draft is a model; early_exit: L for early_exit:L;
    n_tokens: new tokens asked for; k: the widest draft a round may verify (K, k_max or a tree's nodes).
    cross_vocab: the draft model may have another tokenizer (its drafts are re-spelt, drafters/crossvocab.py).
    shipped_head: a kind of head the draft is the target's shipped one of ("eagle" for --draft eagle): the
    registry knows every target that has one (SHIPPED_HEADS), so any other name is refused here, unknown
    names included (a folder or a GGUF file has no shipped head), before the target is fetched.
    """
    if shipped_head is not None:
        shipped_heads(target, shipped_head)  # ValueError of one line when none is shipped for it
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
        chats = ", ".join(n for n, c in MODELS.items() if c.chat)
        raise ValueError(f"--chat needs a chat model ({chats}); {target} has no chat template")
    if n_tokens >= t.n_ctx:
        raise ValueError(f"{n_tokens} new tokens do not fit {target}'s context of {t.n_ctx} tokens with a prompt")
    if k + 1 > t.n_ctx:
        raise ValueError(f"a round of {k} drafts cannot be verified in {target}'s context of {t.n_ctx} tokens")
