"""Torch entry points for the flash-attention kernel.

    attention(q, k, v, causal=False, sm_scale=None, window_size=(-1, -1)) -> (o, lse)
        q: [B, Hq, Sq, D], k/v: [B, Hkv, Sk, D] (SDPA layout; Hkv divides Hq for GQA)
        o: [B, Hq, Sq, D] in q's dtype; lse: [B, Hq, Sq] float32 (natural log)
    attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     causal=False, sm_scale=None, window_size=(-1, -1)) -> (o, lse)
        packed q: [total_q, Hq, D], k/v: [total_k, Hkv, D] as in flash_attn_varlen_func;
        o: [total_q, Hq, D]; lse: [Hq, total_q]

Causal masks are bottom-right aligned when Sq != Sk (as flash-attn does); ``window_size``
is flash-attn's sliding window (window.py: query i sees keys i + Sk - Sq - left ..= i + Sk -
Sq + right, -1 unbounded, causal sets right = 0). Both are
`torch.library` custom ops (``xsync::attention``, ``xsync::attention_varlen``) with fake
implementations, so they trace under ``torch.compile``. The backend follows
XSYNC_BACKEND (auto: Hopper GPU -> nvidia, NPU -> ascend, else the CPU emulator).
"""
from __future__ import annotations

import contextlib
import math

import torch

from xsync import config as _config
from xsync.compiler import caller_loc
from xsync.kernels.flash_attn import layouts, schedule, tiles
from xsync.kernels.flash_attn import window as _window
from xsync.kernels.flash_attn.kernel import attention_fwd
from xsync.errors import LaunchError, UnsupportedError

HEAD_DIMS = (64, 96, 128, 256)
DTYPES = (torch.float16, torch.bfloat16)


def tile_dim(head_dim: int) -> int:
    """The width of the kernels' Q/K/V/O tiles for ``head_dim``: the next power of two (Gluon's
    and Triton's tiles take power-of-two shapes). 96 runs as 128-wide tiles whose last 32
    columns are read as 0 (past the 2-D view's columns: layouts.kernel_layout) and never stored."""
    return 1 << max(0, head_dim - 1).bit_length()


def dim_constexprs(head_dim: int) -> dict:
    """The head-dim constexprs of every attention kernel: D, and D_PAD (tile columns past D)
    only where the head dim is padded, so the power-of-two specializations stay as they were."""
    pad = tile_dim(head_dim) - head_dim
    return dict(D=head_dim, D_PAD=pad) if pad else dict(D=head_dim)


def padded(head_dim: int) -> bool:
    """Whether ``head_dim`` runs as a wider tile (its layouts keep whole heads: layouts.py)."""
    return tile_dim(head_dim) != head_dim


def block_sizes(backend, head_dim: int = 128, causal: bool = False, max_seq: int = 0,
                sm_scale: float | None = None, window: bool = False) -> dict:
    """The constexprs (BM, BN, STAGES, PERSISTENT, Q_STAGES, REPLICAS, SCALE_POSITIVE) the ops
    launch with: the committed schedule table (kernels/flash_attn/schedule.py) for this backend,
    head_dim and sequence length (``window``: a sliding-window launch), and the sign of the
    scale (None: 1/sqrt(head_dim))."""
    return dict(schedule.lookup(backend, head_dim, causal, max_seq, window=window).forward_constexprs(),
                **scale_constexprs(sm_scale))


# The kernels take the scale as a float32: below the smallest normal float32 it may be 0 there
# (or flushed to 0), and a masked score's -inf times 0 is NaN.
_SMALLEST_NORMAL_F32 = 2.0 ** -126


_LOG2E = 1.4426950408889634          # the kernels scale by sm_scale * log2(e) (exp2 softmax)
_FLOAT32_MAX = 3.4028234663852886e38


def scale_constexprs(sm_scale: float | None) -> dict:
    """SCALE_POSITIVE: the kernel scales the row max instead of every score (kernel.py), which
    only a positive scale allows -- one that stays a positive normal number in float32."""
    return dict(SCALE_POSITIVE=int(sm_scale is None or sm_scale >= _SMALLEST_NORMAL_F32))


def _fail(msg: str, fix: str):
    raise LaunchError(f"attention: {msg}", loc=caller_loc(), fix=fix)


