"""Hugging Face Llama folders (specdec/checkpoints/hf_llama.py) through the loopback Hub: a tiny random Llama
written as transformers saves one downloads and gives the original's logits; the SmolLM2 GGUF written out as
a Hugging Face folder gives the GGUF model's logits and transformers' (the committed fixture); hostile configs,
weights and tokenizers are one clear CheckpointError; SmolLM2-shaped models speculate together."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from specdec import autoregressive_sample, speculative_sample
from specdec.checkpoints.download import DownloadError
from specdec.checkpoints.folders import checkpoint_files
from specdec.checkpoints.hf_llama import hf_tensors, save_hf_llama
from specdec.checkpoints.hub import resolve_model
from specdec.checkpoints.load import load_folder, load_model
from specdec.checkpoints.pins import WHEELS
from specdec.checkpoints.registry import hub_repos
from specdec.checkpoints.safetensors import CheckpointError, read_safetensors, write_safetensors
from specdec.model.linear import Linear
from specdec.model.llama import Llama, LlamaBlock, LlamaHParams, LlamaWeights, random_llama
from specdec.model.tokenizer import byte_decoder, chat_prompt

REPO = "tiny-org/tiny-llama"
REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "smollm2_reference.npz"  # transformers' logits
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "1 2"]
SMOLLM_PRE = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ],
}
TEXTS = [" the cat in a hat, 12 times", "In 2024,  x1 costs 35.50\n", "héllo wörld <|im_end|>"]


def tokenizer_json(tokens: list[str], specials: dict[str, int], merges: list[str], pre=SMOLLM_PRE) -> dict:
    """A tokenizer.json as the `tokenizers` library writes SmolLM2's: the vocabulary (specials included, as
    the Hub's file has them), merges, added_tokens and the pre-tokenizer."""
    return copy.deepcopy(
        {  # a copy: tests change it in place
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "normalizer": None,
            "pre_tokenizer": pre,
            "added_tokens": [
                {
                    "id": i,
                    "content": t,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": True,
                }
                for t, i in specials.items()
            ],
            "post_processor": {"type": "ByteLevel"},
            "decoder": {"type": "ByteLevel"},
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": None,
                "continuing_subword_prefix": None,
                "end_of_word_suffix": None,
                "fuse_unk": False,
                "byte_fallback": False,
                "vocab": {t: i for i, t in enumerate(tokens)},
                "merges": merges,
            },
        }
    )


def tiny_tokens() -> list[str]:
    """3 specials, the 256 bytes in GPT-2's alphabet, then one token per merge, in merge order (SmolLM2's plan)."""
    alphabet = [ch for ch, _ in sorted(byte_decoder().items(), key=lambda kv: kv[1])]
    return SPECIALS + alphabet + [m.replace(" ", "") for m in MERGES]


N_VOCAB = len(tiny_tokens())


def tiny_llama(seed=0, **shape) -> Llama:
    """A tiny random Llama with grouped-query attention; `shape` overrides LlamaHParams fields."""
    h = {
        "n_vocab": N_VOCAB,
        "n_ctx": 64,
        "n_embd": 32,
        "n_head": 4,
        "n_kv_head": 2,
        "n_layer": 2,
        "n_ff": 48,
        "rope_theta": 100000.0,
    }
    return random_llama(LlamaHParams(**{**h, **shape}), seed=seed, scale=0.3)


def write_hf_folder(folder: Path, model: Llama, dtype="F32", tokenizer: dict | None = None) -> Path:
    save_hf_llama(model, folder, dtype)
    tokens = tiny_tokens()
    spec = tokenizer or tokenizer_json(tokens, {t: i for i, t in enumerate(SPECIALS)}, MERGES)
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder


