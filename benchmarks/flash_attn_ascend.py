"""Flash attention on Ascend: a cost table on paper (no NPU here), from the lowered kernel.

    python benchmarks/flash_attn_ascend.py [--out DIR]

For d = 128 at s = 4k and 16k (b*s = 16k, h*d = 2048, bf16) it prints, per KV step and per
program, the GM bytes the cross-core hand-offs move, the cube FLOPs, the cross-core syncs and
an estimated time on an Ascend 910B2, for xsync's kernel as lowered now (read from its
allocation and pass log), for xsync 0.1's lowering of the same source, for triton-ascend's
attention tutorial and for a catlass-style inference kernel. Everything is an estimate from
the figures in FIGURES; nothing here ran on an NPU. It writes
``flash_attn_ascend_cost.json`` (and a markdown table) to --out (default
benchmarks/results).

The model, per KV step of one program (one AI core = 1 cube + 2 vector cores):

* GM bytes: every cross-core slot is written once and read once (the two vector cores each
  read their half of the rows). Inputs (K, V) are counted apart: they are shared by all
  programs of a head and mostly come from L2.
* cube time = FLOPs / (cube peak / AI cores); vector time = elementwise operations /
  (2 x vector rate); GM time = bytes / (HBM bandwidth / AI cores), all cores streaming.
* serialized (cube and vector strictly alternate: 1-slot rings, no rotation) =
  cube + vector + GM; overlapped (2-slot rings and the cube's next QK^T issued before this
  block's softmax is awaited) = max(cube, vector, GM).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Figures used (Ascend 910B2, public specifications; see README): state them, change them here.
FIGURES = {
    "chip": "Ascend 910B2",
    "ai_cores": 24,
    "cube_tflops_bf16": 313.0,       # dense fp16/bf16 cube peak, whole chip
    "hbm_tb_per_s": 1.6,             # HBM bandwidth, whole chip
    "vector_gops_per_core": 115.0,   # fp32 elementwise ops per second per vector core (x1e9)
    # elementwise ops per element of one softmax step: scale, mask select (boundary blocks
    # only, ignored), row max, subtract, exp2, row sum, cast; and per output element: rescale
    # (multiply) and add
    "ops_per_score": 6,
    "ops_per_output": 2,
}


@dataclass(frozen=True)
class Design:
    name: str
    rows: int            # query rows per program
    keys: int            # keys per KV step (BN)
    s_bytes: int         # bytes per element of the S hand-off (cube -> vector)
    p_bytes: int         # P (vector -> cube)
    o_bytes: int         # PV or O round trip per output element
    o_trips: float       # how many times per KV step the [rows, D] tile crosses GM (w+r each)
    syncs: int | None    # cross-core set/wait operations per KV step (None: not published)
    overlapped: bool
    note: str


def xsync_design(D: int) -> Design:
    """Read from the kernel as it is lowered for Ascend today."""
    from xsync.kernels.flash_attn import ops
    from xsync.kernels.flash_attn.kernel import attention_fwd

    blocks = ops.block_sizes("ascend")
    cx, dtypes = attention_fwd.specialization()
    cx.update(blocks, D=D, CAUSAL=0)
    low = attention_fwd.lower("ascend", cx, dtypes)
    k = low.kernel
    rings = {r.pipe: r for r in low.allocation.workspace}

    def bytes_per_elem(pipe):
        f = k.sync_object(pipe).fields[0]
        return f.dtype.bytes

    overlapped = "cross-agent-pipeline: applied" in low.passes.text() and \
        all(k.sync_object(p).stages >= 2 for p in ("s_out", "p_in", "pv_out"))
    # per KV step each cross-core pipe hands off once: FULL set + wait, EMPTY set + wait; the
    # cube's sets reach both vector cores and its waits need both
    syncs = 4 * len(rings)
    return Design(f"xsync (this lowering, BM={cx['BM']}x2)", 2 * cx["BM"], cx["BN"],
                  bytes_per_elem("s_out"), bytes_per_elem("p_in"), bytes_per_elem("pv_out"), 1,
                  syncs, overlapped,
                  f"{k.sync_object('s_out').stages}-slot rings; {low.passes.text()}")


def reference_designs() -> list[Design]:
    return [
        Design("xsync 0.1 (BM=64x2, 1-slot rings)", 128, 128, 4, 2, 4, 1, 12, False,
               "the same source before this change: cube and vector strictly alternate"),
        Design("triton-ascend tutorial (BM=64)", 64, 128, 4, 2, 4, 2, None, True,
               "compiler-managed workspaces: acc goes vector->cube (scaled) and cube->vector "
               "(accumulated) every step; the compiler's cv-pipelining overlaps"),
        Design("catlass-style (S 128x512, 3-slot rings)", 128, 512, 4, 2, 4, 1, 12, True,
               "S and P per 512 keys, one PV hand-off per 512 keys, two iterations launched "
               "ahead; 3 flags, each set and waited once per 512 keys (x2 sides)"),
    ]


def step_costs(d: Design, D: int) -> dict:
    f = FIGURES
    keys = d.keys
    gm = 2 * d.rows * keys * (d.s_bytes + d.p_bytes) + 2 * d.rows * D * d.o_bytes * d.o_trips
    flops = 4 * d.rows * keys * D
    inputs = 2 * keys * D * 2
    cube_s = flops / (f["cube_tflops_bf16"] * 1e12 / f["ai_cores"])
    vec_s = (d.rows * keys * f["ops_per_score"] + d.rows * D * f["ops_per_output"]) / \
        (2 * f["vector_gops_per_core"] * 1e9)
    gm_s = gm / (f["hbm_tb_per_s"] * 1e12 / f["ai_cores"])
    serial, overlap = cube_s + vec_s + gm_s, max(cube_s, vec_s, gm_s)
    t = overlap if d.overlapped else serial
    # normalised to 128 keys, so designs with other BN compare per key block
    per128 = 128 / keys
    return {"gm_bytes": gm * per128, "gm_bytes_per_128_rows": gm * per128 * 128 / d.rows,
            "input_bytes": inputs * per128, "cube_flops": flops * per128,
            "syncs": None if d.syncs is None else d.syncs * per128, "cube_us": cube_s * per128 * 1e6,
            "vector_us": vec_s * per128 * 1e6, "gm_us": gm_s * per128 * 1e6,
            "serialized_us": serial * per128 * 1e6, "overlapped_us": overlap * per128 * 1e6,
            "step_us": t * per128 * 1e6, "bound": max((cube_s, "cube"), (vec_s, "vector"),
                                                      (gm_s, "GM"))[1]}


def problem(d: Design, s: int, D: int = 128) -> dict:
    b, h = 16384 // s, 2048 // D
    step = step_costs(d, D)
    tiles = math.ceil(s / d.rows) * b * h
    programs = min(tiles, FIGURES["ai_cores"])
    steps_per_tile = s / 128                                   # non-causal, in 128-key blocks
    steps_per_program = math.ceil(tiles / programs) * steps_per_tile
    seconds = steps_per_program * step["step_us"] * 1e-6
    flops = 4 * b * h * s * s * D
    return {"s": s, "d": D, "tiles": tiles, "programs": programs,
            "kv_steps_per_program": steps_per_program,
            "gm_bytes_per_program": steps_per_program * step["gm_bytes"],
            "est_ms": seconds * 1e3, "est_tflops": flops / seconds / 1e12, "step": step}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = ap.parse_args(argv)
    D = 128
    designs = [xsync_design(D)] + reference_designs()
    rows, table = [], []
    header = ("| design | s | rows/program | GM KB per KV step (per 128 rows) | cube MFLOP | syncs | "
              "cube / vector / GM µs | serialized / overlapped µs | schedule | est. TFLOP/s |")
    table += ["Estimated on paper (no NPU): Ascend 910B2 figures "
              f"{FIGURES['ai_cores']} AI cores, {FIGURES['cube_tflops_bf16']:g} TFLOP/s bf16 cube, "
              f"{FIGURES['hbm_tb_per_s']:g} TB/s HBM, {FIGURES['vector_gops_per_core']:g} Gop/s "
              "per vector core; d = 128, non-causal, b*s = 16k, h*d = 2048; per KV step of 128 keys. "
              "GM time assumes every hand-off goes to HBM (an upper bound: workspaces written and "
              "read back at once mostly stay in L2).",
              "", header, "|" + "---|" * 10]
    for dsn in designs:
        for s in (4096, 16384):
            p = problem(dsn, s, D)
            st = p["step"]
            syncs = "n/a" if st["syncs"] is None else f"{st['syncs']:.0f}"
            rows.append({"design": asdict(dsn), **p})
            table.append(
                f"| {dsn.name} | {s // 1024}k | "
                f"{dsn.rows} | {st['gm_bytes'] / 1024:.0f} ({st['gm_bytes_per_128_rows'] / 1024:.0f}) | "
                f"{st['cube_flops'] / 1e6:.1f} | {syncs} | "
                f"{st['cube_us']:.2f} / {st['vector_us']:.2f} / {st['gm_us']:.2f} | "
                f"{st['serialized_us']:.2f} / {st['overlapped_us']:.2f} | "
                f"{'overlapped' if dsn.overlapped else 'serialized'} ({st['bound']}-bound) | "
                f"{p['est_tflops']:.0f} |")
    text = "\n".join(table)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "flash_attn_ascend_cost.json"), "w") as f:
        json.dump({"figures": FIGURES, "measured": False, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "flash_attn_ascend_cost.md"), "w") as f:
        f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
