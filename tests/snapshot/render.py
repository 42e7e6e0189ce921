"""Snapshot of every renderer's output: the generated Gluon (nvidia), triton-ascend (ascend, both
source forms) and CPU-emulator (both schedulers) source of every library kernel at every
specialization the tests and ops use, rendered without compiling (pure text: no triton, no GPU).

    python -m tests.snapshot.render                       # compare with the golden hashes
    python -m tests.snapshot.render --write               # record them (tests/snapshot/<backend>.json)
    python -m tests.snapshot.render --dump DIR            # also write every source to DIR/<backend>/<case>.py
    python -m tests.snapshot.render --backend ascend ...  # one backend only

A refactor of lowering or of a renderer must leave every hash unchanged (byte-identical
source). The nvidia source is the one ``compile_ptx`` compiles (the same option resolution and
occupancy defaults, hang-debug sources with a fixed ``bars_smem``); the ascend source is the one
``compile_kernel`` writes for a form; the cpu source is the one the emulator executes.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field

HERE = os.path.dirname(__file__)
BACKENDS = ("nvidia", "ascend", "cpu")


def golden_path(backend: str) -> str:
    return os.path.join(HERE, f"{backend}.json")


@dataclass(frozen=True)
class Case:
    name: str
    kernel: object
    constexprs: dict | None = None                  # None: the kernel's example=
    settings: dict = field(default_factory=dict)    # xs.options(...) while lowering and rendering
    # nvidia option fields (compile_ptx's options=): the RenderOptions ones are rendered with;
    # a LowerOptions one (producer_regs) changes what compile_ptx lowers, not this source
    options: dict = field(default_factory=dict)


def _library():
    """(examples, gemm variants, attention variants): every library kernel object."""
    from xsync.compiler import Kernel
    from xsync.kernels import gemm_variants
    from xsync.kernels.flash_attn import attention_fwd, variants
    from xsync.kernels.flash_attn.backward import attention_bwd_dkdv, attention_bwd_dq, attention_bwd_preprocess
    from xsync.kernels.gemm import gemm, gemm_persistent
    from xsync.kernels.gemm_softmax import gemm_softmax

    gvars = [(n, v) for n, v in sorted(vars(gemm_variants).items()) if isinstance(v, Kernel)]
    examples = [gemm, gemm_persistent, gemm_softmax, attention_fwd, attention_bwd_preprocess,
                attention_bwd_dkdv, attention_bwd_dq]
    return examples, gvars, sorted(variants.VARIANTS.items())


def _example_cases() -> list[Case]:
    """kernels/examples/ at the specializations its torch functions launch with (every ACT)."""
    from xsync.kernels import examples as ex

    out = [Case(f"ex-gemm_bias_act-act{act}", ex.gemm_bias_act,
                {**ex.gemm_bias_act.specialization()[0], "ACT": act}) for act in (0, 1, 2)]
    out += [Case(f"ex-{k.fn.__name__}", k) for k in (ex.gemm_split_k, ex.rmsnorm_fwd, ex.rmsnorm_bwd,
                                                      ex.layernorm_fwd, ex.layernorm_bwd, ex.softmax_rows)]
    return out


def _attention_cases(backend: str) -> list[Case]:
    """The forward at every schedule row of ``backend`` (its head dims and masks) and the backward
    at every specialization grad.py launches there."""
    from xsync.kernels.flash_attn import attention_fwd, grad, ops, schedule
    from xsync.kernels.flash_attn.backward import attention_bwd_dkdv, attention_bwd_dq, attention_bwd_preprocess

    out: list[Case] = []
    cx0, _ = attention_fwd.specialization()
    seen = set()
    def shadowed(i: int, d: int, causal: int) -> bool:
        # an earlier row of d's tile width that takes every length: lookup never reaches row i
        # (unless as that row's fallback schedule)
        width, row = ops.tile_dim(d), schedule.TABLE[i]
        return any(e.backend == backend and e.head_dim == width and e.max_seq is None
                   and e.causal in (None, bool(causal)) and e.schedule.fallback != row.schedule
                   for e in schedule.TABLE[:i])

    for i, r in enumerate(schedule.TABLE):
        if r.backend != backend:
            continue
        s = r.schedule
        for d in ([r.head_dim] if r.head_dim else ops.HEAD_DIMS):
            for causal in ([int(r.causal)] if r.causal is not None else (0, 1)):
                if shadowed(i, d, causal):
                    continue
                name = (f"fwd-R{s.replicas}-BM{s.BM}-BN{s.BN}-S{s.STAGES}-P{int(s.persistent)}"
                        f"-Q{s.q_stages}-d{d}-c{causal}")
                if name not in seen:
                    seen.add(name)
                    cx = {**cx0, **s.forward_constexprs(), **ops.scale_constexprs(None),
                          **ops.dim_constexprs(d), "CAUSAL": causal}
                    out.append(Case(name, attention_fwd, cx))
    for d in ops.HEAD_DIMS:
        out.append(Case(f"bwd-preprocess-d{d}", attention_bwd_preprocess,
                        {**attention_bwd_preprocess.specialization()[0], "BM": grad.preprocess_bm(d),
                         **ops.dim_constexprs(d)}))
        for k in (attention_bwd_dkdv, attention_bwd_dq):
            for causal in (0, 1):
                for max_seq in ((0, 4096) if backend == "cpu" else (0,)):
                    cx = {**k.specialization()[0], **grad.block_sizes(backend, d, bool(causal), max_seq, k is attention_bwd_dq),
                          **ops.dim_constexprs(d), "CAUSAL": causal}
                    tag = f"-long" if max_seq else ""
                    out.append(Case(f"bwd-{k.fn.__name__}-d{d}-c{causal}{tag}", k, cx))
                    # dQ fused (grad.fused_dq), where selected or not; Hopper d256 refuses it
                    # (shared memory: tests/core/test_backward_fused_dq.py)
                    if k is attention_bwd_dkdv and not (backend == "nvidia" and d == 256):
                        cx = {**cx, **grad.fused_block_sizes(backend, d, bool(causal), max_seq)}
                        out.append(Case(f"bwd-{k.fn.__name__}-fused-dq-d{d}-c{causal}{tag}", k, cx))
    # the sliding-window specializations (WINDOW=1: kernels/flash_attn/window.py)
    for d in (64, 128):
        win = {**ops.dim_constexprs(d), "CAUSAL": 0, "WINDOW": 1}
        out.append(Case(f"fwd-window-d{d}", attention_fwd, {**cx0, **ops.block_sizes(backend, d, window=True), **win}))
        for k in (attention_bwd_dkdv, attention_bwd_dq):
            cx = {**k.specialization()[0], **grad.block_sizes(backend, d), **win}
            out.append(Case(f"bwd-{k.fn.__name__}-window-d{d}", k, cx))
        cx = {**attention_bwd_dkdv.specialization()[0], **grad.fused_block_sizes(backend, d), **win}
        out.append(Case(f"bwd-attention_bwd_dkdv-fused-dq-window-d{d}", attention_bwd_dkdv, cx))
    return out


def nvidia_cases() -> list[Case]:
    from tests.nvidia import nv_kernels
    from xsync.kernels.flash_attn import attention_fwd, ops
    from xsync.kernels.gemm import gemm
    from xsync.kernels.gemm_softmax import gemm_softmax

    examples, gvars, avariants = _library()
    out: list[Case] = []
    for k in examples + [nv_kernels.handoff, nv_kernels.shared_partition_barrier]:
        out.append(Case(f"example-{k.fn.__name__}", k))
    for n, k in gvars:
        out.append(Case(f"example-{n}", k))
    from tests.core import holding_kernels   # split counters, an interleaved ring (issue 39.2)
    out += [Case(f"holding-{k.fn.__name__}", k) for k in (holding_kernels.pair_sums, holding_kernels.interleaved_gemm)]
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
    out += _attention_cases("nvidia")
    out += _example_cases()
    out += _many_to_one_cases()
    cx0, _ = attention_fwd.specialization()
    cxf = {**cx0, **ops.block_sizes("nvidia"), "D": 128, "CAUSAL": 0}
    for name, v in avariants:
        for merge in (True, False):
            out.append(Case(f"variant-{name}-merge{int(merge)}", v, cxf, {"nv_merge_pipes": merge}))
    out.append(Case("fwd-flagship-merge0", attention_fwd, cxf, {"nv_merge_pipes": False}))
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
        out.append(Case(f"fwd-{tag}-prefetch", attention_fwd, cx, {"nv_prefetch_tile_scalars": True}))
        for share in ("1/4", "1/2"):
            out.append(Case(f"fwd-{tag}-exp2-{share.replace('/', '_')}", attention_fwd, cx, {"nv_exp2_fma": share}))
        out.append(Case(f"fwd-{tag}-tma-store-off", attention_fwd, cx, {"nv_tma_store": False}))
        out.append(Case(f"fwd-{tag}-regs", attention_fwd, cx, {"nv_producer_regs": 40, "nv_consumer_regs": 232,
                                                              "nv_maxnreg": 168}))
    return out


def _many_to_one_cases() -> list[Case]:
    """N -> 1 pipes (tests/core/many_to_one_kernels.py)."""
    from tests.core import many_to_one_kernels as m
    return [Case(f"m2o-{k.fn.__name__}", k) for k in (m.gemm_split_k_gather, m.row_sum_gather)] + \
        [Case("m2o-scaled_mma_gather", m.scaled_mma_gather, dict(BM=64, BN=64, BK=32)),
         Case("m2o-pair_sum_gather", m.pair_sum_gather), Case("m2o-copy_gather_into_mma", m.copy_gather_into_mma)]


def _example_constexprs(kernel, backend: str) -> dict | None:
    """None (the kernel's example=), except the attention backward kernels on Ascend: there at
    the Ascend schedule's tiles, since the example's (Hopper's) overflow the cube's L0C
    (xsync/backends/ascend/memory.py rule 7) as they do in the HIVM compiler."""
    from xsync.kernels.flash_attn import grad
    from xsync.kernels.flash_attn.backward import attention_bwd_dkdv, attention_bwd_dq

    if backend != "ascend" or kernel not in (attention_bwd_dkdv, attention_bwd_dq):
        return None
    return {**kernel.specialization()[0], **grad.block_sizes("ascend", 128)}


def _portable_cases(backend: str, settings_variants: list[tuple[str, dict]]) -> list[Case]:
    from tests.core import corpus, holding_kernels
    from xsync.compiler import Kernel
    from xsync.kernels.flash_attn import attention_fwd, ops

    examples, gvars, avariants = _library()
    base: list[Case] = [Case(f"example-{k.fn.__name__}", k, _example_constexprs(k, backend)) for k in examples]
    base += [Case(f"example-{n}", k) for n, k in gvars]
    base += _attention_cases(backend)
    base += _example_cases()
    cx0, _ = attention_fwd.specialization()
    cxf = {**cx0, **ops.block_sizes(backend), "D": 128, "CAUSAL": 0}
    if backend == "ascend":
        # 128 rows x 128 keys: the accumulate form keeps the softmax on the cube, whose L1 does
        # not hold the d128 schedule's 512-key S, P and x tiles (750 KB, memory.py)
        cxf.update(BM=64, BN=128, REPLICAS=2)
    base += [Case(f"variant-{n}", v, cxf) for n, v in avariants]
    # the verifier's corpus (correct and broken kernels, rendered unverified): every construct
    # the renderers spell, and the lowering errors some of them meet on this backend
    base += [Case(f"corpus-{n}", k) for n, k in sorted(vars(corpus).items()) if isinstance(k, Kernel)]
    # holding several slots and interleaved rings (issue 39.2)
    base += [Case(f"holding-{n}", k) for n, k in sorted(vars(holding_kernels).items()) if isinstance(k, Kernel)]
    base += _many_to_one_cases()
    out = []
    for tag, settings in settings_variants:
        out += [Case(f"{c.name}-{tag}", c.kernel, c.constexprs, {**c.settings, **settings}) for c in base]
    return out


def ascend_cases() -> list[Case]:
    return _portable_cases("ascend", [("release", {"ascend_form": "release"}), ("scope", {"ascend_form": "scope"})])


def cpu_cases() -> list[Case]:
    return _portable_cases("cpu", [("threads", {"cpu_mode": "threads"}), ("coop", {"cpu_mode": "cooperative"})])


CASES = {"nvidia": nvidia_cases, "ascend": ascend_cases, "cpu": cpu_cases}


def render_case(backend: str, case: Case) -> str:
    """The generated source of ``case`` on ``backend``."""
    import xsync as xs

    # the verifier's verdicts have tests of their own (corpus, differential); rendering does
    # not depend on them
    with xs.options(**{"verify": False, **case.settings}):
        lowered = case.kernel.lower(backend, case.constexprs)
        args = (lowered.kernel, lowered.placement, lowered.allocation)
        if backend == "nvidia":
            from xsync import config
            from xsync.backends.nvidia import NVIDIA
            from xsync.backends.nvidia.render import render
            given = {k: v for k, v in case.options.items() if k in NVIDIA.RenderOptions.field_names()}
            return render(*args, config.render_options(NVIDIA, given)).source
        if backend == "ascend":
            from xsync.backends.ascend import render as ascend_render
            return ascend_render.render_module(*args, case.settings["ascend_form"]).source
        from xsync.backends.cpu import render_source
        return render_source(*args)


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_KERNEL_FILE = re.compile(r"\(([^()]+\.py):(\d+)\)")


def portable(src: str) -> str:
    """The source with the checkout's path left out, and other kernel file paths cut to the
    part from their ``kernels/`` or ``tests/`` folder on, so a clone elsewhere, another worktree
    or an installed package hashes the same."""
    def cut(m):
        path = m.group(1)
        at = max(path.rfind("/kernels/"), path.rfind("/tests/"))
        return f"({path[at + 1:] if at >= 0 else path}:{m.group(2)})"
    return _KERNEL_FILE.sub(cut, src.replace(_ROOT, ""))


def snapshot(backend: str, dump: str | None = None) -> dict[str, str]:
    hashes = {}
    cases = CASES[backend]()
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    from xsync.errors import XSyncError

    for case in cases:
        try:
            src = portable(render_case(backend, case))
        except XSyncError as exc:     # a lowering error is part of the behaviour too
            src = f"{type(exc).__name__}"
        hashes[case.name] = hashlib.sha256(src.encode()).hexdigest()
        if dump:
            folder = os.path.join(dump, backend)
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, case.name + ".py"), "w") as f:
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
    ap.add_argument("--dump", help="write every source to DIR/<backend>/<case>.py")
    ap.add_argument("--backend", choices=BACKENDS, action="append", help="only these backends")
    a = ap.parse_args(argv)
    status = 0
    for backend in a.backend or BACKENDS:
        got = snapshot(backend, a.dump)
        if a.write:
            with open(golden_path(backend), "w") as f:
                json.dump(got, f, indent=1, sort_keys=True)
                f.write("\n")
            print(f"{backend}: wrote {len(got)} hashes to {golden_path(backend)}")
            continue
        with open(golden_path(backend)) as f:
            golden = json.load(f)
        diff = compare(got, golden)
        print(f"{backend}: {len(got)} sources, {len(golden)} golden hashes, {len(diff)} differences")
        for line in diff:
            print("  " + line)
        status |= bool(diff)
    return status


if __name__ == "__main__":
    sys.exit(main())
