"""RMSNorm and LayerNorm, forward and backward, over the last dimension of a [M, N] tensor.

One kernel source per pass, every backend: a copy role streams row blocks of ``BM`` rows
through a ring of ``STAGES`` slots to a vector role that normalizes them in float32. A row is
one tile of ``BN >= N`` columns (a power of two; the load reads zeros past ``N`` and the store
drops them), so these kernels suit hidden sizes up to a few thousand; the softmax example
(row_softmax.py) shows how to loop over the columns of wider rows. The functions start with
row blocks of up to 16 rows and halve them while the backend's memory check refuses the tiles
(an Ascend vector core's 192 KB unified buffer). By xsync's estimate one row fits there up to
N = 8192 (RMSNorm forward), 4096 (RMSNorm backward, LayerNorm forward) and 2048 (LayerNorm
backward); wider rows are an AllocationError naming the tiles.

Programs walk the row blocks with ``xs.tile_range`` (one program per SM / AI core, or fewer).
The backward recomputes the row statistics from ``x`` instead of saving them, and each program
adds its partial dweight (dbias) column sums into a float32 ``[1, N]`` row with
``xs.store(..., reduce="add")`` once, after its last row block.

On Ascend both roles sit on one vector core (a kernel without matrix work) and the ring is a
GM workspace; on Hopper the copy role is a 1-warp TMA producer; on the CPU emulator each role
is a thread.
"""
from __future__ import annotations

import math

import torch

import xsync as xs

from ._host import backend_for, check_positive, check_vector, launch_rows, pow2, readable

RMS_FWD = dict(x=xs.bfloat16, w=xs.float32, y=xs.bfloat16, BM=16, BN=256, STAGES=2)
RMS_BWD = dict(x=xs.bfloat16, w=xs.float32, dy=xs.bfloat16, dx=xs.bfloat16, dw=xs.float32,
               BM=16, BN=256, STAGES=2)
LN_FWD = dict(x=xs.bfloat16, w=xs.float32, b=xs.float32, y=xs.bfloat16, BM=16, BN=256, STAGES=2)
LN_BWD = dict(x=xs.bfloat16, w=xs.float32, dy=xs.bfloat16, dx=xs.bfloat16, dw=xs.float32,
              db=xs.float32, BM=16, BN=256, STAGES=2)


@xs.kernel(example=RMS_FWD)
def rmsnorm_fwd(x, w, y, M, N, eps, BM: xs.constexpr, BN: xs.constexpr, STAGES: xs.constexpr):
    """y = x * rsqrt(mean(x^2) + eps) * w, row by row; ``w`` is a [1, N] row."""
    load = xs.role("load", kind="copy")
    norm = xs.role("norm", kind="vector")
    rows = xs.pipe(load, norm, stages=STAGES, x=xs.tile([BM, BN], x.dtype))
    with norm:
        wt = xs.load(w, [0, 0], [1, BN]).to(xs.float32)
    for tile in xs.tile_range(xs.cdiv(M, BM)):
        row = tile * BM
        with load:
            s = rows.acquire()
            s.x = xs.load(x, [row, 0], [BM, BN])
            rows.commit()
        with norm:
            got = rows.wait()
            v = got.x.to(xs.float32)
            rows.release()
            r = xs.rsqrt(xs.sum(v * v, 1) / N + eps)
            xs.store(y, [row, 0], (v * r[:, None] * wt).to(y.dtype))


@xs.kernel(example=RMS_BWD)
def rmsnorm_bwd(x, w, dy, dx, dw, M, N, eps, BM: xs.constexpr, BN: xs.constexpr,
                STAGES: xs.constexpr):
    """dx and dw of :func:`rmsnorm_fwd`. With r = rsqrt(mean(x^2) + eps) and g = dy * w:
    dx = r * g - x * r^3 * mean(g * x) per row; dw = sum over rows of dy * x * r, added into the
    float32 [1, N] row ``dw`` (zero it before the launch)."""
    load = xs.role("load", kind="copy")
    norm = xs.role("norm", kind="vector")
    rows = xs.pipe(load, norm, stages=STAGES,
                   x=xs.tile([BM, BN], x.dtype), dy=xs.tile([BM, BN], dy.dtype))
    with norm:
        wt = xs.load(w, [0, 0], [1, BN]).to(xs.float32)
        dw_acc = xs.zeros([BN], xs.float32)
    for tile in xs.tile_range(xs.cdiv(M, BM)):
        row = tile * BM
        with load:
            s = rows.acquire()
            s.x = xs.load(x, [row, 0], [BM, BN])
            s.dy = xs.load(dy, [row, 0], [BM, BN])
            rows.commit()
        with norm:
            got = rows.wait()
            v = got.x.to(xs.float32)
            g = got.dy.to(xs.float32)
            rows.release()
            r = xs.rsqrt(xs.sum(v * v, 1) / N + eps)
            gw = g * wt
            c = xs.sum(gw * v, 1) / N * r * r * r
            xs.store(dx, [row, 0], (gw * r[:, None] - v * c[:, None]).to(dx.dtype))
            dw_acc = dw_acc + xs.sum(g * v * r[:, None], 0)
    with norm:
        xs.store(dw, [0, 0], dw_acc[None, :], bounds=[1, N], reduce="add")


