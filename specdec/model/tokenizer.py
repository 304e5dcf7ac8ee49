"""GPT-2's byte-level BPE tokenizer, as a tiktoken Encoding built from the
checkpoint's own vocab.json and merges.txt; and the same kind of tokenizer
given as token strings and merges by a GGUF file or a Hugging Face
tokenizer.json (SmolLM2), through one builder (`byte_level_bpe`).

tiktoken does the fast encoding; this file only turns GPT-2's two files into
what tiktoken wants: a map from each token's *bytes* to its rank.

vocab.json does not store bytes directly. GPT-2 maps each of the 256 byte
values to a printable unicode character (so that BPE never sees whitespace or
control bytes) and writes tokens in that alphabet: byte 0x20 (space) is "Ġ",
so the token " the" appears as "Ġthe". `byte_decoder()` undoes that mapping.

subtle: tiktoken merges pairs by rank, lowest first. In GPT-2 a token's id is
256 + the line of merges.txt that creates it, so ids *are* merge ranks. We
check that against merges.txt rather than assume it, since an id out of merge
order would make tiktoken tokenize differently from the original BPE.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import tiktoken

from .. import safe_io

ENDOFTEXT = "<|endoftext|>"
MAX_FILE_BYTES = 64 << 20  # vocab.json, merges.txt, tokenizer.json: 1-10 MB for real models
# GPT-2's pre-tokenisation pattern (openai/gpt-2, src/encoder.py): contractions,
# letter runs, digit runs, other symbol runs, each with an optional leading
# space, then whitespace.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def byte_decoder() -> dict[str, int]:
    """The printable character GPT-2 uses for each byte value, inverted.

    Bytes that are already printable and not whitespace (33..126, 161..172,
    174..255) stand for themselves; the other 68 are given the characters 256,
    257, ... in byte order.  E.g. "Ġ" (U+0120) -> 32, "!" -> 33.
    """
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    decoder = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            decoder[chr(256 + extra)] = b
            extra += 1
    return decoder


def load_tokenizer(vocab_path: str | Path, merges_path: str | Path) -> tiktoken.Encoding:
    """Build the tiktoken Encoding for a GPT-2 checkpoint's vocab.json + merges.txt.

    >>> enc = load_tokenizer("vocab.json", "merges.txt")  # doctest: +SKIP
    >>> enc.encode("Hello world")                          # doctest: +SKIP
    [15496, 995]
    """
    return _load_tokenizer(str(Path(vocab_path).resolve()), str(Path(merges_path).resolve()))


@lru_cache(maxsize=8)
def _load_tokenizer(vocab_path: str, merges_path: str) -> tiktoken.Encoding:
    # Draft and target of one family share these files; build the Encoding once.
    try:
        vocab = safe_io.parse_json(safe_io.read_bytes(vocab_path, MAX_FILE_BYTES), expect=None)
        merges = safe_io.read_bytes(merges_path, MAX_FILE_BYTES).decode("utf-8").splitlines()
    except FileNotFoundError as e:
        raise ValueError(f"{e.filename} is missing: a GPT-2 tokenizer needs vocab.json and merges.txt") from e
    except (OSError, ValueError, RecursionError) as e:  # ValueError: not UTF-8, not JSON
        raise ValueError(f"cannot read the tokenizer files {vocab_path}, {merges_path}: {e}") from e
    eot_id, ranks = _check_vocab(vocab, vocab_path)
    _check_merges(vocab, merges, vocab_path, merges_path)
    special = {ENDOFTEXT: eot_id} if eot_id is not None else {}
    return _built(
        lambda: tiktoken.Encoding(
            name=f"gpt2-from-{Path(vocab_path).parent.name}",
            pat_str=GPT2_PATTERN,
            mergeable_ranks=ranks,
            special_tokens=special,
        ),
        vocab_path,
    )


def _built(make: Callable[[], tiktoken.Encoding], source) -> tiktoken.Encoding:
    """make(), with tiktoken refusing the vocabulary turned into one ValueError naming the file it came from."""
    try:
        return make()
    except BaseException as e:  # noqa: B036 (tiktoken's Rust panics are BaseExceptions)
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise ValueError(f"{source}: tiktoken refused this vocabulary ({type(e).__name__}: {e})") from None


def _check_vocab(vocab, vocab_path: str) -> tuple[int | None, dict[bytes, int]]:
    """(id of <|endoftext|> or None, {token bytes: id}) after checking what tiktoken assumes.

    NOTE: tiktoken trusts its input: a missing byte token or two tokens with
    one id make it panic (a Rust abort that Python cannot report well), so
    every assumption is checked here first, with a message naming the file.
    """
    if not isinstance(vocab, dict):
        raise ValueError(f"{vocab_path}: expected a JSON object mapping tokens to ids, got a {type(vocab).__name__}")
    bad = next(((t, i) for t, i in vocab.items() if type(i) is not int), None)
    if bad:
        raise ValueError(f"{vocab_path}: token {bad[0]!r:.40} has id {bad[1]!r:.40}; ids must be whole numbers")
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        gap = next((n for n, i in enumerate(ids) if i != n), len(ids))
        raise ValueError(
            f"{vocab_path}: ids must be 0..{len(ids) - 1}, each used once; "
            + (f"id {ids[gap]} is used twice" if gap and ids[gap] == ids[gap - 1] else f"id {gap} is missing")
        )
    vocab = dict(vocab)
    eot_id = vocab.pop(ENDOFTEXT, None)
    decode = byte_decoder()
    # Each character -> the byte it stands for, as a one-character string, so that
    # str.translate + encode("latin-1") gives a token's bytes in C, not per character.
    # Characters below 256 outside the alphabet (a raw space, say) map to one above 255,
    # which the encode then refuses, like every other character outside the alphabet.
    table = {code: "\uffff" for code in range(256)} | {ord(ch): chr(b) for ch, b in decode.items()}
    try:
        ranks = {token.translate(table).encode("latin-1"): rank for token, rank in vocab.items()}
    except UnicodeEncodeError:
        token = next(t for t in vocab if any(ch not in decode for ch in t))
        ch = next(ch for ch in token if ch not in decode)
        raise ValueError(f"{vocab_path}: token with character {ch!r} is not in GPT-2's byte alphabet") from None
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ValueError(f"{vocab_path}: the token for byte {missing[0]} is missing ({len(missing)} of 256 missing)")
    return eot_id, ranks


def _check_merges(vocab: dict, merges: list[str], vocab_path: str, merges_path: str) -> None:
    """Check that ids are merge ranks (see the module docstring) and that each merge joins two tokens."""
    merge_lines = [line for line in merges if line and not line.startswith("#version")]
    for line_no, line in enumerate(merge_lines):
        parts = line.split(" ")
        if len(parts) != 2 or parts[0] not in vocab or parts[1] not in vocab:
            raise ValueError(f"{merges_path}: merge {line_no} ({line[:80]!r}) is not two tokens of {vocab_path}")
        if vocab.get(parts[0] + parts[1]) != 256 + line_no:
            raise ValueError(
                f"{merges_path}: merge {line_no} ({line!r}) does not create token id {256 + line_no} in {vocab_path}"
            )


# ---------------------------------------------------------------------------
# Byte-level BPE given as token strings and merges: a GGUF file's metadata, or Hugging Face's
# tokenizer.json (SmolLM2 and other GPT-2-style vocabularies). Both feed one builder, byte_level_bpe.
# ---------------------------------------------------------------------------

# Pre-tokenizers by the name a GGUF gives in tokenizer.ggml.pre. SmolLM2 ("smollm") splits every digit
# on its own BEFORE GPT-2's pattern runs on what lies between (llama.cpp, src/llama-vocab.cpp; Hugging
# Face's Digits(individual_digits=True) then ByteLevel). tiktoken takes one pattern, so the two steps
# become one: \p{N} first, and a digit ends a whitespace run as the end of a piece would ("x  1" ->
# "x", "  ", "1"). GPT-2's " ?\p{N}+" is gone: a space never joins a digit. Qwen2 ("qwen2") splits in one
# pattern, Hugging Face's Split for Qwen2: contractions in any case, a letter run may take one sign before
# it ("(hello"), digits one by one, punctuation keeps the newlines after it.
PRE_TOKENIZERS = {
    "gpt2": GPT2_PATTERN,
    "smollm": r"""\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+""",
    "qwen2": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+""",
}
NORMAL, CONTROL = 1, 3  # tokenizer.ggml.token_type of ordinary tokens and of special ones such as <|im_start|>


