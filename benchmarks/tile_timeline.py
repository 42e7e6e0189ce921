"""Where a tile's time goes on the H200: clock64 marks in the generated attention kernel.

The per-tile cost that short sequences pay (a prologue, an epilogue, the scalar loads of the
tile table) does not show in TFLOP/s. This inserts marks into the generated Gluon source of the
forward kernel (its consumer warpgroups, the K/V producer and the Q producers), launches it as
the ops do, and reports per span the median over every program's tiles (first and last tile of
each program left out), in SM cycles (~1.98 GHz on the H200 when busy):

    consumer r (r = 0, 1):  top -> scalars loaded (the loop bound) -> Q slot waited -> first
        K/V slot waited -> first S done -> first softmax -> key loop (last PV included)
        -> epilogue [normalize -> TMA store_wait -> staging store + TMA issue -> LSE store]
        -> next tile's top
    producer:  its scalars, the span of its issues, its lead over the consumer

A mark is a volatile inline-asm ``mov %clock64`` + ``st.global`` (every thread of the
partition stores the same slot): it orders against memory and synchronization operations, not
against arithmetic, which the compilers may move across it, so a span between arithmetic is
approximate. The marks cost about 2% of the kernel's time. Persistent schedules only (the marks
index the tile loop's iterations); the source edits are keyed to the renderer's spelling and
fail loudly where it changed.

    PYTHONPATH=. python3 benchmarks/tile_timeline.py --shapes 64:0:1024,128:1:1024 --out DIR

Writes tile_timeline.json under --out (the medians and two programs' raw marks per shape).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks._gpu import cuda_missing  # noqa: E402 - after the source tree is on sys.path

POINTS = 32            # mark slots per tile: 12 per consumer replica, then the producers'
ITERATIONS = 80        # tiles per program the buffer holds
PROGRAMS = 4096
CONSUMER = 12
LOAD, Q_LOAD = 24, 28

MARK = '''
XS_TL_BASE = gl.constexpr({base})


@gluon.jit
def xs_tl_mark(point: gl.constexpr, tile, dep):
    """clock64 of this partition at ``point`` of its ``tile`` (``dep``: a value to wait for)."""
    it = (tile - gl.program_id(0)) // gl.num_programs(0)
    addr = XS_TL_BASE + ((gl.program_id(0).to(gl.int64) * {iterations} + it) * {points} + point) * 8
    gl.inline_asm_elementwise("{{ .reg .u64 t; mov.u64 t, %clock64; st.global.u64 [$1], t; }} mov.b32 $0, $2;",
                              "=r,l,r,~{{memory}}", [addr, dep], dtype=gl.int32, is_pure=False, pack=1)

'''

# (line pattern, its indentation, where the mark goes, mark point, dependency)
CONSUMER_MARKS = (
    (r"for tile in range", 4, "after", 0, "tile"),
    (r"# role 'mma'", 12, "before", 1, "hi"),
    (r"q_in_waited \+= 1", 12, "after", 2, "tile"),
    (r"_waited \+= 1", 16, "after", 3, "tile"),
    (r"s, _, _ = warpgroup_mma_wait\(0", 16, "after", 4, "tile"),
    (r"for n in range\(0 \+ BN, hi, BN\)", 16, "before", 5, "tile"),
    (r"mbarrier.arrive\(xs_bars.index\(Q_IN_EMPTY", 12, "before", 6, "tile"),
    (r"out = gl.where\(", 12, "after", 8, "tile"),
    (r"tma.store_wait\(0\)  # this partition", 16, "after", 9, "tile"),
    (r"xs_tma_store\(o_store_desc", 16, "after", 10, "tile"),
    (r"gl.store\(lse \+", 12, "after", 7, "tile"),
)
LOAD_MARKS = (
    (r"for tile in range", 4, "after", LOAD, "tile"),
    (r"for n in range\(0, hi, BN\)", 12, "before", LOAD + 1, "hi"),
    (r"commit\(\) -- the TMA engine", 16, "after-loop", LOAD + 3, "tile"),
)
Q_LOAD_MARKS = (
    (r"for tile in range", 4, "after", Q_LOAD, "tile"),
    (r"q_in_acquired \+= 1", 12, "after", Q_LOAD + 1, "tile"),
)


def _function(lines, name):
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {name}("))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("@gluon.jit")), len(lines))
    return start, end


def instrument(source: str, base: int) -> str:
    """``source`` (the generated attention_fwd module) with the marks inserted."""
    lines = source.split("\n")
    inserts = []
    for function, marks, replica in (("attention_fwd_consumer", CONSUMER_MARKS, f"REPLICA * {CONSUMER} + "),
                                     ("attention_fwd_load", LOAD_MARKS, ""),
                                     ("attention_fwd_q_load", Q_LOAD_MARKS, "REPLICA * 2 + ")):
        start, end = _function(lines, function)
        for pattern, indent, where, point, dep in marks:
            hits = [i for i in range(start, end) if re.search(pattern, lines[i])
                    and len(lines[i]) - len(lines[i].lstrip()) == indent]
            if not hits:
                if pattern.startswith(("tma.store_wait", "xs_tma_store")):
                    continue       # no TMA-store epilogue in this specialization
                raise SystemExit(f"tile_timeline: no line matches {pattern!r} in {function}: "
                                 f"the renderer's spelling changed; update the marks")
            at = hits[-1] + 1 if where == "after-loop" else hits[0] + (where == "after")
            # a mark after a loop header goes into its body; after a loop's last line, out of it
            header = lines[hits[0]].split("  #")[0].rstrip().endswith(":")
            pad = indent - 4 if where == "after-loop" else indent + 4 * (where == "after" and header)
            inserts.append((at, " " * pad + f"xs_tl_mark({replica}{point}, tile, {dep})"))
    for at, text in sorted(inserts, key=lambda item: -item[0]):
        lines.insert(at, text)
    out = "\n".join(lines)
    anchor = "@gluon.jit\ndef attention_fwd_load"
    return out.replace(anchor, MARK.format(base=base, iterations=ITERATIONS, points=POINTS) + anchor, 1)


def _spans(marks, programs, tiles):
    """Median / p10 / p90 per span over the programs' middle tiles."""
    spans: dict[str, list[int]] = {}

    def add(name, value):
        spans.setdefault(name, []).append(int(value))
    for p in range(programs):
        n = len(range(p, tiles, programs))
        for it in range(1, n - 1):
            t, nxt = marks[p][it], marks[p][it + 1]
            for r in (0, 1):
                o = CONSUMER * r
                add(f"consumer{r} scalars", t[o + 1] - t[o])
                add(f"consumer{r} Q wait", t[o + 2] - t[o + 1])
                add(f"consumer{r} first K/V wait", t[o + 3] - t[o + 2])
                add(f"consumer{r} first S", t[o + 4] - t[o + 3])
                add(f"consumer{r} first softmax", t[o + 5] - t[o + 4])
                add(f"consumer{r} key loop", t[o + 6] - t[o + 5])
                add(f"consumer{r} epilogue", t[o + 7] - t[o + 6])
                if t[o + 10]:
                    add(f"consumer{r}   normalize", t[o + 8] - t[o + 6])
                    add(f"consumer{r}   TMA store_wait", t[o + 9] - t[o + 8])
                    add(f"consumer{r}   staging + TMA issue", t[o + 10] - t[o + 9])
                    add(f"consumer{r}   LSE", t[o + 7] - t[o + 10])
                add(f"consumer{r} to next tile", nxt[o] - t[o + 7])
                add(f"consumer{r} tile", nxt[o] - t[o])
            add("producer scalars", t[LOAD + 1] - t[LOAD])
            add("producer issue span", t[LOAD + 3] - t[LOAD + 1])
            add("producer lead (consumer0 first K/V - producer first issue)", t[3] - t[LOAD + 1])
            add("Q producer0 slot acquired vs consumer0 top", t[Q_LOAD + 1] - t[0])
    return {k: dict(median=statistics.median(v), p10=sorted(v)[len(v) // 10], p90=sorted(v)[9 * len(v) // 10])
            for k, v in spans.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="64:0:1024,64:1:1024,128:0:1024,128:1:1024",
                        help="d:causal:s,... (b*s = 16k, h*d = 2048, as the grid)")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = parser.parse_args(argv)
    import torch
    import triton.testing
    if cuda_missing(__file__):
        return 2
    import xsync.backends.nvidia.modules as nv
    from xsync.kernels.flash_attn import ops, schedule

    # one buffer for the process: a kernel compiled for one shape keeps its address
    marks = torch.zeros(PROGRAMS * ITERATIONS * POINTS, dtype=torch.int64, device="cuda")
    load_module = nv.load_module

    def instrumented(name, source):
        return load_module(name, instrument(source, marks.data_ptr()) if name == "attention_fwd" else source)
    nv.load_module = instrumented
    rows = []
    for d, causal, s in (tuple(int(x) for x in item.split(":")) for item in args.shapes.split(",")):
        causal = bool(causal)
        b, h = 16384 // s, 2048 // d
        plan = schedule.lookup("nvidia", d, causal, s)
        if not plan.persistent:
            print(f"d={d} causal={causal} s={s}: {plan} has no tile loop to mark; skipped")
            continue
        tiles = -(-s // plan.tile_rows) * b * h
        programs = ops.programs("nvidia", tiles, plan.persistent, torch.device("cuda"))
        if -(-tiles // programs) > ITERATIONS:
            print(f"d={d} causal={causal} s={s}: more than {ITERATIONS} tiles a program; skipped")
            continue
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o = ops.attention(q, k, v, causal=causal)
        o = o[0] if isinstance(o, tuple) else o
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        err = (o.float() - ref.float()).abs().max().item()
        ms = triton.testing.do_bench(lambda: ops.attention(q, k, v, causal=causal), warmup=50, rep=300)
        marks.zero_()
        ops.attention(q, k, v, causal=causal)
        torch.cuda.synchronize()
        got = marks[:programs * ITERATIONS * POINTS].view(programs, ITERATIONS, POINTS).cpu().tolist()
        flop = 4.0 * b * h * s * s * d / (2 if causal else 1)
        spans = _spans(got, programs, tiles)
        print(f"== d={d} causal={causal} s={s} {plan} programs={programs} max_abs_err={err:.4f} "
              f"{ms * 1e3:.1f} us {flop / ms / 1e9:.0f} TFLOP/s (marked)")
        for name, v in spans.items():
            print(f"  {name:58s} {v['median']:8.0f}  [{v['p10']:.0f}, {v['p90']:.0f}]")
        rows.append(dict(d=d, causal=causal, s=s, schedule=str(plan), programs=programs,
                         max_abs_err_vs_sdpa=err, ms=ms, tflops_marked=flop / ms / 1e9, spans=spans,
                         raw=[got[p][:len(range(p, tiles, programs))] for p in (0, 1)]))
    os.makedirs(args.out, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                unit="SM cycles (clock64)")
    with open(os.path.join(args.out, "tile_timeline.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
