"""The tokenizer: tiktoken built from vocab.json + merges.txt."""

import json

import pytest
from conftest import SHARED_TOKENIZER, TINY_MERGES, tiny_vocab

from specdec.model.tokenizer import byte_decoder, load_tokenizer

needs_real_tokenizer = pytest.mark.skipif(
    not (SHARED_TOKENIZER / "vocab.json").is_file(),
    reason="GPT-2's vocab.json/merges.txt are not in ../shared/gpt2-tokenizer",
)


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    return load_tokenizer(SHARED_TOKENIZER / "vocab.json", SHARED_TOKENIZER / "merges.txt")


@needs_real_tokenizer
def test_real_gpt2_tokenizer(gpt2_tokenizer):
    enc = gpt2_tokenizer
    assert enc.n_vocab == 50257
    assert enc.eot_token == 50256
    assert enc.encode("Hello world") == [15496, 995]
    # Pinned ids (GPT-2's published tokenization): contractions, spaces, digits, unicode.
    assert enc.encode(" the") == [262]
    assert enc.encode("I'm") == [40, 1101]
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
    text = "Alan Turing theorized that computers would one day become 42x faster!\n\n  ünïcødé 🤖"
    assert enc.decode(enc.encode(text)) == text


def test_byte_alphabet_is_a_bijection():
    decoder = byte_decoder()
    assert sorted(decoder.values()) == list(range(256))
    assert decoder["Ġ"] == 32 and decoder["!"] == 33 and decoder["Ā"] == 0


def test_tiny_tokenizer_applies_merges(tmp_path):
    (tmp_path / "vocab.json").write_text(json.dumps(tiny_vocab()))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n" + "\n".join(TINY_MERGES) + "\n")
    enc = load_tokenizer(tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert enc.encode(" the") == [258]
    assert enc.encode(" t") == [256]
    assert enc.decode(enc.encode(" the cat in a hat")) == " the cat in a hat"


def test_ids_out_of_merge_order_are_rejected(tmp_path):
    vocab = tiny_vocab()
    vocab["Ġt"], vocab["he"] = vocab["he"], vocab["Ġt"]  # swap two merged tokens' ids
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("\n".join(TINY_MERGES))
    with pytest.raises(ValueError, match="does not create token id 256"):
        load_tokenizer(tmp_path / "vocab.json", tmp_path / "merges.txt")


# --- hostile tokenizer files: a ValueError naming the file, never a tiktoken panic ---------------


def write_tokenizer(folder, vocab, merges=TINY_MERGES):
    (folder / "vocab.json").write_text(vocab if isinstance(vocab, str) else json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return folder / "vocab.json", folder / "merges.txt"


def _vocab_with(**changes):
    vocab = tiny_vocab()
    for token, token_id in changes.items():
        if token_id is None:
            del vocab[token]
        else:
            vocab[token] = token_id
    return vocab


@pytest.mark.parametrize(
    "vocab,message",
    [
        ("[1, 2, 3]", "expected a JSON object.*got a list"),
        ('"a string"', "expected a JSON object.*got a str"),
        (_vocab_with(A=0), "id 0 is used twice"),  # "A" now shares id 0 with another byte token
        (_vocab_with(A=None), r"id \d+ is missing"),  # byte 65 has no token (and its id leaves a hole)
        (_vocab_with(A="32"), "has id '32'"),
        (_vocab_with(A=True), "has id True"),
        (_vocab_with(**{"<|endoftext|>": 0}), "used twice"),
    ],
)
def test_a_broken_vocabulary_is_a_value_error_naming_the_file(tmp_path, vocab, message):
    vocab_path, merges_path = write_tokenizer(tmp_path, vocab)
    with pytest.raises(ValueError, match=message) as e:
        load_tokenizer(vocab_path, merges_path)
    assert str(vocab_path) in str(e.value)


def test_a_missing_byte_token_is_caught_before_tiktoken(tmp_path):
    """Byte 65's token renamed to a two-byte string: ids stay dense, but tiktoken would panic."""
    vocab = tiny_vocab()
    vocab["AA"] = vocab.pop("A")
    vocab_path, merges_path = write_tokenizer(tmp_path, vocab)
    with pytest.raises(ValueError, match="the token for byte 65 is missing"):
        load_tokenizer(vocab_path, merges_path)


@pytest.mark.parametrize("merge,message", [("Ġ t x", "is not two tokens"), ("Ġ zz", "is not two tokens")])
def test_malformed_merges_are_refused(tmp_path, merge, message):
    vocab_path, merges_path = write_tokenizer(tmp_path, tiny_vocab(), [merge, *TINY_MERGES[1:]])
    with pytest.raises(ValueError, match=f"merges.txt: merge 0 .*{message}"):
        load_tokenizer(vocab_path, merges_path)
