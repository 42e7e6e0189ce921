"""The attention backward as torch ops, and autograd for the forward ops.

    attention_backward(grad_o, grad_lse, q, k, v, o, lse, causal, sm_scale,
                       window_size=(-1, -1)) -> (dq, dk, dv)
        dense [B, H, S, D] tensors as ``xsync::attention`` takes and returns them;
        grad_lse ([B, Hq, Sq] float32) may be None (only O was used)
    attention_varlen_backward(grad_o, grad_lse, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k,
                              max_seqlen_q, max_seqlen_k, causal, sm_scale,
                              window_size=(-1, -1)) -> (dq, dk, dv)
        packed [total, H, D] tensors as ``xsync::attention_varlen``

A sliding window (window.py) runs the WINDOW specializations of the dK/dV and dQ kernels: each
key block visits only the query blocks that see it, each query block only the key blocks it
sees (the fused dQ path too).

Both are ``torch.library`` custom ops (``xsync::attention_backward``,
``xsync::attention_varlen_backward``) with fake implementations, and ``register_autograd``
makes them the backward of ``xsync::attention`` and ``xsync::attention_varlen``: the forward
saves q, k, v, O and the LSE, so ``o.sum().backward()`` and ``torch.compile`` (forward and
backward graphs) work. A gradient reaching the LSE output is honoured (dS gains P * dLSE).

Three launches of the kernels in backward.py: delta = rowsum(dO * O) - dLSE, then dK/dV per
key block (summed over the query heads of a GQA group inside the kernel), then dQ per query
block. Deterministic: no atomics, one fixed summation order.

Or, where the backward schedule says ``fused_dq`` (the CPU rows; ``xsync.options(attn_fused_dq=
True/False)`` or XSYNC_ATTN_FUSED_DQ overrides it), two launches and a convert: the dK/dV kernel
with FUSED_DQ=1 also computes each step's dQ share (dS K over its keys) and reduce-adds it into
an fp32 accumulator zeroed on the host, then converted into dQ (``copy_``, the post step).
Hopper keeps the dQ kernel by default: the fused kernel is proven and compiles
(tests/nvidia/test_compile_backward.py; 64 query rows a step, as wgmma needs M >= 64) but is
untimed and spills (Triton 3.6: d64 88-96 B, d128 1.2-1.4 KB a thread, dQ's fp32 share in
registers beside dK and dV; FA3 stages it through shared memory instead). Ascend keeps it too:
the fused kernel lowers and is proven in both source forms (its reduce-add runs on the two
vector cores, one grad replica each), but is neither HIVM-compiled nor simulated yet. The fused
dQ sums in arrival order (the two grad replicas add into the same rows), so its last bits may
vary from run to run; the unfused path is deterministic.
"""
from __future__ import annotations

import math

import torch

from xsync.kernels.flash_attn import layouts, ops, schedule
from xsync.kernels.flash_attn import window as _window
from xsync.kernels.flash_attn.backward import (attention_bwd_dkdv, attention_bwd_dq,
                                               attention_bwd_preprocess)
from xsync.kernels.flash_attn.ops import _check, _check_varlen_args, _fail
from xsync.errors import UnsupportedError


def block_sizes(backend: str, head_dim: int = 128, causal: bool = False, max_seq: int = 0,
                dq: bool = False) -> dict:
    """The dK/dV kernel's constexprs (BM, BN, STAGES, PERSISTENT, REPLICAS) from
    schedule.BACKWARD_TABLE, or with ``dq`` the dQ kernel's (its REPLICAS may differ)."""
    return _plan(backend, head_dim, causal, max_seq).backward_constexprs(dq)


def _plan(backend, head_dim, causal, max_seq):
    return schedule.lookup(backend, head_dim, causal, max_seq, table=schedule.BACKWARD_TABLE)


PREPROCESS_BM = 64      # rows per replica of the delta kernel (elementwise: no cube, no pipes)


