"""Snapshot of the Hopper renderer's output: the Gluon source of every kernel and pass-option
specialization the tests and ops use, rendered without compiling (no GPU, no ptxas).

    python -m tests.nvidia.render_snapshot            # compare with the golden hashes
    python -m tests.nvidia.render_snapshot --write    # record them (tests/nvidia/render_snapshot.json)
    python -m tests.nvidia.render_snapshot --dump DIR # also write every source to DIR/<case>.py

A refactor of the renderer must leave every hash unchanged (byte-identical Gluon source).
The source is the one ``compile_ptx`` compiles: the same option resolution and occupancy
defaults (xsync.backends.nvidia), hang-debug sources with a fixed ``bars_smem``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field

GOLDEN = os.path.join(os.path.dirname(__file__), "render_snapshot.json")


@dataclass(frozen=True)
class Case:
    name: str
    kernel: object
    constexprs: dict | None = None          # None: the kernel's example=
    settings: dict = field(default_factory=dict)   # xs.options(...) while lowering
    options: dict = field(default_factory=dict)    # renderer options (compile_ptx's options=)


def cases() -> list[Case]:
    import xsync as xs
    from tests.nvidia import nv_kernels
    from xsync.kernel import Kernel
    from xsync.kernels import gemm_variants
    from xsync.kernels.flash_attn import attention_fwd, grad, ops, schedule, variants
    from xsync.kernels.flash_attn.backward import attention_bwd_dkdv, attention_bwd_dq, attention_bwd_preprocess
    from xsync.kernels.gemm import gemm, gemm_persistent
    from xsync.kernels.gemm_softmax import gemm_softmax

    out: list[Case] = []
    # every kernel at its example specialization
    gvars = [(n, v) for n, v in sorted(vars(gemm_variants).items()) if isinstance(v, Kernel)]
    examples = [gemm, gemm_persistent, gemm_softmax, attention_fwd, attention_bwd_preprocess,
                attention_bwd_dkdv, attention_bwd_dq, nv_kernels.handoff, nv_kernels.shared_partition_barrier]
    for n, k in [(k.fn.__name__, k) for k in examples] + gvars:
        out.append(Case(f"example-{n}", k))
    # GEMM stages, option switches (tests/nvidia/test_compile.py)
    for stages in (1, 2, 3, 4):
        out.append(Case(f"gemm-stages{stages}", gemm, dict(BM=128, BN=128, BK=64, STAGES=stages)))
    g2 = dict(BM=128, BN=128, BK=64, STAGES=2)
    out.append(Case("gemm-stages2-defer-off", gemm, g2, {"nv_defer_mma_wait": False}))
    out.append(Case("gemm-stages2-producer-regs32", gemm, g2, {}, {"producer_regs": 32}))
    for k in (gemm, gemm_softmax, nv_kernels.handoff):
        out.append(Case(f"debug-hang-{k.fn.__name__}", k, None, {}, {"debug_hang": True, "bars_smem": 1024}))
    # a kernel the verifier rejects (it hangs on purpose): rendered with verification off
    out.append(Case("debug-hang-gemm_extra_wait", nv_kernels.gemm_extra_wait, None, {"verify": False},
                    {"debug_hang": True, "bars_smem": 1024}))
    g3 = dict(BM=128, BN=128, BK=64, STAGES=3)
    for n, v in [("gemm", gemm)] + gvars:
        for merge in (True, False):
            out.append(Case(f"gemm3-{n}-merge{int(merge)}", v, g3, {"nv_merge_pipes": merge}))
    # attention forward: every Hopper schedule of the table, at the head dims and masks its
    # rows take it for (a d64 row's Q ring may not fit beside d128's K/V ring)
    cx0, _ = attention_fwd.specialization()
    # (PERSISTENT=0 rows compile without the tile loop: xs.tile_range's single-tile form)
    seen = set()
    for r in schedule.TABLE:
        if r.backend != "nvidia":
            continue
        s = r.schedule
        for d in ([r.head_dim] if r.head_dim else ops.HEAD_DIMS):
            for causal in ([int(r.causal)] if r.causal is not None else (0, 1)):
                name = f"fwd-R{s.replicas}-BM{s.BM}-BN{s.BN}-S{s.STAGES}-P{int(s.persistent)}-Q{s.q_stages}-d{d}-c{causal}"
                if name not in seen:
                    seen.add(name)
                    cx = {**cx0, **s.forward_constexprs(), **ops.scale_constexprs(None), "D": d, "CAUSAL": causal}
                    out.append(Case(name, attention_fwd, cx))
    # attention variants at the flagship's specialization (tests/nvidia/test_variants.py)
    cxf = {**cx0, **ops.block_sizes("nvidia"), "D": 128, "CAUSAL": 0}
    for name, v in sorted(variants.VARIANTS.items()):
        for merge in (True, False):
            out.append(Case(f"variant-{name}-merge{int(merge)}", v, cxf, {"nv_merge_pipes": merge}))
    out.append(Case("fwd-flagship-merge0", attention_fwd, cxf, {"nv_merge_pipes": False}))
    # pass options on the attention forward (test_compile.py's specialization and the flagship's)
    cxt = {**cx0, "BM": 64, "BN": 128, "D": 128, "CAUSAL": 1, "STAGES": 2}
    for tag, cx in (("s2", cxt), ("flagship", cxf)):
        for pp in ("each", "first", "wrap", "0"):
            for ov in (True, False):
                out.append(Case(f"fwd-{tag}-pingpong-{pp}-overlap{int(ov)}", attention_fwd, cx,
                                {"nv_pingpong": pp, "nv_overlap": ov}))
        out.append(Case(f"fwd-{tag}-fuse-off", attention_fwd, cx, {"nv_fuse_mma": False}))
        out.append(Case(f"fwd-{tag}-fuse-off-overlap1", attention_fwd, cx, {"nv_fuse_mma": False, "nv_overlap": True}))
        out.append(Case(f"fwd-{tag}-merge-off", attention_fwd, cx, {"nv_merge_pipes": False}))
        out.append(Case(f"fwd-{tag}-defer-off", attention_fwd, cx, {"nv_defer_mma_wait": False}))
        out.append(Case(f"fwd-{tag}-debug-hang", attention_fwd, cx, {}, {"debug_hang": True, "bars_smem": 1024}))
    # attention backward at every specialization grad.py launches
    for d in ops.HEAD_DIMS:
        out.append(Case(f"bwd-preprocess-d{d}", attention_bwd_preprocess,
                        {**attention_bwd_preprocess.specialization()[0], "D": d}))
        for k in (attention_bwd_dkdv, attention_bwd_dq):
            for causal in (0, 1):
                cx = {**k.specialization()[0], **grad.block_sizes("nvidia", d, bool(causal)), "D": d, "CAUSAL": causal}
                out.append(Case(f"bwd-{k.fn.__name__}-d{d}-c{causal}", k, cx))
    names = [c.name for c in out]
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    return out


def render_case(case: Case) -> str:
    """The Gluon source compile_ptx would compile for this case."""
    import xsync as xs
    from xsync.backends.nvidia import occupancy_defaults, resolve_options
    from xsync.backends.nvidia.render import render

    with xs.options(**case.settings):
        lowered = case.kernel.lower("nvidia", case.constexprs)
        args = (lowered.kernel, lowered.placement, lowered.allocation)
        opts = occupancy_defaults(*args, resolve_options(case.options))
        return render(*args, opts).source


_KERNEL_FILE = re.compile(r"\(([^()]+\.py):(\d+)\)")


def portable(src: str) -> str:
    """The source with the kernel file's path (in the header comment) cut to the part from
    its ``kernels/`` or ``tests/`` folder on, so a clone elsewhere, or an installed package,
    hashes the same."""
    def cut(m):
        path = m.group(1)
        at = max(path.rfind("/kernels/"), path.rfind("/tests/"))
        return f"({path[at + 1:] if at >= 0 else path}:{m.group(2)})"
    return _KERNEL_FILE.sub(cut, src, count=1)


def snapshot(dump: str | None = None) -> dict[str, str]:
    hashes = {}
    for case in cases():
        src = render_case(case)
        hashes[case.name] = hashlib.sha256(portable(src).encode()).hexdigest()
        if dump:
            with open(os.path.join(dump, case.name + ".py"), "w") as f:
                f.write(src)
    return hashes


def compare(got: dict[str, str], golden: dict[str, str]) -> list[str]:
    """Lines naming every case whose source differs from (or is missing in) the golden file."""
    out = [f"changed: {n}" for n in sorted(golden) if n in got and got[n] != golden[n]]
    out += [f"missing: {n}" for n in sorted(golden) if n not in got]
    out += [f"new (not in the golden file): {n}" for n in sorted(got) if n not in golden]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="record the golden hashes")
    ap.add_argument("--dump", help="write every source to this folder")
    a = ap.parse_args(argv)
    if a.dump:
        os.makedirs(a.dump, exist_ok=True)
    got = snapshot(a.dump)
    if a.write:
        with open(GOLDEN, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {len(got)} hashes to {GOLDEN}")
        return 0
    with open(GOLDEN) as f:
        golden = json.load(f)
    diff = compare(got, golden)
    print(f"{len(got)} sources, {len(golden)} golden hashes, {len(diff)} differences")
    for line in diff:
        print("  " + line)
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