class ByteLevelEncoding(tiktoken.Encoding):
    """A tiktoken Encoding that refuses text it cannot encode with one clear error.

    subtle: SmolLM2's vocabulary has no token for 21 of the 256 byte values (bytes
    that never occur in UTF-8 text, such as 0xC0, 0xC1 and 0xF5..0xFF, and a few
    control characters). Byte-level BPE falls back to single bytes, so such text
    has no encoding at all; tiktoken would panic deep inside.
    """

    def __init__(self, *args, missing_bytes: frozenset[int], **kwargs):
        super().__init__(*args, **kwargs)
        self.missing_bytes = missing_bytes

    def check_encodable(self, text: str) -> None:
        """A ValueError naming the characters this vocabulary cannot spell (tiktoken would panic on them)."""
        if self.missing_bytes:
            bad = sorted({c for c in text if self.missing_bytes.intersection(c.encode("utf-8", "surrogatepass"))})
            if bad:
                raise ValueError(
                    f"this model's vocabulary has no token for the character(s) {', '.join(map(repr, bad))}: "
                    "remove or replace them"
                )

    def encode(self, text: str, **kwargs) -> list[int]:
        self.check_encodable(text)
        return super().encode(text, **kwargs)

    def encode_ordinary(self, text: str) -> list[int]:
        self.check_encodable(text)
        return super().encode_ordinary(text)