def _check(q, k, v, packed: bool, sm_scale):
    """Shapes, dtypes, devices and the scale: everything that needs no tensor data, so it runs
    in the real op, in the fake op (torch.compile) and on direct torch.ops.xsync.* calls."""
    want = 3 if packed else 4
    layout = "[total, heads, head_dim]" if packed else "[batch, heads, seq, head_dim]"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            _fail(f"{name} is a {type(t).__name__}", "pass torch tensors")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != want:
            _fail(f"{name} has shape {tuple(t.shape)}; expected {want} dims {layout}",
                  f"pass {layout} tensors")
        if t.dtype not in DTYPES:
            _fail(f"{name} has dtype {t.dtype}", "use torch.float16 or torch.bfloat16")
        if t.device != q.device:
            _fail(f"{name} is on {t.device} but q is on {q.device}", "put q, k and v on one device")
        if t.device.type == "meta":
            _fail(f"{name} is on the meta device, which holds no data",
                  "pass real tensors (torch.compile and FakeTensorMode trace the op without data)")
    if not q.dtype == k.dtype == v.dtype:
        _fail(f"dtypes differ: q {q.dtype}, k {k.dtype}, v {v.dtype}", "cast them to one dtype")
    d = q.shape[-1]
    if k.shape[-1] != d or v.shape[-1] != d:
        _fail(f"head_dim q={q.shape[-1]} k={k.shape[-1]} v={v.shape[-1]} differ",
              f"give q, k and v one head_dim, one of {', '.join(map(str, HEAD_DIMS))}")
    if d not in HEAD_DIMS:
        _fail(f"head_dim {d} is not supported; the supported head dims are "
              f"{', '.join(map(str, HEAD_DIMS))}",
              f"pad the head dim to the next supported one ({_next_dim(d)}) with zeros, or use "
              f"torch.nn.functional.scaled_dot_product_attention")
    if k.shape != v.shape:
        _fail(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ", "k and v need one shape")
    hq, hk = q.shape[-2 if packed else 1], k.shape[-2 if packed else 1]
    if hk == 0 or hq % hk:
        _fail(f"{hq} query heads are not a multiple of {hk} key/value heads",
              "grouped-query attention needs the kv head count to divide the q head count")
    if not packed and q.shape[0] != k.shape[0]:
        _fail(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}", "use one batch size")
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale):
        _fail(f"sm_scale={sm_scale!r} is not a finite number",
              "pass a finite softmax scale, or None for 1/sqrt(head_dim)")
    if abs(sm_scale) * _LOG2E > _FLOAT32_MAX:
        # finite as a Python float, inf where the kernels compute (float32, times log2(e)):
        # every output would be NaN, so it is refused as inf is
        _fail(f"sm_scale={sm_scale!r} is not finite in float32, where the kernels scale the scores "
              f"(|sm_scale| * log2(e) must stay below {_FLOAT32_MAX:.4g})",
              f"pass a softmax scale of magnitude below {_FLOAT32_MAX / _LOG2E:.4g}, or None for "
              f"1/sqrt(head_dim)")


def _next_dim(d: int):
    return next((h for h in HEAD_DIMS if h >= d), HEAD_DIMS[-1])


def _check_varlen_args(q, k, cu_q, cu_k, max_q, max_k):
    """What needs no tensor data: the cu_seqlens tensors' kind and the max lengths."""
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 \
                or cu.device != q.device:
            _fail(f"{name} must be a 1-D int32 tensor on {q.device}",
                  f"pass {name}.to(torch.int32) on q's device")
        if cu.numel() < 1:
            _fail(f"{name} is empty", "cumulative lengths start with 0: [0, len0, len0+len1, ...]")
    if cu_q.numel() != cu_k.numel():
        _fail(f"cu_seqlens_q has {cu_q.numel()} entries and cu_seqlens_k {cu_k.numel()}",
              "one entry per sequence plus one, in both")
    for name, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        # a SymInt under torch.compile(dynamic=True) is a length too
        if isinstance(m, bool) or not isinstance(m, (int, torch.SymInt)) or m < 0:
            _fail(f"{name}={m!r} is not a length", f"pass the longest sequence's length as {name}")


