"""What a sampler returns: the new tokens and what producing them cost, and how results show themselves.

Both samplers fill the same record; everything past the raw counters is
derived from the per-round record (k drafted, n accepted), so the numbers
cannot disagree with each other. One name per figure, the papers' names:

    alpha   accepted drafts / judged drafts: the chance that one draft token is
            accepted (Leviathan et al., section 3). A draft after the first
            rejection is never judged, so it does not count against alpha.
    tau     tokens per round: accepted drafts + the target's one token. Each round
            is one target pass, so tau is also the tokens per decoding pass; the
            prompt's pass (prefill) decides no token and is counted apart.
    nan     a figure with nothing to measure (alpha when nothing was drafted):
            printed as "-" everywhere (fmt), null in JSON.
"""

from __future__ import annotations

import codecs
import html
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .costmodel import drafts_judged
from .model.tokenizer import control_ids

# on_token(token, kind) is called once per emitted token, in order. kind is
# "target" (sampled from the target: every token here, and speculative
# decoding's corrected tokens), "draft" (an accepted draft token) or "bonus"
# (the extra target token after a round whose drafts were all accepted).
TokenCallback = Callable[[int, str], None]


@dataclass
class DecodeResult:
    """New tokens and what producing them cost, for either sampler."""

    tokens: list[int] = field(default_factory=list)  # the new token ids, prompt excluded
    target_calls: int = 0  # target forward passes, the prompt's prefill included
    draft_calls: int = 0  # draft forward passes (0 without a draft model)
    k_per_round: list[int] = field(default_factory=list)  # drafts proposed in each speculative round
    accepted_per_round: list[int] = field(default_factory=list)  # of which accepted
    k_max: int = 0  # the most drafts a round could ask for (sizes the histogram)
    tokenizer: object = field(default=None, repr=False, compare=False)  # the target's, for .text (None: unknown)

    judged_per_round: list[int] = field(default_factory=list)  # depths tested per round (empty: chains, derived)

    def add_round(self, k: int, n_accepted: int, judged: int) -> None:
        """Record a speculative round that proposed k drafts (chain or tree) and accepted n_accepted of them.

        judged: depths at which candidates were tested: n_accepted, plus one when
        the candidates below the last accepted node were all rejected (a tree's
        path can also end at a leaf).
        """
        self.k_per_round.append(k)
        self.accepted_per_round.append(n_accepted)
        self.judged_per_round.append(judged)

    # Everything below is derived from the per-round record above.

    @property
    def rounds(self) -> int:
        """Speculative rounds (drafting, then one verification pass each)."""
        return len(self.k_per_round)

    @property
    def drafted(self) -> int:
        return sum(self.k_per_round)

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_round)

    @property
    def accepted_histogram(self) -> list[int]:
        """[n] = rounds that accepted n drafts, n = 0..k_max ([] without rounds). A round that drafted
        nothing (the last one, say, with one token left) accepted 0: the counts sum to the rounds."""
        if not self.rounds:
            return []
        histogram = [0] * (max(self.k_max, *self.accepted_per_round) + 1)
        for n in self.accepted_per_round:
            histogram[n] += 1
        return histogram

    @property
    def alpha(self) -> float:
        """The chance that one draft token is accepted (the paper's alpha): accepted / drafts
        actually judged (see costmodel.drafts_judged); nan when nothing was drafted. For a
        tree: the chance that some candidate at a depth the path reached is accepted."""
        judged = sum(self.judged) if self.drafted else 0
        return self.accepted / judged if judged else math.nan

    @property
    def judged(self) -> list[int]:
        """Per round, the depths at which candidates were tested (add_round's `judged`); for a
        record without them (chains), costmodel.drafts_judged of each round's k and n."""
        if len(self.judged_per_round) == self.rounds:  # (a round that drafted nothing judged nothing)
            return [min(j, k) for j, k in zip(self.judged_per_round, self.k_per_round)]
        return [drafts_judged(k, n) for k, n in zip(self.k_per_round, self.accepted_per_round)]

    @property
    def mean_k(self) -> float:
        """Drafts proposed per round, over rounds that drafted at all (0 if none did)."""
        drafting = [k for k in self.k_per_round if k > 0]
        return sum(drafting) / len(drafting) if drafting else 0.0

    @property
    def draft_steps(self) -> int:
        """Draft steps to price with c: the draft's forward passes, or for a model-free drafter
        (n-gram lookup: no passes) one lookup per round, which is what its c is measured on."""
        return self.draft_calls if self.draft_calls else self.rounds

    @property
    def prefill_calls(self) -> int:
        """Target passes over the prompt that decided no token: speculative decoding's prefill (its
        rounds then start from the prompt's last token). Plain decoding's first pass decides a token."""
        return self.target_calls - self.rounds if self.rounds else 0

    @property
    def tau(self) -> float:
        """Tokens per round (accepted drafts + the target's one token); each round is one target pass.
        Plain decoding: tokens per target pass, 1. nan without tokens."""
        passes = self.rounds if self.rounds else self.target_calls
        return len(self.tokens) / passes if passes and self.tokens else math.nan

    @property
    def acceptance_by_position(self) -> list[float]:
        """[i-1] = P(draft i accepted | drafts 1..i-1 accepted), i = 1..K (nan where never judged).
        For trees: P(some candidate at depth i accepted | the path reached depth i - 1)."""
        # A round judged depths 1..judged: acceptance_by_position with k = judged counts exactly those.
        return acceptance_by_position(self.judged, self.accepted_per_round, self.k_max)[0].tolist()

    # The same rounds under the names the serving engines print them (docs/engines.md): vLLM's SpecDecoding
    # log line (v1/spec_decode/metrics.py), llama.cpp's llama-server and llama-speculative-simple.

    @property
    def draft_acceptance_rate(self) -> float:
        """accepted / drafted, every proposed draft counted, judged or not: vLLM's "draft acceptance rate",
        llama.cpp's "accept". Below alpha whenever a rejection leaves later drafts unjudged. nan: nothing drafted."""
        return self.accepted / self.drafted if self.drafted else math.nan

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted / rounds that drafted: vLLM's "mean acceptance length", llama-server's "mean len". tau
        counts every round; this leaves out the rounds that drafted nothing (an n-gram miss, a cut chain), so it
        equals tau when every round drafted. nan: no round drafted."""
        drafting = sum(k > 0 for k in self.k_per_round)
        return 1 + self.accepted / drafting if drafting else math.nan

    @property
    def acceptance_by_position_per_round(self) -> list[float]:
        """[i-1] = rounds that accepted drafts 1..i / rounds that drafted, i = 1..k_max: vLLM's "per-position
        acceptance rate" (unconditional: position i counts only after 1..i-1 were accepted). The product of
        acceptance_by_position's first i rates when every round drafts k_max; [] when no round drafted."""
        drafting = [n for k, n in zip(self.k_per_round, self.accepted_per_round) if k > 0]
        width = max([self.k_max, *self.k_per_round]) if drafting else 0
        return [sum(n >= i for n in drafting) / len(drafting) for i in range(1, width + 1)]

    @property
    def kinds(self) -> list[str]:
        """How each token was produced: "draft", "target" or "bonus" (as on_token was told).

        A round that accepted n of its k drafts emitted n "draft" tokens, then one
        "bonus" if its path ended at a leaf (judged == n: for a chain, n == k) and
        k > 0, else one "target" token; without rounds (plain decoding) every
        token is the target's.
        """
        if not self.rounds:
            return ["target"] * len(self.tokens)
        kinds = []
        for k, n, judged in zip(self.k_per_round, self.accepted_per_round, self.judged):
            kinds += ["draft"] * n + ["bonus" if judged == n and k > 0 else "target"]
        return kinds

    @property
    def text(self) -> str | None:
        """The new tokens decoded, when the model that made them has a tokenizer. Control tokens
        (<|im_end|> ending a chat reply, <|endoftext|>) are not text and are left out; .tokens keeps them."""
        if self.tokenizer is None:
            return None
        control = control_ids(self.tokenizer)
        return self.tokenizer.decode([t for t in self.tokens if t not in control])

    def to_dict(self) -> dict:
        """Plain values (lists, ints, floats, str) for JSON or pandas: pd.DataFrame([r.to_dict() for r in runs])."""
        return {
            "tokens": list(self.tokens),
            "text": self.text,
            "kinds": self.kinds,
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "rounds": self.rounds,
            "drafted": self.drafted,
            "judged": sum(self.judged),
            "accepted": self.accepted,
            "alpha": self.alpha,
            "tau": self.tau,
            "acceptance_by_position": self.acceptance_by_position,
            "accepted_histogram": self.accepted_histogram,
            "k_per_round": list(self.k_per_round),
            "accepted_per_round": list(self.accepted_per_round),
            "mean_k": self.mean_k,
            "prefill_calls": self.prefill_calls,
        }

    def __repr__(self) -> str:
        return result_repr(self)

    def __str__(self) -> str:
        return result_summary(self)

    def _repr_html_(self) -> str:
        """What a notebook shows: the summary, then the text with each token coloured by its kind."""
        return result_html(self)


