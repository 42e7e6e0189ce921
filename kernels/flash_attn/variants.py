"""The flagship attention kernel written other ways with the same meaning.

Each variant is ``kernel.py``'s ``attention_fwd`` with a few source edits (listed below, old
text -> new text, each found exactly as often as stated, once by default), so it stays the
flagship everywhere else. On Hopper the schedule passes must give every variant the flagship's
schedule: tests/nvidia/test_variants.py compares the PTX hot loops, benchmarks/attention.py
(``variants``) their speed, tests/core/test_variants_cpu.py their outputs on the emulator.

    python -c "from xsync.kernels.flash_attn import variants; print(variants.source('pv_first'))"

prints a variant's full source.
"""
from __future__ import annotations

import linecache
import math

import xsync as xs
from xsync.kernels.flash_attn import kernel as flagship

_MMA_PV = """                with mma:
                    pt = p_in.wait()
                    vt = v_in.wait()
                    pv = xs.mma(pt.p, vt.v)
                    pv = xs.mma_wait(pv, pending=0)
                    v_in.release()
                    p_in.release()
                    po2 = pv_out.acquire()
                    po2.pv = pv
                    pv_out.commit()
                with softmax:
                    pvs = pv_out.wait()
                    o_acc = o_acc * alpha[:, None] + pvs.pv
                    pv_out.release()
"""

EDITS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    # the V tile waited before P: the order of two waits of different pipes
    "v_wait_first": ("`v_in.wait()` before `p_in.wait()`", (
        ("                    pt = p_in.wait()\n                    vt = v_in.wait()\n",
         "                    vt = v_in.wait()\n                    pt = p_in.wait()\n"),)),
    # the rescale with the product first: `pv + o * alpha`
    "pv_first": ("the rescale written `pv + o_acc * alpha`", (
        ("o_acc = o_acc * alpha[:, None] + pvs.pv", "o_acc = pvs.pv + o_acc * alpha[:, None]"),)),
    # the accumulate form written directly, `o_acc = mma(p, v, o_acc * alpha)`: one matrix role
    # computes S, the softmax and PV (no register hand-offs to write)
    "accumulate_form": ("one role; PV written as `o_acc = mma(p, v, o_acc * alpha)`", (
        ("    softmax = xs.role(\"softmax\", kind=\"vector\", replicas=REPLICAS)\n", ""),
        ("    s_out = xs.pipe(mma, softmax, stages=3 - WINDOW, s=xs.tile([BM, BN], xs.float32))\n"
         "    p_in = xs.pipe(softmax, mma, stages=2, p=xs.tile([BM, BN], q.dtype))\n"
         "    pv_out = xs.pipe(mma, softmax, stages=2, pv=xs.tile([BM, D + D_PAD], xs.float32))\n", ""),
        ("                    k_in.release()\n                    so = s_out.acquire()\n"
         "                    so.s = s\n                    s_out.commit()\n"
         "                with softmax:\n                    sc = s_out.wait()\n",
         "                    k_in.release()\n"),
        ("                        x = sc.s\n", "                        x = s\n"),
        ("                        x = sc.s * qk_scale\n", "                        x = s * qk_scale\n"),
        ("                    s_out.release()\n", ""),
        ("                    po = p_in.acquire()\n                    po.p = p.to(q.dtype)\n"
         "                    p_in.commit()\n" + _MMA_PV,
         "                    vt = v_in.wait()\n"
         "                    o_acc = xs.mma(p.to(q.dtype), vt.v, o_acc * alpha[:, None])\n"
         "                    o_acc = xs.mma_wait(o_acc, pending=0)\n"
         "                    v_in.release()\n"),
        ("            with softmax:\n", "            with mma:\n", 2))),
    # K and V in one pipe: one slot per key block carries both tiles
    "kv_one_pipe": ("K and V tiles in one pipe `kv_in`", (
        ("    k_in = xs.pipe(load, mma, stages=STAGES, k=xs.tile([BN, D + D_PAD], k.dtype))\n"
         "    v_in = xs.pipe(load, mma, stages=STAGES, v=xs.tile([BN, D + D_PAD], v.dtype))\n",
         "    kv_in = xs.pipe(load, mma, stages=STAGES, k=xs.tile([BN, D + D_PAD], k.dtype), v=xs.tile([BN, D + D_PAD], v.dtype))\n"),
        ("                    ks = k_in.acquire()\n"
         "                    ks.k = xs.load(k, [kv_row + n, kv_h * kv_head_cols], [BN, D + D_PAD])\n"
         "                    k_in.commit()\n                    vs = v_in.acquire()\n"
         "                    vs.v = xs.load(v, [kv_row + n, kv_h * kv_head_cols], [BN, D + D_PAD])\n"
         "                    v_in.commit()\n",
         "                    kvs = kv_in.acquire()\n"
         "                    kvs.k = xs.load(k, [kv_row + n, kv_h * kv_head_cols], [BN, D + D_PAD])\n"
         "                    kvs.v = xs.load(v, [kv_row + n, kv_h * kv_head_cols], [BN, D + D_PAD])\n"
         "                    kv_in.commit()\n"),
        ("                    kt = k_in.wait()\n", "                    kt = kv_in.wait()\n"),
        ("                    k_in.release()\n", ""),
        ("                    vt = v_in.wait()\n                    pv = xs.mma(pt.p, vt.v)\n",
         "                    pv = xs.mma(pt.p, kt.v)\n"),
        ("                    v_in.release()\n", "                    kv_in.release()\n"))),
    # releases moved: K's slot after S is handed over, P's hand-off before V's slot
    "late_k_release": ("`k_in.release()` after the S hand-off, `p_in.release()` before `v_in.release()`", (
        ("                    k_in.release()\n                    so = s_out.acquire()\n"
         "                    so.s = s\n                    s_out.commit()\n",
         "                    so = s_out.acquire()\n                    so.s = s\n"
         "                    s_out.commit()\n                    k_in.release()\n"),
        ("                    v_in.release()\n                    p_in.release()\n",
         "                    p_in.release()\n                    v_in.release()\n"),)),
}