def _check_varlen_values(q, k, cu_q, cu_k, max_q, max_k):
    """The varlen contract, read from the cumulative lengths (a host copy when they live on
    an accelerator): both start at 0 and never decrease, cu_seqlens_q ends at q's token
    count, cu_seqlens_k at most at k's, and no sequence is longer than its max_seqlen."""
    for name, cu, total, exact in (("cu_seqlens_q", cu_q, q.shape[0], True),
                                   ("cu_seqlens_k", cu_k, k.shape[0], False)):
        c = cu.tolist()
        if c[0] != 0:
            _fail(f"{name} starts at {c[0]}, not 0", "cumulative lengths start with 0")
        bad = next((i for i in range(1, len(c)) if c[i] < c[i - 1]), None)
        if bad is not None:
            _fail(f"{name} decreases at entry {bad} ({c[bad - 1]} -> {c[bad]})",
                  "cumulative lengths never decrease (sequence b is rows cu[b]:cu[b+1])")
        if (c[-1] != total) if exact else (c[-1] > total):
            _fail(f"{name} ends at {c[-1]} but {'q' if exact else 'k'} holds {total} tokens",
                  f"the last entry of {name} is the total token count"
                  + ("" if exact else " (at most k's)"))
        longest = max((c[i + 1] - c[i] for i in range(len(c) - 1)), default=0)
        limit = max_q if exact else max_k
        if longest > limit:
            which = "max_seqlen_q" if exact else "max_seqlen_k"
            _fail(f"{which}={limit} but a sequence in {name} has {longest} tokens",
                  f"pass {which} >= the longest sequence ({longest})")


def varlen_contract(q, k, cu_q, cu_k, max_q, max_k) -> bool:
    """Check the varlen arguments, and their values where the contract is checked (always on
    the CPU backend, elsewhere with check_inputs); True if the values were checked."""
    from xsync import config
    from xsync.backends import select

    _check_varlen_args(q, k, cu_q, cu_k, max_q, max_k)
    checked = select().cpu_emulator or config.current().check_inputs
    if checked:
        _check_varlen_values(q, k, cu_q, cu_k, max_q, max_k)
    return checked


def programs(backend, tiles: int, persistent: bool | None = None, device=None) -> int:
    """Programs to launch for ``tiles`` tiles (the kernel loops over its share of them):
    a persistent schedule runs one per AI core (Ascend) or SM (Hopper), otherwise one per
    tile (``Backend.resident_programs``). ``persistent=None``: the backend's default schedule.
    ``backend``: a Backend or its name."""
    from xsync.backends import get

    backend = get(backend)
    if persistent is None:
        persistent = schedule.lookup(backend, 128, False, 0).persistent
    if not persistent:
        return max(1, tiles)
    resident = backend.resident_programs(device)
    return max(1, tiles if resident is None else min(tiles, resident))