@xs.kernel(example=LN_FWD)
def layernorm_fwd(x, w, b, y, M, N, eps, BM: xs.constexpr, BN: xs.constexpr, STAGES: xs.constexpr):
    """y = (x - mean) * rsqrt(var + eps) * w + b, row by row (biased variance, as torch);
    ``w`` and ``b`` are [1, N] rows."""
    load = xs.role("load", kind="copy")
    norm = xs.role("norm", kind="vector")
    rows = xs.pipe(load, norm, stages=STAGES, x=xs.tile([BM, BN], x.dtype))
    with norm:
        wt = xs.load(w, [0, 0], [1, BN]).to(xs.float32)
        bt = xs.load(b, [0, 0], [1, BN]).to(xs.float32)
    for tile in xs.tile_range(xs.cdiv(M, BM)):
        row = tile * BM
        with load:
            s = rows.acquire()
            s.x = xs.load(x, [row, 0], [BM, BN])
            rows.commit()
        with norm:
            got = rows.wait()
            v = got.x.to(xs.float32)
            rows.release()
            mean = xs.sum(v, 1) / N
            d = xs.where(xs.arange(0, BN)[None, :] < N, v - mean[:, None], 0.0)   # columns past N: 0
            r = xs.rsqrt(xs.sum(d * d, 1) / N + eps)
            xs.store(y, [row, 0], (d * r[:, None] * wt + bt).to(y.dtype))


@xs.kernel(example=LN_BWD)
def layernorm_bwd(x, w, dy, dx, dw, db, M, N, eps, BM: xs.constexpr, BN: xs.constexpr,
                  STAGES: xs.constexpr):
    """dx, dw and db of :func:`layernorm_fwd`. With xhat = (x - mean) * r and g = dy * w:
    dx = r * (g - mean(g) - xhat * mean(g * xhat)) per row; dw = sum over rows of dy * xhat and
    db = sum over rows of dy, added into the float32 [1, N] rows ``dw`` and ``db`` (zero them)."""
    load = xs.role("load", kind="copy")
    norm = xs.role("norm", kind="vector")
    rows = xs.pipe(load, norm, stages=STAGES,
                   x=xs.tile([BM, BN], x.dtype), dy=xs.tile([BM, BN], dy.dtype))
    with norm:
        wt = xs.load(w, [0, 0], [1, BN]).to(xs.float32)
        dw_acc = xs.zeros([BN], xs.float32)
        db_acc = xs.zeros([BN], xs.float32)
    for tile in xs.tile_range(xs.cdiv(M, BM)):
        row = tile * BM
        with load:
            s = rows.acquire()
            s.x = xs.load(x, [row, 0], [BM, BN])
            s.dy = xs.load(dy, [row, 0], [BM, BN])
            rows.commit()
        with norm:
            got = rows.wait()
            v = got.x.to(xs.float32)
            g = got.dy.to(xs.float32)
            rows.release()
            mean = xs.sum(v, 1) / N
            d = xs.where(xs.arange(0, BN)[None, :] < N, v - mean[:, None], 0.0)
            r = xs.rsqrt(xs.sum(d * d, 1) / N + eps)
            xhat = d * r[:, None]
            gw = g * wt
            c1 = xs.sum(xhat * gw, 1) / N
            c2 = xs.sum(gw, 1) / N
            xs.store(dx, [row, 0], ((gw - xhat * c1[:, None] - c2[:, None]) * r[:, None]).to(dx.dtype))
            dw_acc = dw_acc + xs.sum(g * xhat, 0)
            db_acc = db_acc + xs.sum(g, 0)
    with norm:
        xs.store(dw, [0, 0], dw_acc[None, :], bounds=[1, N], reduce="add")
        xs.store(db, [0, 0], db_acc[None, :], bounds=[1, N], reduce="add")


# ---------------------------------------------------------------- torch-facing functions
def _rows(x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 0:
        raise ValueError("x is a 0-d tensor: a norm reduces over the last dimension")
    rows = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])     # -1 cannot be inferred at N = 0
    return readable(rows) if x.numel() else rows


