"""Context-parallel (ring) attention over N ranks: xsync.distributed.ring_attention with xsync's
attention as the block kernel, and torch's context_parallel over SDPA beside it where it runs.

Per rank: forward and forward+backward time, tokens/s and TFLOP/s (causal FLOPs counted over the
blocks the mask leaves: 4*B*Hq*D per visible (query, key) pair forward, 2.5x that backward, the
flash-attention convention), and the overlap achieved: the same ring's compute alone (every
step's blocks, no exchange) and its exchanges alone (W-1 rotations of the K/V buffer) give

    overlap = (compute + exchange - ring) / min(compute, exchange)      (1: fully hidden, 0: serial)

    python benchmarks/context_parallel.py --world 8 --seq 131072 --heads 32 --kv-heads 8 --dim 128
    torchrun --nproc-per-node 8 benchmarks/context_parallel.py --seq 131072 ...   (same flags)
    python benchmarks/context_parallel.py --world 2 --seq 256 --heads 2 --dim 64 --iters 3   (CPU, gloo)

Spawns --world processes itself unless started by torchrun (RANK/WORLD_SIZE set). Backend: nccl
where CUDA has a GPU per rank, else gloo (CPUs, the CPU emulator as the block kernel; tiny sizes
only). Rank 0 prints a table and writes context_parallel.json to --out.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2, help="ranks to spawn (ignored under torchrun)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=256, help="tokens of the whole sequence")
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--kv-heads", type=int, default=None, help="GQA: K/V heads (default: --heads)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--no-causal", action="store_true")
    p.add_argument("--layout", choices=("zigzag", "contiguous"), default="zigzag")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--no-torch", action="store_true", help="skip torch's context_parallel")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    return p.parse_args(argv)


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, device, iters, warmup):
    """Median seconds of fn() over iters, after warmup calls; ranks start each call together."""
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        _sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        _sync(device)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _visible_pairs(meta, rank, causal):
    pairs = 0
    for step in range(meta.world):
        for b in meta.blocks(rank, (rank - step) % meta.world, causal):
            n, m = b.q_hi - b.q_lo, b.k_hi - b.k_lo
            pairs += n * (n + 1) // 2 if b.causal else n * m
    return pairs


def _compute_only(q, meta, rank, causal, scale, kvs):
    """Every step's block kernels of the forward ring, on stand-in K/V of each source's shape."""
    from xsync.kernels.flash_attn import attention

    for step in range(meta.world):
        src = (rank - step) % meta.world
        k, v = kvs[src]
        for b in meta.blocks(rank, src, causal):
            attention(q[:, :, b.q_lo:b.q_hi], k[:, :, b.k_lo:b.k_hi], v[:, :, b.k_lo:b.k_hi],
                      causal=b.causal, sm_scale=scale)


def _exchange_only(comm, meta, rank, kv):
    for step in range(meta.world - 1):
        src = (rank - step) % meta.world
        kv = comm.rotate(kv, meta.kv_numel((src - 1) % meta.world), "benchmark exchange", 7).wait()


def _torch_cp(args, q, k, v, device, dist, rank, world, xsync_blocks=False):
    """torch's context_parallel over SDPA on the whole-sequence tensors (its own head-tail
    split), or with xsync computing its blocks (xsync.distributed.torch_cp);
    (fwd seconds, None) or (None, why it does not run here)."""
    import torch
    import torch.nn.functional as F

    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel

        if xsync_blocks:
            from xsync.distributed.torch_cp import context_parallel
        mesh = init_device_mesh(device.type, (world,))
        bufs = [t.clone() for t in (q, k, v)]
        with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2]):
            def fwd():
                F.scaled_dot_product_attention(*bufs, is_causal=not args.no_causal,
                                               enable_gqa=bufs[1].shape[1] != bufs[0].shape[1])
            return _time(fwd, device, args.iters, args.warmup), None
    except Exception as exc:    # report why, keep the xsync numbers
        return None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"


def _rank_main(rank, world, args, init):
    import torch
    import torch.distributed as dist

    from xsync.distributed import comm as C, ring_attention, shard

    use_cuda = args.backend == "nccl" or (args.backend == "auto" and torch.cuda.device_count() >= world)
    backend = "nccl" if use_cuda else "gloo"
    local = int(os.environ.get("LOCAL_RANK", rank))      # torchrun: the rank on this host
    device = torch.device("cuda", local % max(1, torch.cuda.device_count())) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    hkv = args.kv_heads or args.heads
    causal = not args.no_causal
    gen = torch.Generator().manual_seed(0)
    whole = [torch.randn(args.batch, h, args.seq, args.dim, generator=gen).to(dtype)
             for h in (args.heads, hkv, hkv)]
    q, k, v = (shard(t, rank, world, layout=args.layout).to(device) for t in whole)
    scale = 1.0 / math.sqrt(args.dim)
    comm = C.Comm()
    meta = C.agree(comm, q, k, v, causal, scale, args.layout, None)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

    def fwd():
        ring_attention(q, k, v, causal=causal, sm_scale=scale, layout=args.layout)

    def fwd_bwd():
        o, _ = ring_attention(qg, kg, vg, causal=causal, sm_scale=scale, layout=args.layout)
        o.backward(torch.ones_like(o))

    kvs = {r: (torch.randn(args.batch, hkv, meta.k_len[r], args.dim, device=device).to(dtype),) * 2
           for r in range(world)}
    kv = torch.cat([k.reshape(-1), v.reshape(-1)])
    t_fwd = _time(fwd, device, args.iters, args.warmup)
    t_fb = _time(fwd_bwd, device, args.iters, args.warmup)
    t_comp = _time(lambda: _compute_only(q, meta, rank, causal, scale, kvs), device, args.iters, args.warmup)
    t_exch = _time(lambda: _exchange_only(comm, meta, rank, kv), device, args.iters, args.warmup)
    hidden = (t_comp + t_exch - t_fwd) / min(t_comp, t_exch) if min(t_comp, t_exch) > 0 else float("nan")
    pairs = _visible_pairs(meta, rank, causal)
    flops = 4 * args.batch * args.heads * args.dim * pairs
    row = dict(rank=rank, tokens=q.shape[2], fwd_s=t_fwd, fwd_bwd_s=t_fb, compute_only_s=t_comp,
               exchange_only_s=t_exch, overlap=max(0.0, min(1.0, hidden)),
               fwd_tokens_per_s=q.shape[2] * args.batch / t_fwd, fwd_tflops=flops / t_fwd / 1e12,
               fwd_bwd_tflops=3.5 * flops / t_fb / 1e12)
    if not args.no_torch:
        row["torch_cp_fwd_s"], row["torch_cp_skipped"] = _torch_cp(
            args, *(t.to(device) for t in whole), device, dist, rank, world)
        row["torch_cp_xsync_fwd_s"], row["torch_cp_xsync_skipped"] = _torch_cp(
            args, *(t.to(device) for t in whole), device, dist, rank, world, xsync_blocks=True)
    rows = [None] * world
    dist.all_gather_object(rows, row)
    if rank == 0:
        _report(args, backend, device, rows)
    dist.barrier()
    dist.destroy_process_group()


def _report(args, backend, device, rows):
    import torch

    print(f"context parallel: world {len(rows)}, {backend} on {device.type}"
          f"{' (' + torch.cuda.get_device_name(device) + ')' if device.type == 'cuda' else ' (xsync CPU emulator)'}, "
          f"B={args.batch} S={args.seq} Hq={args.heads} Hkv={args.kv_heads or args.heads} D={args.dim} "
          f"{args.dtype} {'causal' if not args.no_causal else 'non-causal'} {args.layout}")
    print(f"{'rank':>4} {'tokens':>7} {'fwd ms':>9} {'fwd+bwd ms':>11} {'tok/s':>10} {'fwd TF/s':>9} "
          f"{'f+b TF/s':>9} {'compute ms':>11} {'exch ms':>9} {'overlap':>8} {'torch CP fwd ms':>16} "
          f"{'torch CP+xsync ms':>18}")
    for r in rows:
        tcp = f"{r['torch_cp_fwd_s'] * 1e3:16.2f}" if r.get("torch_cp_fwd_s") else f"{'-':>16}"
        tcx = f"{r['torch_cp_xsync_fwd_s'] * 1e3:18.2f}" if r.get("torch_cp_xsync_fwd_s") else f"{'-':>18}"
        print(f"{r['rank']:>4} {r['tokens']:>7} {r['fwd_s'] * 1e3:9.2f} {r['fwd_bwd_s'] * 1e3:11.2f} "
              f"{r['fwd_tokens_per_s']:10.0f} {r['fwd_tflops']:9.3g} {r['fwd_bwd_tflops']:9.3g} "
              f"{r['compute_only_s'] * 1e3:11.2f} {r['exchange_only_s'] * 1e3:9.2f} {r['overlap']:8.2f} {tcp} {tcx}")
    for key, what in (("torch_cp_skipped", "torch context_parallel over SDPA"),
                      ("torch_cp_xsync_skipped", "torch context_parallel with xsync blocks")):
        why = {r.get(key) for r in rows} - {None}
        if why:
            print(f"{what} did not run:", "; ".join(sorted(why)))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "context_parallel.json")
    with open(path, "w") as f:
        json.dump(dict(args=vars(args), backend=backend, device=str(device), rows=rows), f, indent=1)
    print("wrote", path)


def _spawned(rank, world, args, init):
    _rank_main(rank, world, args, init)


def main(argv=None) -> int:
    args = _parse(argv if argv is not None else sys.argv[1:])
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:      # torchrun
        _rank_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, "env://")
        return 0
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_spawned, args=(args.world, args, f"file://{tmp}/rendezvous"), nprocs=args.world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
