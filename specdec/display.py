"""How results show themselves: a one-line repr, a short text summary, and an
HTML trace for notebooks where each token is coloured by how it was produced.

Nothing here computes a statistic: the numbers come from the result objects
(result.py); this module only lays them out. Colours, by token kind:
    draft   an accepted draft token
    target  sampled by the target (every autoregressive token; a corrected token after a rejection)
    bonus   the target's extra token after a round whose drafts were all accepted
"""

from __future__ import annotations

import codecs
import html
import math

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
    """A few lines: what was produced, acceptance overall and per draft position, the histogram."""
    lines = [result_repr(r)]
    if r.rounds:
        lines.append(
            f"  acceptance {fmt(r.acceptance_rate)} ({r.accepted} of {r.drafted} drafts), alpha {fmt(r.alpha)} "
            f"(accepted / judged), tau {fmt(r.tau)} tokens per round"
        )
        per_position = "  ".join(f"{i}: {fmt(a)}" for i, a in enumerate(r.acceptance_by_position, start=1))
        lines.append(f"  acceptance at draft position  {per_position}")
        histogram = r.accepted_histogram
        counts = " ".join(f"{n}:{c}" for n, c in enumerate(histogram))
        lines.append(f"  rounds by drafts accepted     {counts}  {sparkline(histogram)}")
        lines.append(f"  target passes {r.target_calls} (prompt included), draft passes {r.draft_calls}")
    text = r.text
    if text is not None and text_width:
        shown = text if len(text) <= text_width else text[: text_width - 1] + "…"
        lines.append(f"  text {shown!r}")
    return "\n".join(lines)


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
