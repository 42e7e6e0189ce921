"""One rank of a tests/core/test_distributed.py scenario (a process of its own, gloo backend).

    python tests/core/distributed_worker.py RANK WORLD INIT_FILE SCENARIO OUT_JSON

Writes OUT_JSON: {"ok": bool, "error": type name or None, "message": str, "cases": [...]}.
Every rank builds the same whole-sequence q, k, v, dO from one seed, runs ring attention on its
shard and compares its rows and gradients with a float64 reference of the whole sequence.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import xsync.distributed as xd  # noqa: E402
from xsync.errors import XSyncError  # noqa: E402

DTYPE = torch.float16
# (name, seq_len, hq, hkv, causal, layout, use_lse[, batch, kv seq_len]): odd lengths give ragged
# chunks, lengths below 2 * world give ranks an empty chunk (or no tokens at all); a kv length of
# its own (non-causal) gives each rank other q and kv lengths
CASES = {
    2: [("causal-zigzag", 48, 2, 2, True, "zigzag", False),
        ("causal-gqa-odd", 37, 4, 2, True, "zigzag", True),
        ("noncausal-gqa", 40, 4, 1, False, "zigzag", False),
        ("noncausal-cross-batch2", 21, 2, 1, False, "contiguous", True, 2, 34),
        ("causal-contiguous-odd", 29, 2, 2, True, "contiguous", False),
        ("causal-tiny", 3, 2, 1, True, "zigzag", False)],
    4: [("causal-zigzag-odd", 61, 4, 2, True, "zigzag", True),
        ("noncausal", 50, 2, 2, False, "zigzag", False),
        ("causal-empty-rank", 3, 2, 1, True, "zigzag", True),
        ("noncausal-empty-rank", 3, 2, 2, False, "contiguous", False)],
}


def reference(q, k, v, causal, scale):
    """float64 attention of the whole sequence (top-left causal: the square problem)."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1) @ v, lse


def run_case(rank, world, name, seq, hq, hkv, causal, layout, use_lse, batch=1, seq_k=None):
    gen = torch.Generator().manual_seed(seq * 100 + hq)
    d, scale, seq_k = 64, 0.125, seq_k or seq
    q = torch.randn(batch, hq, seq, d, generator=gen).to(DTYPE)
    k = torch.randn(batch, hkv, seq_k, d, generator=gen).to(DTYPE)
    v = torch.randn(batch, hkv, seq_k, d, generator=gen).to(DTYPE)
    do = torch.randn(batch, hq, seq, d, generator=gen).to(DTYPE)
    dl = torch.randn(batch, hq, seq, generator=gen)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    o_ref, lse_ref = reference(*leaves, causal, scale)
    loss = (o_ref * do.double()).sum() + ((lse_ref * dl.double()).sum() if use_lse else 0)
    grads_ref = torch.autograd.grad(loss, leaves)

    local = [xd.shard(t, rank, world, layout=layout).requires_grad_() for t in (q, k, v)]
    t0 = time.time()
    o, lse = xd.ring_attention(*local, causal=causal, sm_scale=scale, layout=layout)
    t1 = time.time()
    loss = (o.float() * xd.shard(do, rank, world, layout=layout).float()).sum()
    if use_lse:
        loss = loss + (lse * xd.shard(dl, rank, world, dim=2, layout=layout)).sum()
    loss.backward()
    t2 = time.time()
    errs = {"o": (o.double() - xd.shard(o_ref, rank, world, layout=layout)).abs().max().item() if o.numel() else 0.0,
            "lse": (lse.double() - xd.shard(lse_ref, rank, world, layout=layout)).abs().max().item() if lse.numel() else 0.0}
    for n, t, g in zip("qkv", local, grads_ref):
        want = xd.shard(g, rank, world, layout=layout)
        errs["d" + n] = (t.grad.double() - want).abs().max().item() if want.numel() else 0.0
    # fp16 inputs: a single-process fp16 kernel is off the float64 reference by about 1e-3 here
    tol = {"o": 4e-3, "lse": 4e-3, "dq": 1.5e-2, "dk": 1.5e-2, "dv": 1.5e-2}
    bad = {n: e for n, e in errs.items() if not e <= tol[n]}
    return {"name": name, "tokens": local[0].shape[2], "errors": errs, "bad": bad,
            "fwd_s": round(t1 - t0, 3), "bwd_s": round(t2 - t1, 3)}