def _launch(kernel, args, n: int, m: int, device, backend, block_rows, programs_):
    if m == 0 or n == 0:
        return                                             # nothing to normalize
    bn = pow2(n)
    bm = check_positive("block_rows", block_rows) if block_rows is not None else \
        max(1, min(16, 8192 // bn))                      # a [BM, BN] fp32 tile of <= 32 KB
    launch_rows(kernel, args, m, device, backend, dict(BN=bn, STAGES=2), bm, programs_)


def _weight(name: str, t: torch.Tensor, n: int) -> torch.Tensor:
    check_vector(name, t, n)
    return readable(t.reshape(1, n)) if n else t.reshape(1, n)


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, backend=None,
                     block_rows: int | None = None, programs: int | None = None) -> torch.Tensor:
    """RMSNorm of ``x`` over its last dimension, in ``x``'s dtype (float32 math)."""
    backend = backend_for(backend)
    x2 = _rows(x)
    m, n = x2.shape
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _launch(rmsnorm_fwd, (x2, _weight("weight", weight, n), y, m, n, float(eps)), n, m, x.device,
            backend, block_rows, programs)
    return y.reshape(x.shape)


def rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                      backend=None, block_rows: int | None = None, programs: int | None = None):
    """(dx, dweight) of :func:`rms_norm_forward`."""
    backend = backend_for(backend)
    x2, dy2 = _rows(x), _rows(dy.to(x.dtype))
    m, n = x2.shape
    dx = torch.empty(m, n, dtype=x.dtype, device=x.device)
    dw = torch.zeros(1, n, dtype=torch.float32, device=x.device)
    _launch(rmsnorm_bwd, (x2, _weight("weight", weight, n), dy2, dx, dw, m, n, float(eps)), n, m,
            x.device, backend, block_rows, programs)
    return dx.reshape(x.shape), dw.reshape(weight.shape).to(weight.dtype)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, backend):
        ctx.save_for_backward(x, weight)
        ctx.eps, ctx.backend = eps, backend
        return rms_norm_forward(x, weight, eps, backend=backend)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dx, dw = rms_norm_backward(dy, x, weight, ctx.eps, backend=ctx.backend)
        return dx, dw, None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, backend=None) -> torch.Tensor:
    """RMSNorm with autograd: ``torch.nn.functional.rms_norm(x, (N,), weight, eps)``, forward
    and backward by the xsync kernels above."""
    return _RMSNorm.apply(x, weight, eps, backend)


def layer_norm_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                       eps: float = 1e-5, *, backend=None, block_rows: int | None = None,
                       programs: int | None = None) -> torch.Tensor:
    """LayerNorm of ``x`` over its last dimension, in ``x``'s dtype (float32 math)."""
    backend = backend_for(backend)
    x2 = _rows(x)
    m, n = x2.shape
    if bias is None:
        bias = torch.zeros(n, dtype=torch.float32, device=x.device)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _launch(layernorm_fwd, (x2, _weight("weight", weight, n), _weight("bias", bias, n), y, m, n,
                            float(eps)), n, m, x.device, backend, block_rows, programs)
    return y.reshape(x.shape)


def layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5, *,
                        backend=None, block_rows: int | None = None, programs: int | None = None):
    """(dx, dweight, dbias) of :func:`layer_norm_forward`; dbias in weight's dtype."""
    backend = backend_for(backend)
    x2, dy2 = _rows(x), _rows(dy.to(x.dtype))
    m, n = x2.shape
    dx = torch.empty(m, n, dtype=x.dtype, device=x.device)
    dw = torch.zeros(1, n, dtype=torch.float32, device=x.device)
    db = torch.zeros(1, n, dtype=torch.float32, device=x.device)
    _launch(layernorm_bwd, (x2, _weight("weight", weight, n), dy2, dx, dw, db, m, n, float(eps)), n, m,
            x.device, backend, block_rows, programs)
    return dx.reshape(x.shape), dw.reshape(weight.shape).to(weight.dtype), db.reshape(weight.shape).to(weight.dtype)


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, backend):
        ctx.save_for_backward(x, weight)
        ctx.eps, ctx.backend, ctx.has_bias = eps, backend, bias is not None
        return layer_norm_forward(x, weight, bias, eps, backend=backend)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dx, dw, db = layer_norm_backward(dy, x, weight, ctx.eps, backend=ctx.backend)
        return dx, dw, db if ctx.has_bias else None, None, None


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5, *,
               backend=None) -> torch.Tensor:
    """LayerNorm with autograd: ``torch.nn.functional.layer_norm(x, (N,), weight, bias, eps)``,
    forward and backward by the xsync kernels above."""
    return _LayerNorm.apply(x, weight, bias, eps, backend)