def launch(kernel, q2, k2, v2, o2, lse2, cu_q, cu_k, max_q, batch, hq, hk, d, causal, scale, layout,
           backend, plan: schedule.Schedule, grid_size: int | None = None,
           constexprs_over: dict | None = None, packed_tokens: int | None = None):
    """Launch ``kernel`` (the flagship or a variant of it) on 2-D views as the ops do: the
    schedule's tiles, its program count (or ``grid_size``) and the tile order it deals them
    in (kernels/flash_attn/tiles.py); ``constexprs_over`` replaces some of the constexprs
    (A/B runs). ``packed_tokens``: the query token count of packed sequences of different
    lengths, whose tiles are counted from it and ordered on the device from ``cu_q``/``cu_k``
    (tiles.packed_order); None: every sequence is ``max_q`` long or any tile may be empty
    (a dense batch, or every (sequence, head, row block) walked). Returns (grid, compiled,
    args, constexprs)."""
    row_blocks = math.ceil(max_q / plan.tile_rows)
    pairs = batch * hq
    count = row_blocks * pairs if packed_tokens is None else \
        tiles.packed_count(pairs, row_blocks, hq, batch, packed_tokens, plan.tile_rows)
    grid = (grid_size or programs(backend, count, plan.persistent, q2.device),)
    if packed_tokens is None:
        order = tiles.order(pairs, row_blocks, plan.tile_rows, grid[0], plan.causal_group if causal else None,
                            q2.device)
    else:
        order = tiles.packed_order(cu_q, cu_k, hq, row_blocks, plan.tile_rows, plan.BN, grid[0], causal, count)
    args = (q2, k2, v2, o2, lse2, cu_q, cu_k, order, float(scale), hq, hq // hk, count, *layout)
    constexprs = dict(**dim_constexprs(d), CAUSAL=int(bool(causal)), **plan.forward_constexprs(), **scale_constexprs(scale))
    constexprs.update(constexprs_over or {})
    fixed = plan.fixed_options()    # Hopper spellings the row chose (schedule.py): over the environment
    with _config.options(**fixed) if fixed else contextlib.nullcontext():
        compiled = kernel[grid](*args, backend=backend, **constexprs)
    return grid, compiled, args, constexprs


# Schedules whose kernel spilled to local memory when first launched here (a register budget
# measured under one Triton can spill under another): (backend, head_dim, causal, dtype,
# schedule) -> bytes of local memory a thread. Rows with a fallback are checked once, by the
# kernel a positive scale launches (SCALE_POSITIVE); zero and negative scales, whose kernel is
# another specialization, follow that record and leave none of their own.
_SPILLED: dict = {}


def launched_schedule(backend, head_dim: int, causal: bool, max_seq: int,
                      dtype=torch.bfloat16, window: bool = False) -> schedule.Schedule:
    """The schedule the ops launch for this shape: the table's (schedule.lookup), or where
    its kernel spilled when this process first launched it, its ``fallback``. ``backend``: a
    Backend or its name. ``window``: the sliding-window kernel (another specialization, with
    a spill record of its own: on Hopper d64's three consumer warpgroups spill with the
    window's masks under Triton 3.6, 248 B a thread, and fall back to two)."""
    from xsync.backends import get

    backend = get(backend)
    plan = schedule.lookup(backend, head_dim, causal, max_seq, window=window)
    mask = _mask_kind(causal, window)
    while plan.fallback is not None and _SPILLED.get((backend, head_dim, mask, dtype, plan)):
        plan = plan.fallback
    return plan


def _mask_kind(causal, window) -> bool | str:
    """The spill records' mask key: the causal flag, or "window" for a windowed kernel."""
    return "window" if window else bool(causal)


def spilled_schedules() -> dict:
    """{(backend name, head_dim, causal (or "window"), dtype, schedule): local bytes a thread} of
    the table rows checked so far (0: no spill, so the row's own schedule runs)."""
    return {(key[0].name, *key[1:]): local for key, local in _SPILLED.items()}


def packs_tiles(plan: schedule.Schedule, causal: bool) -> bool:
    """Whether a varlen launch under ``plan`` takes the packed tile table (only the tiles that can
    hold rows, tiles.packed_order) rather than every row block of every pair."""
    # Packed sequences launch only the tiles that can hold rows (tiles.packed_order) where that
    # measured ahead: a persistent non-causal schedule, whose programs would otherwise walk
    # every empty row block of every pair (d64 on the varlen benchmark's problem, interleaved:
    # 478-491 vs 454-460 TFLOP/s). One program per tile starts and ends an empty tile in a
    # moment, and the table's dozen small device operations per call cost more than that saves
    # (the suite's d128 varlen rows, trees alternated: 597 / 511 vs 613 / 524); a persistent
    # causal schedule's deal of every row block by work in groups of pairs measured ahead of
    # the packed order (d64: 420 / 408 vs 403 / 388). Runs: benchmarks/results/runs/
    # flash_attn_ab_20261204_varlen_{a,b}.json, varlen_tree_ab_20261204_packed_all.json.
    return plan.persistent and not causal


def _run(q2, k2, v2, o2, lse2, cu_q, cu_k, max_q, batch, hq, hk, d, causal, scale, layout,
         packed_tokens=None, window_args=None):
    """Launch as the table says. Returns launch()'s tuple and whether the schedule is settled:
    False where this launch found its kernel spilling (its result is right, but the next call
    takes the row's fallback, so no launch plan should keep it). ``window_args``: a sliding
    window's WINDOW and extents (window.constexprs), or None."""
    from xsync.backends import select

    backend = select()
    plan = launched_schedule(backend, d, causal, max_q, q2.dtype, window=bool(window_args))
    if not packs_tiles(plan, causal):
        packed_tokens = None
    out = launch(attention_fwd, q2, k2, v2, o2, lse2, cu_q, cu_k, max_q, batch, hq, hk, d, causal,
                 scale, layout, backend, plan, constexprs_over=window_args, packed_tokens=packed_tokens)
    key = (backend, d, _mask_kind(causal, window_args), q2.dtype, plan)
    if plan.fallback is None or key in _SPILLED or not scale_constexprs(scale)["SCALE_POSITIVE"]:
        return out, True
    measure = getattr(out[1], "local_memory_bytes", None)
    spilled = measure() if measure is not None else None
    if spilled is None:
        return out, True
    _SPILLED[key] = spilled
    return out, not spilled


_OFFSETS: dict = {}     # (batch, sq, sk, device) -> (cu_q, cu_k), read-only for the kernels


def _dense_offsets(b: int, sq: int, sk: int, device):
    """The cumulative lengths of a dense batch (0, S, 2S, ...). Made once per shape and
    device: two small kernels and two allocations per call cost more than the attention of
    a short sequence. Not cached while a CUDA graph is being captured (the graph's copy
    would only be filled when it replays)."""
    key = (b, sq, sk, device)
    hit = _OFFSETS.get(key)
    if hit is not None:
        return hit
    ar = torch.arange(0, b + 1, dtype=torch.int32, device=device)
    pair = (ar * sq, ar * sk)
    if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
        if len(_OFFSETS) > 256:
            _OFFSETS.clear()
        _OFFSETS[key] = pair
    return pair


def _direct(*tensors) -> bool:
    """Whether an eager call may skip the torch.library dispatcher (about 100 us a call on
    an H200 host) and run the implementation itself: plain tensors, no autograd to record,
    no tracing, no torch function or dispatch mode. Anything else goes through the op."""
    if torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled() or \
            torch._C._len_torch_dispatch_stack():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if type(t) is not torch.Tensor or (grad and t.requires_grad):
            return False
    return True


def _default_scale(q, sm_scale):
    if sm_scale is not None:
        return sm_scale
    if isinstance(q, torch.Tensor) and q.dim() and q.shape[-1] == 0:   # 1/sqrt(0): no default scale
        _fail(f"q has head dimension 0 (shape {tuple(q.shape)})", "pass q, k and v with a head dimension of at least 1")
    return 1.0 / math.sqrt(q.shape[-1]) if isinstance(q, torch.Tensor) and q.dim() else 1.0


# Launch plans of the dense op: (shapes, strides, dtypes, devices of q, k, v; causal; scale;
# configuration) -> _Plan. A hit skips the checks (they depend on nothing else), the schedule
# lookup and the argument binding: the launch costs two allocations and the kernel launch.
_PLANS: dict = {}


class _Plan:
    __slots__ = ("launch", "lse_like", "generation", "o_layout")

    def __init__(self, launch, lse_like, o_layout=None):
        # lse_like: one float32 element expanded to [B, H, S]; empty_like of it is a
        # contiguous [B, H, S] tensor (cheaper than torch.empty with a shape, dtype, device).
        # o_layout: None for a contiguous q (O is empty_like(q)), else the Layout O takes.
        self.launch, self.lse_like, self.o_layout = launch, lse_like, o_layout
        self.generation = attention_fwd.generation


def _plan_key(q, k, v, causal, scale):
    # get_device(): an int (-1 off CUDA), cheaper to make and hash than a torch.device
    return (q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), k.dtype, k.get_device(),
            v.shape, v.stride(), v.dtype, v.get_device(), causal, scale, _config.current())


