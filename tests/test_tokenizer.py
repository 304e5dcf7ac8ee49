"""The tokenizer: tiktoken built from vocab.json + merges.txt."""

import json

import pytest

from specdec.tokenizer import byte_decoder, load_tokenizer

from conftest import SHARED_TOKENIZER, TINY_MERGES, tiny_vocab

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
