"""Every H200 number the README quotes, in one command and one JSON.

    PYTHONPATH=. python3 benchmarks/suite.py [--sections grid,varlen,host,gemm,variants,backward]
                                             [--out benchmarks/results] [--update]

Sections (each measured side by side with its torch reference in this one process):
  grid      attention forward, bf16, d 64/128, s 1k..16k, causal and not, vs SDPA cuDNN and flash
  varlen    16 packed sequences of 128..8192 tokens vs torch varlen_attn (called as torch 2.11
            takes it) and nested-jagged SDPA; a fallback reference is named in the row
  host      wall microseconds per call on tiny problems, xsync vs SDPA (benchmarks/host_path.py)
  gemm      kernels/gemm.py at 2048^3, 4096^3 and 8192^3 vs torch.matmul: plain and persistent,
            128x128, 256x128 and 128x256 (two consumer warpgroups) output tiles, the cluster GEMM
            (clusters of two programs sharing B), fp32 C and (``_bf16``) bf16 C as torch's
  variants  rewrites of the flagship kernel that mean the same, vs the flagship (if present)
  backward  attention backward vs SDPA backward and FA4 (if importable), all 20 grid points
  model     a Llama-style LM's training step, xsync attention vs SDPA (benchmarks/model_step.py)
  dropin    strided vs contiguous inputs, head dims 96/256, sliding windows (benchmarks/dropin.py)

Writes suite.json (``--update`` keeps the sections of an existing file that this run does not
measure, so a run may be split over calls). README tables come from it only:
``python benchmarks/readme_tables.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "benchmarks")):
    if path not in sys.path:
        sys.path.insert(0, path)

from benchmarks._gpu import cuda_missing  # noqa: E402 - after the source tree is on sys.path

SECTIONS = ("grid", "varlen", "host", "gemm", "variants", "backward", "model", "dropin")


def _grid():
    import attention
    return [attention.measure_point(p) for p in attention.grid(quick=False)]


def _varlen():
    import attention
    return [attention.measure_varlen(causal) for causal in (False, True)]


def _host():
    import host_path
    return host_path.measure()


def _gemm():
    import gemm
    return [gemm.measure(size, ["s3", "s4", "s4_persistent", "s3_2wg", "s3_2wg_persistent", "s4_2wg_persistent",
                                 "s3_2wg_persistent_bf16", "s4_2wg_persistent_bf16", "s4_cluster2",
                                 "s4_cluster2_bf16", "s3_2wg_persistent_bf16_bm64_bn256",
                                 "s3_cluster2_2wg_bf16_bm64_bn256"]) for size in (2048, 4096, 8192)]


def _variants():
    import attention
    rows = []
    for d, causal, s in attention.variant_points(quick=True):     # d128 s8k, causal and not
        rows.extend(attention.measure_attention_variants(d, causal, s))
    rows.extend(attention.measure_gemm_variants())
    return rows


def _backward():
    import attention
    if not hasattr(attention, "measure_backward"):
        return {"skipped": "benchmarks/attention.py has no measure_backward()"}
    return [attention.measure_backward(p) for p in attention.grid(quick=False)]   # all 20 points


def _model():
    import model_step
    return [model_step.measure(name, cfg, steps=5, device="cuda") for name, cfg in model_step.CONFIGS.items()]


def _dropin():
    import dropin
    return dropin.run(quick=False)


RUNNERS = dict(grid=_grid, varlen=_varlen, host=_host, gemm=_gemm, variants=_variants,
               backward=_backward, model=_model, dropin=_dropin)


def main(argv=None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--update", action="store_true")
    parser.add_argument("--commit", default=None, help="the source revision measured (default: git HEAD)")
    args = parser.parse_args(argv)
    if cuda_missing(__file__):
        return 2
    wanted = [s for s in args.sections.split(",") if s]
    unknown = [s for s in wanted if s not in SECTIONS]
    if unknown:
        print(f"unknown section(s) {unknown}; valid: {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    path = os.path.join(args.out, "suite.json")
    data = {}
    if args.update and os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
    import triton
    commit = args.commit
    try:
        commit = commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    meta = data.setdefault("meta", {})
    for name in wanted:
        start = time.time()
        print(f"== {name}", flush=True)
        data[name] = RUNNERS[name]()
        meta[name] = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                          triton=triton.__version__, cudnn=torch.backends.cudnn.version(),
                          commit=commit, date=time.strftime("%Y-%m-%dT%H:%M:%S"),
                          seconds=round(time.time() - start, 1))
        os.makedirs(args.out, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:      # after every section: a later failure loses nothing
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
        print(json.dumps(data[name])[:2000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
