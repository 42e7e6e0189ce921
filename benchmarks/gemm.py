"""GEMM throughput: xsync's kernels/gemm.py on Hopper vs torch.matmul, same process.

    PYTHONPATH=. python3 benchmarks/gemm.py [--size 8192 | --shape M N K] [--stages 3 4] [--variants ...] [--out DIR]

bf16 inputs, fp32 accumulation; xsync writes fp32 C, or bf16 C as torch.matmul does with
``_bf16`` (the same bytes out as the reference: half the fp32 epilogue's).
Times come from ``triton.testing.do_bench`` around the xsync launch of the compiled
kernel (TMA descriptors built per call, launch). torch.matmul is timed before the first variant
and after every variant; each variant is compared with the mean of the two torch runs
around it (``ratio_vs_torch_around``), which follows the GPU's clock drift. Results are printed and written as JSON
to benchmarks/results/ (and to --out if given).

A variant is ``s<STAGES>[_g<GROUP_M>][_2cta][_2wg][_cluster<N>][_nodefer][_pp0][_persistent][_bf16][_smem<KB>][_bm<BM>][_bn<BN>]``
(BM x BN is one consumer's accumulator, 128 x 128 unless ``_bm`` / ``_bn`` say otherwise: ``_2wg_bm64_bn256``
is CUTLASS's cooperative 128 x 256 tile; GROUP_M defaults to 8; ``_g1``
walks the output row by row without grouping): ``_2cta`` launches with maxnreg=128 and
24/232 producer/consumer registers, so two CTAs share an SM (their mainloops and
epilogues overlap; with ``_persistent``, two programs an SM); ``_pp0`` turns off the ping-pong pass
(two consumer warpgroups taking turns at issuing wgmma); ``_nodefer`` turns off the defer-mma-wait pass
(``defer_mma_wait``: one wgmma stays in flight across K steps) for an A/B in the same
process; ``_persistent`` runs ``gemm_persistent`` (one program per SM walking the output
tiles; the loads of the next tile overlap this tile's epilogue); ``_2wg`` takes output tiles
of 256 x 128 computed by two consumer warpgroups sharing each B tile (``gemm_2wg``, or
``gemm_persistent_2wg`` with ``_persistent``); ``_cluster<N>`` runs ``gemm_cluster`` (persistent,
clusters of N programs stacked along M sharing B as a multicast field; without a multicast copy
on the installed Triton each program loads its own B: the allocation table says which), and with
``_2wg`` ``gemm_cluster_2wg`` (the same at 256 x 128 a program: one B load serves 2 consumer
warpgroups x N CTAs; e.g. ``s3_cluster2_2wg_bf16``, ``s4_cluster2_2wg``); ``_smem<KB>`` renders it with that much shared memory
for the rings and the TMA-store staging tiles together (the renderer option ``staging_smem_limit``;
by default ``STAGING_SMEM_LIMIT``, 216 KB: above it C leaves through masked register stores). The default list is, per --stages value, ``s<N>`` and ``s<N>_nodefer``, plus
``s3_2cta`` / ``s3_2cta_nodefer`` when 3 is among them.
"""
import argparse
import os
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._gpu import write_result  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--shape", type=int, nargs=3, default=None, metavar=("M", "N", "K"))
    ap.add_argument("--stages", type=int, nargs="+", default=[3, 4])
    ap.add_argument("--variants", default=None, help="comma-separated, e.g. s3,s3_nodefer,s3_2cta")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    variants = args.variants.split(",") if args.variants else \
        [f"s{n}{suffix}" for n in args.stages for suffix in ("", "_nodefer")] + \
        (["s3_2cta", "s3_2cta_nodefer"] if 3 in args.stages else [])
    shape = tuple(args.shape) if args.shape else (args.size,) * 3
    results = measure(shape, variants)
    write_result(results, f"gemm_{'x'.join(map(str, shape))}", args.out)
    return 0


