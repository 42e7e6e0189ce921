"""The README's measured-speed tables, rendered from the committed suite run only.

    python benchmarks/readme_tables.py [--json benchmarks/results/suite.json] [--check]

Replaces the block between ``<!-- suite:begin -->`` and ``<!-- suite:end -->`` in README.md
(``--check``: exit 1 if the README differs from what the JSON gives; tests/core runs it). A
section the JSON lacks is said to be missing, never filled in.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- suite:begin -->", "<!-- suite:end -->"
DEFAULT_JSON = os.path.join(ROOT, "benchmarks", "results", "suite.json")


def _f(x, fmt="{:.0f}"):
    return "n/a" if x is None else fmt.format(x)


def _meta_line(data, names) -> str:
    metas = [data.get("meta", {}).get(n) for n in names]
    metas = [m for m in metas if m]
    if not metas:
        return ""
    m = metas[0]
    return (f"{m['device']}, torch {m['torch']}, Triton {m['triton']}, cuDNN {m.get('cudnn')}, "
            f"source {m.get('commit') or 'unrecorded'}, {m['date'][:10]}")


def grid_table(rows, diff: bool = False) -> list[str]:
    """Attention rows (forward grid, or backward with ``diff``: the max abs diff vs cuDNN too).
    FA4 columns say ``n/a`` where FA4 was not importable in the run."""
    head = "| d | causal | s | xsync | cuDNN | SDPA flash | FA4 | xsync / cuDNN | xsync / flash | xsync / FA4 |"
    rule = "|---|---|---|---|---|---|---|---|---|---|"
    out = [head + (" max abs diff vs cuDNN |" if diff else ""), rule + ("---|" if diff else "")]
    for r in rows:
        out.append(f"| {r['d']} | {'yes' if r['causal'] else 'no'} | {r['s'] // 1024}k "
                   f"| {_f(r.get('xsync_tflops'))} | {_f(r.get('sdpa_cudnn_tflops'))} "
                   f"| {_f(r.get('sdpa_flash_tflops'))} | {_f(r.get('fa4_tflops'))} "
                   f"| {_f(r.get('ratio_vs_cudnn'), '{:.2f}')} | {_f(r.get('ratio_vs_flash'), '{:.2f}')} "
                   f"| {_f(r.get('ratio_vs_fa4'), '{:.2f}')} |"
                   + (f" {_f(r.get('max_abs_err_vs_sdpa'), '{:.1e}')} |" if diff else ""))
    return out


def varlen_table(rows) -> list[str]:
    out = ["| causal | xsync | reference | reference TFLOP/s | xsync / reference | nested-jagged SDPA | xsync / nested |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        ref = r["reference"]
        if "reference_fallback" in r:
            ref = f"**{ref}** ({r['reference_fallback']})"
        nested = _f(r.get("nested_sdpa_tflops")) if "nested_sdpa_tflops" in r else \
            f"n/a ({r.get('nested_sdpa_error', 'not measured')[:80]})"
        out.append(f"| {'yes' if r['causal'] else 'no'} | {_f(r['xsync_tflops'])} | {ref} "
                   f"| {_f(r['reference_tflops'])} | {_f(r['ratio_vs_reference'], '{:.2f}')} "
                   f"| {nested} | {_f(r.get('ratio_vs_nested_sdpa'), '{:.2f}')} |")
    return out


def host_table(rows) -> list[str]:
    out = ["| problem | xsync | SDPA (default) | SDPA cuDNN | SDPA flash | xsync / SDPA default | xsync / SDPA cuDNN "
           "| GPU per call from a CUDA graph: xsync / SDPA default | xsync through Triton's launcher |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| b{r['b']} h{r['h']} s{r['s']} d{r['d']} | {_f(r['xsync_attention_wall_us'], '{:.1f}')} "
                   f"| {_f(r.get('sdpa_default_wall_us'), '{:.1f}')} | {_f(r.get('sdpa_cudnn_wall_us'), '{:.1f}')} "
                   f"| {_f(r.get('sdpa_flash_wall_us'), '{:.1f}')} | {_f(r.get('ratio_vs_sdpa_default'), '{:.2f}')} "
                   f"| {_f(r.get('ratio_vs_sdpa_cudnn'), '{:.2f}')} "
                   f"| {_f(r.get('xsync_attention_graph_gpu_us'), '{:.1f}')} / {_f(r.get('sdpa_default_graph_gpu_us'), '{:.1f}')} "
                   f"| {_f(r.get('xsync_attention_via_triton_launcher_wall_us'), '{:.1f}')} |")
    return out


def gemm_table(runs) -> list[str]:
    """Each variant against torch.matmul: the mean of the torch runs just before and after it
    where the run recorded them (``ratio_vs_torch_around``), else of the run's first and last."""
    out = ["| size | variant | C | xsync TFLOP/s | torch.matmul, bf16 C (mean of the runs around it) | xsync / torch |",
           "|---|---|---|---|---|---|"]
    for run in runs:
        size = f"{run['M']}³" if run["M"] == run["N"] == run["K"] else f"{run['M']}×{run['N']}×{run['K']}"
        first_last = (run["torch_matmul"]["tflops"] + run["torch_matmul_after"]["tflops"]) / 2
        for r in run["xsync"]:
            if "error" in r:
                out.append(f"| {size} | {r['variant']} | | refused: {r['error'][:80]} | | |")
                continue
            c = "bf16" if r.get("c_dtype", "float32") == "bfloat16" else "fp32"
            around = r.get("torch_ms_around")
            torch_tflops = r["tflops"] * r["ratio_vs_torch_around"] if around else first_last
            ratio = r.get("ratio_vs_torch_around", r.get("ratio_vs_torch_mean"))
            out.append(f"| {size} | {r['variant']} | {c} | {_f(r['tflops'])} | {_f(torch_tflops)} "
                       f"| {_f(ratio, '{:.2f}')} |")
    return out


