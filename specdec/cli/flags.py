"""Strict command-line flags, shared by `python -m specdec`, `python -m specdec.bench` and `python -m specdec.train`.

What it adds over argparse:
- no abbreviations: `--k 2` is an unknown flag, not `--k_max 2` (allow_abbrev=False);
- every flag in both spellings: `--k-max` and `--k_max` are the same flag (the help
  shows the spelling the command declared); `--only=a,b` forms work with either;
- one line per error and exit code 2, not a usage dump;
- `given(args)`: the flags the user typed, so a command can refuse a flag that contradicts
  the others (`refuse_ignored`) and accept one that is merely redundant with a note
  on standard error (`note_redundant`: `--seed 1` at temperature 0), instead of
  dropping either without a word;
- `read_prompt`: where a prompt's text comes from (`--prompt -` is standard input,
  `--prompt_file PATH` a file or a pipe), in one place; a read that waits says so.

    p = flags.Parser(prog="python -m specdec.train", description="...")
    p.add_argument("--seq-len", type=int, default=64)
    args = p.parse_args(["--seq_len", "32"])          # args.seq_len == 32
    flags.given(args)                                  # {"seq_len"}
"""

from __future__ import annotations

import argparse
import stat
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

PROMPT_FILE_LIMIT = 1 << 20  # bytes: a prompt is text for a context of at most a few thousand tokens
WAIT_NOTICE_SECONDS = 1.0  # a prompt read from a pipe that has waited this long says what it waits for


class Parser(argparse.ArgumentParser):
    """argparse with allow_abbrev=False, both spellings of every long flag, and one-line errors."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line and exit code 2, not a usage dump
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def parse_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        argv, typed = self._canonical(argv)
        parsed = super().parse_args(argv, namespace)
        parsed._given = typed
        return parsed

    def _canonical(self, argv: list[str]) -> tuple[list[str], set[str]]:
        """argv with each long flag in its declared spelling (dashes and underscores swapped where needed),
        and the dests of the flags typed. Stops at `--` (what follows is not a flag)."""
        out, typed = [], set()
        for i, arg in enumerate(argv):
            if arg == "--":
                return out + argv[i:], typed
            flag, eq, value = arg.partition("=")
            if flag.startswith("--") and flag not in self._option_string_actions:
                for other in (flag[:2] + flag[2:].replace("-", "_"), flag[:2] + flag[2:].replace("_", "-")):
                    if other in self._option_string_actions:
                        flag = other
                        break
            if flag in self._option_string_actions:
                typed.add(self._option_string_actions[flag].dest)
            out.append(flag + eq + value)
        return out, typed


def documented(prog: str, doc: str, epilog_from: int = 1) -> Parser:
    """A Parser whose --help is a module's docstring: its first paragraph the description, the paragraphs from
    `epilog_from` on the epilog, laid out as written."""
    paragraphs = doc.split("\n\n")
    return Parser(
        prog=prog,
        description=paragraphs[0],
        epilog="\n\n".join(paragraphs[epilog_from:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def given(args: argparse.Namespace) -> set[str]:
    """The dests of the flags the user typed (empty for a namespace not made by Parser)."""
    return set(getattr(args, "_given", set()))


def settings(args: argparse.Namespace) -> dict:
    """The parsed flags as a plain dict, for a benchmark's JSON record (without Parser's record of what was typed)."""
    return {dest: value for dest, value in vars(args).items() if not dest.startswith("_")}


def at_least_one(text: str) -> int:
    """An argparse type: a whole number, 1 or more (argparse names the flag in the one-line error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def refuse_ignored(parser: Parser, args: argparse.Namespace, rules: list[tuple[str, bool, str]]) -> None:
    """rules: (dest, ignored, why): a flag the user typed that contradicts the others (it asks for something
    this run cannot do, or would mislead) is refused with one line."""
    typed = given(args)
    for dest, ignored, why in rules:
        if dest in typed and ignored:
            parser.error(f"{_spelled(parser, dest)} {why}")


def note_redundant(
    parser: Parser, args: argparse.Namespace, rules: list[tuple[str, bool, str, object]], out=None
) -> list[str]:
    """rules: (dest, redundant, why, used): a flag the user typed that changes nothing here (`--seed` at
    temperature 0: greedy decoding draws nothing) is accepted, not refused, since a script passing it must
    not break: one note on standard error says so, and the run uses `used` in its place. Returns the notes.

        prog: note: --seed has no effect at temperature 0 (greedy decoding draws nothing); ignored
    """
    typed, notes = given(args), {}
    for dest, redundant, why, used in rules:
        if dest in typed and redundant and dest not in notes:  # one note per flag: its first reason
            notes[dest] = f"{parser.prog}: note: {_spelled(parser, dest)} {why}; ignored"
            setattr(args, dest, used)
    for note in notes.values():
        print(note, file=out or sys.stderr)
    return list(notes.values())


def _spelled(parser: Parser, dest: str) -> str:
    """A flag as the command declared it first (--init-head, --n_tokens_to_generate)."""
    spelled = [s for action in parser._actions if action.dest == dest for s in action.option_strings]
    return spelled[0] if spelled else "--" + dest


def read_prompt(prompt: str | None, prompt_file: str | None, stdin=None) -> str:
    """The prompt's text: `prompt` itself, standard input for "-", or the whole of prompt_file (UTF-8).

    Raises ValueError with a sentence a user can act on (both given, a missing, unreadable or huge
    file, a folder, bytes that are not UTF-8 from any of the three). `read_prompts` splits a file
    into one prompt per line (--batch).
    """
    if prompt is not None and prompt_file is not None:
        raise ValueError("give the prompt once: --prompt TEXT (or - for standard input) or --prompt_file PATH")
    if prompt_file is not None:
        where = f"--prompt_file {prompt_file}"
        if Path(prompt_file).is_dir():
            raise ValueError(f"{where}: is a folder; give a text file")
        # NOTE: read at most one byte past the limit rather than trust st_size, which is 0 for a pipe
        # (`--prompt_file <(cmd)`) and for files such as /proc/self/mem, whose read then fails.
        # subtle: opening a named pipe (mkfifo) waits until something opens it to write: say so if it takes long.
        try:
            waiting = f"({where} is a pipe: waiting for text to be written to it; Ctrl-C to stop)"
            with _said_if_slow(waiting if _is_pipe(prompt_file) else None):
                with open(prompt_file, "rb") as f:
                    data = f.read(PROMPT_FILE_LIMIT + 1)
        except FileNotFoundError:
            raise ValueError(f"{where}: no such file") from None
        except OSError as e:  # no permission, a file the kernel refuses to read this way, ...
            raise ValueError(f"{where}: cannot be read ({e.strerror or e})") from None
        if len(data) > PROMPT_FILE_LIMIT:
            raise ValueError(f"{where}: larger than {PROMPT_FILE_LIMIT >> 20} MB; a prompt is text")
        return _text(data, where)
    if prompt == "-":
        stream = sys.stdin if stdin is None else stdin
        if getattr(stream, "isatty", lambda: False)():  # a person types it: say how to end it
            print("(--prompt -: type the prompt, then Ctrl-D at the start of a line)", file=sys.stderr, flush=True)
        data = stream.buffer.read(PROMPT_FILE_LIMIT + 1) if hasattr(stream, "buffer") else stream.read()
        if isinstance(data, str):
            return data
        if len(data) > PROMPT_FILE_LIMIT:
            raise ValueError(f"--prompt -: standard input holds more than {PROMPT_FILE_LIMIT >> 20} MB")
        return _text(data, "--prompt - (standard input)")
    if prompt is not None:
        # subtle: Python hands over command-line bytes that are not UTF-8 as lone surrogates (PEP 383's
        # surrogateescape), which the tokenizer would turn into U+FFFD without a word: refuse them as a
        # file's bytes are refused, at the same byte.
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"--prompt: not UTF-8 text (byte {len(prompt[: e.start].encode())})") from None
    return prompt


