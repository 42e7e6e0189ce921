"""What 16-bit cross-core hand-offs cost in accuracy (the Ascend GM workspaces of S and PV).

    python benchmarks/workspace_precision.py      (CPU emulator, a few minutes)

Runs the attention kernel source as shipped and three variants whose S and/or PV pipe fields
are declared in the input dtype (so the slot is rounded to 16 bits when it crosses GM),
causal, b1 h2 s512 d128, inputs N(0, 1) and N(0, 16), against float64; prints the max and mean
error beside the error of rounding the float64 result to the output dtype alone. Writes
benchmarks/results/workspace_precision.md.
"""
import importlib.util
import math
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("XSYNC_BACKEND", "cpu")

import torch  # noqa: E402

from xsync.kernels.flash_attn import kernel as shipped, ops  # noqa: E402

S16 = [("s_out = xs.pipe(mma, softmax, stages=2, s=xs.tile([BM, BN], xs.float32))",
        "s_out = xs.pipe(mma, softmax, stages=2, s=xs.tile([BM, BN], q.dtype))"),
       ("so.s = s\n", "so.s = s.to(q.dtype)\n"),
       ("x = sc.s * qk_scale", "x = sc.s.to(xs.float32) * qk_scale")]
PV16 = [("pv_out = xs.pipe(mma, softmax, stages=2, pv=xs.tile([BM, D], xs.float32))",
         "pv_out = xs.pipe(mma, softmax, stages=2, pv=xs.tile([BM, D], q.dtype))"),
        ("po2.pv = pv\n", "po2.pv = pv.to(q.dtype)\n"),
        ("o_acc * alpha[:, None] + pvs.pv", "o_acc * alpha[:, None] + pvs.pv.to(xs.float32)")]


def variant(edits, tmp):
    src = open(shipped.__file__).read()
    for old, new in edits:
        assert old in src, old
        src = src.replace(old, new)
    path = os.path.join(tmp, f"attn_{len(edits)}_{abs(hash(src))}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.attention_fwd


def reference(q, k, v):
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    n = s.shape[-1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v.double()


def main():
    lines = ["| S, PV on the wire | dtype | inputs | max error | mean error | output rounding alone (max / mean) |",
             "|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for name, edits in (("fp32, fp32 (shipped)", []), ("16-bit, fp32", S16), ("fp32, 16-bit", PV16),
                            ("16-bit, 16-bit", S16 + PV16)):
            ops.attention_fwd = variant(edits, tmp)
            for dtype in (torch.bfloat16, torch.float16):
                for scale in (1.0, 4.0):
                    torch.manual_seed(0)
                    q, k, v = (torch.randn(1, 2, 512, 128, dtype=dtype) * scale for _ in range(3))
                    o, _ = ops.attention_impl(q, k, v, causal=True)
                    r = reference(q, k, v)
                    rounded = r.to(dtype).double()
                    err = (o.double() - r).abs()
                    base = (rounded - r).abs()
                    lines.append(f"| {name} | {str(dtype)[6:]} | N(0, {scale ** 2:g}) | {err.max():.4f} | "
                                 f"{err.mean():.5f} | {base.max():.4f} / {base.mean():.5f} |")
                    print(lines[-1], flush=True)
    out = os.path.join(ROOT, "benchmarks", "results", "workspace_precision.md")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
