"""What the command line shows while a race runs: the status line on standard error and the decoded
text streamed as it is decided (coloured by kind on a terminal)."""

from __future__ import annotations

import codecs
import os
import sys
import unicodedata
from collections.abc import Callable

from ..model.tokenizer import control_ids

# ANSI colours for the speculative trace, by how each token was produced.
COLOURS = {"draft": "\033[32m", "target": "\033[33m", "bonus": "\033[36m"}
RESET = "\033[0m"
LEGEND = {
    "draft": "accepted draft token",
    "target": "sampled by the target (corrected)",
    "bonus": "bonus token (all drafts accepted)",
}


class Status:
    """What the race is doing, on standard error: one line rewritten in place on a terminal, one line per
    change otherwise (so --json keeps standard output for the JSON alone)."""

    def __init__(self, out=None):
        self.out = out or sys.stderr
        self.tty = self.out.isatty()
        self.shown = False
        self.before: Callable[[], None] | None = None  # e.g. end the streamed text's line first

    def __call__(self, text: str) -> None:
        if self.before:
            self.before()
        if self.tty:
            self.out.write(f"\r\033[K({text})")
            self.shown = True
        else:
            self.out.write(f"({text})\n")
        self.out.flush()

    def clear(self) -> None:
        """Remove the status line (a terminal only) before other output."""
        if self.shown:
            self.out.write("\r\033[K")
            self.out.flush()
            self.shown = False


class Stream:
    """Prints each decoder's tokens as they come: a section title, the prompt, then text,
    decoding UTF-8 across token boundaries; the speculative trace is coloured on a terminal."""

    def __init__(self, args, tokenizer, draft_label: str, status: Status | None = None):
        self.args, self.tokenizer, self.draft_label, out = args, tokenizer, draft_label, sys.stdout
        self.out, self.status = out, status
        self.colour = out.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"
        self.decoder, self.kind = None, None
        self.control = control_ids(tokenizer)  # <|im_end|> ending a reply is not text: not printed

    def start(self, decoder: str) -> None:
        self.finish()
        if self.status:  # the status line (on a terminal, the same screen) gives way to the text
            self.status.clear()
        self.kind, self.decoder = decoder, codecs.getincrementaldecoder("utf-8")(errors="replace")
        a = self.args
        title = (
            f"autoregressive ({a.target_model_size} alone)"
            if decoder == "autoregressive"
            else f"speculative (draft: {self.draft_label}, K={a.K}" + (f", tree={a.tree})" if a.tree else ")")
        )
        print(f"\n── {title} " + "─" * max(3, 70 - len(title)), file=self.out)
        if decoder == "speculative" and self.colour:
            print("legend: " + "  ".join(f"{COLOURS[k]}{v}{RESET}" for k, v in LEGEND.items()), file=self.out)
        self.out.write(visible(shorten(a.prompt)) + ("\n" if a.chat else ""))  # a chat reply starts on its own line

    def __call__(self, token: int, kind: str) -> None:
        if token in self.control:
            return
        text = visible(self.decoder.decode(self.tokenizer.decode_single_token_bytes(token)))
        if self.colour and self.kind == "speculative":
            text = f"{COLOURS[kind]}{text}{RESET}"
        self.out.write(text)
        self.out.flush()

    def finish(self) -> None:
        if self.decoder is not None:
            self.out.write(visible(self.decoder.decode(b"", final=True)) + "\n")
            self.decoder = None


def shorten(text: str, limit: int = 300) -> str:
    """A long prompt is echoed by its start and end only."""
    return text if len(text) <= limit else f"{text[: limit // 2]} [...] {text[-limit // 2 :]}"


def visible(text: str) -> str:
    """Text as it may be shown on a terminal: control characters (ESC starting a colour or a cursor move, a
    carriage return, a bell; C0, DEL and C1) written as Python escapes, so that a prompt or a reply cannot
    drive the terminal. Line breaks and tabs stay.

    >>> visible("red \\x1b[31mtext\\r\\n")
    'red \\\\x1b[31mtext\\\\r\\n'
    """
    if text.isprintable():
        return text
    return "".join(ch if ch in "\n\t" or unicodedata.category(ch) != "Cc" else repr(ch)[1:-1] for ch in text)
