"""Strided q, k, v, o and gradients as the attention kernels address them, without copies.

The kernels (kernel.py, backward.py) read a 2-D view: token t of sequence b, head h is row
``cu[b] * cu_rows + h * head_rows + t``, columns ``h * head_cols`` to ``+ D``. The row pitch is
the 2-D view's own stride, so it may differ from tensor to tensor; the three scalars are shared
by a group of tensors (q, o, dO, dQ share one triple; k, v, dK, dV another).

A 4-D [B, H, S, D] tensor with strides (sb, sh, ss, 1) is such a view when, with the pitch
P = ss: sh = head_rows * P + head_cols with every head's columns inside a row
((H - 1) * head_cols + D <= P), and sb = S * cu_rows * P (dense batches have cu[b] = b * S).
That covers what models pass: the contiguous [B, H, S, D] tensor (cu_rows = H, head_rows = S),
Hugging Face's ``view(b, s, h, d).transpose(1, 2)`` and flash-attn's [B, S, H, D] (cu_rows = 1,
head_cols = D, pitch H * D), slices of a fused QKV projection (pitch 3 * H * D), a sliced or
stepped batch. A packed [T, H, D] tensor with strides (st, sh, 1) is one with P = st,
cu_rows = 1. The view handed to the kernel is ``as_strided(t, (rows, cols), (P, 1))`` at t's
own storage offset: it ends exactly at t's last element, so it never reaches past the storage.

What cannot be expressed so is copied once, to a contiguous tensor (``Layout.of`` returns None):
a last dimension with a stride other than 1, overlapping elements (stride 0, e.g. an expanded
batch; an expanded head axis of K and V is taken as one kv head by the entry points first), a
batch stride that is not a whole number of sequences (a slice of the sequence axis of a
[B, H, S, D] tensor). A v whose triple differs from k's, or a dO differing from o's, is copied
into its group's layout. Outputs are allocated in the triple of their group with the tightest
pitch (``Layout.empty``): the output of a transposed view is a transposed view.
On a CUDA device TMA needs a 16-byte aligned pitch and base (``aligned``); a tensor that misses
them is copied into its own layout with an aligned pitch (the same triple, so o's strides never
depend on where the data lies).
"""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Layout:
    """The three scalars of a group: rows per cumulative-length unit, rows and columns per head."""
    cu_rows: int
    head_rows: int
    head_cols: int

    # ------------------------------------------------------------ reading a tensor
    @staticmethod
    def of(t: torch.Tensor, packed: bool) -> "Layout | None":
        """The layout of ``t`` ([B, H, S, D], or packed [T, H, D]) or None where it has none
        (module docstring); only layouts whose elements do not overlap are returned, so an
        output allocated in one never aliases itself."""
        if t.is_contiguous():
            return Layout.contiguous(t, packed)
        if packed:
            (T, H, D), (st, sh, sd) = t.shape, t.stride()
            B, S, sb, ss = 1, T, 0, st
        else:
            (B, H, S, D), (sb, sh, ss, sd) = t.shape, t.stride()
        if sd != 1 and D > 1:
            return None
        for pitch in _pitches(B, H, S, D, sb, sh, ss):
            layout = _solve(B, H, S, D, sb, sh, pitch, packed)
            if layout is not None and layout.disjoint(B, H, S, D):
                return layout
        return None

    def disjoint(self, B, H, S, D) -> bool:
        """No two elements share a (row, column) of the 2-D view (columns stay inside a row)."""
        if H > 1 and self.head_cols < D and self.head_rows < S:
            return False
        batch_rows = (H - 1) * self.head_rows + S
        return B == 1 or self.cu_rows * S >= batch_rows

    @staticmethod
    def contiguous(t: torch.Tensor, packed: bool) -> "Layout":
        """The layout of ``t.contiguous()``."""
        return _contiguous_of(t.shape)

    # ------------------------------------------------------------ 2-D views and outputs
    def extent(self, shape, packed: bool) -> tuple[int, int]:
        """(rows, cols) of the 2-D view of a tensor of ``shape`` in this layout."""
        if packed:
            T, H, D = shape
            B, S = 1, T
        else:
            B, H, S, D = shape
        rows = (B - 1) * S * self.cu_rows + (H - 1) * self.head_rows + S
        return rows, (H - 1) * self.head_cols + D

    def view2d(self, t: torch.Tensor, packed: bool) -> torch.Tensor:
        """``t`` (in this layout) as the kernels' 2-D view; ``t.view(-1, d)`` when contiguous."""
        rows, cols = self.extent(t.shape, packed)
        if rows <= 0 or cols <= 0 or t.numel() == 0:      # (a view of 0 elements cannot infer -1)
            return t.new_empty((max(rows, 0), max(cols, 0)))
        if t.is_contiguous():
            return t.view(t.shape[0], -1) if packed else t.view(-1, t.shape[-1])
        pitch = t.stride(0 if packed else 2)
        if (t.shape[0] if packed else t.shape[2]) == 1:
            pitch = self._pitch_of(t, packed)
        return torch.as_strided(t, (rows, cols), (pitch, 1), t.storage_offset())

    def _pitch_of(self, t, packed):
        # a length-1 sequence axis leaves its stride free: the pitch is the one Layout.of chose
        if packed:
            (T, H, D), (st, sh, _) = t.shape, t.stride()
            B, S, sb, ss = 1, T, 0, st
        else:
            (B, H, S, D), (sb, sh, ss, _) = t.shape, t.stride()
        for pitch in _pitches(B, H, S, D, sb, sh, ss):
            if _solve(B, H, S, D, sb, sh, pitch, packed) == self:
                return pitch
        raise AssertionError("view2d of a tensor not in this layout")

    def empty(self, shape, dtype, device, align: int = 1) -> torch.Tensor:
        """A new tensor of ``shape`` in this layout, its pitch the columns rounded up to
        ``align`` elements (16 bytes on CUDA, where TMA reads it)."""
        packed = len(shape) == 3
        rows, cols = self.extent(shape, packed)
        pitch = -(-cols // align) * align
        size = max(rows, 0) * pitch
        if size == 0 or self == _contiguous_of(shape):
            return torch.empty(tuple(shape), dtype=dtype, device=device)
        # gaps (rows or columns no element owns) are zero: the kernels read whole tiles past a
        # sequence's end and mask them, and 0 * NaN of uninitialized memory would be NaN
        numel = 1
        for n in shape:
            numel *= n
        buf = (torch.zeros if size > numel else torch.empty)(size, dtype=dtype, device=device)
        head = self.head_rows * pitch + self.head_cols
        if packed:
            strides = (pitch, head, 1)
        else:
            B, H, S, D = shape
            strides = (S * self.cu_rows * pitch if B > 1 else size, head if H > 1 else S * pitch, pitch, 1)
        return torch.as_strided(buf, tuple(shape), strides)

    def conform(self, t: torch.Tensor, packed: bool) -> tuple[torch.Tensor, bool]:
        """``t`` in this layout: itself where it is (and aligned where TMA reads it), else one
        copy into a new tensor of this layout. Returns (tensor, copied)."""
        if Layout.of(t, packed) == self and aligned(t, self, packed):
            return t, False
        out = self.empty(t.shape, t.dtype, t.device, alignment(t))
        out.copy_(t)
        return out, True


def _contiguous_of(shape) -> Layout:
    return Layout(1, 0, shape[2]) if len(shape) == 3 else Layout(shape[1], shape[2], 0)


def alignment(t: torch.Tensor) -> int:
    """The pitch granularity, in elements, of tensors the kernels read on t's device."""
    return max(1, 16 // t.element_size()) if t.device.type == "cuda" else 1


def aligned(t: torch.Tensor, layout: Layout, packed: bool) -> bool:
    """Whether a TMA descriptor can take t's 2-D view (CUDA: 16-byte pitch and base)."""
    if t.device.type != "cuda" or t.numel() == 0:
        return True
    v = layout.view2d(t, packed)
    return (v.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0


def _pitches(B, H, S, D, sb, sh, ss):
    """Row pitches to try: the sequence stride, or (a length-1 sequence, whose stride is free)
    the head and batch strides and the head dim."""
    if S > 1:
        return (ss,) if ss >= D else ()
    seen = []
    for p in (ss, sh if H > 1 else 0, sb if B > 1 else 0, D):
        if p >= D and p not in seen:
            seen.append(p)
    return tuple(seen)


def _solve(B, H, S, D, sb, sh, pitch, packed) -> Layout | None:
    if pitch <= 0:
        return None
    head_rows, head_cols = (divmod(sh, pitch) if H > 1 and sh >= 0 else (0, 0))
    if (H - 1) * head_cols + D > pitch:
        return None
    if packed:
        return Layout(1, head_rows, head_cols)
    if B == 1:
        return Layout(0, head_rows, head_cols)
    if sb <= 0 or sb % (S * pitch):
        return None
    return Layout(sb // (S * pitch), head_rows, head_cols)


def whole_heads(layout: Layout, shape, packed: bool) -> bool:
    """Whether every head's columns end at the 2-D view's last column (no head to the right of
    another in a row). A head dim that is not a power of two is read as a wider tile
    (kernel.py's D_PAD) whose extra columns must lie past the view's columns, where loads read
    0 -- not in the next head's columns."""
    return layout.head_cols == 0 or shape[-2 if packed else 1] <= 1


def head_major(shape, packed: bool) -> Layout:
    """A layout whose heads each end at the view's last column: the contiguous [B, H, S, D]
    one, or for packed [T, H, D] tensors [H, T, D] (head h's rows start at h * T)."""
    return Layout(1, shape[0], 0) if packed else _contiguous_of(shape)


def kernel_layout(t: torch.Tensor, packed: bool, padded: bool = False) -> Layout | None:
    """The layout ``prepare`` reads ``t`` in: its own (Layout.of), or None where it has none (a
    copy to the contiguous layout); with ``padded`` (a head dim the kernels pad) one that keeps
    whole heads (head_major where ``t``'s own does not)."""
    lay = Layout.of(t, packed)
    if not padded or (lay is not None and whole_heads(lay, t.shape, packed)):
        return lay
    return head_major(t.shape, packed)


def prepare(q, k, v, packed: bool, padded: bool = False):
    """q, k and v as the kernels take them: (q, k, v, q_layout, kv_layout, direct), each
    tensor itself where its strides allow (``direct`` True: no copy made), else copied once.
    ``padded``: the head dim is read as a wider tile (kernel_layout)."""
    direct = True
    lq = kernel_layout(q, packed, padded)
    if lq is None:
        q, lq, direct = q.contiguous(), Layout.contiguous(q, packed), False
    q, copied = lq.conform(q, packed)
    direct &= not copied
    lk = kernel_layout(k, packed, padded)
    if lk is None:
        k, lk, direct = k.contiguous(), Layout.contiguous(k, packed), False
    k, copied = lk.conform(k, packed)
    direct &= not copied
    v, copied = lk.conform(v, packed)
    return q, k, v, lq, lk, direct and not copied


def output_layouts(q, k, packed: bool, padded: bool = False) -> tuple[Layout, Layout]:
    """The layouts ``prepare`` gives q's and k's groups, from shapes and strides alone (what the
    fake implementations need to give the outputs the real strides)."""
    lq = kernel_layout(q, packed, padded) or Layout.contiguous(q, packed)
    lk = kernel_layout(k, packed, padded) or Layout.contiguous(k, packed)
    return lq, lk


def mqa_heads(k, v, head_axis: int, q_heads: int):
    """K and V expanded over their head axis (stride 0, e.g. ``k.expand(b, h, s, d)`` of one kv
    head): one kv head, which the kernels share among the query heads as grouped-query
    attention does, so nothing is materialized. A view: autograd sums the heads' gradients.
    Only where the expanded count divides ``q_heads``: otherwise the shapes stay, and the checks
    refuse them as torch and flash-attn do."""
    heads = k.shape[head_axis]
    if heads > 1 and q_heads % heads == 0 and k.stride(head_axis) == 0 and v.stride(head_axis) == 0 \
            and k.shape == v.shape:
        index = (slice(None),) * head_axis + (slice(0, 1),)
        return k[index], v[index]
    return k, v