def fused_dq(backend: str, head_dim: int = 128, causal: bool = False, max_seq: int = 0) -> bool:
    """Whether the backward reduce-adds dQ from the dK/dV kernel (xsync.options(attn_fused_dq=...)
    if set, else the backward schedule's ``fused_dq``)."""
    from xsync import config

    chosen = config.current().attn_fused_dq
    return _plan(backend, head_dim, causal, max_seq).fused_dq if chosen is None else bool(chosen)


def fused_block_sizes(backend: str, head_dim: int = 128, causal: bool = False,
                      max_seq: int = 0) -> dict:
    """The dK/dV kernel's constexprs with FUSED_DQ=1: the schedule's, with at least 64 query rows
    a step on Hopper (dQ's share is a [BN, D] wgmma result: M >= 64), at most 32 on Ascend (16
    at d256): the cube holds each replica's [BN, D] fp32 share in L0C beside its dK and dV
    accumulators (xsync/backends/ascend/memory.py rule 7: 112 KB of 128 at d128)."""
    blocks = block_sizes(backend, head_dim, causal, max_seq)
    if schedule.target(backend) == "nvidia":
        blocks["BN"] = max(blocks["BN"], 64)
    elif schedule.target(backend) == "ascend":
        blocks["BN"] = min(blocks["BN"], 32 if ops.tile_dim(head_dim) <= 128 else 16)
    return dict(blocks, FUSED_DQ=1)


def preprocess_bm(head_dim: int) -> int:
    """The delta kernel's rows per replica: 64, and 32 for d256, whose 64-row O and dO tiles
    and their float32 casts (about 290 KB) overflow an Ascend vector core's 192 KB UB. (On
    Hopper the d256 kernel keeps 88 B of stack a thread at 32 rows and 96 at 16 under Triton
    3.6: not the rows' registers; tests/nvidia/test_compile_backward.py marks it.)"""
    return PREPROCESS_BM if ops.tile_dim(head_dim) <= 128 else PREPROCESS_BM // 2


def _check_backward(grad_o, grad_lse, q, k, v, o, lse, packed: bool, sm_scale):
    _check(q, k, v, packed=packed, sm_scale=sm_scale)
    lse_shape = (q.shape[1], q.shape[0]) if packed else tuple(q.shape[:3])
    for name, t, shape, dtype in (("grad_o", grad_o, tuple(q.shape), q.dtype),
                                  ("o", o, tuple(q.shape), q.dtype),
                                  ("lse", lse, lse_shape, torch.float32),
                                  ("grad_lse", grad_lse, lse_shape, torch.float32)):
        if t is None and name == "grad_lse":
            continue
        if not isinstance(t, torch.Tensor):
            _fail(f"{name} is a {type(t).__name__}", "pass torch tensors")
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != q.device:
            _fail(f"{name} is {tuple(t.shape)} {t.dtype} on {t.device}; the backward needs "
                  f"{shape} {dtype} on {q.device}",
                  f"pass the forward's outputs and gradients of their shapes ({name})")
        if name in ("lse", "grad_lse") and not t.is_contiguous():
            _fail(f"{name} is not contiguous", f"pass {name}.contiguous()")


