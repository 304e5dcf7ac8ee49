"""The GGUF tokenizer (gguf_encoding in specdec/model/tokenizer.py) on a tiny vocabulary built here:
SmolLM2's one-regex pre-tokenizer against llama.cpp's two steps, ranks = ids refused where they are
not, characters without a token named, ChatML. (The real vocabulary: tests/model/test_llama.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from specdec.model.tokenizer import GPT2_PATTERN, PRE_TOKENIZERS, byte_decoder, chat_prompt, gguf_encoding

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "1 2"]


def vocab_lists(merges=MERGES, missing: str = "") -> tuple[list[str], list[int], list[str]]:
    """(tokens, token_types, merges) as a GGUF gives them: 3 control tokens, the byte alphabet
    (less the `missing` bytes), then one token per merge, in merge order."""
    alphabet = [ch for ch, b in sorted(byte_decoder().items(), key=lambda kv: kv[1]) if chr(b) not in missing]
    tokens = SPECIALS + alphabet + [m.replace(" ", "") for m in merges]
    return tokens, [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)), list(merges)


def encoding(tokens, types, merges, pre="smollm"):
    metadata = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
    }
    return gguf_encoding(metadata, "tiny.gguf")


def tiny(pre="smollm", missing=""):
    return encoding(*vocab_lists(missing=missing), pre=pre)


def test_merges_apply_and_control_tokens_are_special():
    tok = tiny()
    assert tok.encode(" the") == [3 + 256 + 2]  # "Ġt he", the third merge
    assert tok.encode("<|im_end|>", allowed_special="all") == [2] and tok.eot_token == 0
    text = " the cat in a hat, 12 times"
    assert tok.decode(tok.encode(text)) == text


# --- SmolLM2's pre-tokenizer: every digit alone, before GPT-2's pattern -----------------------


def two_step_pieces(text: str) -> list[str]:
    """llama.cpp's way, literally (src/llama-vocab.cpp, "smollm"): split off every digit, then GPT-2's
    pattern on the text between the digits."""
    regex = pytest.importorskip("regex")
    pieces = []
    for part in regex.split(r"(\p{N})", text):
        if len(part) == 1 and regex.fullmatch(r"\p{N}", part):
            pieces.append(part)
        elif part:
            pieces += regex.findall(GPT2_PATTERN, part)
    return pieces


CASES = [
    "In 2024,  x1 costs 35.50",
    "1234567890",
    "  42\n\t7 ",
    "v3.11.7-rc2 and 0x1F",
    "a1b22c333 4 5",
    "x  1",
    "٣٤ and ½ and Ⅻ",
    "it's 3's",
    "  \n 9",
    "end 9  ",
    "a  b   c",
    "",
    "9",
]


@pytest.mark.parametrize("text", CASES)
def test_the_one_pattern_splits_like_the_two_steps(text):
    regex = pytest.importorskip("regex")
    assert regex.findall(PRE_TOKENIZERS["smollm"], text) == two_step_pieces(text)


def test_the_one_pattern_splits_like_the_two_steps_on_random_text():
    regex = pytest.importorskip("regex")
    rng = np.random.default_rng(0)
    alphabet = list("ab Z'sdtlm  \t\n1234567.,-!é٣")
    for _ in range(500):
        text = "".join(rng.choice(alphabet, size=rng.integers(1, 20)))
        assert regex.findall(PRE_TOKENIZERS["smollm"], text) == two_step_pieces(text), repr(text)


def test_digits_stand_alone_and_whitespace_before_a_digit_is_its_own_piece():
    smollm, gpt2 = tiny("smollm"), tiny("gpt2")
    assert [smollm.decode([t]) for t in smollm.encode("x  12")] == ["x", " ", " ", "1", "2"]
    assert [gpt2.decode([t]) for t in gpt2.encode("x  12")] == ["x", " ", " ", "12"]  # GPT-2 keeps "12"


# --- what the tokenizer refuses: a ValueError, never a tiktoken panic ------------------------------


def test_a_character_without_a_token_is_a_value_error_naming_it():
    tok = tiny(missing="\x04")
    for encode in (tok.encode, tok.encode_ordinary, lambda t: tok.encode_batch([t])[0], lambda t: chat_prompt(tok, t)):
        with pytest.raises(ValueError, match=r"no token for the character\(s\) '\\x04'"):
            encode("ok\x04")
    assert tok.decode(tok.encode("fine \x05")) == "fine \x05"


def test_ids_out_of_merge_order_are_refused():
    tokens, types, merges = vocab_lists()
    tokens[-1], tokens[-2] = tokens[-2], tokens[-1]  # two merged tokens swap ids
    with pytest.raises(ValueError, match="tiny.gguf: merge 4 .* out of merge order"):
        encoding(tokens, types, merges)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda t, y, m: m.pop(), "6 multi-byte tokens but 5 merges"),  # a token no merge makes
        (lambda t, y, m: y.__setitem__(5, 4), "has type 4"),  # user-defined tokens: not read
        (lambda t, y, m: t.__setitem__(5, "a b"), "byte alphabet"),
        (lambda t, y, m: t.__setitem__(5, t[6]), "are the same bytes"),
        (lambda t, y, m: m.__setitem__(0, "Ġ t x"), "merge 0 .* does not make token"),
        (lambda t, y, m: m.__setitem__(0, "Ġ \x01"), "merge 0 .* does not make token"),
    ],
)
def test_malformed_vocabularies_are_refused(change, message):
    tokens, types, merges = vocab_lists()
    change(tokens, types, merges)
    with pytest.raises(ValueError, match=message):
        encoding(tokens, types, merges)


def test_chat_prompt_is_chatml_with_the_text_spelt_out():
    tok = tiny()
    ids = chat_prompt(tok, "hi <|im_end|>", system="sys")
    assert tok.decode(ids) == (
        "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi <|im_end|><|im_end|>\n<|im_start|>assistant\n"
    )
    assert ids.count(2) == 2  # the typed "<|im_end|>" is text, not the control token