def _planned(q, k, v, causal: bool, scale: float):
    """A launch by the cached plan of these shapes, or None (no plan yet: the caller takes
    the checked path, which makes one). The two outputs are the only allocations."""
    plan = _PLANS.get(_plan_key(q, k, v, causal, scale))
    if plan is None or plan.generation != attention_fwd.generation:
        return None
    o = torch.empty_like(q) if plan.o_layout is None else \
        plan.o_layout.empty(q.shape, q.dtype, q.device, layouts.alignment(q))
    lse = torch.empty_like(plan.lse_like)
    # the kernel takes lse by its pointer alone, so the [B, H, S] tensor serves as [B*H, S]
    return (o, lse) if plan.launch(q, k, v, o, lse) else None


def attention_impl(q, k, v, causal=False, sm_scale=None, window=None):
    """``window``: a normalized sliding window (window.normalize), or None."""
    scale = _default_scale(q, sm_scale)
    causal = bool(causal)
    key = None
    if type(q) is torch.Tensor and q.is_cuda and window is None:
        hit = _planned(q, k, v, causal, scale)
        if hit is not None:
            return hit
        key = _plan_key(q, k, v, causal, scale)
    _check(q, k, v, packed=False, sm_scale=scale)
    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    # strided q, k, v as they are where their strides allow (kernels/flash_attn/layouts.py)
    q, k, v, lq, lk, direct = layouts.prepare(q, k, v, packed=False, padded=padded(d))
    o = lq.empty(q.shape, q.dtype, q.device, layouts.alignment(q))
    lse = torch.empty((b * hq, sq), dtype=torch.float32, device=q.device)
    if sq == 0 or b == 0 or hq == 0:
        return o, lse.view(b, hq, sq)
    cu_q, cu_k = _dense_offsets(b, sq, sk, q.device)
    # contiguous [B, H, S, D] as [B*H*S, D]: token t of sequence b, head h is row
    # (b*H + h)*S + t = cu[b]*H + h*S + t with cu[b] = b*S, column 0: layout (H, S, 0).
    layout = (lq.cu_rows, lq.head_rows, lq.head_cols, lk.cu_rows, lk.head_rows, lk.head_cols, hq, 0)
    q2, k2, v2, o2 = lq.view2d(q, False), lk.view2d(k, False), lk.view2d(v, False), lq.view2d(o, False)
    window_args = _window.constexprs(window, sq, sk)
    (grid, compiled, args, constexprs), settled = _run(q2, k2, v2, o2, lse, cu_q, cu_k, sq, b, hq, hk,
                                                        d, causal, scale, layout, window_args=window_args)
    prepare = getattr(compiled, "prepare", None)
    # a plan launches the caller's tensors as they come: only where none was copied
    if key is not None and not window_args and direct and settled and prepare is not None and \
            not torch.cuda.is_current_stream_capturing():
        run_args, _, _ = attention_fwd.bind(args, constexprs)
        # q, k, v, o and lse change from call to call; cu_q/cu_k (the cached offsets) and the
        # tile order are the plan's
        launch = prepare(grid, run_args, ("q", "k", "v", "o", "lse"))
        if launch is not None:
            if len(_PLANS) > 256:
                _PLANS.clear()
            lse_like = torch.empty(1, dtype=torch.float32, device=q.device).expand(b, hq, sq)
            _PLANS[key] = _Plan(launch, lse_like, None if q.is_contiguous() else lq)
    return o, lse.view(b, hq, sq)