def acceptance_by_position(k_per_round, accepted_per_round, k_max: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per draft position i = 1..max k: (acceptance rate, rounds that judged position i).

    A round that proposed k drafts and accepted n judged positions 1..min(n+1, k):
    drafts after the first rejection are never judged. The rate at i is
    P(draft i accepted | drafts 1..i-1 accepted); under the papers' i.i.d.
    assumption it is alpha at every i. Positions never judged get nan.

    >>> rate, judged = acceptance_by_position([3, 3, 3], [3, 1, 0])
    >>> rate.tolist(), judged.tolist()
    ([0.6666666666666666, 0.5, 1.0], [3, 2, 1])
    """
    k_max = max(k_max, *k_per_round, 0)  # positions 1..k_max, at least the longest round
    judged = np.zeros(k_max, dtype=np.int64)
    accepted = np.zeros(k_max, dtype=np.int64)
    for k, n in zip(k_per_round, accepted_per_round):
        assert 0 <= n <= k, f"a round cannot accept {n} of {k} drafts"
        judged[: min(n + 1, k)] += 1
        accepted[:n] += 1
    rate = np.full(k_max, np.nan)
    np.divide(accepted, judged, out=rate, where=judged > 0)
    return rate, judged


# ---------------------------------------------------------------------------
# How results show themselves: a one-line repr, a short text summary, and an HTML
# trace for notebooks where each token is coloured by how it was produced. Nothing
# below computes a statistic; it only lays out the numbers above.
#     draft   an accepted draft token
#     target  sampled by the target (every autoregressive token; a corrected token after a rejection)
#     bonus   the target's extra token after a round whose drafts were all accepted
# ---------------------------------------------------------------------------
# The same three colours as the terminal trace and specdec.bench.plot.
KIND_COLOURS = {"draft": "#2ca02c", "target": "#ff7f0e", "bonus": "#1f77b4"}
KIND_LEGEND = {
    "draft": "accepted draft token",
    "target": "sampled by the target",
    "bonus": "bonus token (all drafts accepted)",
}
BARS = " ▁▂▃▄▅▆▇█"


def fmt(x: float, digits: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def sparkline(counts) -> str:
    """A histogram as block characters, tallest bar = the largest count: [1, 4, 0, 2] -> '▂█ ▄'."""
    top = max(counts, default=0)
    return "".join(BARS[math.ceil(c / top * (len(BARS) - 1))] if top else " " for c in counts)


def token_pieces(tokenizer, tokens) -> list[str]:
    """The text of each token, decoding UTF-8 across token boundaries (a character
    split over two tokens shows up on the second; invalid bytes as U+FFFD)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces = [decoder.decode(tokenizer.decode_single_token_bytes(t)) for t in tokens]
    if pieces:
        pieces[-1] += decoder.decode(b"", final=True)
    return pieces


def result_repr(r) -> str:
    """One line: DecodeResult(40 tokens, 12 rounds, alpha 0.78, tau 3.33)."""
    parts = [f"{len(r.tokens)} tokens"]
    if r.rounds:
        parts += [f"{r.rounds} rounds", f"alpha {fmt(r.alpha)}", f"tau {fmt(r.tau)}"]
    else:
        parts.append(f"{r.target_calls} target passes")
    return f"{type(r).__name__}(" + ", ".join(parts) + ")"


def result_summary(r, text_width: int | None = 72) -> str:
    """A few lines: what was produced, alpha and tau, acceptance per draft position, the histogram."""
    lines = [result_repr(r)]
    if r.rounds:
        lines.append(
            f"  alpha {fmt(r.alpha)} ({r.accepted} accepted of {sum(r.judged)} judged drafts; {r.drafted} drafted), "
            f"tau {fmt(r.tau)} tokens per round"
        )
        per_position = "  ".join(f"{i}: {fmt(a)}" for i, a in enumerate(r.acceptance_by_position, start=1))
        lines.append(f"  acceptance at draft position  {per_position}")
        histogram = r.accepted_histogram
        counts = " ".join(f"{n}:{c}" for n, c in enumerate(histogram))
        lines.append(f"  rounds by drafts accepted     {counts}  {sparkline(histogram)}")
        lines.append(f"  target passes {r.target_calls} ({passes(r)}), draft passes {r.draft_calls}")
    text = r.text
    if text is not None and text_width:
        shown = text if len(text) <= text_width else text[: text_width - 1] + "…"
        lines.append(f"  text {shown!r}")
    return "\n".join(lines)


def passes(r) -> str:
    """What the target passes were: '1 over the prompt + 35 rounds'."""
    if not r.rounds:
        return "one per token"
    return (f"{r.prefill_calls} over the prompt + " if r.prefill_calls else "") + f"{r.rounds} rounds"


def trace_html(pieces: list[str], kinds: list[str], prompt: str = "") -> str:
    """The tokens as coloured spans after the prompt in grey, with a legend of the kinds that occur."""
    spans = [f'<span style="color:grey">{html.escape(prompt)}</span>'] if prompt else []
    for piece, kind in zip(pieces, kinds):
        colour = KIND_COLOURS.get(kind, "inherit")
        spans.append(f'<span style="color:{colour}" title="{kind}">{html.escape(piece)}</span>')
    legend = " ".join(
        f'<span style="color:{KIND_COLOURS[k]}">■ {KIND_LEGEND[k]}</span>' for k in KIND_COLOURS if k in kinds
    )
    return (
        f'<div style="font-family:monospace;white-space:pre-wrap;line-height:1.5">{"".join(spans)}</div>'
        f'<div style="font-size:smaller">{legend}</div>'
    )


def result_html(r, prompt: str = "") -> str:
    """A notebook's view of a result: the summary lines, then the coloured trace (when a tokenizer is known)."""
    out = f'<pre style="margin:0">{html.escape(result_summary(r, text_width=None))}</pre>'
    if r.tokenizer is not None and r.kinds:
        out += trace_html(token_pieces(r.tokenizer, r.tokens), r.kinds, prompt)
    return out
