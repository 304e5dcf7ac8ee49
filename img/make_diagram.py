"""Draw the README figure of one speculative-decoding round (K = 4).

The figure follows a concrete GPT-2 style example through one
draft / verify / accept round of Leviathan et al. (arXiv 2211.17192),
Algorithm 1:

1. the draft model proposes " jumps", " over", " a", " lazy" one after
   another after the last accepted token " fox", sampling each from q_i;
2. the target model runs ONE forward pass over the K + 1 = 5 tokens
   [" fox", " jumps", " over", " a", " lazy"]; output row p_i verifies
   draft i (the token one position later) and p_4 is the bonus row;
3. " jumps" and " over" are accepted, " a" is rejected, " lazy" is
   dropped, and " the" is sampled from norm(max(0, p_2 - q_2)).

Letters follow Leviathan et al.: p = target, q = draft (Chen et al.,
arXiv 2302.01318, swap them).

The SVG is built by hand from strings, using only the standard library.
Regenerate it from the repository root with:

    python img/make_diagram.py

which writes img/speculative_round.svg next to this script.
"""

from pathlib import Path
from xml.sax.saxutils import escape

OUT = Path(__file__).resolve().parent / "speculative_round.svg"

WIDTH = 900  # the height follows from the layout, see the end
SANS = "Helvetica, Arial, 'DejaVu Sans', sans-serif"
MONO = "Menlo, Consolas, 'DejaVu Sans Mono', monospace"

# (stroke, fill, text) colour triples.
CONTEXT = ("#94a3b8", "#f1f5f9", "#334155")
LAST = ("#334155", "#ffffff", "#111827")
DRAFT = ("#7c3aed", "#ede9fe", "#3b0764")
TARGET = ("#475569", "#ffffff", "#1e293b")
ACCEPT = ("#16a34a", "#dcfce7", "#14532d")
CORRECT = ("#ea580c", "#ffedd5", "#7c2d12")
BONUS = ("#2563eb", "#dbeafe", "#1e3a8a")
REJECT = ("#dc2626", "#fee2e2", "#7f1d1d")
DISCARD = ("#9ca3af", "#f3f4f6", "#9ca3af")
INK, MUTED = "#111827", "#4b5563"

# Token columns: last accepted token, four drafts, then the bonus slot.
BOX_W, BOX_H = 90, 32
PITCH = 120
COL = [220 + PITCH * i for i in range(6)]  # centres: fox, d0..d3, bonus
DRAFTS = ['" jumps"', '" over"', '" a"', '" lazy"']
SUB = "₀₁₂₃₄"  # subscript digits

parts = []


def add(s):
    parts.append(s)


def text(x, y, s, size=12, anchor="start", weight="normal", fill=INK, family=SANS, italic=False):
    style = ' font-style="italic"' if italic else ""
    add(
        f'<text x="{x}" y="{y}" font-family="{family}" font-size="{size}" '
        f'font-weight="{weight}" fill="{fill}" text-anchor="{anchor}"{style}>'
        f"{escape(s)}</text>"
    )


def lines(x, y, rows, size=11, step=13, **kw):
    for k, row in enumerate(rows):
        text(x, y + k * step, row, size=size, **kw)


def box(cx, y, label, colours, w=BOX_W, h=BOX_H, dashed=False, mono=True, weight="bold"):
    stroke, fill, ink = colours
    dash = ' stroke-dasharray="5 3"' if dashed else ""
    add(
        f'<rect x="{cx - w / 2}" y="{y}" width="{w}" height="{h}" rx="6" '
        f'fill="{fill}" stroke="{stroke}" stroke-width="1.6"{dash}/>'
    )
    if label:
        text(
            cx, y + h / 2 + 4.5, label, size=13, anchor="middle", weight=weight, fill=ink, family=MONO if mono else SANS
        )


def arrow(x1, y1, x2, y2, colour=MUTED, width=1.4, dashed=False):
    dash = ' stroke-dasharray="4 3"' if dashed else ""
    add(
        f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{colour}" '
        f'stroke-width="{width}"{dash} marker-end="url(#head-{colour[1:]})"/>'
    )