def attention_varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          causal=False, sm_scale=None, window=None):
    """The varlen contract (see _check_varlen_values) is checked on the CPU backend always and
    elsewhere with the check_inputs option (XSYNC_CHECK_INPUTS=1): reading the lengths costs a
    device-to-host copy and a sync. Without it the outputs are zero-filled first (no result
    holds uninitialized memory) and rows outside the described sequences stay 0."""
    scale = _default_scale(q, sm_scale)
    _check(q, k, v, packed=True, sm_scale=scale)
    checked = varlen_contract(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    total_q, hq, d = q.shape
    hk = k.shape[1]
    batch = cu_seqlens_q.numel() - 1
    q, k, v, lq, lk, _ = layouts.prepare(q, k, v, packed=True, padded=padded(d))
    o = lq.empty(q.shape, q.dtype, q.device, layouts.alignment(q))
    if not checked:
        o.zero_()
    lse = (torch.empty if checked else torch.zeros)((hq, total_q), dtype=torch.float32, device=q.device)
    if checked and batch > 0:
        # max_seqlen_q only bounds the lengths: where they were read, launch for the longest
        # (a max_seqlen_q of 1e9 over short sequences would walk millions of empty row blocks)
        max_seqlen_q = min(int(max_seqlen_q), int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()))
    if batch <= 0 or total_q == 0 or max_seqlen_q == 0:
        if total_q and not checked:
            lse.fill_(float("inf"))
        return (o.contiguous() if padded(d) else o), lse
    # contiguous packed [total, H, D] as [total, H*D]: sequence b, head h starts at row cu[b],
    # column h*D: layout (1, 0, D).
    layout = (lq.cu_rows, lq.head_rows, lq.head_cols, lk.cu_rows, lk.head_rows, lk.head_cols, 0, 1)
    _run(lq.view2d(q, True), lk.view2d(k, True), lk.view2d(v, True), lq.view2d(o, True),
         lse, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), batch, hq, hk, d, causal, scale, layout,
         packed_tokens=total_q, window_args=_window.constexprs(window, max_seqlen_q, max_seqlen_k))
    # a padded head dim ran head-major ([H, T, D]): O comes back as [T, H, D] (as _empty_out)
    return (o.contiguous() if padded(d) else o), lse