def _run(tensors, cu_q, cu_k, max_q, max_k, batch, hq, hk, d, causal, scale, layout, window=None):
    """Launch the three kernels. ``tensors``: 2-D views (q, k, v, o, do, lse, dlse, delta,
    dq, dk, dv) in the kernels' layout; ``layout`` is the forward's 8 layout scalars;
    ``window`` a normalized sliding window or None."""
    from xsync.backends import select

    q, k, v, o, do, lse, dlse, delta, dq, dk, dv = tensors
    backend = select()
    plan = _plan(backend, d, causal, max(max_q, max_k))
    blocks = plan.backward_constexprs()
    cx = dict(**ops.dim_constexprs(d), CAUSAL=int(bool(causal)), backend=backend,
              **_window.constexprs(window, max_q, max_k))
    q_layout, lse_layout = layout[:3], layout[6:]

    def grid(tiles):
        return (ops.programs(backend, tiles, plan.persistent, q.device),)

    pre_bm = preprocess_bm(d)
    pre_tiles = math.ceil(max_q / (2 * pre_bm)) * batch * hq
    attention_bwd_preprocess[grid(pre_tiles)](
        o, do, dlse, delta, cu_q, hq, batch, int(max_q), *q_layout, *lse_layout,
        BM=pre_bm, **ops.dim_constexprs(d), PERSISTENT=int(plan.persistent), backend=backend)
    fused = fused_dq(backend, d, causal, max(max_q, max_k))
    # fp32 dQ accumulator in dq's 2-D view (same layout scalars); unfused, dq_acc is unused
    # (FUSED_DQ=0 drops the add) and delta stands in for it
    acc = torch.zeros(dq.shape, dtype=torch.float32, device=dq.device) if fused else delta
    if max_k > 0:
        kv_blocks = fused_block_sizes(backend, d, causal, max(max_q, max_k)) if fused else blocks
        kv_tiles = math.ceil(max_k / (kv_blocks["REPLICAS"] * kv_blocks["BM"])) * batch * hk
        attention_bwd_dkdv[grid(kv_tiles)](
            q, k, v, do, lse, delta, dk, dv, cu_q, cu_k, float(scale), hq, hq // hk, batch,
            int(max_k), *layout, **kv_blocks, **cx, dq_acc=acc)
    if fused:
        dq.copy_(acc)       # the post step: fp32 sums to dq's dtype (rows of no sequence: 0)
        return
    # a windowed dQ keeps dK/dV's schedule (its masks' tiles are not compiled at four replicas)
    dq_blocks = plan.backward_constexprs(dq=window is None)
    q_tiles = math.ceil(max_q / (dq_blocks["REPLICAS"] * dq_blocks["BM"])) * batch * hq
    attention_bwd_dq[grid(q_tiles)](
        q, k, v, do, lse, delta, dq, cu_q, cu_k, float(scale), hq, hq // hk, batch, int(max_q),
        *layout, **dq_blocks, **cx)


def attention_backward_impl(grad_o, grad_lse, q, k, v, o, lse, causal, sm_scale, window=None):
    _check_backward(grad_o, grad_lse, q, k, v, o, lse, packed=False, sm_scale=sm_scale)
    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    q, k, v, o, grad_o, lq, lk = _strided(q, k, v, o, grad_o, packed=False)
    dq, dk, dv = _empty_grads(q, k, lq, lk, packed=False)
    if b == 0 or hq == 0 or sq == 0 or sk == 0:
        # no query, or no key (O = 0 does not depend on q, k, v): zero gradients
        return dq.zero_(), dk.zero_(), dv.zero_()
    if grad_lse is None:
        grad_lse = torch.zeros_like(lse)
    delta = torch.empty_like(lse)
    ar = torch.arange(0, b + 1, dtype=torch.int32, device=q.device)
    layout = (*_triple(lq), *_triple(lk), hq, 0)      # as ops.attention_impl
    views = (lq.view2d(q, False), lk.view2d(k, False), lk.view2d(v, False), lq.view2d(o, False),
             lq.view2d(grad_o, False), lse.view(b * hq, sq), grad_lse.view(b * hq, sq),
             delta.view(b * hq, sq), lq.view2d(dq, False), lk.view2d(dk, False), lk.view2d(dv, False))
    _run(views, ar * sq, ar * sk, sq, sk, b, hq, hk, d, causal, sm_scale, layout, window)
    return dq, dk, dv


def attention_varlen_backward_impl(grad_o, grad_lse, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k,
                                   max_seqlen_q, max_seqlen_k, causal, sm_scale, window=None):
    """Rows past cu_seqlens_k[-1] of dK and dV (k may hold more tokens than the sequences
    use) get zero gradients; the varlen contract is checked as in the forward."""
    _check_backward(grad_o, grad_lse, q, k, v, o, lse, packed=True, sm_scale=sm_scale)
    checked = ops.varlen_contract(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    total_q, hq, d = q.shape
    hk = k.shape[1]
    batch = cu_seqlens_q.numel() - 1
    q, k, v, o, grad_o, lq, lk = _strided(q, k, v, o, grad_o, packed=True)
    dq, dk, dv = _empty_grads(q, k, lq, lk, packed=True)
    dk.zero_()
    dv.zero_()
    if not checked:
        dq.zero_()
    if batch <= 0 or total_q == 0 or max_seqlen_q == 0:
        return _packed_out(dq.zero_(), dk, dv, d)
    if grad_lse is None:
        grad_lse = torch.zeros_like(lse)
    delta = torch.empty_like(lse)
    layout = (*_triple(lq), *_triple(lk), 0, 1)       # as ops.attention_varlen_impl
    views = (lq.view2d(q, True), lk.view2d(k, True), lk.view2d(v, True), lq.view2d(o, True),
             lq.view2d(grad_o, True), lse, grad_lse, delta, lq.view2d(dq, True),
             lk.view2d(dk, True), lk.view2d(dv, True))
    _run(views, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), batch, hq, hk, d,
         causal, sm_scale, layout, window)
    return _packed_out(dq, dk, dv, d)