def badge(cx, cy, ok):
    """A small round badge with a tick (ok) or a cross, drawn as paths."""
    colour = ACCEPT[0] if ok else REJECT[0]
    add(f'<circle cx="{cx}" cy="{cy}" r="8" fill="{colour}"/>')
    if ok:
        d = f"M{cx - 4},{cy} L{cx - 1.2},{cy + 3} L{cx + 4},{cy - 3.5}"
    else:
        d = f"M{cx - 3.2},{cy - 3.2} L{cx + 3.2},{cy + 3.2} M{cx + 3.2},{cy - 3.2} L{cx - 3.2},{cy + 3.2}"
    add(f'<path d="{d}" fill="none" stroke="#ffffff" stroke-width="2" stroke-linecap="round" stroke-linejoin="round"/>')


# --------------------------------------------------------------------------
# Canvas, arrow heads, legend
# --------------------------------------------------------------------------
add("<title>One speculative decoding round with K = 4: draft, verify, accept/reject</title>")
add("<defs>")
for colour in (MUTED, DRAFT[0], TARGET[0], CORRECT[0], BONUS[0]):
    add(
        f'<marker id="head-{colour[1:]}" viewBox="0 0 10 10" refX="9" '
        f'refY="5" markerWidth="7" markerHeight="7" orient="auto">'
        f'<path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker>'
    )
add("</defs>")
add('<rect width="100%" height="100%" fill="#ffffff"/>')

legend = [
    (DRAFT, "draft proposal"),
    (ACCEPT, "accepted draft"),
    (CORRECT, "target-sampled (corrected)"),
    (BONUS, "bonus (from p₄)"),
    (REJECT, "rejected"),
    (DISCARD, "discarded"),
]
x = 20
for (stroke, fill, _), label in legend:
    add(f'<rect x="{x}" y="9" width="14" height="14" rx="3" fill="{fill}" stroke="{stroke}" stroke-width="1.6"/>')
    text(x + 20, 20.5, label, size=12, fill=MUTED)
    x += 20 + 7.2 * len(label) + 22

# --------------------------------------------------------------------------
# Row 1: the draft model proposes K = 4 tokens, one after another
# --------------------------------------------------------------------------
Y1 = 62
text(20, Y1 - 10, "Draft (small model, K = 4 steps)", size=14, weight="bold")
box(90, Y1, '"The quick brown"', CONTEXT, w=140, weight="normal")
lines(90, Y1 + BOX_H + 15, ["accepted so far,", "already in both KV caches"], anchor="middle", fill=MUTED)
box(COL[0], Y1, '" fox"', LAST, dashed=True)
lines(COL[0], Y1 + BOX_H + 15, ["last token, not yet", "in any KV cache"], anchor="middle", fill=MUTED)
for i, tok in enumerate(DRAFTS):
    cx = COL[i + 1]
    arrow(cx - PITCH + BOX_W / 2 + 2, Y1 + BOX_H / 2, cx - BOX_W / 2 - 3, Y1 + BOX_H / 2, colour=DRAFT[0])
    box(cx, Y1, tok, DRAFT)
    text(cx, Y1 + BOX_H + 16, f"~ q{SUB[i]}", size=13, anchor="middle", fill=DRAFT[0], weight="bold")
lines(COL[5] - 40, Y1 + 10, ["4 sequential", "small-model passes"], fill=MUTED)

# --------------------------------------------------------------------------
# Row 2: one target forward pass over K + 1 tokens
# --------------------------------------------------------------------------
P_Y, P_H = 164, 38  # output rows p_0..p_4
IN_Y = 232  # input tokens
text(20, P_Y - 12, "Target (large model): ONE forward pass over K+1 = 5 tokens", size=14, weight="bold")
lines(20, P_Y + 14, ["output row i", "verifies draft i,", "the token at the", "next position"], fill=MUTED)
inputs = ['" fox"'] + DRAFTS
for i, tok in enumerate(inputs):
    cx = COL[i]
    box(cx, IN_Y, tok, LAST if i == 0 else DRAFT, dashed=(i == 0))
    # the input at position i yields output row p_i ...
    arrow(cx - 18, IN_Y - 2, cx - 18, P_Y + P_H + 3, colour=TARGET[0])
    bonus = i == len(inputs) - 1
    colours = BONUS if bonus else TARGET
    box(cx, P_Y, "", colours, h=P_H, dashed=bonus)
    text(cx, P_Y + 16, f"p{SUB[i]}", size=14, anchor="middle", weight="bold", fill=colours[2])
    sub = "bonus row" if bonus else f"checks {DRAFTS[i]}"
    text(cx, P_Y + 31, sub, size=11, anchor="middle", fill=colours[2])
    # ... which verifies the token at the NEXT position.
    arrow(cx + 12, P_Y + P_H + 2, COL[i + 1] - 22, IN_Y - 3, colour=BONUS[0] if bonus else TARGET[0], dashed=bonus)