@torch.library.custom_op("xsync::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  sm_scale: float, window_left: int = -1,
                  window_right: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    return attention_impl(q, k, v, causal, sm_scale, _op_window(window_left, window_right))


def _op_window(left: int, right: int):
    """The ops' window arguments as attention_impl takes them: (-1, -1) is no window (a
    normalized window is never that: window.normalize). The ops are public (torch.compile
    graphs call them), so a side below -1 is refused here too."""
    left, right = _window.sides((left, right), "torch.ops.xsync attention")
    return None if (left, right) == _window.NONE else (left, right)


@_attention_op.register_fake
def _(q, k, v, causal, sm_scale, window_left=-1, window_right=-1):
    _check(q, k, v, packed=False, sm_scale=sm_scale)
    b, hq, sq, _ = q.shape
    return _empty_out(q, False), q.new_empty((b, hq, sq), dtype=torch.float32)


@torch.library.custom_op("xsync::attention_varlen", mutates_args=())
def _attention_varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
                         max_seqlen_k: int, causal: bool, sm_scale: float, window_left: int = -1,
                         window_right: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    return attention_varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 causal, sm_scale, _op_window(window_left, window_right))


@_attention_varlen_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, sm_scale,
      window_left=-1, window_right=-1):
    _check(q, k, v, packed=True, sm_scale=sm_scale)
    _check_varlen_args(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    return _empty_out(q, True), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _empty_out(q, packed: bool):
    """O as the real op allocates it (the layout of q's group), for the fake implementations."""
    if q.is_contiguous() or (packed and padded(q.shape[-1])):
        return torch.empty_like(q, memory_format=torch.contiguous_format)
    lq = layouts.kernel_layout(q, packed, padded(q.shape[-1])) or layouts.Layout.contiguous(q, packed)
    return lq.empty(q.shape, q.dtype, q.device, layouts.alignment(q))


_TRANSFORMS = {"Grad": "torch.func.grad (or vjp/jacrev)", "Jvp": "torch.func.jvp (forward-mode AD)",
               "Vmap": "torch.func.vmap", "Functionalize": "torch.func.functionalize"}


def _refuse_transforms(op: str, *tensors):
    """torch.func transforms and forward-mode AD are not implemented for the xsync ops: the
    kernels would run on the unwrapped data and the transform would see a constant (jvp
    returned zero tangents, silently). Refused by name; reverse-mode autograd is supported."""
    if torch.compiler.is_compiling():
        return      # dynamo cannot trace the interpreter stack; the compiled graph runs the op
    interp = torch._C._functorch.peek_interpreter_stack()
    if interp is not None and any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors):
        kind = interp.key().name
        raise UnsupportedError(
            f"{op}: {_TRANSFORMS.get(kind, f'the torch.func {kind} transform')} is not supported "
            f"through xsync's attention ops (the kernels run outside the transform)",
            fix=("compute gradients with reverse-mode autograd (loss.backward() or "
                 "torch.autograd.grad), which the ops support" if kind != "Vmap" else
                 "the ops take a batch dimension already: stack the inputs to [B, H, S, D] "
                 "(or loop over the vmapped dimension)"))
    if torch.autograd.forward_ad._current_level >= 0 and any(
            torch.autograd.forward_ad.unpack_dual(t).tangent is not None for t in tensors):
        raise UnsupportedError(
            f"{op}: forward-mode AD (torch.autograd.forward_ad dual tensors) is not supported "
            f"through xsync's attention ops; the tangents would be lost",
            fix="use reverse-mode autograd (loss.backward() or torch.autograd.grad)")


