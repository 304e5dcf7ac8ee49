"""Self-distillation shards with the target's forward pass on a GPU (PyTorch), for a machine that has one.

`python -m specdec.train data` answers the request pool with SmolLM2 on the CPU, at
about 65 reply tokens a second on 2 idle cores. This script runs the same pipeline,
with the same requests, rows, per-row seeds, sampler, top-k and shard format
(specdec.train.distill's make_shard and write_shard, unchanged), and swaps only the
target's forward pass for a PyTorch one on the GPU, in float32 with TF32 off. The
sampling stays specdec's own: each row's logits come back to NumPy, where
`answer` draws from them with the row's own generator. A shard made here is the
shard the CPU run would make up to float32 rounding in the products: where a
sampled row's draw falls on the boundary between two tokens, it can take the
other one and go on differently (the CPU pipeline allows the same: the batch's
makeup changes the rounding there too).

torch is not a dependency of specdec; run this where torch is installed.

    python scripts/distill_torch.py pool --out pool.json [--seed 0]
        # the request pool as this machine builds it (its docstring requests come from this
        # machine's standard library, so another Python may build another pool: carry this file)
    python scripts/distill_torch.py check --device cuda [--data DATA --pool pool.json]
        # torch's logits against specdec's for a ragged batch; with --data, small shards of the
        # run's rows (2 rows of 8 tokens) made by both, compared row by row
    python scripts/distill_torch.py make --data DATA --pool pool.json --first 35 --last 259 \
        --out NEW --workers 14 --seconds 320 --grace 100
        # shards first..last of DATA's run (settings from DATA/manifest.json), in index order,
        # none started after --seconds; each worker is a process with its own copy of the model
    python scripts/distill_torch.py merge --data DATA --new NEW
        # specdec.train.adopt.adopt_shards: the new shards that continue DATA's run, each one
        # checked before any is copied; then `python -m specdec.train data` trusts them like its own
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specdec.checkpoints.load import read_model  # noqa: E402
from specdec import safe_io  # noqa: E402
from specdec.checkpoints.settings import HubSettings  # noqa: E402
from specdec.drafters.heads import model_fingerprint  # noqa: E402
from specdec.model.llama import rope_tables  # noqa: E402
from specdec.train import distill, shards  # noqa: E402
from specdec.train.adopt import MADE, adopt_shards, made_record  # noqa: E402
from specdec.train.requests import RequestPool, build_requests  # noqa: E402


def load_target(name: str = "smollm2-135m"):
    """specdec's own NumPy model of that name, read as load_model reads it (the default models folder, the
    file checked against its pin), untuned: only its weights are used here."""
    return read_model(name, None, False, HubSettings.from_env(), None)


# ---------------------------------------------------------------------------
# The target's forward pass in PyTorch: what `answer` calls (new_cache, forward_batch with last_only).
# ---------------------------------------------------------------------------


class TorchCache:
    """One row's keys and values: a slot of the model's preallocated [n_layer, slots, n_kv, capacity, d] tensors.

    NOTE: the slot goes back when the cache is dropped: `answer` drops a finished row's cache
    (row.cache = None), and CPython frees it, and calls __del__, there and then.
    """

    def __init__(self, owner: TorchLlama):
        if not owner.free:
            raise RuntimeError(f"all {owner.k.shape[1]} cache slots are in use; start with more slots")
        self.owner, self.slot, self.length = owner, owner.free.pop(), 0

    def __del__(self):
        if hasattr(self, "slot"):  # (not when __init__ refused)
            self.owner.free.append(self.slot)


class TorchLlama:
    """specdec's Llama (model/llama.py) computed by torch: the same weights, RoPE tables, norms and grouping."""

    def __init__(self, model, device: str, slots: int, capacity: int):
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.torch, self.device, self.model, self.capacity = torch, device, model, capacity
        self.name, self.tokenizer = model.name, model.tokenizer
        self.hparams, self.weights = model.hparams, model.weights  # (model_fingerprint reads the weights)
        h, w = model.hparams, model.weights

        def t(a):
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(device)

        for block in w.blocks:  # a Llama's matrices have no biases (a Qwen2's q, k, v do: not served here)
            assert all(lin.b is None for lin in (block.attn_qkv, block.attn_output, block.ffn_gate_up, block.ffn_down))
        assert w.lm_head.b is None
        self.wte = t(w.wte)
        self.blocks = [
            (
                t(b.attn_norm),
                t(b.attn_qkv.w_t),
                t(b.attn_output.w_t),
                t(b.ffn_norm),
                t(b.ffn_gate_up.w_t),
                t(b.ffn_down.w_t),
            )
            for b in w.blocks
        ]
        self.norm_f, self.lm_head = t(w.norm_f), t(w.lm_head.w_t)
        cos, sin = rope_tables(np.arange(capacity), h.d_head, h.rope_theta)  # specdec's own tables, [capacity, d]
        self.cos, self.sin = t(cos), t(sin)
        shape = (h.n_layer, slots, h.n_kv_head, capacity, h.d_head)
        self.k = torch.zeros(shape, device=device)
        self.v = torch.zeros(shape, device=device)
        self.free = list(range(slots))

    n_vocab = property(lambda self: self.hparams.n_vocab)
    n_ctx = property(lambda self: self.hparams.n_ctx)
    n_embd = property(lambda self: self.hparams.n_embd)

    def new_cache(self, capacity: int | None = None) -> TorchCache:
        if capacity is not None and capacity > self.capacity:
            raise ValueError(f"a row needs {capacity} positions; start with a capacity of at least that")
        return TorchCache(self)

    def rms(self, x, g):
        return x / self.torch.sqrt(x.square().sum(-1, keepdim=True) / x.shape[-1] + self.hparams.rms_eps) * g

    def forward_batch(self, tokens, caches, last_only=False, n_layer=None, return_hidden=False, parents=None):
        """[1, n_vocab] float32 logits (NumPy) of each row's last new token: prompts one by one, then the
        rows of a single new token together."""
        if not last_only or n_layer is not None or return_hidden or parents is not None:
            raise NotImplementedError("only what `answer` asks for: last_only logits of chains")
        out = [None] * len(tokens)
        single = [b for b, row in enumerate(tokens) if len(row) == 1]
        for b, row in enumerate(tokens):
            if len(row) > 1:
                out[b] = self.run([row], [caches[b]])[0]
        if single:
            for b, logits in zip(single, self.run([tokens[b] for b in single], [caches[b] for b in single])):
                out[b] = logits
        return [logits[None] for logits in out]

    def run(self, rows, caches):
        """Either one row of n tokens, or n_rows rows of one token each: [n_rows, n_vocab] logits of the last."""
        torch, h = self.torch, self.hparams
        n_rows, n_new = len(rows), len(rows[0])
        assert n_rows == 1 or n_new == 1
        ids = torch.as_tensor(np.asarray(rows, np.int64), device=self.device)  # [B, S]
        past = torch.as_tensor([c.length for c in caches], device=self.device)  # [B]
        slots = torch.as_tensor([c.slot for c in caches], device=self.device)  # [B]
        positions = past[:, None] + torch.arange(n_new, device=self.device)[None]  # [B, S]
        n_kv = max(c.length for c in caches) + n_new
        cos, sin = self.cos[positions][:, :, None], self.sin[positions][:, :, None]  # [B, S, 1, d]
        keys = torch.arange(n_kv, device=self.device)
        allowed = keys[None, None, :] <= positions[:, :, None]  # [B, S, n_kv]: the cache and the row so far
        group, d = h.n_head // h.n_kv_head, h.d_head
        x = self.wte[ids]  # [B, S, n_embd]
        for layer, (attn_norm, w_qkv, w_o, ffn_norm, w_gate_up, w_down) in enumerate(self.blocks):
            qkv = self.rms(x, attn_norm) @ w_qkv.T  # [B, S, (n_head + 2 n_kv_head) d]
            q, k, v = qkv.split([h.n_head * d, h.n_kv_head * d, h.n_kv_head * d], dim=-1)
            q = q.reshape(n_rows, n_new, h.n_head, d)
            k = k.reshape(n_rows, n_new, h.n_kv_head, d)
            q = q * cos + torch.cat([-q[..., d // 2 :], q[..., : d // 2]], -1) * sin  # rotate half
            k = k * cos + torch.cat([-k[..., d // 2 :], k[..., : d // 2]], -1) * sin
            v = v.reshape(n_rows, n_new, h.n_kv_head, d)
            # NOTE: keys are cached after rotation, as llama_block caches them. A reused slot keeps its last
            # row's entries past this row's length: the mask (key <= position) never lets them be read.
            if n_rows == 1:  # a prompt: one row at a time (a few per shard), its tokens side by side
                start = caches[0].length
                self.k[layer, caches[0].slot, :, start : start + n_new] = k[0].transpose(0, 1)
                self.v[layer, caches[0].slot, :, start : start + n_new] = v[0].transpose(0, 1)
            else:
                self.k[layer, slots, :, past] = k[:, 0]
                self.v[layer, slots, :, past] = v[:, 0]
            kk = self.k[layer, slots, :, :n_kv].repeat_interleave(group, dim=1)  # [B, n_head, n_kv, d]
            vv = self.v[layer, slots, :, :n_kv].repeat_interleave(group, dim=1)
            scores = (q.transpose(1, 2) * (1.0 / np.sqrt(d))) @ kk.transpose(2, 3)  # [B, n_head, S, n_kv]
            scores = scores.masked_fill(~allowed[:, None], float("-inf"))
            o = (scores.softmax(-1) @ vv).transpose(1, 2).reshape(n_rows, n_new, h.n_embd)
            x = x + o @ w_o.T
            gate, up = (self.rms(x, ffn_norm) @ w_gate_up.T).split(h.n_ff, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ w_down.T
        for c in caches:
            c.length += n_new
        last = self.rms(x[:, -1], self.norm_f)  # [B, n_embd]
        return (last @ self.lm_head.T).cpu().numpy()  # [B, n_vocab]


# ---------------------------------------------------------------------------
# The commands.
# ---------------------------------------------------------------------------


def save_pool(out: Path, seed: int) -> None:
    pool = build_requests(seed)
    safe_io.write_json(out, asdict(pool), indent=None)
    print(f"{out}: {len(pool.requests):,} requests, sha256 {pool.sha256}")


def read_run(data: Path, pool_file: Path) -> tuple[shards.DistillSettings, RequestPool]:
    """The run's settings (DATA/manifest.json) and its request pool, which must be the run's own."""
    manifest = shards.read_manifest(data)
    if manifest is None:
        raise SystemExit(f"{data}: no {shards.MANIFEST}; give the folder of the run to continue")
    settings = shards.DistillSettings(**manifest["settings"])
    pool = RequestPool(**safe_io.read_json(pool_file, max_bytes=1 << 30))
    if pool.sha256 != settings.requests_sha256 or len(pool.requests) != settings.n_requests:
        raise SystemExit(
            f"{pool_file}: not the pool of this run (its sha256 differs); make it with `pool` on the "
            f"machine that began the run"
        )
    return settings, pool


def check(device: str, data: str | None, pool_file: str | None) -> None:
    """torch's logits beside specdec's for the same ragged batch (prompts, then two single-token steps); with a
    run's data and pool, its first four shards at 2 rows of 8 tokens, made by both and compared row by row."""
    from dataclasses import replace

    from specdec.model.tokenizer import chat_prompt

    model = load_target()
    fast = TorchLlama(model, device, slots=4, capacity=1024)
    prompts = [chat_prompt(model.tokenizer, text) for text in ("What is a list?", "Name three colours.", "Hi")]
    np_caches, t_caches = [model.new_cache(256) for _ in prompts], [fast.new_cache(256) for _ in prompts]
    feed = prompts
    worst = 0.0
    for step in range(3):
        ref = model.forward_batch(feed, np_caches, last_only=True)
        got = fast.forward_batch(feed, t_caches, last_only=True)
        for r, g in zip(ref, got):
            worst = max(worst, float(np.abs(r - g).max()))
            assert r.shape == g.shape and int(r.argmax()) == int(g.argmax()), (step, r.argmax(), g.argmax())
        feed = [[int(r.argmax())] for r in ref]
    print(f"max |logit difference| over 3 steps of 3 rows: {worst:.2e}")
    assert worst < 1e-3, worst
    if data is None:
        return
    del np_caches, t_caches  # their slots go back
    settings, pool = read_run(Path(data), Path(pool_file))
    small = replace(settings, shard_rows=2, max_reply=8)
    same = rows = 0
    for index in range(4):
        a = distill.make_shard(model, pool, small, index)
        b = distill.make_shard(fast, pool, small, index)
        replies = zip(*(shards.split_rows(x["reply_ids"], x["reply_offsets"]) for x in (a, b)))
        for r, (ra, rb) in enumerate(replies):
            same, rows = same + int(np.array_equal(ra, rb)), rows + 1
            if not np.array_equal(ra, rb):
                first = int(np.argmax(ra[: min(len(ra), len(rb))] != rb[: min(len(ra), len(rb))]))
                print(
                    f"shard {index} row {r} ({'greedy' if a['greedy'][r] else 'sampled'}): the same until token "
                    f"{first}, then {ra[first]} on the CPU and {rb[first]} here"
                )
    print(f"rows written alike by specdec and torch: {same} of {rows}")


def worker(args, queue, results) -> None:
    import torch

    torch.set_num_threads(1)
    settings, pool = read_run(Path(args.data), Path(args.pool))
    model = load_target(settings.model)
    longest = max(len(distill.chat_prompt(model.tokenizer, r, settings.system)) for r in pool.requests)
    fast = TorchLlama(model, args.device, slots=settings.batch, capacity=longest + settings.max_reply)
    out = Path(args.out)
    while time.time() < args.deadline:
        index = queue.get()
        if index is None:
            break
        t0 = time.perf_counter()
        arrays = distill.make_shard(fast, pool, settings, index)
        entry = shards.write_shard(out, index, arrays)
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        results.put(entry)
        print(
            f"[{time.strftime('%H:%M:%S')}] shard {index}: {entry['reply_tokens']:,} tokens in "
            f"{entry['seconds']:.0f} s",
            flush=True,
        )


def make(args) -> None:
    import multiprocessing as mp
    import queue as queues

    import torch

    out = Path(args.out)
    if (out / MADE).exists():
        raise SystemExit(f"{out / MADE} exists: merge those shards first, then give another --out")
    settings, pool = read_run(Path(args.data), Path(args.pool))  # checked here once, before any worker starts
    if model_fingerprint(load_target(settings.model)) != settings.model_fingerprint:
        raise SystemExit(f"{settings.model}: not the model this run was made with (its fingerprint differs)")
    out.mkdir(parents=True, exist_ok=True)
    args.deadline = time.time() + args.seconds
    ctx = mp.get_context("spawn")
    queue, results = ctx.Queue(), ctx.Queue()
    for index in range(args.first, args.last + 1):
        queue.put(index)
    for _ in range(args.workers):
        queue.put(None)
    procs = [ctx.Process(target=worker, args=(args, queue, results)) for _ in range(args.workers)]
    for p in procs:
        p.start()
    queue.cancel_join_thread()  # shards left unmade at the deadline stay in the queue
    entries = []
    while any(p.is_alive() for p in procs) or not results.empty():
        try:
            entries.append(results.get(timeout=1))
        except queues.Empty:
            pass
        if time.time() > args.deadline + args.grace:  # a shard still being made now is dropped, never half-written
            for p in procs:
                p.terminate()
    device = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    record = made_record(settings, entries, "scripts/distill_torch.py", device, torch.__version__)
    safe_io.write_json(out / MADE, record)
    made = sorted(int(shards.SHARD_FILE.fullmatch(e["file"]).group(1)) for e in entries)
    run = 0
    while args.first + run in made:
        run += 1
    failed = [p.exitcode for p in procs if p.exitcode not in (0, None, -15)]  # -15: terminated at the grace's end
    print(
        f"{len(entries)} shards, {sum(e['reply_tokens'] for e in entries):,} reply tokens, in "
        f"{args.seconds - (args.deadline - time.time()):.0f} s; shards {args.first}..{args.first + run - 1} follow "
        f"one another" + (f"; workers that failed (exit status): {failed}" if failed else "")
    )


def merge(args) -> None:
    try:
        added = adopt_shards(args.data, args.new, args.n_vocab, log=print)
    except (ValueError, OSError) as e:
        raise SystemExit(f"merge: {e}") from None
    print(
        f"added shards {added[0]}..{added[-1]} to {args.data}; `python -m specdec.train data` with the run's "
        f"settings checks them again"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pool")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0, help="the run's --seed")
    p = sub.add_parser("check")
    p.add_argument("--device", default="cuda")
    p.add_argument("--data", default=None)
    p.add_argument("--pool", default=None)
    p = sub.add_parser("make")
    for flag in ("--data", "--pool", "--out"):
        p.add_argument(flag, required=True)
    p.add_argument("--first", type=int, required=True)
    p.add_argument("--last", type=int, required=True)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--seconds", type=float, default=300, help="start no shard after this many seconds")
    p.add_argument("--grace", type=float, default=120, help="then wait this long for the shards being made")
    p.add_argument("--device", default="cuda")
    p = sub.add_parser("merge")
    p.add_argument("--data", required=True)
    p.add_argument("--new", required=True)
    p.add_argument("--n-vocab", type=int, default=49152, help="the model's vocabulary (SmolLM2's by default)")
    args = parser.parse_args()
    if args.command == "pool":
        save_pool(Path(args.out), args.seed)
    elif args.command == "check":
        check(args.device, args.data, args.pool)
    elif args.command == "make":
        make(args)
    else:
        merge(args)


if __name__ == "__main__":
    main()
