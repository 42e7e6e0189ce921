"""The drop-in rows (issue 37, and the sliding window of issue 38): what a model's call costs.

    python benchmarks/dropin.py [--quick] [--out benchmarks/results]

* strided: Hugging Face's ``view(b, s, h, d).transpose(1, 2)`` q/k/v (seq stride h*d) against
  the same values contiguous, both through xsync, interleaved in one process: the ratio should
  be 1 within noise (no copy is made);
* head dims 96 and 256: the forward grid's lengths at h*d near 2048, xsync vs cuDNN SDPA and
  FA4 (where importable), forward and backward;
* sliding window: ``window_size=(W, 0)`` through ``xsync.flash_attn_func`` vs FA4's window and
  vs xsync's full causal on the same shape (a window must never be slower than full causal).

Writes dropin.json and dropin.md under --out; needs a CUDA GPU. FA4 absent: the row says why.
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

import attention as bench_attention  # noqa: E402 - after the source tree is on sys.path
from benchmarks import fa4  # noqa: E402
from benchmarks._gpu import cuda_missing  # noqa: E402

WIDE_DIMS = {96: 16, 256: 8}          # head dim -> heads (h*d near 2048, as the main grid)
WINDOWS = (128, 512, 2048)


def measure_strided(d: int, causal: bool, s: int) -> dict:
    import torch
    from xsync.kernels.flash_attn import attention

    b, h = 16384 // s, 2048 // d
    torch.manual_seed(0)
    x = [torch.randn(b, s, h * d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    hf = [t.view(b, s, h, d).transpose(1, 2) for t in x]       # seq stride h*d: HF's layout
    dense = [t.contiguous() for t in hf]
    err = (attention(*hf, causal=causal)[0].float() - attention(*dense, causal=causal)[0].float()).abs().max().item()
    ms = bench_attention.interleaved({"strided": lambda: attention(*hf, causal=causal),
                      "contiguous": lambda: attention(*dense, causal=causal)})
    f = bench_attention.flops(b, h, s, d, causal)
    return dict(kind="strided", d=d, causal=causal, s=s, b=b, h=h, strided_ms=ms["strided"],
                contiguous_ms=ms["contiguous"], strided_tflops=f / (ms["strided"] * 1e-3) / 1e12,
                ratio_strided_vs_contiguous=ms["contiguous"] / ms["strided"], max_abs_diff=err)


def wide_points(quick: bool):
    for d, h in WIDE_DIMS.items():
        for causal in (False, True):
            for s in ((1024, 4096) if quick else bench_attention.SEQS):
                yield dict(b=16384 // s, h=h, s=s, d=d, causal=causal)


def measure_window(w: int, s: int, d: int = 128) -> dict:
    import torch
    import xsync

    b, h = 16384 // s, 2048 // d
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    # keys in the window per row: min(row + 1, w + 1), summed over the rows
    seen = sum(min(i + 1, w + 1) for i in range(s))
    f = 4.0 * b * h * seen * d
    runs = {"xsync_window": lambda: xsync.flash_attn_func(q, k, v, causal=True, window_size=(w, 0)),
            "xsync_causal": lambda: xsync.flash_attn_func(q, k, v, causal=True)}
    row = dict(kind="window", window=w, s=s, d=d, b=b, h=h)
    if fa4.available():
        row["fa4_error"] = fa4.available()
    else:
        from flash_attn.cute import flash_attn_func
        runs["fa4_window"] = lambda: flash_attn_func(q, k, v, causal=True, window_size=(w, 0))
    ms = bench_attention.interleaved(runs)
    for name, t in ms.items():
        row[f"{name}_ms"] = t
    row["xsync_window_tflops"] = f / (ms["xsync_window"] * 1e-3) / 1e12
    row["window_vs_full_causal_speed"] = ms["xsync_causal"] / ms["xsync_window"]
    if "fa4_window" in ms:
        row["ratio_vs_fa4"] = ms["fa4_window"] / ms["xsync_window"]
    return row


def table(rows) -> str:
    out = ["## strided (HF transpose view) vs contiguous, xsync both", "",
           "| d | causal | s | strided TFLOP/s | strided/contiguous speed | max diff |", "|---|---|---|---|---|---|"]
    out += [f"| {r['d']} | {r['causal']} | {r['s']} | {r['strided_tflops']:.0f} | {r['ratio_strided_vs_contiguous']:.3f} "
            f"| {r['max_abs_diff']:.1e} |" for r in rows if r.get("kind") == "strided"]
    out += ["", "## head dims 96 and 256 (forward, then backward)", "",
            "| d | causal | s | b | h | xsync TFLOP/s | cuDNN | flash | FA4 | xsync/cuDNN | xsync/flash "
            "| xsync/FA4 | max err |", "|" + "---|" * 13]
    out += [bench_attention.table_row(r) for r in rows if r.get("kind") in (None, "backward") and "d" in r
            and r["d"] in WIDE_DIMS]
    out += ["", "## sliding window (causal, window_size=(W, 0), d128)", "",
            "| W | s | xsync TFLOP/s (keys seen) | window/full-causal speed | xsync/FA4 |", "|---|---|---|---|---|"]
    out += [f"| {r['window']} | {r['s']} | {r['xsync_window_tflops']:.0f} | {r['window_vs_full_causal_speed']:.2f} "
            f"| {r['ratio_vs_fa4']:.2f} |" if "ratio_vs_fa4" in r else
            f"| {r['window']} | {r['s']} | {r['xsync_window_tflops']:.0f} | {r['window_vs_full_causal_speed']:.2f} | n/a |"
            for r in rows if r.get("kind") == "window"]
    return "\n".join(out)


def run(quick: bool) -> list:
    rows = []
    for d, causal, s in ((128, False, 4096), (128, True, 8192), (64, True, 4096)):
        rows.append(measure_strided(d, causal, s))
    for p in wide_points(quick):
        rows.append(bench_attention.measure_point(p))
        rows.append(bench_attention.measure_backward(p))
    for s in ((4096,) if quick else (4096, 16384)):
        rows.extend(measure_window(w, s) for w in WINDOWS)
    return rows


def main(argv=None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = parser.parse_args(argv)
    if cuda_missing(__file__):
        return 2
    start = time.time()
    rows = run(args.quick)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, seconds=round(time.time() - start, 1),
                fa4=fa4.available() or "importable")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dropin.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    md = f"# drop-in rows, {meta['device']}, torch {meta['torch']}\n\n" + table(rows) + "\n"
    with open(os.path.join(args.out, "dropin.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