def bf16(model: Llama) -> Llama:
    """The model with every weight rounded as write_safetensors writes BF16 (the top 16 bits kept)."""

    def cut(a):
        return (np.ascontiguousarray(a, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)

    def cast(v):
        return Linear(cut(v.w_t), None) if isinstance(v, Linear) else cut(v)

    w = model.weights
    blocks = [LlamaBlock(**{k: cast(v) for k, v in vars(b).items()}) for b in w.blocks]
    return Llama(model.hparams, LlamaWeights(cut(w.wte), blocks, cut(w.norm_f)), name="bf16")


def one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text and len(text) < 400, text
    return text


# --- half precision in safetensors reads exactly --------------------------------------------------------


def test_bf16_and_f16_tensors_read_to_the_exact_float32_values(tmp_path):
    values = np.array([1.0, -2.5, 3.140625, 1e-3, -65504.0, 0.0, 2.0**-20], np.float32)
    bits = (values.view(np.uint32) >> 16).astype("<u2")  # BF16: the top half of each float32
    header = {
        "b": {"dtype": "BF16", "shape": [7], "data_offsets": [0, 14]},
        "h": {"dtype": "F16", "shape": [7], "data_offsets": [14, 28]},
    }
    blob = json.dumps(header).encode()
    path = tmp_path / "half.safetensors"
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + bits.tobytes() + values.astype("<f2").tobytes())
    got = read_safetensors(path)
    assert got["b"].dtype == got["h"].dtype == np.float32
    expected_bf16 = (bits.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(got["b"], expected_bf16)
    assert got["b"][2] == np.float32(3.140625) and got["b"][3] != np.float32(1e-3)  # 1e-3 loses bits in BF16
    np.testing.assert_array_equal(got["h"], values.astype(np.float16).astype(np.float32))


# --- names ------------------------------------------------------------------------------------------


def test_short_names_are_the_instruct_models_and_smollm2_135m_stays_the_wheel(tmp_path):
    assert resolve_model("smollm2-360m", tmp_path) == (
        tmp_path / "HuggingFaceTB--SmolLM2-360M-Instruct",
        "HuggingFaceTB/SmolLM2-360M-Instruct",
    )
    assert resolve_model("smollm2-1.7b", tmp_path)[1] == "HuggingFaceTB/SmolLM2-1.7B-Instruct"
    assert resolve_model("smollm2-135m-bf16", tmp_path)[1] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_model("smollm2-360m-base", tmp_path)[1] == "HuggingFaceTB/SmolLM2-360M"
    # A repo id shares the short name's folder: downloaded once whichever way it is named.
    assert resolve_model("HuggingFaceTB/SmolLM2-360M-Instruct", tmp_path) == resolve_model("smollm2-360m", tmp_path)
    assert "smollm2-135m" in WHEELS and "smollm2-135m" not in hub_repos()


# --- a tiny Llama through the loopback Hub ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["F32", "BF16"])
def test_a_llama_repo_downloads_its_own_files_and_gives_the_original_logits(fake_hub, tmp_path, dtype):
    model = tiny_llama(seed=1)
    fake_hub.add_checkpoint(REPO, write_hf_folder(tmp_path / "src", model, dtype))
    loaded = load_model(REPO, tmp_path / "models", progress=False)
    assert isinstance(loaded, Llama) and loaded.hparams == model.hparams
    reference = model if dtype == "F32" else bf16(model)
    tokens = [5, 70, 261, 3, 99, 264, 0]
    np.testing.assert_array_equal(loaded(tokens), reference(tokens))  # the same float32 weights: the same logits
    assert loaded(tokens).dtype == np.float32 and loaded.weights.lm_head.w_t is loaded.weights.wte  # tied
    fetched = sorted({Path(p).name for m, p, _ in fake_hub.requests if m == "GET"})
    assert fetched == ["config.json", "model.safetensors", "tokenizer.json"]  # no vocab.json / merges.txt
    assert checkpoint_files(tmp_path / "models" / "tiny-org--tiny-llama")[-1] == "tokenizer.json"
    for text in TEXTS:
        ids = loaded.tokenizer.encode(text, allowed_special="all")
        assert loaded.tokenizer.decode(ids) == text
    # Byte b is id 3 + b; " the" is the third merge; SmolLM2's digits stand alone, the space before them too.
    assert loaded.tokenizer.encode(" the 12") == [3 + 256 + 2, 3 + ord(" "), 3 + ord("1"), 3 + ord("2")]
    # Once downloaded, nothing more is asked of the network.
    n = len(fake_hub.requests)
    load_model(REPO, tmp_path / "models", progress=False)
    assert len(fake_hub.requests) == n


def test_an_untied_head_is_loaded_as_lm_head(tmp_path):
    model = tiny_llama(seed=2)
    head = Linear(np.random.default_rng(0).standard_normal((N_VOCAB, 32), dtype=np.float32), None)
    untied = Llama(model.hparams, LlamaWeights(model.weights.wte, model.weights.blocks, model.weights.norm_f, head))
    loaded = load_folder(write_hf_folder(tmp_path / "m", untied))
    assert json.loads((tmp_path / "m" / "config.json").read_text())["tie_word_embeddings"] is False
    np.testing.assert_array_equal(loaded([1, 2, 3]), untied([1, 2, 3]))
    with pytest.raises(AssertionError):  # the test can fail: the tied model's logits differ
        np.testing.assert_array_equal(loaded([1, 2, 3]), model([1, 2, 3]))


def test_a_sharded_repo_downloads_the_index_and_every_shard(fake_hub, tmp_path):
    model = tiny_llama(seed=3)
    src = write_hf_folder(tmp_path / "src", model)
    tensors = dict(hf_tensors(model))
    names = list(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:7], "model-00002-of-00002.safetensors": names[7:]}
    for shard, keys in shards.items():
        write_safetensors(src / shard, {k: tensors[k] for k in keys})
    (src / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}})
    )
    (src / "model.safetensors").unlink()
    fake_hub.add_checkpoint(REPO, src)
    loaded = load_model(REPO, tmp_path / "models", progress=False)
    np.testing.assert_array_equal(loaded([4, 5, 6]), model([4, 5, 6]))
    heads = [p for m, p, _ in fake_hub.requests if m == "HEAD"]
    assert any(p.endswith("/model.safetensors") for p in heads)  # asked first, 404: then the index
    assert sorted({Path(p).name for m, p, _ in fake_hub.requests if m == "GET"}) == sorted(
        ["config.json", "model.safetensors.index.json", *shards, "tokenizer.json"]
    )