def _packed_out(dq, dk, dv, d):
    """A padded head dim ran head-major ([H, T, D]): its gradients come back as [T, H, D]."""
    if not ops.padded(d):
        return dq, dk, dv
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


def _strided(q, k, v, o, grad_o, packed: bool):
    """q, k, v in their layouts (layouts.prepare, copied only where the strides cannot be
    addressed); O and dO in q's layout (dO as autograd passes it: copied where its strides
    differ, e.g. the expanded gradient of o.sum())."""
    q, k, v, lq, lk, _ = layouts.prepare(q, k, v, packed, ops.padded(q.shape[-1]))
    o, _ = lq.conform(o, packed)
    grad_o, _ = lq.conform(grad_o, packed)
    return q, k, v, o, grad_o, lq, lk


def _empty_grads(q, k, lq, lk, packed: bool):
    """dQ in q's layout, dK and dV in k's (the kernels share each group's layout scalars)."""
    if not packed and q.is_contiguous() and k.is_contiguous():
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(k)
    align = layouts.alignment(q)
    return (lq.empty(q.shape, q.dtype, q.device, align), lk.empty(k.shape, k.dtype, k.device, align),
            lk.empty(k.shape, k.dtype, k.device, align))


def _triple(layout):
    return layout.cu_rows, layout.head_rows, layout.head_cols