box(COL[5], IN_Y, "bonus", BONUS, dashed=True, mono=False, weight="normal")
lines(
    COL[5],
    IN_Y + BOX_H + 14,
    ["if all K are accepted,", "a bonus token is", "sampled from p₄"],
    anchor="middle",
    fill=BONUS[2],
)

# --------------------------------------------------------------------------
# Row 3: accept / reject left to right, then correct
# --------------------------------------------------------------------------
Y3 = 318
text(20, Y3 + 12, "Accept / reject", size=14, weight="bold")
lines(20, Y3 + 32, ["left to right, r ~ U(0,1):", "accept draft i if", "r ≤ pᵢ(x)/qᵢ(x)"], fill=MUTED)
verdicts = [
    (ACCEPT, True, "accepted", "r ≤ p₀(x)/q₀(x)"),
    (ACCEPT, True, "accepted", "r ≤ p₁(x)/q₁(x)"),
    (REJECT, False, "rejected", "r > p₂(x)/q₂(x)"),
    (DISCARD, None, "discarded", ""),
]
for i, (colours, ok, word, why) in enumerate(verdicts):
    cx = COL[i + 1]
    box(cx, Y3, DRAFTS[i], colours)
    if ok is not None:
        badge(cx + BOX_W / 2 - 2, Y3 + 2, ok)
    else:  # strike the dropped draft through
        add(
            f'<line x1="{cx - 34}" y1="{Y3 + BOX_H / 2}" x2="{cx + 34}" '
            f'y2="{Y3 + BOX_H / 2}" stroke="{DISCARD[0]}" stroke-width="2"/>'
        )
    text(cx, Y3 + BOX_H + 15, word, size=12, anchor="middle", weight="bold", fill=colours[0])
    if why:
        text(cx, Y3 + BOX_H + 29, why, size=11, anchor="middle", fill=MUTED)
lines(COL[4] + BOX_W / 2 + 10, Y3 + 6, ["after a rejection,", "later drafts", "are dropped"], fill=MUTED)

# the rejected position is refilled from the residual distribution
NEW_Y = Y3 + BOX_H + 48
arrow(COL[3], Y3 + BOX_H + 34, COL[3], NEW_Y - 3, colour=CORRECT[0])
box(COL[3], NEW_Y, '" the"', CORRECT)
text(
    COL[3] - BOX_W / 2 - 10,
    NEW_Y + 21,
    "new token sampled from norm(max(0, p₂ − q₂))",
    size=12,
    anchor="end",
    fill=CORRECT[2],
    weight="bold",
)

# --------------------------------------------------------------------------
# Result and notation caption
# --------------------------------------------------------------------------
R_Y = NEW_Y + BOX_H + 24
text(
    20,
    R_Y,
    "Result: 3 new tokens (' jumps over the') for 1 target pass; both KV caches roll back to",
    size=13,
    weight="bold",
)
text(20, R_Y + 17, "'The quick brown fox jumps over', and ' the' is fed in the next round.", size=13, weight="bold")
text(
    20,
    R_Y + 38,
    "p = target distribution, q = draft distribution (Leviathan et al. notation; Chen et al. swap the letters)",
    size=11,
    fill=MUTED,
    italic=True,
)

HEIGHT = R_Y + 48
parts.insert(
    0, f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}">'
)
add("</svg>")

if __name__ == "__main__":
    OUT.write_text("\n".join(parts) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