def source(name: str) -> str:
    """The variant's kernel source: the flagship's with ``EDITS[name]`` applied."""
    import inspect

    text = inspect.getsource(flagship.attention_fwd.fn)
    for old, new, *count in EDITS[name][1]:
        want = count[0] if count else 1
        if text.count(old) != want:
            raise ValueError(f"variant {name!r}: the flagship's source holds {text.count(old)} copies of "
                             f"{old.strip()[:60]!r}, not {want} (kernels/flash_attn/kernel.py changed: update "
                             f"kernels/flash_attn/variants.py)")
        text = text.replace(old, new)
    return text.replace("def attention_fwd(", f"def attention_fwd_{name}(", 1)


def _make(name: str):
    text = source(name)
    file = f"<xsync.kernels.flash_attn.variants:{name}>"
    # inspect (and so the xsync frontend) reads a kernel's source through linecache
    linecache.cache[file] = (len(text), None, text.splitlines(True), file)
    scope = dict(vars(flagship))
    exec(compile(text, file, "exec"), scope)  # noqa: S102 - our own source, edited above
    return scope[f"attention_fwd_{name}"]


VARIANTS = {name: _make(name) for name in EDITS}


def run_dense(kernel, q, k, v, causal: bool, sm_scale: float | None = None, backend: str | None = None):
    """``kernel`` (the flagship or a variant) on [B, H, S, D] tensors as ``ops.attention``
    launches the flagship: same tiles, programs and argument layout; returns (o, lse).
    ``backend``: the selected one (``xsync.backends.select()``) unless given."""
    import torch

    from xsync.backends import select
    from xsync.kernels.flash_attn import ops, schedule

    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    o = torch.empty_like(q)
    lse = torch.empty((b * hq, sq), dtype=torch.float32, device=q.device)
    cu_q, cu_k = ops._dense_offsets(b, sq, sk, q.device)
    backend = backend or select()
    plan = schedule.lookup(backend, d, causal, sq)
    ops.launch(kernel, q.view(-1, d), k.view(-1, d), v.view(-1, d), o.view(-1, d), lse, cu_q, cu_k, sq,
               b, hq, hk, d, causal, scale, (hq, sq, 0, hk, sk, 0, hq, 0), backend, plan)
    return o, lse.view(b, hq, sq)


__all__ = ["EDITS", "VARIANTS", "run_dense", "source", "xs"]