def measure(shape, variants) -> dict:
    """torch.matmul, then each variant followed by torch.matmul again, on the same tensors.
    ``shape``: M = N = K, or (M, N, K)."""
    import torch
    import triton

    M, N, K = (shape,) * 3 if isinstance(shape, int) else shape
    flops = 2.0 * M * N * K
    torch.manual_seed(0)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    outputs = {"float32": torch.empty(M, N, device="cuda", dtype=torch.float32),
               "bfloat16": torch.empty(M, N, device="cuda", dtype=torch.bfloat16)}
    ref = torch.matmul(a, b)

    def tflops(ms):
        return flops / (ms * 1e-3) / 1e12

    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "M": M, "N": N, "K": K, "dtype": "bfloat16", "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "xsync": []}

    def time_torch():
        return triton.testing.do_bench(lambda: torch.matmul(a, b), warmup=25, rep=200)

    t_ref = time_torch()
    results["torch_matmul"] = {"ms": t_ref, "tflops": tflops(t_ref)}
    print(f"torch.matmul          {t_ref:8.3f} ms  {tflops(t_ref):7.1f} TFLOP/s")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    operands = dict(a=a, b=b, M=M, N=N, K=K)
    t_before = t_ref
    for name in variants:
        variant = Variant.parse(name, M, N, sms)
        try:
            row = _time_variant(variant, operands, outputs[variant.out], ref)
        except Exception as e:    # one variant's refusal (shared memory, a register budget) is a result
            results["xsync"].append({"variant": name, "kernel": variant.kernel.__name__,
                                     "error": f"{type(e).__name__}: {e}"[:2000]})
            print(f"xsync gemm {name:16s} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        t = row["ms"]
        t_after = time_torch()
        row.update({"programs": variant.grid, "BM": variant.rows, "BN": variant.consts["BN"], "BK": 64,
                    "stages": variant.consts["STAGES"], "group_m": variant.consts["GROUP_M"],
                    "c_dtype": variant.out, "tflops": tflops(t), "ratio_vs_torch": t_ref / t,
                    "torch_ms_around": [t_before, t_after], "ratio_vs_torch_around": (t_before + t_after) / 2 / t})
        results["xsync"].append(row)
        print(f"xsync gemm {name:16s} {t:8.3f} ms  {tflops(t):7.1f} TFLOP/s  "
              f"({row['ratio_vs_torch_around']:.3f}x torch.matmul around it, max rel err {row['max_rel_err_vs_torch']:.1e})",
              flush=True)
        t_before = t_after
    t_ref2 = t_before
    results["torch_matmul_after"] = {"ms": t_ref2, "tflops": tflops(t_ref2)}
    print(f"torch.matmul (again)  {t_ref2:8.3f} ms  {tflops(t_ref2):7.1f} TFLOP/s")
    # The GPU drifts during a run (torch.matmul itself slows by several percent): also
    # compare against the mean of the two torch measurements that bracket the variants.
    t_mean = (t_ref + t_ref2) / 2
    for row in (r for r in results["xsync"] if "ms" in r):
        row["ratio_vs_torch_mean"] = t_mean / row["ms"]
        print(f"xsync gemm {row['variant']:16s} {row['ratio_vs_torch_mean']:.2f}x the mean of both torch.matmul runs")
    return results


def _number(name: str, prefix: str, default):
    """The number of a variant's ``_<prefix><N>`` part (``_bm64`` -> 64), or ``default``."""
    return next((int(part[len(prefix):]) for part in name.split("_")[1:]
                 if part.startswith(prefix) and part[len(prefix):].isdigit()), default)


@dataclass(frozen=True)
class Variant:
    """One benchmarked GEMM, parsed from its name (the grammar is in the module docstring)."""
    name: str
    kernel: object            # the xsync kernel
    consts: dict              # its constexprs
    out: str                  # C's dtype: "float32" or "bfloat16"
    at_lowering: dict         # lowering options (passes, register budgets)
    opts: dict                # renderer options
    grid: tuple
    rows: int                 # a program's output rows

    @classmethod
    def parse(cls, name: str, M: int, N: int, sms: int) -> "Variant":
        import triton

        from xsync.kernels.gemm import gemm, gemm_cluster, gemm_cluster_2wg, gemm_persistent, gemm_persistent_2wg
        from xsync.kernels.gemm_variants import gemm_2wg

        persistent, two = "_persistent" in name, "_2wg" in name
        cluster = _number(name, "cluster", 0)
        kernel = (gemm_cluster_2wg if two else gemm_cluster) if cluster else \
            {(False, False): gemm, (True, False): gemm_persistent,
             (False, True): gemm_2wg, (True, True): gemm_persistent_2wg}[persistent, two]
        bm, bn = _number(name, "bm", 128), _number(name, "bn", 128)
        rows = bm * (2 if two else 1)             # a program's tile: rows x bn
        tiles = (triton.cdiv(M, rows), triton.cdiv(N, bn))
        per_sm = 2 if "_2cta" in name else 1      # two CTAs an SM: two persistent programs each
        grid = (min(per_sm * sms, tiles[0] * tiles[1]),) if persistent else tiles
        if cluster:   # whole clusters, one program an SM; a cluster's tile: cluster x rows
            grid = (min(sms // cluster, triton.cdiv(M, cluster * rows) * tiles[1]) * cluster,)
        at_lowering, opts = {}, {}
        if "_2cta" in name:
            at_lowering.update(maxnreg=128, producer_regs=24, consumer_regs=232)
        if "_nodefer" in name:
            at_lowering["defer_mma_wait"] = False
        if "_pp0" in name:
            at_lowering["pingpong"] = "0"
        smem_kb = _number(name, "smem", None)
        if smem_kb is not None:
            opts["staging_smem_limit"] = smem_kb * 1024
        consts = dict(BM=bm, BN=bn, BK=64, STAGES=int(name.split("_")[0][1:]), GROUP_M=_number(name, "g", 8),
                      **({"CLUSTER": cluster} if cluster else {}))
        return cls(name, kernel, consts, "bfloat16" if "_bf16" in name else "float32", at_lowering, opts,
                   grid, rows)


def _time_variant(variant: Variant, operands: dict, c, ref) -> dict:
    """Lower and compile one variant, check it against torch's product, time it."""
    import torch
    import triton

    import xsync as xs
    from xsync.backends.nvidia import compile_kernel

    # the wait deferral is a pass and the register budgets the allocator's: both are
    # lowering options (handed to compile_kernel they are a ConfigError)
    lowered = variant.kernel.lower("nvidia", variant.consts,
                                   dict(a=xs.bfloat16, b=xs.bfloat16, c=getattr(xs, variant.out)),
                                   options=variant.at_lowering)
    compiled = compile_kernel(lowered.kernel, lowered.placement, lowered.allocation, variant.opts)
    kargs = dict(operands, c=c)

    def run():
        compiled.launch(variant.grid, kargs)
    c.zero_()
    run()
    torch.cuda.synchronize()
    err = (c.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
    return {"variant": variant.name, "kernel": variant.kernel.__name__, "options": variant.opts,
            "staging_smem_kb": variant.opts.get("staging_smem_limit", 0) // 1024 or None,
            "tma_store": any(kind == "store_desc" for _, kind, _ in compiled.result.params),
            "ms": triton.testing.do_bench(run, warmup=25, rep=200), "max_rel_err_vs_torch": err}


if __name__ == "__main__":
    sys.exit(main())