def byte_level_bpe(
    tokens: dict[int, str], special: dict[str, int], merges: list[str], pre: str, source
) -> ByteLevelEncoding:
    """The tiktoken Encoding for a byte-level BPE: ordinary tokens {id: token in GPT-2's byte alphabet},
    special tokens {text: id}, merges "a b" in order, and a pre-tokenizer named in PRE_TOKENIZERS.

    Checks, as load_tokenizer does for GPT-2's files, that token ids follow merge
    order (so ranks = ids): every assumption tiktoken makes, with a message naming `source`.
    """
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"{source}: pre-tokenizer {pre!r} is unknown to specdec (known: {', '.join(PRE_TOKENIZERS)})")
    decode = byte_decoder()

    def spelt(token) -> bytes | None:  # a token's bytes, or None when it is not in GPT-2's byte alphabet
        return (
            bytes(decode[c] for c in token)
            if isinstance(token, str) and token and set(token) <= decode.keys()
            else None
        )

    ranks = {}
    for i, token in tokens.items():
        b = spelt(token)
        if b is None:
            raise ValueError(f"{source}: token {i} ({token!r:.40}) is not in GPT-2's byte alphabet")
        if b in ranks:
            raise ValueError(f"{source}: tokens {ranks[b]} and {i} are the same bytes ({token!r:.40})")
        ranks[b] = i
    clash = sorted(set(special.values()) & set(tokens))
    if clash:
        raise ValueError(f"{source}: id {clash[0]} is both a special token and an ordinary one")
    # subtle: tiktoken merges the pair whose merged token has the lowest rank; the original BPE merges
    # the pair listed first. They agree when ids follow merge order: the multi-byte tokens, by id, are
    # exactly the merges' results in merge order (SmolLM2: 235 bytes, then merge j makes id 252 + j).
    merged = sorted(i for b, i in ranks.items() if len(b) > 1)
    if len(merged) != len(merges):
        raise ValueError(
            f"{source}: {len(merged)} multi-byte tokens but {len(merges)} merges; tiktoken would tokenize differently"
        )
    for j, (line, i) in enumerate(zip(merges, merged)):
        parts = line.split(" ") if isinstance(line, str) else []
        ids = [ranks.get(spelt(part)) for part in parts] if len(parts) == 2 else [None]
        if None in ids or "".join(parts) != tokens[i] or max(ids) >= i:
            raise ValueError(
                f"{source}: merge {j} ({line!r:.40}) does not make token {i} ({tokens[i]!r:.40}) from two "
                "earlier tokens: ids are out of merge order, so tiktoken would tokenize differently"
            )
    missing = frozenset(b for b in range(256) if bytes([b]) not in ranks)
    return _built(
        lambda: ByteLevelEncoding(
            name=f"bpe-{pre}",
            pat_str=PRE_TOKENIZERS[pre],
            mergeable_ranks=ranks,
            special_tokens=special,
            missing_bytes=missing,
        ),
        source,
    )


