"""Flash-attention forward benchmark: xsync vs torch SDPA (cuDNN and flash backends),
measured side by side in one process on the same tensors with triton.testing.do_bench.

Grid (docs/design.md §6): bf16, head_dim 64 and 128, b*s = 16384, h*d = 2048,
s in {1k, 2k, 4k, 8k, 16k}, causal and not. FLOPs = 4*b*h*s^2*d (half for causal).
Plus a varlen row set: 16 sequences of mixed lengths 128..8k, d=128, causal and not,
against torch's ``torch.nn.attention.varlen.varlen_attn`` on the same packed tensors.
Where the installed torch lacks it (or it fails), the reference falls back to cuDNN
SDPA over the padded batch; such a row says so (``reference_fallback`` in the JSON,
"FALLBACK" in the table, a warning on stderr), since padding makes the comparison a
different one.

    python benchmarks/attention.py [--quick] [--out benchmarks/results] [--backward] [--no-forward]

``--backward`` adds the backward section (measure_backward): the same grid, the time of
dQ, dK and dV from a retained forward graph, FLOPs = 2.5x the forward's, xsync vs SDPA's
cuDNN and flash backward in the same process; its rows (kind "backward") go into the same
JSON and a second table.

Plus ``variants`` (``--no-variants`` skips them): the attention and GEMM kernels written other
ways with the same meaning (kernels/flash_attn/variants.py, kernels/gemm_variants.py), one
row each with TFLOP/s and the ratio to its flagship measured in the same process.

Prints a table of TFLOP/s and ratios and writes flash_attn.json and flash_attn.md.
Needs a CUDA GPU (Hopper for the xsync nvidia backend).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import fa4  # noqa: E402 - after the source tree is on sys.path
from benchmarks._gpu import cuda_missing  # noqa: E402

SEQS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)


def grid(quick: bool):
    for d in HEAD_DIMS:
        for causal in (False, True):
            for s in (SEQS[:3:2] if quick else SEQS):
                yield dict(b=16384 // s, h=2048 // d, s=s, d=d, causal=causal)


def flops(b, h, s, d, causal, s_k=None):
    s_k = s if s_k is None else s_k
    f = 4.0 * b * h * s * s_k * d
    return f / 2 if causal else f


def bench(fn, warmup=10, rep=50):
    import triton.testing
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep)  # milliseconds (median)


def sdpa_runner(backend_name, q, k, v, causal):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend_name]

    def run():
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def measure_point(p, progress=None):
    import torch
    from xsync.kernels.flash_attn import attention

    b, h, s, d, causal = p["b"], p["h"], p["s"], p["d"], p["causal"]
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    row = dict(p)
    f = flops(b, h, s, d, causal)
    o, _ = attention(q, k, v, causal=causal)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    row["max_abs_err_vs_sdpa"] = (o.float() - ref.float()).abs().max().item()
    runners = {"xsync": lambda: attention(q, k, v, causal=causal)}
    for name in ("cudnn", "flash"):
        runners[f"sdpa_{name}"] = sdpa_runner(name, q, k, v, causal)
    if fa4.available():
        row["fa4_error"] = fa4.available()
    else:
        runners["fa4"] = fa4.forward(q, k, v, causal)[0]
    for name, fn in runners.items():
        try:
            ms = bench(fn)
            row[f"{name}_ms"] = ms
            row[f"{name}_tflops"] = f / (ms * 1e-3) / 1e12
        except Exception as exc:  # noqa: BLE001 - a backend missing on this torch is reported
            row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    ratios(row)
    return row


def ratios(row):
    """xsync's TFLOP/s over each reference's measured in the same row."""
    for ref, key in (("cudnn", "sdpa_cudnn_tflops"), ("flash", "sdpa_flash_tflops"), ("fa4", "fa4_tflops")):
        if key in row and "xsync_tflops" in row:
            row[f"ratio_vs_{ref}"] = row["xsync_tflops"] / row[key]


VARLEN_LENS = (128, 8192, 512, 4096, 256, 2048, 1024, 6144, 384, 3072, 768, 5120, 1536, 7168, 640, 2560)


def varlen_attn_call(q, k, v, cu, max_len, causal):
    """torch's varlen attention on the packed tensors, as a thunk, or (None, why not).

    Its signature (torch 2.11; 2.13 adds keywords) is ``varlen_attn(q, k, v, cu_q, cu_k,
    max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1))``: there is no
    ``is_causal``; causal attention is the window ``(-1, 0)`` (nothing right of the
    diagonal). The call is checked against the installed signature before it runs."""
    import inspect

    import torch
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as exc:
        return None, f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn ({exc})"
    args = (q, k, v, cu, cu, max_len, max_len)
    kwargs = dict(window_size=(-1, 0) if causal else (-1, -1))
    try:
        inspect.signature(varlen_attn).bind(*args, **kwargs)
    except TypeError as exc:
        return None, f"torch {torch.__version__}'s varlen_attn does not take this call: {exc}"
    return (lambda: varlen_attn(*args, **kwargs)), None


def nested_sdpa_call(q, k, v, cu, causal):
    """SDPA on nested jagged tensors (the same packed storage, offsets = cu): torch's own
    variable-length path through the fused backends; (thunk, None) or (None, why not)."""
    import torch

    try:
        offsets = cu.to(torch.int64)
        qn, kn, vn = (torch.nested.nested_tensor_from_jagged(x, offsets).transpose(1, 2) for x in (q, k, v))
    except Exception as exc:  # noqa: BLE001
        return None, f"nested jagged tensors unavailable: {type(exc).__name__}: {exc}"

    def run():
        out = torch.nn.functional.scaled_dot_product_attention(qn, kn, vn, is_causal=causal)
        return out.transpose(1, 2).values()
    return run, None


def measure_varlen(causal: bool):
    import torch
    from xsync.kernels.flash_attn import attention_varlen

    lens = list(VARLEN_LENS)
    h, d = 16, 128
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    total = sum(lens)
    torch.manual_seed(0)
    q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    f = sum(flops(1, h, n, d, causal) for n in lens)
    row = dict(kind="varlen", sequences=len(lens), lengths=lens, h=h, d=d, causal=causal)
    o, _ = attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
    ms = bench(lambda: attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal))
    row.update(xsync_ms=ms, xsync_tflops=f / (ms * 1e-3) / 1e12)
    ref, why = varlen_attn_call(q, k, v, cu, max(lens), causal)
    if ref is not None:
        try:
            err = (o.float() - ref().float()).abs().max().item()
            row.update(reference="torch varlen_attn", reference_ms=bench(ref), max_abs_err_vs_reference=err)
        except Exception as exc:  # noqa: BLE001 - reported below as the reason for the fallback
            ref, why = None, f"torch varlen_attn failed: {type(exc).__name__}: {str(exc)[:300]}"
    nested, why_nested = nested_sdpa_call(q, k, v, cu, causal)
    if nested is not None:
        try:
            err = (o.float() - nested().float()).abs().max().item()
            ms = bench(nested)
            row.update(nested_sdpa_ms=ms, nested_sdpa_tflops=f / (ms * 1e-3) / 1e12, nested_sdpa_max_abs_err=err)
            row["ratio_vs_nested_sdpa"] = row["xsync_tflops"] / row["nested_sdpa_tflops"]
        except Exception as exc:  # noqa: BLE001 - reported in the row
            row["nested_sdpa_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    else:
        row["nested_sdpa_error"] = why_nested
    if fa4.available():
        row["fa4_error"] = fa4.available()
    else:
        try:
            run4 = fa4.varlen_forward(q, k, v, cu, max(lens), causal)
            row["fa4_max_abs_err"] = (o.float() - run4().float()).abs().max().item()
            row["fa4_ms"] = bench(run4)
            row["fa4_tflops"] = f / (row["fa4_ms"] * 1e-3) / 1e12
            row["ratio_vs_fa4"] = row["xsync_tflops"] / row["fa4_tflops"]
        except Exception as exc:  # noqa: BLE001 - reported in the row
            row["fa4_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    if ref is None:
        # Loud: a padded batch does (max_len / mean_len)x the work, so this is not the
        # comparison the row would otherwise claim.
        print(f"WARNING: varlen reference (causal={causal}) falls back to cuDNN SDPA over the padded "
              f"batch: {why}", file=sys.stderr)
        pad = max(lens)
        qp = torch.randn(len(lens), h, pad, d, device="cuda", dtype=torch.bfloat16)
        row.update(reference="FALLBACK: sdpa over padded batch (cuDNN)", reference_fallback=why,
                   reference_ms=bench(sdpa_runner("cudnn", qp, qp, qp, causal)))
    # useful work only, for both: a padded reference's wasted work is not counted
    row["reference_tflops"] = f / (row["reference_ms"] * 1e-3) / 1e12
    row["ratio_vs_reference"] = row["xsync_tflops"] / row["reference_tflops"]
    return row


# ---------------------------------------------------------------- variants
# Kernels written other ways with the same meaning (kernels/flash_attn/variants.py,
# kernels/gemm_variants.py): the schedule passes must give them the flagship's schedule, so
# each row's ratio to the flagship, measured in the same process on the same tensors, should
# be within noise (2%).
VARIANT_POINTS = ((128, False, 8192), (128, True, 8192), (64, False, 4096), (128, False, 16384))
GEMM_SIZE = 8192


def variant_points(quick: bool):
    """(head_dim, causal, seq) of the attention variant rows."""
    return VARIANT_POINTS[:2] if quick else VARIANT_POINTS


def gemm_variant_launches():
    """name -> (kernel, rows per program) of the GEMM flagship and its variants."""
    from xsync.kernels import gemm_variants
    from xsync.kernels.gemm import gemm

    out = {"gemm": (gemm, 128)}
    for name in ("gemm_split", "gemm_two_pipes", "gemm_two_pipes_split", "gemm_2wg", "gemm_2wg_split"):
        out[name] = (getattr(gemm_variants, name), 256 if "2wg" in name else 128)
    return out


ROUNDS = 5    # the flagship and its variants are timed in turn, round after round


def interleaved(runs: dict, rounds: int = ROUNDS) -> dict:
    """Median milliseconds per thunk, each round timing every thunk once in turn: a GPU
    that warms up or is shared drifts over a run, and timing the flagship once, first,
    put identical kernels 5-9% apart."""
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            times[name].append(bench(run))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def against_flagship(rows: dict, runs: dict, flagship: str, flop: float) -> list:
    """``rows`` (one per variant) with TFLOP/s and the ratio to ``runs[flagship]``, all of
    ``runs`` timed in turn (a variant that failed has no thunk and keeps its error)."""
    ms = interleaved(runs)
    for name, row in rows.items():
        row["flagship_tflops"] = flop / (ms[flagship] * 1e-3) / 1e12
        if name in ms:
            row.update(ms=ms[name], tflops=flop / (ms[name] * 1e-3) / 1e12)
            row["ratio_vs_flagship"] = row["tflops"] / row["flagship_tflops"]
    return list(rows.values())


def measure_attention_variants(d: int, causal: bool, s: int):
    import torch
    from xsync.kernels.flash_attn import attention_fwd, variants

    b, h = 16384 // s, 2048 // d
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    f = flops(b, h, s, d, causal)
    ref, _ = variants.run_dense(attention_fwd, q, k, v, causal)
    runs = {"flagship": lambda: variants.run_dense(attention_fwd, q, k, v, causal)}
    rows = {}
    for name, kernel in variants.VARIANTS.items():
        row = dict(kind="attention", variant=name, written=variants.EDITS[name][0], b=b, h=h, s=s, d=d,
                   causal=causal, rounds=ROUNDS)
        try:
            o, _ = variants.run_dense(kernel, q, k, v, causal)
            row["max_abs_err_vs_flagship"] = (o.float() - ref.float()).abs().max().item()
            runs[name] = (lambda kernel=kernel: variants.run_dense(kernel, q, k, v, causal))
        except Exception as exc:  # noqa: BLE001 - a failing variant is reported, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        rows[name] = row
    return against_flagship(rows, runs, "flagship", f)


def measure_gemm_variants():
    import torch
    from xsync.backends import select

    n = GEMM_SIZE
    torch.manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    f = 2.0 * n * n * n
    backend = select()

    def runner(kernel, rows_per_program):
        c = torch.empty(n, n, device="cuda", dtype=torch.float32)
        grid = (math.ceil(n / rows_per_program), math.ceil(n / 128))
        return c, lambda: kernel[grid](a, b, c, n, n, n, BM=128, BN=128, BK=64, STAGES=3, backend=backend)

    launches = gemm_variant_launches()
    c_ref, run_ref = runner(*launches.pop("gemm"))
    run_ref()
    runs = {"gemm": run_ref}
    rows = {}
    for name, launch in launches.items():
        row = dict(kind="gemm", variant=name, M=n, N=n, K=n, rounds=ROUNDS)
        try:
            c, run = runner(*launch)
            run()
            row["max_abs_err_vs_flagship"] = (c - c_ref).abs().max().item()
            runs[name] = run
        except Exception as exc:  # noqa: BLE001 - a failing variant is reported, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        rows[name] = row
    return against_flagship(rows, runs, "gemm", f)


def variants_table(rows) -> str:
    out = ["| kind | variant | point | TFLOP/s | flagship TFLOP/s | ratio | max err vs flagship |",
           "|" + "---|" * 7]
    for r in rows:
        point = (f"d={r['d']} causal={r['causal']} s={r['s']}" if r["kind"] == "attention"
                 else f"{r['M']}x{r['N']}x{r['K']}")
        if "error" in r:
            out.append(f"| {r['kind']} | {r['variant']} | {point} | {r['error']} | | | |")
            continue
        out.append(f"| {r['kind']} | {r['variant']} | {point} | {r['tflops']:.0f} | {r['flagship_tflops']:.0f} "
                   f"| {r['ratio_vs_flagship']:.3f} | {r['max_abs_err_vs_flagship']:.1e} |")
    return "\n".join(out)


# ---------------------------------------------------------------- backward section
def backward_runner(forward, q, k, v):
    """Time only the backward: one forward, then dQ, dK, dV from the retained graph."""
    import torch

    o = forward(q, k, v)
    grad_o = torch.randn_like(o)

    def run():
        return torch.autograd.grad(o, (q, k, v), grad_o, retain_graph=True)
    return run, grad_o


def measure_backward(p):
    """One backward row: TFLOP/s of xsync, SDPA cuDNN and SDPA flash (FLOPs = 2.5x the
    forward's: 5 matmuls against the forward's 2), and the largest gradient difference from
    cuDNN's."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from xsync.kernels.flash_attn import attention

    b, h, s, d, causal = p["b"], p["h"], p["s"], p["d"], p["causal"]
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    row = dict(p, kind="backward")
    f = 2.5 * flops(b, h, s, d, causal)

    def sdpa(backend):
        def forward(q, k, v):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return forward

    forwards = {"xsync": lambda q, k, v: attention(q, k, v, causal=causal)[0],
                "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
                "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION)}
    inputs = {name: (q, k, v) for name in forwards}
    if fa4.available():
        row["fa4_error"] = fa4.available()
    else:
        forwards["fa4"], inputs["fa4"] = fa4.forward(q, k, v, causal)
    grads = {}
    grad_o = None
    for name, forward in forwards.items():
        try:
            torch.manual_seed(1)            # the same grad_o for every implementation
            run, grad_o = backward_runner(forward, *inputs[name])
            grads[name] = run()
            ms = bench(run)
            row[f"{name}_ms"] = ms
            row[f"{name}_tflops"] = f / (ms * 1e-3) / 1e12
        except Exception as exc:  # noqa: BLE001 - a backend missing on this torch is reported
            row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    if "xsync" in grads and "sdpa_cudnn" in grads:
        row["max_abs_err_vs_sdpa"] = max((a.float() - r.float()).abs().max().item()
                                         for a, r in zip(grads["xsync"], grads["sdpa_cudnn"]))
    ratios(row)
    return row


def table(rows) -> str:
    head = ("| d | causal | s | b | h | xsync TFLOP/s | cuDNN | flash | FA4 | xsync/cuDNN | xsync/flash "
            "| xsync/FA4 | max err |")
    out = [head, "|" + "---|" * 13]
    for r in rows:
        if r.get("kind") in ("varlen", "backward"):
            continue

        out.append(table_row(r))
    for r in rows:
        if r.get("kind") == "varlen":
            out.append("")
            err = (f", max err {r['max_abs_err_vs_reference']:.1e}" if "max_abs_err_vs_reference" in r else "")
            note = f" ({r['reference_fallback']})" if "reference_fallback" in r else ""
            out.append(f"varlen ({r['sequences']} sequences, lengths {min(r['lengths'])}..{max(r['lengths'])}, "
                       f"d={r['d']}, causal={r['causal']}): xsync {r['xsync_tflops']:.0f} TFLOP/s, "
                       f"{r['reference']}{note} {r['reference_tflops']:.0f} TFLOP/s, "
                       f"ratio {r['ratio_vs_reference']:.2f}{err}; FA4 "
                       + (f"{r['fa4_tflops']:.0f} TFLOP/s, xsync/FA4 {r['ratio_vs_fa4']:.2f}" if "fa4_tflops" in r
                          else f"absent ({r.get('fa4_error', 'not measured')})"))
    backward = [r for r in rows if r.get("kind") == "backward"]
    if backward:
        out += ["", "backward (FLOPs = 2.5x forward; max err: largest |dQ, dK, dV - cuDNN's|)", "",
                head, "|" + "---|" * 13]
        for r in backward:
            out.append(table_row(r))
    return "\n".join(out)


def table_row(r) -> str:
    def cell(key, fmt="{:.0f}"):
        return fmt.format(r[key]) if key in r else "n/a"
    return (f"| {r['d']} | {r['causal']} | {r['s']} | {r['b']} | {r['h']} | {cell('xsync_tflops')} "
            f"| {cell('sdpa_cudnn_tflops')} | {cell('sdpa_flash_tflops')} | {cell('fa4_tflops')} "
            f"| {cell('ratio_vs_cudnn', '{:.2f}')} | {cell('ratio_vs_flash', '{:.2f}')} "
            f"| {cell('ratio_vs_fa4', '{:.2f}')} | {cell('max_abs_err_vs_sdpa', '{:.1e}')} |")


def main(argv=None, progress=True) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="s in {1k, 4k} only")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--no-varlen", action="store_true")
    parser.add_argument("--no-variants", action="store_true",
                        help="skip the same-meaning variants (kernels/flash_attn/variants.py, kernels/gemm_variants.py)")
    parser.add_argument("--backward", action="store_true", help="also the backward section (same grid)")
    parser.add_argument("--no-forward", action="store_true", help="skip the forward rows (with --backward)")
    args = parser.parse_args(argv)
    if cuda_missing(__file__):
        return 2
    points = [] if args.no_forward else list(grid(args.quick))
    rows = []
    start = time.time()
    for i, p in enumerate(points, 1):
        rows.append(measure_point(p))
        if progress:
            r = rows[-1]
            bar = "#" * (30 * i // len(points))
            print(f"\r[{bar:<30}] {i}/{len(points)} d={p['d']} causal={p['causal']} s={p['s']}: "
                  f"xsync {r.get('xsync_tflops', float('nan')):.0f} TFLOP/s", end="", flush=True)
    if progress:
        print()
    if not args.no_varlen and not args.no_forward:
        rows.extend(measure_varlen(causal) for causal in (False, True))
    variant_rows = []
    if not args.no_variants and not args.no_forward:
        for d, causal, s in variant_points(args.quick):
            variant_rows.extend(measure_attention_variants(d, causal, s))
        variant_rows.extend(measure_gemm_variants())
    if args.backward:
        for p in grid(args.quick):
            rows.append(measure_backward(p))
            if progress:
                r = rows[-1]
                print(f"backward d={p['d']} causal={p['causal']} s={p['s']}: "
                      f"xsync {r.get('xsync_tflops', float('nan')):.0f} TFLOP/s", flush=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                seconds=round(time.time() - start, 1))
    try:
        import triton
        meta["triton"] = triton.__version__
    except ImportError:
        pass
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "flash_attn.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows, variants=variant_rows), f, indent=1)
    fa4_absent = sorted({r["fa4_error"] for r in rows if "fa4_error" in r})
    md = f"# flash attention, {meta['device']}, torch {meta['torch']}\n\n" + table(rows) + "\n"
    if fa4_absent:
        md += "\nFA4 absent from some rows (n/a): " + "; ".join(fa4_absent) + "\n"
    if variant_rows:
        md += "\n## variants (same meaning; ratio to the flagship, same process)\n\n" + variants_table(variant_rows) + "\n"
    with open(os.path.join(args.out, "flash_attn.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
