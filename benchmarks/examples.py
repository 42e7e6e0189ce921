"""The examples users copy from (kernels/examples/) on Hopper vs their torch equivalents, same
process, same tensors.

    PYTHONPATH=. python3 benchmarks/examples.py [--only gemm_gelu,rms_norm,...] [--out DIR]
    xsync bench examples [...]

Rows (bf16 unless named): ``gemm_gelu`` / ``gemm_gelu_tanh`` (matmul_bias_act, 4096^3) vs
``gelu(a @ b + bias)``; ``split_k`` (matmul_split_k, 256 x 4096 x 16384) vs ``a @ b``;
``rms_norm`` / ``rms_norm_bwd`` and ``layer_norm`` / ``layer_norm_bwd`` (8192 x 4096) vs
torch.nn.functional (the backward vs torch's autograd of the same op); ``softmax`` (8192 x
32768) vs torch.softmax. Each row reports milliseconds, the ratio to torch (> 1: xsync is faster)
and the largest difference from torch's result. Times are ``triton.testing.do_bench`` around
the torch-facing function, host work (allocation, padding) included. Written as JSON to
benchmarks/results/ (and to --out). No numbers are recorded in the repository yet: this needs
a Hopper GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "benchmarks")):
    if path not in sys.path:
        sys.path.insert(0, path)


def cases(device: str = "cuda", scale: int = 1, backend=None):
    """name -> (xsync call, torch call): each returns a tensor or a tuple of tensors. ``scale``
    divides every size (the CPU test runs them tiny on the emulator)."""
    import torch
    import torch.nn.functional as F

    from xsync.kernels import examples as ex

    torch.manual_seed(0)

    def t(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=device, dtype=dtype)

    s = scale
    M = N = K = 4096 // s
    a, b, bias = t(M, K), t(K, N), t(N, dtype=torch.float32)
    sa, sb = t(256 // s, 4096 // s), t(4096 // s, 16384 // s)
    rows, hidden = 8192 // s, 4096 // s
    x, dy, w, lb = t(rows, hidden), t(rows, hidden), t(hidden, dtype=torch.float32), t(hidden, dtype=torch.float32)
    wide = t(8192 // s, 32768 // s)
    kw = dict(backend=backend)
    small = dict(block=(32, 32, 16), stages=2) if s > 1 else {}

    def torch_rms_bwd():
        xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
        F.rms_norm(xr, (hidden,), wr, 1e-6).backward(dy)
        return xr.grad, wr.grad

    def torch_ln_bwd():
        xr, wr, br = (v.detach().requires_grad_() for v in (x, w, lb))
        F.layer_norm(xr, (hidden,), wr, br, 1e-5).backward(dy)
        return xr.grad, wr.grad, br.grad

    return {
        "gemm_gelu": (lambda: ex.matmul_bias_act(a, b, bias, "gelu", **small, **kw),
                      lambda: F.gelu((a @ b).float() + bias).to(a.dtype)),
        "gemm_gelu_tanh": (lambda: ex.matmul_bias_act(a, b, bias, "gelu_tanh", **small, **kw),
                           lambda: F.gelu((a @ b).float() + bias, approximate="tanh").to(a.dtype)),
        "split_k": (lambda: ex.matmul_split_k(sa, sb, **small, **kw), lambda: sa @ sb),
        "rms_norm": (lambda: ex.rms_norm_forward(x, w, 1e-6, **kw), lambda: F.rms_norm(x, (hidden,), w, 1e-6)),
        "rms_norm_bwd": (lambda: ex.rms_norm_backward(dy, x, w, 1e-6, **kw), torch_rms_bwd),
        "layer_norm": (lambda: ex.layer_norm_forward(x, w, lb, 1e-5, **kw),
                       lambda: F.layer_norm(x, (hidden,), w, lb, 1e-5)),
        "layer_norm_bwd": (lambda: ex.layer_norm_backward(dy, x, w, 1e-5, **kw), torch_ln_bwd),
        "softmax": (lambda: ex.softmax(wide, **kw), lambda: torch.softmax(wide, -1)),
    }


def max_diff(got, want) -> float:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    return max((g.float() - w.float()).abs().max().item() for g, w in zip(got, want))


def main(argv=None) -> int:
    from benchmarks._gpu import cuda_missing

    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=None, help="comma-separated row names")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if cuda_missing(__file__):
        return 1
    import torch
    import triton

    rows = []
    for name, (ours, theirs) in cases().items():
        if args.only and name not in args.only.split(","):
            continue
        diff = max_diff(ours(), theirs())
        t_ours = triton.testing.do_bench(ours, warmup=25, rep=200)
        t_torch = triton.testing.do_bench(theirs, warmup=25, rep=200)
        rows.append(dict(name=name, xsync_ms=t_ours, torch_ms=t_torch, ratio_vs_torch=t_torch / t_ours,
                         max_abs_diff=diff))
        print(f"{name:16s} xsync {t_ours:8.3f} ms  torch {t_torch:8.3f} ms  {t_torch / t_ours:5.2f}x  "
              f"max |diff| {diff:.2e}", flush=True)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "rows": rows}
    name = f"examples_{time.strftime('%Y%m%d-%H%M%S')}.json"
    for d in filter(None, [os.path.join(ROOT, "benchmarks", "results"), args.out]):
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "w") as f:
            f.write(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