# --- hostile or unsupported files: one clear line -----------------------------------------------------------


CONFIG_CHANGES = [
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"head_dim": 16}, "head_dim"),
    ({"num_key_value_heads": 3}, "not a usable Llama config"),
    ({"vocab_size": "265"}, "vocab_size must be a whole number"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be a whole number"),
    ({"hidden_size": 2**40}, "hidden_size must be a whole number"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps must be a number"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
    ({"tie_word_embeddings": False}, "'lm_head.weight' is missing"),
    ({"num_hidden_layers": 3}, "'model.layers.2.input_layernorm.weight' is missing"),
    ({"num_hidden_layers": 1}, "unexpected tensor 'model.layers.1."),
    ({"intermediate_size": 64}, "has shape (48, 32), config.json implies (64, 32)"),
    ({"vocab_size": 300}, "has shape (265, 32), config.json implies (300, 32)"),
    ({"model_type": "mistral", "architectures": ["MistralForCausalLM"]}, "model_type 'mistral'"),
]


@pytest.mark.parametrize("change,message", CONFIG_CHANGES, ids=[m for _, m in CONFIG_CHANGES])
def test_configs_llama_py_would_run_wrongly_are_refused_by_name(tmp_path, change, message):
    folder = write_hf_folder(tmp_path / "m", tiny_llama())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError) as e:
        load_folder(folder)
    assert message in one_line(e)


def test_hostile_weights_are_refused_naming_the_file_and_tensor(tmp_path):
    model = tiny_llama()
    folder = write_hf_folder(tmp_path / "m", model)
    weights = folder / "model.safetensors"
    tensors = dict(hf_tensors(model))
    tensors["model.layers.1.mlp.up_proj.weight"] = np.full((48, 32), np.nan, np.float32)
    write_safetensors(weights, tensors)
    with pytest.raises(CheckpointError) as e:
        load_folder(folder)
    assert f"{weights}: tensor 'model.layers.1.mlp.up_proj.weight' holds NaN" in one_line(e)
    save_hf_llama(model, folder)
    weights.write_bytes(weights.read_bytes()[:-10])  # truncated
    with pytest.raises(CheckpointError) as e:
        load_folder(folder)
    assert str(weights) in one_line(e) and "truncated" in one_line(e)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing model.safetensors; a Llama model folder needs"):
        load_folder(folder)