# ---------------------------------------------------------------- the backward ops
@torch.library.custom_op("xsync::attention_backward", mutates_args=())
def _attention_backward_op(grad_o: torch.Tensor, grad_lse: torch.Tensor | None, q: torch.Tensor,
                           k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                           causal: bool, sm_scale: float, window_left: int = -1, window_right: int = -1
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return attention_backward_impl(grad_o, grad_lse, q, k, v, o, lse, causal, sm_scale,
                                   ops._op_window(window_left, window_right))


@_attention_backward_op.register_fake
def _(grad_o, grad_lse, q, k, v, o, lse, causal, sm_scale, window_left=-1, window_right=-1):
    _check_backward(grad_o, grad_lse, q, k, v, o, lse, packed=False, sm_scale=sm_scale)
    return _empty_grads(q, k, *layouts.output_layouts(q, k, False, ops.padded(q.shape[-1])), packed=False)


@torch.library.custom_op("xsync::attention_varlen_backward", mutates_args=())
def _attention_varlen_backward_op(grad_o: torch.Tensor, grad_lse: torch.Tensor | None,
                                  q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                  o: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                  cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                                  causal: bool, sm_scale: float, window_left: int = -1,
                                  window_right: int = -1
                                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return attention_varlen_backward_impl(grad_o, grad_lse, q, k, v, o, lse, cu_seqlens_q,
                                          cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, sm_scale,
                                          ops._op_window(window_left, window_right))


@_attention_varlen_backward_op.register_fake
def _(grad_o, grad_lse, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      causal, sm_scale, window_left=-1, window_right=-1):
    _check_backward(grad_o, grad_lse, q, k, v, o, lse, packed=True, sm_scale=sm_scale)
    _check_varlen_args(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if ops.padded(q.shape[-1]):       # as _packed_out
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(k)
    return _empty_grads(q, k, *layouts.output_layouts(q, k, True), packed=True)


def attention_backward(grad_o, grad_lse, q, k, v, o, lse, causal: bool = False,
                       sm_scale: float | None = None, window_size=(-1, -1)):
    """Gradients (dq, dk, dv) of ``xsync::attention`` for output gradients grad_o (and
    grad_lse, or None); a grad_o whose strides differ from o's is copied into o's layout."""
    ops._tensor_args(grad_o=grad_o, q=q, k=k, v=v, o=o, lse=lse)
    causal, window = _window.normalize(window_size, causal, "attention_backward")
    return _attention_backward_op(grad_o, _contiguous(grad_lse), q, k, v, o, lse,
                                  causal, ops._scale_arg(q, sm_scale), *(window or _window.NONE))


def attention_varlen_backward(grad_o, grad_lse, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k,
                              max_seqlen_q, max_seqlen_k, causal: bool = False,
                              sm_scale: float | None = None, window_size=(-1, -1)):
    """Gradients (dq, dk, dv) of ``xsync::attention_varlen``."""
    ops._tensor_args(grad_o=grad_o, q=q, k=k, v=v, o=o, lse=lse, cu_seqlens_q=cu_seqlens_q,
                     cu_seqlens_k=cu_seqlens_k)
    causal, window = _window.normalize(window_size, causal, "attention_varlen_backward")
    return _attention_varlen_backward_op(
        grad_o, _contiguous(grad_lse), q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k,
        ops._int_arg(max_seqlen_q), ops._int_arg(max_seqlen_k), causal,
        ops._scale_arg(q, sm_scale), *(window or _window.NONE))


def _contiguous(t):
    return None if t is None else t.contiguous()


# ---------------------------------------------------------------- autograd of the forward ops
def _setup_dense(ctx, inputs, output):
    q, k, v, causal, sm_scale, *window = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.sm_scale, ctx.window, ctx.inputs = causal, sm_scale, tuple(window), len(inputs)


def _backward_dense(ctx, grad_o, grad_lse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _attention_backward_op(_grad_like(grad_o, o), _contiguous(grad_lse), q, k, v, o,
                                        lse, ctx.causal, ctx.sm_scale, *ctx.window)
    return (dq, dk, dv) + (None,) * (ctx.inputs - 3)


def _setup_varlen(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, sm_scale, *window = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
    ctx.max_q, ctx.max_k, ctx.causal, ctx.sm_scale = max_q, max_k, causal, sm_scale
    ctx.window, ctx.inputs = tuple(window), len(inputs)


def _backward_varlen(ctx, grad_o, grad_lse):
    q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = _attention_varlen_backward_op(
        _grad_like(grad_o, o), _contiguous(grad_lse), q, k, v, o, lse, cu_q, cu_k, ctx.max_q,
        ctx.max_k, ctx.causal, ctx.sm_scale, *ctx.window)
    return (dq, dk, dv) + (None,) * (ctx.inputs - 3)


def _grad_like(grad, out):
    """The gradient of O as the backward op takes it (autograd may pass None, or an
    expanded view such as the gradient of o.sum())."""
    return torch.zeros_like(out) if grad is None else grad


torch.library.register_autograd("xsync::attention", _backward_dense, setup_context=_setup_dense)
torch.library.register_autograd("xsync::attention_varlen", _backward_varlen,
                                setup_context=_setup_varlen)


# Double backward: the backward ops have no derivative of their own. Registered so that the
# second differentiation names what is missing, instead of torch's "no autograd formula".
def _setup_nothing(ctx, inputs, output):
    pass


def _no_double_backward(ctx, *grads):
    raise UnsupportedError(
        "attention: double backward (differentiating the gradient of attention, e.g. a gradient "
        "penalty or a Hessian-vector product) is not supported: the backward kernels have no "
        "derivative of their own",
        fix="differentiate attention once (create_graph=False); for second-order terms use "
            "torch.nn.functional.scaled_dot_product_attention on that path")


torch.library.register_autograd("xsync::attention_backward", _no_double_backward,
                                setup_context=_setup_nothing)
torch.library.register_autograd("xsync::attention_varlen_backward", _no_double_backward,
                                setup_context=_setup_nothing)
