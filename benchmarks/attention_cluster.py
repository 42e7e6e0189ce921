"""K/V multicast in attention, A/B (issue 39): xsync.kernels.flash_attn.cluster with clusters of
2 programs (the lead CTA multicasts each K/V tile to both CTAs, where the installed Triton has
Gluon multicast, >= 3.8) against the same kernel without a cluster (each CTA loads its own K/V),
beside the flagship forward and cuDNN SDPA, in one process, timed round after round (medians).

    PYTHONPATH=. python3 benchmarks/attention_cluster.py [--s 1024 4096 8192] [--d 64 128] [--out DIR]

bf16, non-causal, b*s = 16384, h*d = 2048 (the attention grid's shapes). The cluster kernel has
the flagship's roles and Hopper schedule but not its tile table, Q ring or d64 third warpgroup,
so the A/B is the cluster row against the no-cluster row; the flagship and cuDNN rows place both. Each row says whether the multicast
lowering was used (``multicast``: the allocation table's cluster decision). Writes
benchmarks/results/attention_cluster_<time>.json (and to --out).
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._gpu import cuda_missing, write_result  # noqa: E402
from benchmarks.attention import flops, interleaved, sdpa_runner  # noqa: E402

ROUNDS = 5


def multicast_decision(d: int) -> str:
    """The allocation table's reason for the cluster kernel's K field: multicast or not, why."""
    from xsync.kernels.flash_attn.cluster import attention_fwd_cluster

    cx = dict(BM=64, BN=128, D=d, STAGES=3, REPLICAS=2, CLUSTER=2)
    lines = [line.split("multicast k", 1)[1].strip() for line in
             attention_fwd_cluster.lower("nvidia", cx).allocation.table().splitlines() if "multicast k " in line]
    return " ".join(lines[0].split()) if lines else "no multicast field"


def measure(s: int, d: int) -> dict:
    import torch

    from xsync.kernels.flash_attn import attention
    from xsync.kernels.flash_attn.cluster import attention_cluster

    b, h = 16384 // s, 2048 // d
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    runs = {"cluster2_multicast": lambda: attention_cluster(q, k, v, cluster=2),
            "cluster1": lambda: attention_cluster(q, k, v, cluster=1),
            "flagship": lambda: attention(q, k, v, causal=False),
            "cudnn": sdpa_runner("cudnn", q, k, v, False)}
    row = dict(b=b, h=h, s=s, d=d, causal=False, rounds=ROUNDS, multicast=multicast_decision(d), errors={})
    for name in ("cluster2_multicast", "cluster1"):
        try:
            o, _ = runs[name]()
            row["errors"][name] = (o.float() - ref.float()).abs().max().item()
        except Exception as exc:  # noqa: BLE001 - a failing candidate is a row, not a crash
            row["errors"][name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            runs.pop(name)
    ms = interleaved(runs, ROUNDS)
    f = flops(b, h, s, d, False)
    row["tflops"] = {name: f / (t * 1e-3) / 1e12 for name, t in ms.items()}
    if "cluster2_multicast" in ms and "cluster1" in ms:
        row["multicast_speedup"] = ms["cluster1"] / ms["cluster2_multicast"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--s", type=int, nargs="+", default=[1024, 4096, 8192])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if cuda_missing(__file__):
        return 1
    import torch
    import triton

    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "rows": []}
    for d in args.d:
        for s in args.s:
            row = measure(s, d)
            results["rows"].append(row)
            t = row["tflops"]
            print(f"d{d} s{s}: " + "  ".join(f"{n} {x:6.1f}" for n, x in t.items())
                  + f"  multicast/no-cluster {row.get('multicast_speedup', float('nan')):.3f}", flush=True)
    write_result(results, "attention_cluster", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