def test_a_hostile_index_is_refused(tmp_path):
    model = tiny_llama()
    folder = write_hf_folder(tmp_path / "m", model)
    (folder / "model.safetensors").rename(folder / "model-1.safetensors")
    index = {"weight_map": {k: "model-1.safetensors" for k, _ in hf_tensors(model)}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    np.testing.assert_array_equal(load_folder(folder)([1, 2]), model([1, 2]))  # the honest index loads
    for weight_map, message in [
        ({**index["weight_map"], "model.norm.weight": "../../etc/x.safetensors"}, "not a plain *.safetensors"),
        ({**index["weight_map"], "model.norm.weight": "model-2.safetensors"}, "model-2.safetensors"),
        ({k: v for k, v in index["weight_map"].items() if k != "model.norm.weight"}, "places it in None"),
        ({}, "no weight_map"),
    ]:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        with pytest.raises(CheckpointError) as e:
            load_folder(folder)
        assert message in one_line(e), message


TOKENIZER_CHANGES = [
    (lambda t: t.update(normalizer={"type": "NFC"}), "normalizer 'NFC'"),
    (lambda t: t["model"].update(byte_fallback=True), "model.byte_fallback is True"),
    (lambda t: t["model"].update(type="WordPiece"), "tokenizer model 'WordPiece'"),
    (lambda t: t.update(pre_tokenizer={"type": "Metaspace"}), "pre-tokenizer 'Metaspace'"),
    (lambda t: t["pre_tokenizer"]["pretokenizers"].reverse(), "pre-tokenizer 'Sequence[ByteLevel, Digits]'"),
    (lambda t: t["added_tokens"][1].update(special=False), "added token '<|im_start|>' is not special"),
    (lambda t: t["model"]["merges"].reverse(), "out of merge order"),
    (lambda t: t["model"]["vocab"].pop("Ġa"), "tokens but 6 merges"),
    (lambda t: t["model"]["vocab"].update({"<|endoftext|>": 7}), "'<|endoftext|>' is id 7 in model.vocab but 0"),
    (lambda t: t["model"]["vocab"].update({"Ġt": 0}), "id 0 is both a special token and an ordinary one"),
]


@pytest.mark.parametrize("change,message", TOKENIZER_CHANGES, ids=[m for _, m in TOKENIZER_CHANGES])
def test_tokenizers_specdec_would_read_wrongly_are_refused_by_name(tmp_path, change, message):
    spec = tokenizer_json(tiny_tokens(), {t: i for i, t in enumerate(SPECIALS)}, MERGES)
    change(spec)
    folder = write_hf_folder(tmp_path / "m", tiny_llama(), tokenizer=spec)
    with pytest.raises(CheckpointError) as e:
        load_folder(folder)
    assert message in one_line(e) and "tokenizer.json" in one_line(e)


def test_merges_as_pairs_and_gpt2s_byte_level_are_read(tmp_path):
    spec = tokenizer_json(
        tiny_tokens(),
        {t: i for i, t in enumerate(SPECIALS)},
        [m.split(" ") for m in MERGES],
        pre={"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
    )
    tok = load_folder(write_hf_folder(tmp_path / "m", tiny_llama(), tokenizer=spec)).tokenizer
    # GPT-2's pattern keeps " 12" one piece, where BPE makes " " and the merge "12" (SmolLM2's: " ", "1", "2").
    assert tok.encode("x 12") == [3 + ord("x"), 3 + ord(" "), 3 + 256 + 5]


def test_a_missing_repo_says_so(fake_hub, tmp_path):
    with pytest.raises(DownloadError, match="does not exist"):
        load_model("tiny-org/absent", tmp_path / "models", progress=False)


# --- SmolLM2's real weights, from its GGUF written out as a Hugging Face folder ----------------------------


def smollm2_tokenizer_json(gguf_path) -> dict:
    """SmolLM2's tokenizer.json, rebuilt from the GGUF's tokens, token types and merges."""
    from specdec.checkpoints.gguf_file import GGUFFile

    meta = GGUFFile(gguf_path).metadata
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    specials = {t: i for i, (t, kind) in enumerate(zip(tokens, types)) if kind == 3}
    return tokenizer_json(tokens, specials, meta["tokenizer.ggml.merges"])


@pytest.mark.slow
def test_smollm2_as_a_hugging_face_folder_equals_the_gguf_and_transformers(smollm2_gguf, tmp_path):
    """The strong check: the GGUF's dequantized weights, written under Hugging Face's names and layout (the
    Q/K rows put back by gguf.unpermute_rows), load through hf_llama with NO permutation, and give the GGUF
    model's logits exactly and transformers' (tests/fixtures/smollm2_reference.npz) within 1e-3."""
    from specdec.checkpoints.gguf import load_gguf, unpermute_rows

    gguf = load_gguf(smollm2_gguf, name="smollm2-135m")
    folder = tmp_path / "SmolLM2-135M-Instruct"
    save_hf_llama(gguf, folder, "F32")
    (folder / "tokenizer.json").write_text(json.dumps(smollm2_tokenizer_json(smollm2_gguf)))
    config = json.loads((folder / "config.json").read_text())
    assert (
        config["num_hidden_layers"],
        config["hidden_size"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["intermediate_size"],
        config["vocab_size"],
        config["rope_theta"],
    ) == (30, 576, 9, 3, 1536, 49152, 100000.0)  # the model card's
    hf = load_folder(folder)
    with np.load(REFERENCE, allow_pickle=False) as f:  # tests/fixtures/make_smollm2_reference.py made it
        ref = {k: f[k] for k in f.files}
    ids = ref["prompt_0"]
    logits = hf(ids)
    np.testing.assert_array_equal(logits, gguf(ids))
    np.testing.assert_allclose(logits[:, ref["cols"]], ref["logits_0_cols"], atol=1e-3, rtol=0)
    np.testing.assert_allclose(logits[-1], ref["logits_0_last"], atol=1e-3, rtol=0)
    for text in [*TEXTS, "The capital of France is", "x  12 345 ½ \t\n", "def f(n):\n    return n * 2"]:
        assert hf.tokenizer.encode(text, allowed_special="all") == gguf.tokenizer.encode(text, allowed_special="all")
    assert chat_prompt(hf.tokenizer, "Hi") == chat_prompt(gguf.tokenizer, "Hi")
    # The test can fail: Q's rows in another order (the permutation applied once more) give other logits.
    q = hf.weights.blocks[0].attn_q
    hf.weights.blocks[0].attn_q = Linear(unpermute_rows(q.w_t, 9), None)
    assert np.abs(hf(ids) - gguf(ids)).max() > 1e-2


# --- the same-family pair: a 135M-shaped draft for a 360M-shaped target, by their short names ---------------


def test_a_135m_shaped_draft_speculates_for_a_360m_shaped_target_by_their_names(fake_hub, tmp_path, monkeypatch):
    """SmolLM2-135M's and -360M's real widths, heads and KV heads (2 layers each instead of 30 and 32, and a tiny
    vocabulary), served as the Hub's repos and loaded by the short names."""
    from specdec.model.fast import tuning

    # Timing these widths' products for a fresh models folder took 22 s of the test's 27; which threads multiply
    # is tested in tests/model/test_tuning.py, and changes no value here.
    monkeypatch.setattr(tuning, "tune", lambda *args, **kwargs: None)
    draft = tiny_llama(seed=4, n_ctx=128, n_embd=576, n_head=9, n_kv_head=3, n_ff=1536)
    target = tiny_llama(seed=5, n_ctx=128, n_embd=960, n_head=15, n_kv_head=5, n_ff=2560)
    fake_hub.add_checkpoint(hub_repos()["smollm2-135m-bf16"], write_hf_folder(tmp_path / "d", draft, "BF16"))
    fake_hub.add_checkpoint(hub_repos()["smollm2-360m"], write_hf_folder(tmp_path / "t", target, "BF16"))
    d = load_model("smollm2-135m-bf16", tmp_path / "models", progress=False)
    t = load_model("smollm2-360m", tmp_path / "models", progress=False)
    assert (d.n_embd, d.hparams.n_kv_head, t.n_embd, t.hparams.n_kv_head) == (576, 3, 960, 5)
    prompt = t.tokenizer.encode(" the cat in a hat")
    plain = autoregressive_sample(t, prompt, 24).tokens
    out = speculative_sample(t, d, prompt, 24, K=4)
    assert out.tokens == plain
    assert speculative_sample(t, d, prompt, 24, K=3, tree=6).tokens == plain
    sampled = speculative_sample(t, d, prompt, 24, K=4, temperature=1.0, seed=0)
    assert len(sampled.tokens) == 24 and sum(sampled.accepted_per_round) <= sum(sampled.k_per_round)


def test_the_cli_runs_the_smollm2_names_and_says_a_download_only_once(fake_hub, tmp_path, capsys):
    from specdec.cli import main as cli

    fake_hub.add_checkpoint(hub_repos()["smollm2-1.7b"], write_hf_folder(tmp_path / "t", tiny_llama(seed=6, n_ctx=128)))
    fake_hub.add_checkpoint(hub_repos()["smollm2-360m"], write_hf_folder(tmp_path / "d", tiny_llama(seed=7, n_ctx=128)))
    argv = [
        "--target_model_size",
        "smollm2-1.7b",
        "--draft",
        "smollm2-360m",
        "--models_dir",
        str(tmp_path / "models"),
        "--n_tokens_to_generate",
        "6",
        "--chat",
        "--prompt",
        "Hi",
        "--no_warmup",
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "(downloaded smollm2-1.7b in" in out and "(downloaded smollm2-360m in" in out
    assert "target: smollm2-1.7b (2 layers, 32 wide)" in out
    assert cli.main(argv) == 0
    assert "(downloaded" not in capsys.readouterr().out  # complete folders: nothing fetched, nothing said


# The config.json fields SmolLM2's Hub repos carry (transformers 4.42's LlamaConfig plus nanotron's extras), with
# each size's numbers from the model cards: the loader must read them, refusing nothing.
SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "initializer_range": 0.0417,
    "is_llama_config": True,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "pad_token_id": 2,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_interleaved": False,
    "rope_scaling": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3",
    "use_cache": True,
    "vocab_size": 49152,
}
SIZES = {  # layers, hidden, heads, kv heads, intermediate, rope_theta
    "135M": (30, 576, 9, 3, 1536, 100000),
    "360M": (32, 960, 15, 5, 2560, 100000),
    "1.7B": (24, 2048, 32, 32, 8192, 130000),
}


@pytest.mark.parametrize("size", SIZES)
def test_smollm2_configs_as_the_hub_has_them_are_read(tmp_path, size):
    from specdec.checkpoints.hf_llama import expected_shapes, read_llama_config

    n_layer, n_embd, n_head, n_kv_head, n_ff, theta = SIZES[size]
    config = {
        **SMOLLM2_CONFIG,
        "num_hidden_layers": n_layer,
        "hidden_size": n_embd,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv_head,
        "intermediate_size": n_ff,
        "rope_theta": theta,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    h, tied = read_llama_config(tmp_path / "config.json")
    assert tied and (h.n_layer, h.n_embd, h.n_head, h.n_kv_head, h.n_ff, h.rope_theta) == SIZES[size]
    assert (h.n_vocab, h.n_ctx, h.rms_eps, h.d_head) == (49152, 8192, 1e-5, 64)
    n_params = sum(int(np.prod(s)) for s in expected_shapes(h, tied).values())
    billions = {"135M": 0.1348, "360M": 0.3618, "1.7B": 1.7115}[size]  # parameters, tied head counted once
    assert abs(n_params / 1e9 - billions) < 0.0005, n_params


def test_a_qwen2_is_refused_before_anything_is_written(tmp_path):
    """A Llama folder has no place for Qwen2's q, k and v biases (and load_hf_llama reads none): saving one
    is refused in one line, and no folder is left behind."""
    qwen2 = load_model(str(Path(__file__).resolve().parents[1] / "fixtures" / "tiny-qwen2.gguf"))
    folder = tmp_path / "qwen2-as-llama"
    with pytest.raises(ValueError, match=r"projections have biases \(a Qwen2\).*keep this model in its GGUF") as e:
        save_hf_llama(qwen2, folder)
    assert "\n" not in str(e.value)
    assert not folder.exists()