def gguf_encoding(metadata: dict, source) -> ByteLevelEncoding:
    """The tiktoken Encoding a GGUF's tokenizer.ggml.* metadata describes (model "gpt2": byte-level BPE).

    Ordinary tokens have token_type 1; control tokens (token_type 3) become specials.
    """
    model = metadata.get("tokenizer.ggml.model")
    pre = metadata.get("tokenizer.ggml.pre", "gpt2")
    if model != "gpt2":
        raise ValueError(f"{source}: tokenizer {model!r}; specdec reads byte-level BPE GGUF tokenizers ('gpt2')")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"{source}: pre-tokenizer {pre!r} is unknown to specdec (known: {', '.join(PRE_TOKENIZERS)})")
    tokens, types = metadata.get("tokenizer.ggml.tokens"), metadata.get("tokenizer.ggml.token_type")
    merges = metadata.get("tokenizer.ggml.merges")
    if not (isinstance(tokens, list) and isinstance(types, list) and isinstance(merges, list)) or len(types) != len(
        tokens
    ):
        raise ValueError(f"{source}: tokenizer.ggml.tokens, token_type and merges are missing or disagree")
    ordinary, special = {}, {}
    for i, (token, kind) in enumerate(zip(tokens, types)):
        if kind == CONTROL:
            special[token] = i
        elif kind == NORMAL:
            ordinary[i] = token
        else:
            raise ValueError(
                f"{source}: token {i} ({token!r:.40}) has type {kind!r}; specdec reads normal (1) and "
                "control (3) tokens"
            )
    return byte_level_bpe(ordinary, special, merges, pre, source)


def hf_tokenizer_encoding(path: str | Path) -> ByteLevelEncoding:
    """The tiktoken Encoding for a Hugging Face tokenizer.json holding a byte-level BPE (SmolLM2's, GPT-2's).

    What is read: model.vocab {token: id} and model.merges (in order; "a b" strings, or
    [a, b] pairs as newer `tokenizers` write them), added_tokens (each a special token,
    such as <|im_start|>), and the pre-tokenizer, which must be one specdec knows:
        ByteLevel(use_regex)                                  -> "gpt2"
        Sequence[Digits(individual_digits), ByteLevel(...)]   -> "smollm" (SmolLM2)
    Anything that would tokenize differently (a normalizer, byte fallback, a
    word-suffix, another pre-tokenizer) is refused by name, not ignored.
    """
    path = Path(path)
    try:
        spec = safe_io.parse_json(safe_io.read_bytes(path, MAX_FILE_BYTES), expect=None)
    except FileNotFoundError as e:
        raise ValueError(f"{path} is missing: a Llama model folder needs tokenizer.json") from e
    except (OSError, ValueError, RecursionError) as e:  # ValueError: not UTF-8, not JSON
        raise ValueError(f"{path}: cannot read it as JSON ({e})") from e
    model = spec.get("model") if isinstance(spec, dict) else None
    if not isinstance(model, dict) or model.get("type", "BPE") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else None
        raise ValueError(f"{path}: tokenizer model {kind!r}; specdec reads byte-level BPE tokenizers ('BPE')")
    for key, harmless in (
        ("byte_fallback", (None, False)),
        ("dropout", (None,)),
        ("continuing_subword_prefix", (None, "")),
        ("end_of_word_suffix", (None, "")),
    ):
        if model.get(key) not in harmless:
            raise ValueError(f"{path}: model.{key} is {model.get(key)!r:.40}; specdec's BPE does not implement it")
    if spec.get("normalizer") is not None:
        kind = spec["normalizer"].get("type") if isinstance(spec["normalizer"], dict) else spec["normalizer"]
        raise ValueError(f"{path}: normalizer {kind!r:.40}; specdec's tokenizer applies none")
    pre = _hf_pre_tokenizer(spec.get("pre_tokenizer"), path)
    vocab, merges, added = model.get("vocab"), model.get("merges"), spec.get("added_tokens", [])
    if not isinstance(vocab, dict) or not isinstance(merges, list) or not isinstance(added, list):
        raise ValueError(f"{path}: model.vocab, model.merges or added_tokens is missing or malformed")
    special = {}
    for entry in added:
        ok = isinstance(entry, dict) and isinstance(entry.get("content"), str) and type(entry.get("id")) is int
        if not ok:
            raise ValueError(f"{path}: added_tokens entry {entry!r:.80} is malformed")
        if not entry.get("special", False):
            raise ValueError(
                f"{path}: added token {entry['content']!r:.40} is not special; specdec treats every "
                "added token as a special token"
            )
        special[entry["content"]] = entry["id"]
    ordinary = {}
    for token, i in vocab.items():
        if type(i) is not int:
            raise ValueError(f"{path}: token {token!r:.40} has id {i!r:.40}; ids must be whole numbers")
        if token in special:
            if special[token] != i:
                raise ValueError(f"{path}: {token!r:.40} is id {i} in model.vocab but {special[token]} in added_tokens")
            continue
        if i in ordinary:
            raise ValueError(f"{path}: id {i} is given to two tokens")
        ordinary[i] = token
    merges = [" ".join(m) if isinstance(m, list) and len(m) == 2 else m for m in merges]
    return byte_level_bpe(ordinary, special, merges, pre, path)


