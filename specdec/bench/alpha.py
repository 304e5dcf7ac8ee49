"""The alpha table: the acceptance rate alpha of every draft -> target pair of the GPT-2 family on disk.

    python -m specdec.bench --only alpha-table

How the alpha table measures alpha. Leviathan et al. (arXiv 2211.17192,
section 3.1) define a position's acceptance as beta = sum_x min(p(x), q(x))
for the target's and draft's distributions p and q there, and alpha = E[beta].
So no speculative run is needed: the target writes a continuation of each
prompt (at the table's temperature), then one forward pass of each model over
prompt + continuation gives p and q at every generated position, and alpha is
the mean of beta over them. At temperature 0, beta is 1 where the two argmaxes
agree and 0 elsewhere. This is exact in expectation and has far less variance
than counting accepted drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

import numpy as np

from ..autoregressive import autoregressive_sample
from ..model.base import CausalLM
from ..model.gpt2 import GPT2, HParams
from ..sampling import SamplingParams, probabilities
from .prompts import encode

# The released GPT-2 family, smallest first (distilgpt2 has 6 layers of 124M's width).
GPT2_FAMILY = ("distilgpt2", "124M", "355M", "774M", "1558M")
TEMPERATURES = (0.0, 0.7, 1.0)


def beta(p_logits: np.ndarray, q_logits: np.ndarray, temperature: float) -> np.ndarray:
    """[n, n_vocab] target and draft logits -> [n] acceptance beta = sum_x min(p(x), q(x)) per row.

    At temperature 0 both distributions are point masses on their argmax, so
    beta is 1 where the argmaxes agree and 0 where they differ.
    """
    if temperature == 0:
        return (p_logits.argmax(axis=-1) == q_logits.argmax(axis=-1)).astype(np.float64)
    params = SamplingParams(temperature)
    p, q = probabilities(p_logits, params), probabilities(q_logits, params)
    return np.minimum(p, q).sum(axis=-1, dtype=np.float64)


@dataclass
class TargetRows:
    """The target's side of the alpha table, for one temperature: each prompt's
    text (prompt + the target's continuation) and the target's logits at the
    positions that predicted the continuation."""

    texts: list[list[int]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)  # row r of prompt j's logits predicts texts[j][starts[j] + r + 1]
    logits: list[np.ndarray] = field(default_factory=list)  # [n_tokens, n_vocab] each


def target_rows(target: CausalLM, prompts: list[list[int]], n_tokens: int, temperature: float, seed: int) -> TargetRows:
    rows = TargetRows()
    for j, prompt in enumerate(prompts):
        new = autoregressive_sample(target, prompt, n_tokens, temperature=temperature, seed=seed + j).tokens
        text = prompt + new
        start = len(prompt) - 1  # the row of the prompt's last token predicts the first new token
        rows.texts.append(text)
        rows.starts.append(start)
        rows.logits.append(target(text[:-1])[start:])  # [n_tokens, n_vocab]
    return rows


def pair_alpha(draft: CausalLM, rows: TargetRows, temperature: float) -> float:
    """Mean beta over every generated position of every prompt."""
    betas = [
        beta(p, draft(text[:-1])[start:], temperature) for text, start, p in zip(rows.texts, rows.starts, rows.logits)
    ]
    return float(np.concatenate(betas).mean())


def n_params(h: HParams) -> int:
    """Parameters of a GPT-2 of these shapes (blocks: 12 n_embd^2 each; embeddings), to order models by size."""
    return h.n_layer * 12 * h.n_embd**2 + (h.n_vocab + h.n_ctx) * h.n_embd


def alpha_table(
    load: Callable[[str], GPT2],
    names: list[str],
    prompts: dict[str, list[str]],
    temperatures=TEMPERATURES,
    n_tokens: int = 32,
    seed: int = 0,
    say: Callable[[str], None] = lambda line: None,
) -> list[dict]:
    """[{"draft", "target", "alpha": {T: alpha}}] for every pair of `names`
    (smallest first), the smaller model drafting for the larger. Models are
    loaded by `load(name)` one target at a time (plus one draft), so memory
    holds two models at most."""
    table = []
    for t_index, target_name in enumerate(names[1:], start=1):
        target = load(target_name)
        texts = [encode(target, p) for ps in prompts.values() for p in ps]
        rows = {}
        for T in temperatures:
            say(f"  {target_name}: writing {len(texts)} continuations of {n_tokens} tokens at T={T}")
            rows[T] = target_rows(target, texts, n_tokens, T, seed)
        for draft_name in names[:t_index]:
            draft = load(draft_name)
            if draft.n_vocab != target.n_vocab:
                raise ValueError(f"{draft_name} and {target_name} have different vocabularies")
            say(f"  {draft_name} -> {target_name}")
            table.append(
                {
                    "draft": draft_name,
                    "target": target_name,
                    "alpha": {T: pair_alpha(draft, rows[T], T) for T in temperatures},
                }
            )
            del draft
        del target
    return table


def alpha_markdown(table: list[dict], out: TextIO) -> None:
    temperatures = list(table[0]["alpha"]) if table else list(TEMPERATURES)
    out.write("| draft -> target | " + " | ".join(f"T = {T:g}" for T in temperatures) + " |\n")
    out.write("|---" * (1 + len(temperatures)) + "|\n")
    for row in table:
        cells = [f"{row['alpha'][T]:.3f}" for T in temperatures]
        out.write(f"| {row['draft']} -> {row['target']} | " + " | ".join(cells) + " |\n")


def model_hparams(name: str, models_dir: str | Path | None) -> HParams:
    """A model's shapes from its config.json, without loading the weights."""
    from ..checkpoints.gpt2_folder import read_hparams
    from ..checkpoints.hub import resolve_model

    return read_hparams(resolve_model(name, models_dir)[0] / "config.json")


def present_models(models_dir: str | Path | None, names=GPT2_FAMILY) -> list[str]:
    """The names among `names` whose checkpoint files are all in models_dir (no download)."""
    from ..checkpoints.folders import CHECKPOINT_FILES
    from ..checkpoints.hub import resolve_model

    present = []
    for name in names:
        folder, _ = resolve_model(name, models_dir)
        if all((folder / f).is_file() for f in CHECKPOINT_FILES):
            present.append(name)
    return present