def scenario(rank, world, name):
    if name == "cases":
        out = [run_case(rank, world, *c) for c in CASES[world]]
        return all(not c["bad"] for c in out), out
    q = torch.randn(1, 2, 8, 64, dtype=DTYPE)
    if name == "single":
        from xsync.kernels.flash_attn import attention

        k, v = torch.randn_like(q), torch.randn_like(q)
        o, lse = xd.ring_attention(q, k, v, causal=True)
        o2, lse2 = attention(q, k, v, causal=True)
        return bool(torch.equal(o, o2)) and bool(torch.allclose(lse, lse2)), []
    if name == "disagree":
        # one group, three refused calls in a row (the group stays usable), then a good call
        out = []
        for sub in ("mismatch", "mismatch-causal", "refuse", "good"):
            try:
                _bad_call(rank, sub)
                out.append({"name": sub, "error": None, "message": ""})
            except XSyncError as exc:
                out.append({"name": sub, "error": type(exc).__name__, "message": str(exc)})
        return True, out
    if name == "torch-cp":
        return _torch_cp(rank, world)
    if name == "die" and rank == 1:
        os._exit(3)
    if name == "hang" and rank == 1:
        time.sleep(8)           # alive, never calling: the others time out after 4 s
        return True, []
    if name == "die-mid" and rank == 1:
        from xsync.distributed import comm

        calls = []
        real = comm.Comm.rotate

        def dying(self, *a, **kw):
            calls.append(1)
            if len(calls) == 2:     # in the second step of the forward ring
                os._exit(3)
            return real(self, *a, **kw)

        comm.Comm.rotate = dying
    o, _ = xd.ring_attention(q, q.clone(), q.clone(), timeout=None if name != "hang" else 4)
    o.sum().item()
    return True, []


def _torch_cp(rank, world):
    """torch's context_parallel with xsync computing the blocks, against ring_attention."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    from xsync.distributed.torch_cp import context_parallel

    gen = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(1, h, 64, 64, generator=gen).to(DTYPE) for h in (4, 2, 2, 4))
    mine = [xd.shard(t, rank, world).requires_grad_() for t in (q, k, v)]
    o_ring, _ = xd.ring_attention(*mine, causal=True, sm_scale=0.125)
    o_ring.backward(xd.shard(do, rank, world))
    o_full, _ = xd.ring_attention(*(t.detach() for t in mine), causal=False, sm_scale=0.125)
    bufs = [t.clone() for t in (q, k, v)]
    with context_parallel(init_device_mesh("cpu", (world,)), buffers=bufs, buffer_seq_dims=[2, 2, 2],
                          no_restore_buffers=set(bufs)):
        theirs = [t.detach().requires_grad_() for t in bufs]
        o = F.scaled_dot_product_attention(*theirs, is_causal=True, scale=0.125, enable_gqa=True)
        o.backward(xd.shard(do, rank, world))
        o_nc = F.scaled_dot_product_attention(*bufs, scale=0.125, enable_gqa=True)     # no mask
    errs = {"o": (o.float() - o_ring.float()).abs().max().item(),
            "o non-causal": (o_nc.float() - o_full.float()).abs().max().item()}
    errs.update({"d" + n: (a.grad.float() - b.grad.float()).abs().max().item() for n, a, b in zip("qkv", theirs, mine)})
    restored = F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention
    return restored and all(e < 5e-3 for e in errs.values()), [{"name": "torch-cp", "errors": errs}]


def _bad_call(rank, sub):
    q = torch.randn(1, 2, 8, 64, dtype=DTYPE)
    if sub == "mismatch":               # rank 1 has another head count
        q = torch.randn(1, 4 if rank == 1 else 2, 8, 64, dtype=DTYPE)
    elif sub == "mismatch-causal":      # lengths that are not the zig-zag split
        q = torch.randn(1, 2, 8 + rank, 64, dtype=DTYPE)
    elif sub == "refuse" and rank == 1:  # a dtype the kernel does not take
        q = q.float()
    xd.ring_attention(q, q.clone(), q.clone(), causal=sub == "mismatch-causal")


def main():
    rank, world, init, name, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    result = {"ok": False, "error": None, "message": "", "cases": []}
    torch.set_num_threads(1)    # W ranks share the machine's cores
    if name != "no-init":
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        dist.barrier()      # every rank's gloo mesh is up before a scenario kills one of them
    try:
        result["ok"], result["cases"] = scenario(rank, world, name) if name != "no-init" else \
            (xd.ring_attention(*(torch.zeros(1, 1, 4, 64, dtype=DTYPE),) * 3) and True, [])
    except XSyncError as exc:
        result["error"], result["message"] = type(exc).__name__, str(exc)
    with open(out, "w") as f:
        json.dump(result, f)
    os._exit(0)    # no destroy_process_group: a peer may be dead


if __name__ == "__main__":
    main()