def _hf_pre_tokenizer(spec, path) -> str:
    """The PRE_TOKENIZERS name for a tokenizer.json pre_tokenizer, or a ValueError naming what it is."""

    def byte_level(p) -> bool:
        return (
            isinstance(p, dict)
            and p.get("type") == "ByteLevel"
            and p.get("use_regex", True)
            and not p.get("add_prefix_space", False)
        )

    if byte_level(spec):
        return "gpt2"
    steps = spec.get("pretokenizers") if isinstance(spec, dict) and spec.get("type") == "Sequence" else None
    if (
        isinstance(steps, list)
        and len(steps) == 2
        and isinstance(steps[0], dict)
        and steps[0].get("type") == "Digits"
        and steps[0].get("individual_digits") is True
        and byte_level(steps[1])
    ):
        return "smollm"
    if isinstance(spec, dict) and spec.get("type") == "Sequence" and isinstance(steps, list):
        what = "Sequence[" + ", ".join(str(s.get("type")) if isinstance(s, dict) else "?" for s in steps) + "]"
    else:
        what = spec.get("type") if isinstance(spec, dict) else spec
    raise ValueError(
        f"{path}: pre-tokenizer {what!r:.80} (with these settings) is unknown to specdec; it reads "
        "GPT-2's ByteLevel and SmolLM2's Digits + ByteLevel"
    )


def encode_text(tokenizer, text: str, allow_special: bool = False) -> list[int]:
    """A prompt's text as token ids. Control strings typed in it ("<|endoftext|>", "<|im_end|>")
    are plain text unless allow_special=True, which makes them the control tokens they name.

    subtle: tiktoken's encode(text) raises on such strings, and encode(text, allowed_special="all")
    turns them into control ids: text a user typed could then close a chat turn or open a system
    one. Plain text by default is the rule every entry point of specdec follows.

    >>> encode_text(gpt2, "<|endoftext|>")                      # doctest: +SKIP
    [27, 91, 437, 1659, 5239, 91, 29]
    >>> encode_text(gpt2, "<|endoftext|>", allow_special=True)  # doctest: +SKIP
    [50256]
    """
    if allow_special:
        return tokenizer.encode(text, allowed_special="all")
    return tokenizer.encode(text, allowed_special=set(), disallowed_special=())


def control_ids(tokenizer) -> frozenset[int]:
    """The ids of the tokenizer's control tokens (<|endoftext|>, <|im_end|>, ...): not text, never printed as text."""
    return frozenset(tokenizer.encode_single_token(s) for s in tokenizer.special_tokens_set)


def chat_prompt(tokenizer, text: str, system: str | None = None, allow_special: bool = False) -> list[int]:
    """ChatML, as SmolLM2's chat template writes one user turn (with its default system turn):

        <|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{text}<|im_end|>\\n<|im_start|>assistant\\n

    The model then writes the reply and ends it with <|im_end|>. `text` and `system` are
    encoded by encode_text: a "<|im_end|>" typed inside them is plain text, not the control
    token, unless allow_special=True.
    """
    system = DEFAULT_SYSTEM if system is None else system
    ids: list[int] = []
    for role, content in (("system", system), ("user", text)):
        ids += tokenizer.encode(f"<|im_start|>{role}\n", allowed_special="all")
        ids += encode_text(tokenizer, content, allow_special)
        ids += tokenizer.encode("<|im_end|>\n", allowed_special="all")
    return ids + tokenizer.encode("<|im_start|>assistant\n", allowed_special="all")


# SmolLM2-Instruct's chat template adds this system turn when a conversation has none.
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
