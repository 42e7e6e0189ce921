"""Schedule sweep for the attention kernel on Hopper: the data behind the committed table
in kernels/flash_attn/schedule.py.

For each grid point (bf16, b*s = 16384, h*d = 2048, head_dim 64/128, causal and not) and each
candidate schedule (STAGES of the K/V rings, one program per tile or persistent with one per
SM), the kernel is launched as ops launches it -- same arguments, explicit constexprs, no
patching of xsync -- checked against SDPA once, and timed with triton.testing.do_bench next to
SDPA's cuDNN backend in the same process. Renderer switches are set with xsync.options.

    PYTHONPATH=. python3 benchmarks/flash_attn_tune.py [--seqs 1024,4096,16384] [--out DIR]

Writes flash_attn_tune.json: every measurement, and per point the fastest schedule.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks._gpu import cuda_missing  # noqa: E402 - after the source tree is on sys.path

CANDIDATES = {
    "stages2": dict(BN=128, STAGES=2, persistent=False),
    "stages3": dict(BN=128, STAGES=3, persistent=False),
    "stages2_persistent": dict(BN=128, STAGES=2, persistent=True),
    "stages3_persistent": dict(BN=128, STAGES=3, persistent=True),
    "bn64_stages3": dict(BN=64, STAGES=3, persistent=False),
    "bn64_stages3_persistent": dict(BN=64, STAGES=3, persistent=True),
}


def launcher(q, k, v, causal, candidate):
    """A thunk launching attention_fwd exactly as ops.attention_impl does, with this
    candidate's constexprs and program count; returns (thunk, o)."""
    import torch

    from xsync.kernels.flash_attn import ops, schedule
    from xsync.kernels.flash_attn.kernel import attention_fwd

    b, hq, s, d = q.shape
    hk = k.shape[1]
    o = torch.empty_like(q)
    lse = torch.empty((b * hq, s), dtype=torch.float32, device=q.device)
    cu_q, cu_k = ops._dense_offsets(b, s, s, q.device)
    plan = schedule.Schedule(BM=64, BN=candidate["BN"], STAGES=candidate["STAGES"],
                             persistent=candidate["persistent"])
    views = q.view(-1, d), k.view(-1, d), v.view(-1, d), o.view(-1, d), lse, cu_q, cu_k

    def run():
        ops.launch(attention_fwd, *views, s, b, hq, hk, d, causal, d ** -0.5, (hq, s, 0, hk, s, 0, hq, 0),
                   "nvidia", plan)
    return run, o


def main(argv=None) -> int:
    import torch
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", default="1024,4096,16384")
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = parser.parse_args(argv)
    if cuda_missing(__file__):
        return 2
    rows, best = [], []
    start = time.time()
    for d in (64, 128):
        for causal in (False, True):
            for s in (int(x) for x in args.seqs.split(",")):
                b, h = 16384 // s, 2048 // d
                torch.manual_seed(0)
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
                ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    cudnn_ms = triton.testing.do_bench(
                        lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))
                point = dict(d=d, causal=causal, s=s, b=b, h=h, cudnn_tflops=flops / cudnn_ms / 1e9)
                for name in args.candidates.split(","):
                    try:
                        run, o = launcher(q, k, v, causal, CANDIDATES[name])
                        run()
                        err = (o.float() - ref.float()).abs().max().item()
                        ms = triton.testing.do_bench(run)
                    except Exception as exc:  # a candidate that does not compile is data, not a crash
                        rows.append(dict(point, candidate=name, **CANDIDATES[name], error=f"{type(exc).__name__}: {exc}"[:300]))
                        print(f"d={d} causal={causal} s={s} {name}: failed: {type(exc).__name__}", flush=True)
                        continue
                    row = dict(point, candidate=name, **CANDIDATES[name], max_abs_err=err,
                               tflops=flops / ms / 1e9)
                    row["ratio_vs_cudnn"] = row["tflops"] / point["cudnn_tflops"]
                    rows.append(row)
                    print(f"d={d} causal={causal} s={s} {name}: {row['tflops']:.0f} TFLOP/s "
                          f"({row['ratio_vs_cudnn']:.2f}x cuDNN) err {err:.1e}", flush=True)
                here = [r for r in rows if (r["d"], r["causal"], r["s"]) == (d, causal, s) and r.get("max_abs_err", 1.0) < 2e-2]
                if here:
                    top = max(here, key=lambda r: r["tflops"])
                    best.append(dict(point, candidate=top["candidate"], tflops=top["tflops"]))
    os.makedirs(args.out, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, seconds=round(time.time() - start, 1))
    with open(os.path.join(args.out, "flash_attn_tune.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows, best=best), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