def read_prompts(prompt_file: str | None, n: int) -> list[str]:
    """--batch N: the first n non-empty lines of prompt_file (UTF-8), one prompt each.

    >>> # a file "The cat\n\nA long time ago\ndef f(x):\n" with n = 2 -> ["The cat", "A long time ago"]
    """
    if prompt_file is None:
        raise ValueError("--batch N reads N prompts, one per line, from --prompt_file PATH: give the file")
    lines = [line.removesuffix("\r") for line in read_prompt(None, prompt_file).split("\n")]
    prompts = [line for line in lines if line.strip()][:n]
    if len(prompts) < n:
        raise ValueError(f"--prompt_file {prompt_file} has {len(prompts)} non-empty lines; --batch {n} needs {n}")
    return prompts


def _text(data: bytes, where: str) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: not UTF-8 text (byte {e.start})") from e
    text = text.removeprefix("\ufeff")  # a byte-order mark is not part of the prompt
    # NOTE: one final line break is the file's (or echo's), not the prompt's: GPT-2 would continue after it.
    return text.removesuffix("\n").removesuffix("\r")


def _is_pipe(path: str) -> bool:
    try:
        return stat.S_ISFIFO(Path(path).stat().st_mode)
    except OSError:
        return False  # opening it says what is wrong


@contextmanager
def _said_if_slow(notice: str | None):
    """Print `notice` on standard error if the block is still running after WAIT_NOTICE_SECONDS: a read
    that waits for a writer says so instead of hanging silently."""
    if notice is None:
        yield
        return
    timer = threading.Timer(WAIT_NOTICE_SECONDS, lambda: print(notice, file=sys.stderr, flush=True))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
