"""Tuning sweep for the Hopper flash-attention lowering (kernels/flash_attn).

Checks correctness of every variant against a float32 reference on small odd shapes,
then measures TFLOP/s for d=128 / d=64 at s=4k and 16k (b*s = 16384, h*d = 2048),
causal and not, next to torch SDPA (cuDNN and flash backends) in the same process.

A variant is a set of block sizes (BM, BN, STAGES) and renderer options
(consumer_regs, producer_regs, fuse_mma, pingpong, overlap_softmax). Select with --variants name,name (default all).

    PYTHONPATH=. python3 benchmarks/flash_attn_tune.py [--variants default,stages3] [--d 128,64]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("XSYNC_BACKEND", "nvidia")
os.environ.setdefault("XSYNC_VERIFY", "0")

VARIANTS = {
    "default": ({}, {}),
    "nofuse": ({}, {"fuse_mma": False}),
    "stages3": ({"STAGES": 3}, {}),
    "regs240": ({}, {"consumer_regs": 240, "producer_regs": 24}),
    "stages3_regs240": ({"STAGES": 3}, {"consumer_regs": 240, "producer_regs": 24}),
    "bn64": ({"BN": 64}, {}),
    "bn64_stages4": ({"BN": 64, "STAGES": 4}, {}),
    # inter-warpgroup ping-pong scheduling (render.pingpong_schedule), per placement
    "pp_off": ({}, {"pingpong": False}),
    "pp_wrap": ({}, {"pingpong": "wrap"}),
    "pp_first": ({}, {"pingpong": "first"}),
    "pp_each": ({}, {"pingpong": "each"}),
    # intra-warpgroup overlap (render.overlap_softmax): PV of the previous block in flight
    # during the softmax
    "ov_off": ({}, {"overlap_softmax": False}),          # the previous default (ping-pong "each")
    "ov_pp_first": ({}, {"overlap_softmax": True, "pingpong": "first"}),
    "ov_on": ({}, {"overlap_softmax": True}),
    "ov_on_pp_off": ({}, {"overlap_softmax": True, "pingpong": False}),
    "ov_on_regs240": ({}, {"overlap_softmax": True, "consumer_regs": 240, "producer_regs": 24}),
    "ov_on_stages3": ({"STAGES": 3}, {"overlap_softmax": True}),
}


def setup(variant):
    import xsync.kernels.flash_attn.ops as ops
    import xsync.backends.nvidia as nv
    from xsync.kernels.flash_attn.kernel import attention_fwd

    blocks, opts = VARIANTS[variant]
    base = ops.block_sizes.__wrapped__ if hasattr(ops.block_sizes, "__wrapped__") else ops.block_sizes

    def block_sizes(backend):
        return {**base(backend), **blocks}
    block_sizes.__wrapped__ = base
    ops.block_sizes = block_sizes
    orig = nv.resolve_options.__wrapped__ if hasattr(nv.resolve_options, "__wrapped__") else nv.resolve_options

    def resolve_options(options=None):
        return {**orig(options), **opts}
    resolve_options.__wrapped__ = orig
    nv.resolve_options = resolve_options
    attention_fwd._cache.clear()
    getattr(ops, "_COMPILED", {}).clear()  # older ops.py kept its own cache


def ref(q, k, v, causal):
    import torch
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    return torch.softmax(s, -1) @ v.float(), torch.logsumexp(s, -1)


def check(ds):
    import torch
    from xsync.kernels.flash_attn.ops import attention_impl
    worst = 0.0
    for d in ds:
        for causal in (False, True):
            for sq, sk in ((256, 256), (200, 333), (333, 200), (1000, 1000)):
                torch.manual_seed(1)
                q = torch.randn(2, 4, sq, d, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(2, 4, sk, d, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(2, 4, sk, d, device="cuda", dtype=torch.bfloat16)
                o, lse = attention_impl(q, k, v, causal)
                ro, rl = ref(q, k, v, causal)
                fin = torch.isfinite(rl)
                eo = (o.float() - ro).nan_to_num(0).abs().max().item()
                el = (lse - rl)[fin].abs().max().item() if fin.any() else 0.0
                if not (eo < 3e-2 and el < 1e-2):
                    raise AssertionError(f"d={d} causal={causal} sq={sq} sk={sk}: |o|={eo:.2e} |lse|={el:.2e}")
                worst = max(worst, eo)
    return worst


def main():
    import torch
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--d", default="128,64")
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()
    ds = [int(x) for x in args.d.split(",")]
    seqs = [int(x) for x in args.seqs.split(",")]
    points = [(d, s, c) for d in ds for s in seqs for c in (False, True)]
    tensors, refs = {}, {}
    for d, s, c in points:
        b, h = 16384 // s, 2048 // d
        torch.manual_seed(0)
        qkv = tuple(torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        tensors[(d, s)] = qkv
        f = 4.0 * b * h * s * s * d / (2 if c else 1)
        row = {}
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            def fn(be=be):
                with sdpa_kernel(be):
                    return torch.nn.functional.scaled_dot_product_attention(*qkv, is_causal=c)
            try:
                row[name] = f / (triton.testing.do_bench(fn, warmup=10, rep=50) * 1e-3) / 1e12
            except Exception as exc:  # noqa: BLE001
                row[name] = float("nan")
                print("sdpa", name, exc)
        refs[(d, s, c)] = row
        print(f"SDPA d={d} s={s} causal={int(c)}: cudnn {row['cudnn']:.0f} flash {row['flash']:.0f}", flush=True)
    results = {}
    from xsync.kernels.flash_attn.ops import attention_impl
    for var in args.variants.split(","):
        t0 = time.time()
        try:
            setup(var)
            err = check(ds)
        except Exception as exc:  # noqa: BLE001
            print(f"[{var}] FAILED: {type(exc).__name__}: {str(exc)[:1500]}", flush=True)
            continue
        res = {}
        for d, s, c in points:
            q, k, v = tensors[(d, s)]
            b, h = q.shape[0], q.shape[1]
            f = 4.0 * b * h * s * s * d / (2 if c else 1)
            o, _ = attention_impl(q, k, v, c)
            r = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=c)
            e = (o.float() - r.float()).abs().max().item()
            ms = triton.testing.do_bench(lambda: attention_impl(q, k, v, c), warmup=10, rep=50)
            tf = f / (ms * 1e-3) / 1e12
            rr = refs[(d, s, c)]
            res[f"d{d}_s{s}_c{int(c)}"] = dict(tflops=tf, cudnn=rr["cudnn"], flash=rr["flash"], err=e)
            print(f"[{var}] d={d} s={s} causal={int(c)}: xsync {tf:.0f} TFLOP/s | cudnn {rr['cudnn']:.0f} "
                  f"flash {rr['flash']:.0f} | x/cudnn {tf / rr['cudnn']:.2f} x/flash {tf / rr['flash']:.2f} "
                  f"| err {e:.1e}", flush=True)
        results[var] = dict(check_err=err, points=res, seconds=time.time() - t0)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "flash_attn_tune.json"), "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(), results=results), fh, indent=1)


if __name__ == "__main__":
    main()