def variants_table(rows) -> list[str]:
    out = ["| kernel | variant (same meaning, written differently) | shape | variant TFLOP/s | flagship TFLOP/s | variant / flagship |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        if r["kind"] == "attention":
            shape = f"b{r['b']} h{r['h']} s{r['s'] // 1024}k d{r['d']}{' causal' if r['causal'] else ''}"
        else:
            shape = f"{r['M']}³"
        kernel = "attention" if r["kind"] == "attention" else "gemm"
        if "error" in r:
            out.append(f"| {kernel} | {r['variant']} | {shape} | failed: {r['error'][:80]} | | |")
            continue
        out.append(f"| {kernel} | {r['variant']} | {shape} | {_f(r['tflops'])} | {_f(r['flagship_tflops'])} "
                   f"| {_f(r['ratio_vs_flagship'], '{:.3f}')} |")
    return out


def backward_table(rows) -> list[str]:
    return grid_table(rows, diff=True)


def model_table(rows) -> list[str]:
    out = ["| config | model | layers, hidden, heads / kv heads, head dim | batch x seq | SDPA step ms | xsync step ms "
           "| xsync / SDPA (speed) | loss abs diff | max rel grad diff |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r or "skipped" in r:
            out.append(f"| {r.get('config', '?')} | not measured: {(r.get('error') or r.get('skipped'))[:80]} "
                       "| | | | | | | |")
            continue
        out.append(f"| {r['config']} | {r['model']} | {r['layers']}, {r['hidden']}, {r['heads']} / {r['kv_heads']}, "
                   f"{r['head_dim']} | {r['batch']} x {r['seq']} | {_f(r['sdpa_step_ms'], '{:.1f}')} "
                   f"| {_f(r['xsync_step_ms'], '{:.1f}')} | {_f(r['speed_vs_sdpa'], '{:.2f}')} "
                   f"| {_f(r['loss_abs_diff'], '{:.1e}')} | {_f(r['max_rel_grad_diff'], '{:.1e}')} |")
    return out


def dropin_table(rows) -> list[str]:
    """Three tables: strided (Hugging Face) inputs, the wide head dims, sliding windows."""
    strided = [r for r in rows if r.get("kind") == "strided"]
    wide = [r for r in rows if r.get("kind") in (None, "backward")]
    window = [r for r in rows if r.get("kind") == "window"]
    out = ["| q/k/v as `view(b, s, h, d).transpose(1, 2)` | d | causal | s | strided TFLOP/s "
           "| strided / contiguous (speed) | max abs diff |", "|---|---|---|---|---|---|---|"]
    for r in strided:
        out.append(f"| b{r['b']} h{r['h']} | {r['d']} | {'yes' if r['causal'] else 'no'} | {r['s'] // 1024}k "
                   f"| {_f(r['strided_tflops'])} | {_f(r['ratio_strided_vs_contiguous'], '{:.2f}')} "
                   f"| {_f(r['max_abs_diff'], '{:.1e}')} |")
    out += ["", "| pass | d | causal | s | xsync | cuDNN | FA4 | xsync / cuDNN | xsync / FA4 |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in wide:
        out.append(f"| {'backward' if r.get('kind') == 'backward' else 'forward'} | {r['d']} "
                   f"| {'yes' if r['causal'] else 'no'} | {r['s'] // 1024}k | {_f(r.get('xsync_tflops'))} "
                   f"| {_f(r.get('sdpa_cudnn_tflops'))} | {_f(r.get('fa4_tflops'))} "
                   f"| {_f(r.get('ratio_vs_cudnn'), '{:.2f}')} | {_f(r.get('ratio_vs_fa4'), '{:.2f}')} |")
    out += ["", "| window (keys back) | d | s | xsync TFLOP/s (window's FLOPs) | window / full causal (speed) "
            "| xsync / FA4 window |", "|---|---|---|---|---|---|"]
    for r in window:
        out.append(f"| {r['window']} | {r['d']} | {r['s'] // 1024}k | {_f(r['xsync_window_tflops'])} "
                   f"| {_f(r['window_vs_full_causal_speed'], '{:.2f}')} | {_f(r.get('ratio_vs_fa4'), '{:.2f}')} |")
    return out


def render(data: dict) -> str:
    parts = [BEGIN, "", "_Generated by `python benchmarks/readme_tables.py` from "
             "`benchmarks/results/suite.json` (`python benchmarks/suite.py` on the GPU); TFLOP/s, "
             "same process and tensors as the torch reference._", ""]
    sections = (("grid", "Attention forward, bf16, b·s = 16384, h·d = 2048, TFLOP/s", grid_table),
                ("varlen", "Varlen: 16 packed sequences of 128–8192 tokens, h 16, d 128, TFLOP/s", varlen_table),
                ("host", "Host cost per call, wall µs (back-to-back calls; xsync and the SDPA columns measured in "
                 "alternating rounds, medians, ratios the median of round-by-round ratios; the SDPA cuDNN and flash "
                 "columns include the `with sdpa_kernel(...)` that picks the backend, the default column does not)", host_table),
                ("gemm", "GEMM (kernels/gemm.py), bf16 in, fp32 or bf16 out (torch.matmul: bf16)", gemm_table),
                ("variants", "Rewrites of the flagships that mean the same (docs/design.md), same process", variants_table),
                ("backward", "Attention backward, bf16, FLOPs = 2.5× the forward's, TFLOP/s", backward_table),
                ("model", "Training step of a Hugging Face Llama (transformers), xsync attention vs SDPA, "
                 "forward + backward + optimizer", model_table),
                ("dropin", "Drop-in use: Hugging Face's strided q/k/v, head dims 96 and 256, sliding windows "
                 "(bf16, TFLOP/s)", dropin_table))
    for key, title, fn in sections:
        parts.append(f"**{title}** — " + (_meta_line(data, [key]) or "not measured"))
        parts.append("")
        parts.extend(fn(data[key]) if key in data else ["not measured in the committed run"])
        parts.append("")
    parts.append(END)
    return "\n".join(parts)


def splice(readme: str, block: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} block")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + block + tail


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=DEFAULT_JSON)
    parser.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    with open(args.json) as f:
        data = json.load(f)
    with open(args.readme) as f:
        readme = f.read()
    new = splice(readme, render(data))
    if args.check:
        if new != readme:
            print("README.md's measured tables differ from benchmarks/results/suite.json: "
                  "run `python benchmarks/readme_tables.py`", file=sys.stderr)
            return 1
        return 0
    with open(args.readme, "w") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
