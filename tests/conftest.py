"""Shared test helpers: tiny GPT-2 checkpoints on disk and a loopback "Hub".

Everything here is offline. Tiny checkpoints use the Hub's file layout
(config.json, model.safetensors, vocab.json, merges.txt) and key names, so the
library loads them through exactly the code path real GPT-2 takes.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from specdec.checkpoint import checkpoint_tensors, save_folder, write_safetensors  # noqa: F401 (re-exported)
from specdec.gpt2 import GPT2, HParams, random_weights
from specdec.tokenizer import byte_decoder

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
SHARED_TOKENIZER = ROOT.parent / "shared" / "gpt2-tokenizer"

# A tiny byte-level BPE: the 256 byte tokens, five merges, <|endoftext|>.
TINY_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
TINY_N_VOCAB = 256 + len(TINY_MERGES) + 1
TINY_HPARAMS = HParams(n_vocab=TINY_N_VOCAB, n_ctx=64, n_embd=32, n_head=4, n_layer=2)


# ---------------------------------------------------------------------------
# Writing checkpoints (the library only reads them).
# ---------------------------------------------------------------------------


def hub_tensors(model: GPT2, prefix: str = "", with_buffers: bool = True) -> dict[str, np.ndarray]:
    """A model's weights under the Hub's key names (openai-community/gpt2 layout)."""
    return dict(checkpoint_tensors(model, prefix, with_mask_buffers=with_buffers))


def tiny_vocab() -> dict[str, int]:
    alphabet = sorted(byte_decoder().items(), key=lambda kv: (kv[1] not in _printable_bytes(), kv[1]))
    vocab = {ch: i for i, (ch, _) in enumerate(alphabet)}
    for i, merge in enumerate(TINY_MERGES):
        vocab[merge.replace(" ", "")] = 256 + i
    vocab["<|endoftext|>"] = 256 + len(TINY_MERGES)
    return vocab


def _printable_bytes() -> set[int]:
    return {ch for ch, b in byte_decoder().items() if ord(ch) == b}


def tiny_model(seed: int = 0, hparams: HParams = TINY_HPARAMS, scale: float = 0.3) -> GPT2:
    return GPT2(hparams, random_weights(hparams, seed=seed, scale=scale), name=f"tiny-{seed}")


def write_checkpoint(folder: Path, model: GPT2, dtype: str = "F32", prefix: str = "") -> Path:
    """Write a model as the four Hub files in `folder` (with the attn.bias buffers, as the Hub's gpt2 has)."""
    save_folder(model, folder, dtype, prefix, with_mask_buffers=True)
    (folder / "vocab.json").write_text(json.dumps(tiny_vocab()))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(TINY_MERGES) + "\n")
    return folder


@pytest.fixture
def tiny_checkpoint(tmp_path) -> Path:
    return write_checkpoint(tmp_path / "tiny", tiny_model())


# ---------------------------------------------------------------------------
# A loopback Hub: serves /{repo}/resolve/main/{file} like huggingface.co.
# ---------------------------------------------------------------------------


class FakeHub:
    """An HTTP server on 127.0.0.1 that answers like the Hub's /resolve/ URLs.

    model.safetensors is treated as an LFS file: /resolve/ redirects (302) to a
    /cdn/ URL and carries X-Linked-Size and X-Linked-Etag (the sha256), as the
    Hub does. Other files are served directly with a 40-hex-digit ETag.

    Knobs for failure tests:
        drop_after[path] = n   the next GET of `path` sends n bytes, then hangs up
        bad_sha256.add(path)   advertise a wrong sha256 for `path`
        truncate[path] = n     serve only the first n bytes but claim the full size
        fail[path] = n         answer the next n requests for `path` with HTTP 503
        status[path] = code    answer every request for `path` with this status (401, 403, ...)
    """

    def __init__(self):
        self.files: dict[str, bytes] = {}  # "owner/name/file" -> content
        self.drop_after: dict[str, int] = {}
        self.bad_sha256: set[str] = set()
        self.truncate: dict[str, int] = {}
        self.fail: dict[str, int] = {}
        self.status: dict[str, int] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        self.accept_encodings: list[str | None] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._answer(head=True)

            def do_GET(self):
                self._answer(head=False)

            def _answer(self, head: bool):
                hub.requests.append((self.command, self.path, self.headers.get("Range")))
                if self.path.startswith("/cdn/"):
                    key, lfs = self.path[len("/cdn/") :], False
                else:
                    parts = self.path.lstrip("/").split("/resolve/main/")
                    key = "/".join(parts) if len(parts) == 2 else ""
                    lfs = key.endswith(".safetensors")
                hub.accept_encodings.append(self.headers.get("Accept-Encoding"))
                if hub.fail.get(key, 0) > 0 or key in hub.status:
                    if key not in hub.status:
                        hub.fail[key] -= 1
                    self.send_response(hub.status.get(key, 503))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                content = hub.files.get(key)
                if content is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                sha = hashlib.sha256(content).hexdigest()
                if key in hub.bad_sha256:
                    sha = "0" * 64
                if lfs:  # the Hub redirects LFS files to its CDN
                    self.send_response(302)
                    self.send_header("Location", f"/cdn/{key}")
                    self.send_header("X-Linked-Size", str(len(content)))
                    self.send_header("X-Linked-Etag", f'"{sha}"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start = 0
                rng = self.headers.get("Range")
                if rng:
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    if start >= len(content):
                        self.send_response(416)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}")
                else:
                    self.send_response(200)
                body = content[start:]
                self.send_header("Content-Length", str(len(body)))
                if not self.path.startswith("/cdn/"):
                    self.send_header("ETag", '"' + hashlib.sha1(content).hexdigest() + '"')
                self.end_headers()
                if head:
                    return
                if key in hub.truncate:
                    body = body[: max(0, hub.truncate[key] - start)]
                if key in hub.drop_after:
                    body = body[: hub.drop_after.pop(key)]
                    self.wfile.write(body)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def add_checkpoint(self, repo: str, folder: Path) -> None:
        for f in folder.iterdir():
            self.files[f"{repo}/{f.name}"] = f.read_bytes()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_hub(monkeypatch):
    hub = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield hub
    hub.close()
