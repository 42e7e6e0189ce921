"""Side-by-side A/B of attention kernel sources on the H200, interleaved in one process.

Between-process comparisons of two trees drift by several percent on a shared GPU (the same
kernel measured 649 and 588 TFLOP/s an hour apart). This times candidates round after round
in one process on the same tensors, next to SDPA's cuDNN backend, and reports medians:

* ``flagship``: kernels/flash_attn/kernel.py as the ops launch it (table schedule);
* ``flagship_s2`` / ``flagship_s3`` / ``no_merge``: the same at two or three K/V stages, or with the
  merge-pipes pass off;
* ``tile_loop``: the flagship with the tile loop kept (``PERSISTENT=1``) but one program per
  tile, the form it had before ``xs.tile_range`` spelled non-persistent launches without a loop;
* ``bn64`` / ``bn128``: the flagship with 64 or 128 keys per step;
* ``persistent`` / ``one_per_tile``: the flagship with one program per SM, or one per tile;
  ``by_pair`` / ``persistent_by_pair``: causal tiles dealt pair by pair instead of by work
  (kernels/flash_attn/tiles.py), with the table's programs or one per SM; ``persistent_g<n>``:
  one program per SM, causal tiles dealt by work within groups of n pairs (``s2_persistent_g1`` /
  ``s2_persistent_g4``: so, at two K/V stages);
* ``q1`` / ``q2`` / ``s2_q2``: one or two slots in the Q ring (two K/V stages for the last);
  ``no_tma_store``: the flagship with its O tiles stored from registers (XSYNC_NV_TMA_STORE=0);
  ``pingpong`` / ``pingpong_first``: the flagship with the ping-pong pass placed explicitly
  (XSYNC_NV_PINGPONG=each / first) beside overlap-softmax, which otherwise turns it off;
* ``r2`` / ``r2_s2``: two consumer replicas (warpgroups) per tile of 2*BM rows (at two K/V
  stages); ``r3_bn64`` / ``r3_persistent_g<n>``: three, with 64 keys a step, or one program per
  SM dealing causal tiles by work in groups of n pairs;
  ``r3`` / ``r3_s2`` / ``r3_q1`` / ``r3_p24``: three consumer replicas (warpgroups) per tile of
  3*BM rows, as FA3 runs d64; at two K/V stages, one Q slot, or 24 producer registers (the
  consumers get 160 either way since the allocator gives three consumers 160, alloc.py);
* ``prefetch``: the flagship with the consumers' tile-table and sequence-offset reads issued tiles
  ahead of their tiles (``Schedule.reads_ahead``, xsync/backends/nvidia/prefetch.py);
* ``exp2_quarter`` / ``exp2_half``: the flagship with that share of P's exponentials computed by a
  polynomial on the FMA pipe instead of the special-function unit (``Schedule.exp2_fma``,
  xsync/backends/nvidia/exp2.py); ``exp2_quarter_prefetch``: both;
* ``scale_first``: the flagship scaling every score before the row max (``SCALE_POSITIVE=0``,
  what a zero or negative scale launches) instead of the row max after it;
* ``older``: an older revision's kernel source (``--older PATH``, e.g. the file from
  ``git show 00e8dd1:kernels/flash_attn/kernel.py``), lowered by this xsync with its own
  launch layout (grid (row blocks, batch*heads), no ``batch``/``max_q`` arguments).

    PYTHONPATH=. python3 benchmarks/flash_attn_ab.py [--older PATH] [--shapes 128:1:16384,128:1:8192]
    PYTHONPATH=. python3 benchmarks/flash_attn_ab.py --varlen all     # packed-sequence tile counts/orders

Compiles every candidate in parallel processes first (Triton's disk cache), then measures.
Writes flash_attn_ab.json under --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import multiprocessing as mp
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks._gpu import cuda_missing  # noqa: E402 - after the source tree is on sys.path

CANDIDATES = {   # name -> (schedule fields over the table's, merge-pipes on)
    "flagship": ({}, True),
    "flagship_s2": ({"STAGES": 2}, True),
    "flagship_s3": ({"STAGES": 3}, True),
    "no_merge": ({}, False),
    "tile_loop": ({}, True),     # the loop kept (PERSISTENT=1) under a one-per-tile launch
    "bn64": ({"BN": 64}, True),
    "bn128": ({"BN": 128}, True),
    "persistent": ({"persistent": True}, True),
    "one_per_tile": ({"persistent": False}, True),
    "by_pair": ({"causal_group": None}, True),
    "persistent_by_pair": ({"persistent": True, "causal_group": None}, True),
    "persistent_g1": ({"persistent": True, "causal_group": 1}, True),
    "persistent_g4": ({"persistent": True, "causal_group": 4}, True),
    "persistent_g16": ({"persistent": True, "causal_group": 16}, True),
    "s2_persistent_g1": ({"STAGES": 2, "persistent": True, "causal_group": 1}, True),
    "s2_persistent_g4": ({"STAGES": 2, "persistent": True, "causal_group": 4}, True),
    "older": ({"STAGES": 2}, True),
    "q1": ({"q_stages": 1}, True),
    "q2": ({"q_stages": 2}, True),
    "s2_q2": ({"STAGES": 2, "q_stages": 2}, True),
    "no_tma_store": ({}, True),
    "pingpong": ({}, True),
    "pingpong_first": ({}, True),
    "r2": ({"replicas": 2}, True),
    "r3": ({"replicas": 3}, True),
    "r3_s2": ({"replicas": 3, "STAGES": 2}, True),
    "r3_q1": ({"replicas": 3, "q_stages": 1}, True),
    "r3_p24": ({"replicas": 3}, True),
    "r2_s2": ({"replicas": 2, "STAGES": 2}, True),
    "r3_bn64": ({"replicas": 3, "BN": 64}, True),
    "r3_persistent_g1": ({"replicas": 3, "persistent": True, "causal_group": 1}, True),
    "r3_persistent_g0": ({"replicas": 3, "persistent": True, "causal_group": 0}, True),
    "scale_first": ({}, True),
    "prefetch": ({"reads_ahead": True}, True),
    "exp2_quarter": ({"exp2_fma": "1/4"}, True),
    "exp2_half": ({"exp2_fma": "1/2"}, True),
    "exp2_quarter_prefetch": ({"exp2_fma": "1/4", "reads_ahead": True}, True),
}
# candidates launched with other kernel constexprs than the ops choose
CONSTEXPRS = {"scale_first": {"SCALE_POSITIVE": 0}}
# candidates lowered under other renderer options than the defaults
OPTIONS = {"no_tma_store": {"nv_tma_store": False}, "pingpong": {"nv_pingpong": "each"},
           "pingpong_first": {"nv_pingpong": "first"}, "r3_p24": {"nv_producer_regs": 24}}


def _kernel(name: str, older: str | None):
    """The candidate's attention_fwd, from a copy of the source file."""
    path = older if name == "older" else os.path.join(ROOT, "kernels", "flash_attn", "kernel.py")
    text = open(path).read()
    copy = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"xsync_ab_{name}.py")
    with open(copy, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location(f"xsync_ab_{name}", copy)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.attention_fwd


def _launcher(name, kernel, q, k, v, causal):
    """(o, thunk) launching ``kernel`` as the ops do (the older source: its own layout)."""
    import torch

    import xsync as xs
    from xsync.kernels.flash_attn import ops, schedule

    b, h, s, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((b * h, s), dtype=torch.float32, device=q.device)
    cu_q, cu_k = ops._dense_offsets(b, s, s, q.device)
    plan = schedule.lookup("nvidia", d, causal, s)
    override, merge = CANDIDATES[name]
    layout = (h, s, 0, h, s, 0, h, 0)
    if name == "older":
        cx = dict(plan.constexprs(), **override, D=d, CAUSAL=int(causal))
        cx.pop("PERSISTENT")
        grid = (math.ceil(s / (2 * cx["BM"])), b * h)
        args = (q.view(-1, d), k.view(-1, d), v.view(-1, d), o.view(-1, d), lse, cu_q, cu_k, d ** -0.5,
                h, 1, *layout)

        def run():
            with xs.options(nv_merge_pipes=merge):
                kernel[grid](*args, backend="nvidia", **cx)
        return o, run
    plan = dataclasses.replace(plan, **override)
    grid_size = None
    if name == "tile_loop":      # the loop kept, one program per tile
        grid_size = math.ceil(s / plan.tile_rows) * b * h
        plan = dataclasses.replace(plan, persistent=True)
    views = q.view(-1, d), k.view(-1, d), v.view(-1, d), o.view(-1, d), lse, cu_q, cu_k

    def run():
        with xs.options(nv_merge_pipes=merge, **OPTIONS.get(name, {})):
            ops.launch(kernel, *views, s, b, h, h, d, causal, d ** -0.5, layout, "nvidia", plan, grid_size,
                       CONSTEXPRS.get(name))
    return o, run


def _timed_in_turn(runs: dict, rounds: int) -> dict:
    """{name: milliseconds of each round}, every thunk timed once a round. Each round starts at
    another candidate: the first timed in a round runs faster or slower for reasons of its own
    (clocks after the previous round), 5-9% apart."""
    import triton.testing

    times = {name: [] for name in runs}
    order = list(runs)
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            times[name].append(triton.testing.do_bench(runs[name], warmup=10, rep=60))
    return times


# Packed-sequence launches (--varlen): the table's schedule for the longest sequence, its tiles
# counted and ordered from the lengths (ops.launch(packed_tokens=...), tiles.packed_order), or
# every (sequence, head, row block) in pair order as dense batches walk them
VARLEN_CANDIDATES = {"packed": ({}, True), "every_tile": ({}, False),
                     "packed_persistent": ({"persistent": True}, True),
                     "packed_one_per_tile": ({"persistent": False}, True)}


def _varlen_launcher(name, q, k, v, cu, max_len, causal):
    import torch

    from xsync.kernels.flash_attn import ops, schedule

    total, h, d = q.shape
    o, lse = torch.zeros_like(q), torch.zeros(h, total, device=q.device)
    override, packed = VARLEN_CANDIDATES[name]
    plan = dataclasses.replace(schedule.lookup("nvidia", d, causal, max_len), **override)
    views = q.view(total, -1), k.view(total, -1), v.view(total, -1), o.view(total, -1), lse, cu, cu

    def run():
        ops.launch(ops.attention_fwd, *views, max_len, cu.numel() - 1, h, h, d, causal, d ** -0.5,
                   (1, 0, d, 1, 0, d, 0, 1), "nvidia", plan, packed_tokens=total if packed else None)
    return o, run


def varlen_ab(names, rounds: int) -> list:
    """The varlen benchmark's problem (benchmarks/attention.py VARLEN_LENS, h*d = 2048), d 64
    and 128, causal and not: each candidate against torch's varlen_attn, interleaved."""
    import torch

    from benchmarks import attention as bench_attention

    lens = list(bench_attention.VARLEN_LENS)
    rows = []
    for d in (128, 64):
        for causal in (False, True):
            h = 2048 // d
            cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
            torch.manual_seed(0)
            q, k, v = (torch.randn(sum(lens), h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flop = sum(bench_attention.flops(1, h, n, d, causal) for n in lens)
            runs, errs = {}, {}
            ref, _ = bench_attention.varlen_attn_call(q, k, v, cu, max(lens), causal)
            want = ref().float() if ref is not None else None
            for name in names:
                o, runs[name] = _varlen_launcher(name, q, k, v, cu, max(lens), causal)
                runs[name]()
                errs[name] = None if want is None else (o.float() - want).abs().max().item()
            if ref is not None:
                runs["varlen_attn"], errs["varlen_attn"] = ref, 0.0
            for name, ms in _timed_in_turn(runs, rounds).items():
                med = sorted(ms)[len(ms) // 2]
                row = dict(kind="varlen", d=d, h=h, causal=causal, lengths=lens, candidate=name,
                           tflops=flop / med / 1e9, rounds=[flop / t / 1e9 for t in ms], max_abs_err_vs_varlen_attn=errs[name])
                rows.append(row)
                print(f"varlen d={d} causal={causal} {name}: {row['tflops']:.0f} TFLOP/s "
                      f"(rounds {', '.join(f'{x:.0f}' for x in row['rounds'])})", flush=True)
    return rows


def _shapes(text: str):
    return [tuple(int(x) for x in item.split(":")) for item in text.split(",") if item]


def _compile(job):
    name, older, d, causal = job
    os.environ.setdefault("XSYNC_BACKEND", "nvidia")
    import torch
    q, k, v = (torch.randn(1, 2, 256, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    _, run = _launcher(name, _kernel(name, older), q, k, v, bool(causal))
    run()
    torch.cuda.synchronize()
    return job


def main(argv=None) -> int:
    import torch
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--older", default=None, help="an older revision's kernels/flash_attn/kernel.py")
    parser.add_argument("--shapes", default="128:1:16384,128:1:8192", help="d:causal:s,...")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--candidates", default="flagship,flagship_s2,no_merge,tile_loop,older",
                        help="of: " + ", ".join(CANDIDATES))
    parser.add_argument("--varlen", default=None,
                        help="measure packed-sequence launches instead: 'all' or of " + ", ".join(VARLEN_CANDIDATES))
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = parser.parse_args(argv)
    if cuda_missing(__file__):
        return 2
    if args.varlen:
        rows = varlen_ab(list(VARLEN_CANDIDATES) if args.varlen == "all" else args.varlen.split(","), args.rounds)
        os.makedirs(args.out, exist_ok=True)
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                    date=time.strftime("%Y-%m-%dT%H:%M:%S"))
        with open(os.path.join(args.out, "flash_attn_ab_varlen.json"), "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        return 0
    names = [n for n in args.candidates.split(",") if n != "older" or args.older]
    shapes = _shapes(args.shapes)
    jobs = [(n, args.older, d, c) for d, c, _ in shapes for n in names]
    with mp.get_context("spawn").Pool(min(len(jobs), 12)) as pool:
        list(pool.imap_unordered(_compile, jobs))
    rows = []
    for d, causal, s in shapes:
        b, h = 16384 // s, 2048 // d
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
        flop = 4.0 * b * h * s * s * d / (2 if causal else 1)
        runs, errs = {}, {}
        for name in names:
            o, runs[name] = _launcher(name, _kernel(name, args.older), q, k, v, bool(causal))
            runs[name]()
            errs[name] = (o.float() - ref.float()).abs().max().item()

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
        runs["sdpa_cudnn"], errs["sdpa_cudnn"] = cudnn, 0.0
        for name, ms in _timed_in_turn(runs, args.rounds).items():
            med = sorted(ms)[len(ms) // 2]
            row = dict(d=d, causal=bool(causal), s=s, b=b, h=h, candidate=name, tflops=flop / med / 1e9,
                       rounds=[flop / t / 1e9 for t in ms], max_abs_err_vs_sdpa=errs[name])
            rows.append(row)
            print(f"d={d} causal={bool(causal)} s={s} {name}: {row['tflops']:.0f} TFLOP/s "
                  f"(rounds {', '.join(f'{x:.0f}' for x in row['rounds'])})", flush=True)
    os.makedirs(args.out, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                older=args.older, date=time.strftime("%Y-%m-%dT%H:%M:%S"))
    with open(os.path.join(args.out, "flash_attn_ab.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