def attention(q, k, v, causal: bool = False, sm_scale: float | None = None, window_size=(-1, -1)):
    """Attention forward on [B, H, S, D] tensors; returns (o, lse).

    ``window_size=(left, right)``: flash-attn's sliding window (window.py), bottom-right aligned,
    -1 unbounded, ``causal`` sets right = 0; forward and backward skip the key blocks outside
    it. Bad values raise LaunchError naming window_size.

    The library's own entry: causal aligned bottom-right when Sq != Sk (flash-attn's
    convention), O and the LSE returned. ``xsync.sdpa`` wraps it with
    torch.nn.functional.scaled_dot_product_attention's signature and top-left causal mask
    (returns O only); ``xsync.flash_attn_func`` with flash-attn's [B, S, H, D] layout
    (docs/entry_points.md). q, k and v may have any strides: the layouts models pass are read in
    place and O comes back in q's layout (kernels/flash_attn/layouts.py); K and V expanded over
    the head axis run as one kv head.

    The checks run inside the op (and its fake implementation), so a bad input gives the same
    error eagerly, through torch.ops.xsync.attention and under torch.compile. Reverse-mode
    autograd is supported; torch.func transforms and forward-mode AD raise UnsupportedError."""
    _refuse_transforms("attention", q, k, v)
    causal, window = _window.normalize(window_size, causal)
    if window is None and type(q) is torch.Tensor and q.is_cuda and type(sm_scale) in (float, type(None)) \
            and _direct(q, k, v):
        # the eager fast path: a plan for these shapes exists (the checks passed when it was made)
        hit = _planned(q, k, v, bool(causal), _default_scale(q, sm_scale))
        if hit is not None:
            return hit
    _tensor_args(q=q, k=k, v=v)
    if k.dim() == 4 and v.dim() == 4:
        k, v = layouts.mqa_heads(k, v, 1, q.shape[1])
    scale = _scale_arg(q, sm_scale)
    if _direct(q, k, v):
        return attention_impl(q, k, v, causal, scale, window)
    if window is None:
        return _attention_op(q, k, v, causal, scale)
    return _attention_op(q, k, v, causal, scale, *window)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     causal: bool = False, sm_scale: float | None = None, window_size=(-1, -1)):
    """Variable-length attention forward on packed [total, H, D] tensors; returns (o, lse).

    Contract (as flash_attn_varlen_func): cu_seqlens_* are int32 cumulative lengths starting
    at 0, never decreasing, cu_seqlens_q ending at q's token count (cu_seqlens_k at most at
    k's); max_seqlen_* are at least the longest sequence. Checked on the CPU backend and,
    with ``xsync.options(check_inputs=True)`` (XSYNC_CHECK_INPUTS=1), elsewhere; see
    attention_varlen_impl for the cost."""
    _tensor_args(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    _refuse_transforms("attention_varlen", q, k, v)
    causal, window = _window.normalize(window_size, causal, "attention_varlen")
    if k.dim() == 3 and v.dim() == 3:
        k, v = layouts.mqa_heads(k, v, 1, q.shape[1])
    if _direct(q, k, v, cu_seqlens_q, cu_seqlens_k):
        return attention_varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, _int_arg(max_seqlen_q),
                                     _int_arg(max_seqlen_k), causal, _scale_arg(q, sm_scale), window)
    return _attention_varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_k, _int_arg(max_seqlen_q),
                                _int_arg(max_seqlen_k), causal, _scale_arg(q, sm_scale),
                                *(window or _window.NONE))


def _tensor_args(**args):
    """Before the dispatcher, whose own message names neither the fix nor our op."""
    for name, arg in args.items():
        if not isinstance(arg, torch.Tensor):
            _fail(f"{name} is a {type(arg).__name__}", "pass torch tensors")


def _scale_arg(q, sm_scale):
    scale = _default_scale(q, sm_scale)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        _fail(f"sm_scale={sm_scale!r} is not a number", "pass a finite float, or None for 1/sqrt(head_dim)")
    return float(scale)          # NaN and inf are refused inside the op, where compile sees it


def _int_arg(m):
    if isinstance(m, torch.Tensor) and m.numel() == 1 and not m.is_floating_point():
        return int(m)
    if isinstance(m, bool) or not isinstance(m, (int, torch.SymInt)):
        _fail(f"a max_seqlen of {m!r} is not an integer", "pass the longest sequence's length as an int")
    return m
