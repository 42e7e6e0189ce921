"""Hopper renderer: protocol IR + placement + allocation -> Gluon (Triton 3.6-3.9) source.

The generated module is plain Gluon a user could have written:

* every agent instance of the allocation's partition list becomes one
  ``gl.warp_specialize`` partition; the first is the default partition (4 warps);
* a pipe between two agents becomes a shared-memory ring per field plus full/empty
  mbarriers (all mbarriers live in one array ``xs_bars``; ``<PIPE>_FULL`` /
  ``<PIPE>_EMPTY`` are its index bases). Each agent keeps its own counters
  (``tiles_acquired``, ``tiles_waited`` ...): slot = i % stages, parity =
  (i // stages) & 1, the producer's empty wait uses parity ^ 1;
* a pipe whose fields are all ``xs.load`` is filled by TMA (``mbarrier.expect`` at
  acquire, one TMA load per field: ``xs_tma_load``, :data:`TMA_LOAD_ALIAS`); other pipes are
  filled from registers (``smem.store`` + ``fence_async_shared`` + ``mbarrier.arrive`` at commit);
* a pipe or event inside one agent is a register variable / program order;
* an event between agents is an mbarrier (k-th wait on parity k & 1);
* a group barrier is a named barrier (``bar.sync`` / ``bar.arrive`` inline asm) with
  the allocated ID and thread count;
* ``xs.mma`` -> ``warpgroup_mma(is_async=True)``, ``xs.mma_wait`` ->
  ``warpgroup_mma_wait(n, deps=...)``; a register A operand held in a variable (Q in
  attention) gets the wgmma operand layout at its definition, so a loop does not
  convert it on every iteration.

Rewrite before rendering (:func:`fuse_accumulating_mma`, option ``fuse_mma``, default
on; DESIGN §7 "where the output accumulates"): the portable split form

    pv = xs.mma(p, v); pv = xs.mma_wait(pv, pending=0)    # role mma
    slot.pv = pv  ... w = pipe.wait(); o = o * alpha[:, None] + w.pv   # role softmax

becomes one accumulating wgmma, ``pv = warpgroup_mma(p, v, o * alpha[:, None])`` and
``o = pv``, when the product reaches exactly one ``E + product`` use through
``mma_wait`` re-bindings and pipes whose ends share the partition, and no name that E
reads changes between the mma and the use. Otherwise the code is rendered as written.

Rewrite before rendering (:func:`defer_mma_wait`, option ``defer_mma_wait``, default on;
renderer-level software pipelining): a consumer loop written in the simple form

    s = pipe.wait(); x = xs.mma(s.a, s.b, x); x = xs.mma_wait(x, pending=0); pipe.release()

keeps one wgmma in flight: ``warpgroup_mma_wait(1)`` in the loop, the release frees the
previous iteration's slot (predicated on a held-slot flag), and after the loop
``warpgroup_mma_wait(0)`` and the release of the last slot. Conditions in its docstring.

Rewrite before rendering (:func:`pingpong_schedule`, option ``pingpong`` /
``XSYNC_NV_PINGPONG``, default on with placement ``each``; FA3-style inter-warpgroup
ping-pong): the two replicas of an agent with two consumer warpgroups take turns issuing
the wgmmas of a loop whose trip count both replicas share, through the scheduler
named-barrier pair the allocation reserves (bar.sync own ID before a wgmma, bar.arrive
the other's after it; 256 threads). Conditions and placements in its docstring.

Hang debug mode (``debug_hang=True``, ``XSYNC_DEBUG_HANG=1``): every mbarrier wait is
preceded by a bounded ``mbarrier.try_wait.parity`` poll (inline PTX, %globaltimer
budget); on timeout the thread writes (agent, wait site, iteration) into a host-mapped
int32 buffer and traps. The poll addresses the barrier as ``global_smem + offset``; the
offset of ``xs_bars`` is only known after a first compile (see ``__init__``), so it is a
module constant ``XS_BARS_SMEM``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from xsync.api import DType
from xsync.backends.source import float_literal, _PRECEDENCE, Emitter, PythonRenderer
from xsync.errors import BackendError
from xsync.lowering import ir
from xsync.lowering.alloc import Allocation, is_tma_pipe
from xsync.lowering.placement import Placement
from xsync.lowering.protocol import NotConstant, evaluate
from xsync.lowering.slicing import slice_agent

# The TMA global->shared load is spelled differently across the supported Triton versions:
# 3.6/3.7 only have tma.async_copy_global_to_shared, 3.8 adds tma.async_load (same
# positional arguments) and keeps the old name, 3.9 makes the old name raise. The
# generated module feature-detects it once, in its header.
TMA_LOAD_ALIAS = ('xs_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared'
                  '  # Triton >= 3.8 / 3.6-3.7 spelling')

# pingpong_schedule on by default, placement "each": H200, flash attention d=128, one run,
# off/each TFLOP/s non-causal s=4k 531,527/550, s=16k 562,559/576; causal 464,449/457,
# 547,544/548 ("wrap" loses 20%: it keeps the softmax inside the turn).
PINGPONG_DEFAULT = True
GL_DTYPES = {"float16": "gl.float16", "bfloat16": "gl.bfloat16", "float32": "gl.float32",
             "int32": "gl.int32", "int1": "gl.int1"}
SIG_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "int32": "i32", "int1": "i1"}
_GL_OPS = {"exp2": "gl.exp2", "log2": "gl.log2", "maximum": "gl.maximum", "minimum": "gl.minimum",
           "cdiv": "gl.cdiv", "program_id": "gl.program_id", "num_programs": "gl.num_programs"}


# ---------------------------------------------------------------- value types
@dataclass(frozen=True)
class T:
    kind: str                       # scalar | tile | smem
    shape: tuple = ()
    dtype: DType | None = None
    layout: str | None = None       # rendered Gluon layout expression (tiles, smem)


SCALAR = T("scalar")


@dataclass
class TensorUse:
    """How one tensor parameter reaches the device."""

    name: str
    dtype: DType
    descs: dict = field(default_factory=dict)   # (rows, cols) -> descriptor parameter name
    pointer: bool = False                       # masked 2-D gl.load/gl.store through a pointer
    table: bool = False                         # 1-D int32 table read with xs.load_scalar


@dataclass
class WaitSite:
    """One rendered mbarrier wait (hang debug mode maps ids back to these)."""

    id: int
    agent: str
    role: str
    verb: str        # acquire | wait | event wait
    obj: str
    line: int
    what: str


@dataclass
class RenderResult:
    source: str
    kernel_name: str                 # the @gluon.jit entry point
    params: list                     # [(name, kind, extra)] in kernel-argument order
    tensors: dict                    # name -> TensorUse
    partitions: list                 # [(label, agent, replica, warps, regs)]
    num_warps: int
    wait_sites: list
    agent_ids: dict                  # partition label -> debug agent id
    num_bars: int
    debug_hang: bool
    descriptor_layouts: dict         # desc param -> (tensor, [rows, cols], element DType)


def nvmma_shared_layout(shape, dtype: DType):
    """The NVMMASharedLayout Gluon picks for a tile (TMA boxes and wgmma operands)."""
    from triton.experimental.gluon import language as gl
    return gl.NVMMASharedLayout.get_default_for(list(shape), getattr(gl, dtype.name))


def nvmma_shared_repr(shape, dtype: DType) -> str:
    try:
        return "gl." + repr(nvmma_shared_layout(shape, dtype))
    except ImportError:
        # No triton here (e.g. `xsync lower` in the core venv): same rule as
        # NVMMASharedLayout.get_default_for for 2-D, non-transposed tiles.
        row_bytes = shape[-1] * dtype.bits // 8
        swizzle = next((w for w in (128, 64, 32) if row_bytes >= w), 0)
        return (f"gl.NVMMASharedLayout(swizzle_byte_width={swizzle}, element_bitwidth={dtype.bits}, "
                f"rank=2, transposed=False, fp4_padded=False, cga_layout=[])")


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _round8(n: float) -> int:
    return int(n) // 8 * 8


# ---------------------------------------------------------------- renderer rewrites
def _assigned(s) -> set:
    """Names a statement (and everything inside it) assigns or binds."""
    out = set()
    for x in ir.walk([s]):
        if isinstance(x, ir.Assign):
            out |= set(x.targets)
        elif isinstance(x, ir.SyncOp) and x.target:
            out.add(x.target)
        elif isinstance(x, ir.For):
            out.add(x.var)
    return out


def _leaves(stmts):
    """The statements of one block in program order, role blocks entered (they do not
    change control flow); loops and branches are single leaves."""
    for s in stmts:
        if isinstance(s, ir.RoleBlock):
            yield from _leaves(s.body)
        else:
            yield s


def _replace(stmts, repl: dict):
    """Replace statements (by identity) with others, also inside role blocks."""
    return _splice(stmts, {key: [new] for key, new in repl.items()})


def fuse_accumulating_mma(stmts, kernel: ir.KernelIR, placement: Placement):
    """Rewrite the split form ``r = mma(a, b); ...; y = E + r`` into ``r = mma(a, b, E);
    ...; y = r`` (DESIGN §7: Hopper keeps O in the wgmma accumulator).

    Applies, per block (role blocks are transparent, loops and branches are recursed
    into), to an ``xs.mma`` without accumulator whose result ``r`` reaches through
    ``mma_wait`` re-bindings and same-partition pipe hand-offs (slot field written with
    ``r``, read back as ``slot.field`` after ``wait``) exactly one use, of the form
    ``y = E + r`` or ``y = r + E``, later in the same block, where no name that ``E``
    reads is assigned between the mma and the use (so E has the same value at the mma).
    Anything else (a second use, a cross-partition pipe, E's inputs changing) leaves the
    code as written."""
    out = []
    for s in stmts:
        if isinstance(s, ir.For):
            s = ir.For(s.var, s.start, s.stop, s.step, fuse_accumulating_mma(s.body, kernel, placement), s.loc)
        elif isinstance(s, ir.If):
            s = ir.If(s.cond, fuse_accumulating_mma(s.body, kernel, placement),
                      fuse_accumulating_mma(s.orelse, kernel, placement), s.loc)
        elif isinstance(s, ir.RoleBlock):
            s = ir.RoleBlock(s.role, tuple(_fuse_roles(s.body, kernel, placement)), s.loc)
        out.append(s)
    return _fuse_block(tuple(out), kernel, placement)


def _fuse_roles(stmts, kernel, placement):
    # loops/branches nested inside a role block
    for s in stmts:
        if isinstance(s, (ir.For, ir.If)):
            yield fuse_accumulating_mma((s,), kernel, placement)[0]
        else:
            yield s


def _fuse_block(stmts, kernel, placement):
    while True:
        leaves = list(_leaves(stmts))
        repl = _fuse_one(leaves, kernel, placement)
        if not repl:
            return stmts
        stmts = _replace(stmts, repl)


def _fuse_one(leaves, kernel, placement):
    for i, s in enumerate(leaves):
        if not (isinstance(s, ir.Assign) and len(s.targets) == 1 and isinstance(s.value, ir.Call)
                and s.value.op == "mma"):
            continue
        call = s.value
        if len(call.args) > 2 and not (isinstance(call.args[2], ir.Const) and call.args[2].value is None):
            continue
        t = s.targets[0]
        alias = {ir.Name(t)}        # expressions holding the product
        handoff = set()             # (pipe, field) carrying it in registers
        use = None
        ok = True
        changed = set()             # names assigned after the mma
        for j in range(i + 1, len(leaves)):
            x = leaves[j]
            if isinstance(x, ir.Assign) and x.targets == (t,) and isinstance(x.value, ir.Call) \
                    and x.value.op == "mma_wait" and x.value.args[0] == ir.Name(t):
                continue
            if isinstance(x, ir.SlotWrite) and x.value in alias:
                pipe = kernel.sync_object(x.pipe)
                if placement.crosses(pipe):
                    ok = False
                    break
                handoff.add((x.pipe, x.field))
                continue
            if isinstance(x, ir.SyncOp) and x.verb == "wait" and x.target:
                for p, f in handoff:
                    if p == x.obj:
                        alias.add(ir.Attr(ir.Name(x.target), f))
            touches = any(e in alias for st in ir.walk([x]) for e in _stmt_exprs(st))
            if touches:
                if use is not None or not isinstance(x, ir.Assign) or len(x.targets) != 1:
                    ok = False
                    break
                v = x.value
                if not (isinstance(v, ir.BinOp) and v.op == "+" and (v.right in alias) != (v.left in alias)):
                    ok = False
                    break
                other = v.left if v.right in alias else v.right
                if any(e in alias for e in ir.subexprs(other)) or ir.expr_names(other) & changed:
                    ok = False
                    break
                use = (j, x, other, v.right if v.right in alias else v.left)
            if use is None:
                changed |= _assigned(x)
            if isinstance(x, ir.Assign) and t in x.targets and use is not None:
                break
        if not ok or use is None:
            continue
        before = {e for x in leaves[:i] for st in ir.walk([x]) for e in _stmt_exprs(st)}
        if before & alias:
            continue
        j, x, other, res = use
        args = (call.args[0], call.args[1], other)
        return {id(s): ir.Assign(s.targets, ir.Call("mma", args, call.kwargs), s.loc),
                id(x): ir.Assign(x.targets, res, x.loc)}
    return None


def _stmt_exprs(s):
    """Every expression (and sub-expression) one statement reads, itself only."""
    roots = []
    if isinstance(s, ir.Assign):
        roots = [s.value]
    elif isinstance(s, ir.SlotWrite):
        roots = [s.value]
    elif isinstance(s, ir.Store):
        roots = [s.value, *s.offsets, *(s.bounds or ())]
    elif isinstance(s, ir.For):
        roots = [s.start, s.stop, s.step]
    elif isinstance(s, ir.If):
        roots = [s.cond]
    for r in roots:
        yield from ir.subexprs(r)


# ---------------------------------------------------------------- wait deferral
@dataclass(frozen=True)
class HoldInit:
    """``xs_held_<pipe> = 0`` before a loop rewritten by :func:`defer_mma_wait`."""

    flag: str
    pipe: str
    loc: object


@dataclass(frozen=True)
class DeferredRelease(ir.SyncOp):
    """``pipe.release()`` of the slot held back by :func:`defer_mma_wait`: arrives on the
    empty barrier of the oldest held slot when ``flag`` says one is held (FIFO counters
    as for any release). In the loop (``final=False``) the current slot is held next."""

    flag: str = ""
    final: bool = False


@dataclass(frozen=True)
class MmaDrain:
    """``x = warpgroup_mma_wait(0, deps=[x])`` after a loop rewritten by :func:`defer_mma_wait`."""

    target: str
    loc: object


def _mma_calls(stmts):
    return [c for s in ir.walk(stmts) for e in _stmt_exprs(s) for c in [e]
            if isinstance(c, ir.Call) and c.op in ("mma", "mma_wait")]


def _slot_of(e):
    """The slot variable an mma operand reads in shared memory (``slot.f`` or
    ``trans(slot.f)``), else None."""
    if isinstance(e, ir.Call) and e.op == "trans" and len(e.args) == 1:
        e = e.args[0]
    if isinstance(e, ir.Attr) and isinstance(e.value, ir.Name):
        return e.value.id
    return None


def defer_mma_wait(stmts, kernel: ir.KernelIR, placement: Placement):
    """Software-pipeline the wgmma of an accumulating consumer loop ("wait deferral").

    The portable form waits for every mma before it releases the slot the mma read::

        for ...:
            s = pipe.wait()
            x = mma(s.a, s.b, x)
            x = mma_wait(x, pending=0)
            pipe.release()

    so on Hopper each wgmma is drained before the next is issued. The rewrite keeps one
    wgmma in flight: the wait becomes ``warpgroup_mma_wait(1)`` (every wgmma but the one
    just issued has completed), the release frees the *previous* iteration's slot (whose
    wgmma has now completed; nothing on the first iteration), and after the loop
    ``warpgroup_mma_wait(0)`` drains the last wgmma and the last slot is released (nothing
    for a zero-trip loop). A flag ``xs_held_<pipe>`` (0 or 1) carries "one slot is held"
    through the loop; the empty-barrier arrives keep their counts and FIFO order, only
    one iteration later.

    Applies to a loop (anywhere: role blocks and branches are entered, inner loops first)
    whose body, role blocks entered, has at its top level, in this order, the only
    ``wait`` of a cross-partition pipe P with at least 2 stages, the only mma
    ``x = mma(s.f, s.g or trans(s.g), x)`` with both operands in slot s of that wait, the
    only mma_wait ``x = mma_wait(x, pending=0)``, and the only ``release`` of P; x is
    read or written nowhere else in the body, and the body has no other synchronization
    with another partition (holding the slot one iteration longer must not block a
    partner we wait for; with one stage the next ``wait`` would wait for our own
    release). Anything else is rendered as written."""
    out = []
    for s in stmts:
        if isinstance(s, ir.For):
            s = ir.For(s.var, s.start, s.stop, s.step, defer_mma_wait(s.body, kernel, placement), s.loc)
            plan = _defer_plan(s, kernel, placement)
            if plan:
                out.extend(plan)
                continue
        elif isinstance(s, ir.If):
            s = ir.If(s.cond, defer_mma_wait(s.body, kernel, placement),
                      defer_mma_wait(s.orelse, kernel, placement), s.loc)
        elif isinstance(s, ir.RoleBlock):
            s = ir.RoleBlock(s.role, defer_mma_wait(s.body, kernel, placement), s.loc)
        out.append(s)
    return tuple(out)


def _defer_plan(loop: ir.For, kernel, placement):
    leaves = list(_leaves(loop.body))
    calls = _mma_calls(loop.body)
    if sorted(c.op for c in calls) != ["mma", "mma_wait"]:
        return None
    mi = next((i for i, s in enumerate(leaves) if isinstance(s, ir.Assign) and isinstance(s.value, ir.Call)
               and s.value.op == "mma"), None)
    if mi is None or len(leaves[mi].targets) != 1:
        return None
    mma_s = leaves[mi]
    x, call = mma_s.targets[0], mma_s.value
    if len(call.args) < 3 or call.args[2] != ir.Name(x):
        return None
    slots = {_slot_of(a) for a in call.args[:2]}
    if len(slots) != 1 or None in slots:
        return None
    slot = slots.pop()
    wi = next((i for i, s in enumerate(leaves[:mi]) if isinstance(s, ir.SyncOp) and s.verb == "wait"
               and s.target == slot), None)
    if wi is None:
        return None
    pipe = kernel.sync_object(leaves[wi].obj)
    if not isinstance(pipe, ir.Pipe) or not placement.crosses(pipe) or pipe.stages < 2:
        return None
    ji = next((j for j in range(mi + 1, len(leaves)) if isinstance(leaves[j], ir.Assign)
               and isinstance(leaves[j].value, ir.Call) and leaves[j].value.op == "mma_wait"), None)
    if ji is None:
        return None
    wait_s = leaves[ji]
    pending = wait_s.value.kwarg("pending", ir.Const(0))
    if wait_s.targets != (x,) or wait_s.value.args[:1] != (ir.Name(x),) or pending != ir.Const(0):
        return None
    ri = next((r for r in range(ji + 1, len(leaves)) if isinstance(leaves[r], ir.SyncOp)
               and leaves[r].obj == pipe.name and leaves[r].verb == "release"), None)
    if ri is None:
        return None
    # the only synchronization with another partition: this wait and this release
    for st in ir.walk(loop.body):
        if isinstance(st, ir.SyncOp) and st is not leaves[wi] and st is not leaves[ri]:
            obj = kernel.sync_object(st.obj)
            if isinstance(obj, ir.Barrier) or placement.crosses(obj):
                return None
    # x: produced by the mma and its wait only, read by them only
    for st in ir.walk(loop.body):
        if st is mma_s or st is wait_s:
            continue
        own = set(st.targets) if isinstance(st, ir.Assign) else \
            {st.target} if isinstance(st, ir.SyncOp) else {st.var} if isinstance(st, ir.For) else set()
        if x in own or any(e == ir.Name(x) for e in _stmt_exprs(st)):
            return None
    flag = f"xs_held_{pipe.name}"
    deferred_wait = ir.Assign(wait_s.targets, ir.Call("mma_wait", wait_s.value.args, (("pending", ir.Const(1)),)),
                              wait_s.loc)
    rel = leaves[ri]
    body = _replace(loop.body, {id(wait_s): deferred_wait,
                                id(rel): DeferredRelease(rel.verb, rel.obj, rel.target, rel.loc, flag, False)})
    new_loop = ir.For(loop.var, loop.start, loop.stop, loop.step, body, loop.loc)
    return [HoldInit(flag, pipe.name, loop.loc), new_loop, MmaDrain(x, wait_s.loc),
            DeferredRelease(rel.verb, rel.obj, rel.target, rel.loc, flag, True)]


# ---------------------------------------------------------------- ping-pong scheduling
PINGPONG_PLACEMENTS = ("each", "first", "wrap")   # the first is the default placement


@dataclass(frozen=True)
class SchedBarrier:
    """One scheduler named-barrier operation of :func:`pingpong_schedule`.

    ``kind``: ``sync`` (bar.sync ``bar + REPLICA``: wait for this replica's turn),
    ``arrive`` (bar.arrive ``bar + 1 - REPLICA``: hand the turn to the other replica),
    ``first`` (before the loop, replica 1 arrives on ``bar``: replica 0 goes first),
    ``last`` (after the loop, replica 0 arrives on ``bar``: completes replica 1's last,
    unmatched arrival so no barrier is left half-arrived)."""

    kind: str
    bar: int
    threads: int
    loc: object
    note: str = ""


def _replica_tainted(stmts, kernel) -> set:
    """Names whose value may differ between the replicas of one agent: anything computed
    from ``xs.replica_id()``, a pipe slot (paired pipes give each replica its own data) or
    a tainted name, and anything assigned under a tainted branch or loop (fixpoint)."""
    slots = {s.target for s in ir.walk(stmts) if isinstance(s, ir.SyncOp) and s.target}
    tainted = set(slots)

    def dirty(e):
        return any(isinstance(x, ir.Call) and x.op == "replica_id" for x in ir.subexprs(e)) \
            or bool(ir.expr_names(e) & tainted)

    def visit(block, ctrl):
        changed = False
        for s in block:
            if isinstance(s, ir.Assign):
                if ctrl or dirty(s.value):
                    changed |= not set(s.targets) <= tainted
                    tainted.update(s.targets)
            elif isinstance(s, ir.For):
                c = ctrl or any(dirty(e) for e in (s.start, s.stop, s.step))
                if c and s.var not in tainted:
                    tainted.add(s.var)
                    changed = True
                changed |= visit(s.body, c)
            elif isinstance(s, ir.If):
                c = ctrl or dirty(s.cond)
                changed |= visit(s.body, c) | visit(s.orelse, c)
            elif isinstance(s, ir.RoleBlock):
                changed |= visit(s.body, ctrl)
        return changed

    while visit(stmts, False):
        pass
    return tainted


def _splice(stmts, repl: dict):
    """Replace statements (by identity) with lists of statements, also inside role blocks."""
    out = []
    for s in stmts:
        if id(s) in repl:
            out.extend(repl[id(s)])
        elif isinstance(s, ir.RoleBlock):
            out.append(ir.RoleBlock(s.role, tuple(_splice(s.body, repl)), s.loc))
        else:
            out.append(s)
    return tuple(out)


def pingpong_schedule(stmts, kernel: ir.KernelIR, agent, bar: int, threads: int, where: str = "each"):
    """Inter-warpgroup ping-pong scheduling (FA3-style) of an agent with two replicas.

    The two consumer warpgroups of one agent (replicas 0 and 1) take turns issuing
    their wgmmas, so one's softmax (or other non-tensor-core work) overlaps the other's
    GEMMs instead of both contending for the tensor core at once. Two named barriers
    ``bar`` and ``bar + 1`` (reserved by the allocation, ``threads`` = both warpgroups):
    replica r waits on ``bar + r`` (bar.sync) before issuing and hands the turn over by
    arriving on ``bar + 1 - r`` (bar.arrive, no wait). Before the loop replica 1 arrives
    once on ``bar`` (replica 0 goes first); after it replica 0 arrives once on ``bar``,
    completing replica 1's last, unmatched arrival (zero-trip loops included), so no
    barrier is left half-arrived. A replica can never arrive twice on a barrier before
    the other's matching sync (its next arrival needs the other's arrival first).

    ``where`` places the pair in the loop body, whose wgmma issues M1..Mk are in order:
    ``wrap`` sync before M1, arrive after Mk; ``first`` sync before M1, arrive after M1
    (only the first GEMM, QK^T in attention, alternates); ``each`` sync before and arrive
    after every Mi (strict alternation of every GEMM: QK0 QK1 PV0 PV1 ...). Arrivals
    follow the issue, before any wgmma wait.

    Safe by construction, so it applies only to a loop (innermost first) where: the
    agent has exactly 2 replicas (checked by the caller), the loop's bounds and every
    enclosing branch condition and loop bound are the same for both replicas (no
    ``replica_id``, pipe slot or value derived from them: see :func:`_replica_tainted`),
    and every mma of its body sits at the body's top level (role blocks entered), not
    under a branch or an inner loop. Then both replicas execute the same number of
    syncs and arrivals. Anything else is left as written."""
    if where not in PINGPONG_PLACEMENTS:
        raise BackendError(f"pingpong placement {where!r} is not one of {', '.join(PINGPONG_PLACEMENTS)}",
                           fix="set XSYNC_NV_PINGPONG to 0, 1 or a placement name")
    tainted = _replica_tainted(stmts, kernel)

    def dirty(e):
        return any(isinstance(x, ir.Call) and x.op == "replica_id" for x in ir.subexprs(e)) \
            or bool(ir.expr_names(e) & tainted)

    def is_mma(s):
        return isinstance(s, ir.Assign) and len(s.targets) == 1 and isinstance(s.value, ir.Call) \
            and s.value.op == "mma"

    def plan(loop):
        leaves = list(_leaves(loop.body))
        mmas = [s for s in leaves if is_mma(s)]
        nested = [c for c in _mma_calls(loop.body) if c.op == "mma"]
        if not mmas or len(nested) != len(mmas):      # an mma under a branch / inner loop
            return None
        sync = SchedBarrier("sync", bar, threads, loop.loc, "wait for this replica's turn")
        arrive = SchedBarrier("arrive", bar, threads, loop.loc, "hand the turn to the other replica")
        if where == "each":
            repl = {id(m): [sync, m, arrive] for m in mmas}
        elif where == "first" or len(mmas) == 1:
            repl = {id(mmas[0]): [sync, mmas[0], arrive]}
        else:
            repl = {id(mmas[0]): [sync, mmas[0]], id(mmas[-1]): [mmas[-1], arrive]}
        body = _splice(loop.body, repl)
        return [SchedBarrier("first", bar, threads, loop.loc, "replica 0 issues first"),
                ir.For(loop.var, loop.start, loop.stop, loop.step, body, loop.loc),
                SchedBarrier("last", bar, threads, loop.loc, "balance replica 1's last arrival")]

    def rewrite(block, uniform):
        out = []
        for s in block:
            if isinstance(s, ir.For):
                ok = uniform and not any(dirty(e) for e in (s.start, s.stop, s.step))
                p = plan(s) if ok else None
                if p:
                    out.extend(p)
                    continue
                s = ir.For(s.var, s.start, s.stop, s.step, rewrite(s.body, ok), s.loc)
            elif isinstance(s, ir.If):
                ok = uniform and not dirty(s.cond)
                s = ir.If(s.cond, rewrite(s.body, ok), rewrite(s.orelse, ok), s.loc)
            elif isinstance(s, ir.RoleBlock):
                s = ir.RoleBlock(s.role, rewrite(s.body, uniform), s.loc)
            out.append(s)
        return tuple(out)

    return rewrite(stmts, True)


# ---------------------------------------------------------------- intra-warpgroup overlap
# overlap_softmax on by default: H200, flash attention d=128, b*s=16384, one run, TFLOP/s
# s=4k/8k/16k, before (pingpong "each", no overlap) -> overlap without ping-pong:
# non-causal 551/570/572 -> 583/597/603, causal 456/499/550 -> 502/537/599 (overlap
# with ping-pong "each": 545/563/565, 453/500/550, no gain). So when the option
# ``pingpong`` is not given, an agent whose loop is rotated runs without ping-pong.
OVERLAP_DEFAULT = True


@dataclass(frozen=True)
class OverlapWait:
    """``x, y = warpgroup_mma_wait(pending, deps=[x, y])`` placed by :func:`overlap_softmax`
    (``targets``: the values the wait returns; a product still in flight after the wait
    is passed through it, so the loop carries a tensor, as :func:`defer_mma_wait` does)."""

    targets: tuple
    pending: int
    loc: object
    note: str = ""


def _reads(stmts) -> set:
    return {n for st in ir.walk(list(stmts)) for e in _stmt_exprs(st) if isinstance(e, ir.Name) for n in [e.id]}


def _writes(stmts) -> set:
    out = set()
    for st in stmts:
        out |= _assigned(st)
    return out


def _issue_segment(leaves, i, kernel, placement):
    """``t = P.wait(); [sched sync]; r = mma(..); [sched arrive]; r = mma_wait(r, pending=0);
    P.release()`` from leaves[i], P a cross-partition pipe with >= 2 stages whose slot the
    mma reads as B. Returns (wait, issue statements, mma, mma_wait, release, next index)."""
    n = len(leaves)
    if i >= n or not (isinstance(leaves[i], ir.SyncOp) and leaves[i].verb == "wait" and leaves[i].target):
        return None
    wait = leaves[i]
    pipe = kernel.sync_object(wait.obj)
    if not isinstance(pipe, ir.Pipe) or not placement.crosses(pipe) or pipe.stages < 2:
        return None
    j = i + 1
    issue = [wait]
    synced = j < n and isinstance(leaves[j], SchedBarrier) and leaves[j].kind == "sync"
    if synced:
        issue.append(leaves[j])
        j += 1
    if j >= n:
        return None
    m = leaves[j]
    if not (isinstance(m, ir.Assign) and len(m.targets) == 1 and isinstance(m.value, ir.Call)
            and m.value.op == "mma" and len(m.value.args) >= 2 and _slot_of(m.value.args[1]) == wait.target):
        return None
    issue.append(m)
    j += 1
    if synced:
        if not (j < n and isinstance(leaves[j], SchedBarrier) and leaves[j].kind == "arrive"):
            return None
        issue.append(leaves[j])
        j += 1
    if j + 1 >= n:
        return None
    w, rel = leaves[j], leaves[j + 1]
    t = m.targets[0]
    if not (isinstance(w, ir.Assign) and w.targets == (t,) and isinstance(w.value, ir.Call)
            and w.value.op == "mma_wait" and w.value.args[:1] == (ir.Name(t),)
            and w.value.kwarg("pending", ir.Const(0)) == ir.Const(0)):
        return None
    if not (isinstance(rel, ir.SyncOp) and rel.obj == pipe.name and rel.verb == "release"):
        return None
    return wait, issue, m, w, rel, j + 2


def overlap_softmax(stmts, kernel: ir.KernelIR, placement: Placement):
    """Intra-warpgroup overlap (FA3-style): the PV product of the previous key block is in
    flight during the softmax of the current one.

    The portable attention loop, after :func:`fuse_accumulating_mma` (and optionally
    :func:`pingpong_schedule`, placement ``each``), reads per iteration n::

        A_n: kt = K.wait(); s = mma(q, trans(kt.k)); s = mma_wait(s, 0); K.release()
        B_n: softmax of s (register hand-offs only) -> p, alpha, ...
        C_n: vt = V.wait(); pv = mma(p, vt.v, E); pv = mma_wait(pv, 0); V.release()
        D_n: register hand-offs of pv ending in exactly one ``y = pv`` (y = o_acc)

    so the tensor core idles during B (the other warpgroup's ping-pong hides part of it).
    The rewrite rotates it by one GEMM (wgmma groups retire in issue order)::

        if start < stop:
            A_0; n = start; B_0                        # S_0 issued and waited, its softmax
            for n in range(start + step, stop, step):
                kt = K.wait(); s = mma(q, kt)          # S_n                    [S_n]
                vt = V.wait(); pv = mma(p, vt, E)      # PV_{n-1}: p, alpha of B_{n-1}  [S_n, PV_{n-1}]
                s, pv = wait(1); K.release()           # S_n completes, PV_{n-1} stays in flight
                B_n                                    # softmax(S_n) overlaps PV_{n-1}
                pv = wait(0); D_{n-1}; V.release()
            vt = V.wait(); pv = mma(p, vt, E); pv = wait(0); D_last; V.release()

    The tensor core has S_n and PV_{n-1} back to back and this warpgroup's softmax runs
    under PV_{n-1}. Nothing is in flight across the loop's back edge (a product carried
    in flight into the next iteration, whose first wait would retire it, makes ptxas
    serialize every wgmma: C7514), no branch surrounds a wgmma or its wait, and the
    pending counts are constants (the first softmax is peeled into the prologue, the
    last PV into the epilogue). Pipe counters keep their counts and FIFO order: K and V
    are each waited and released once per block. Ping-pong scheduler barriers stay
    attached to their wgmma issue, so both replicas still issue 2 * trips wgmmas in
    alternation.

    Applies only to a loop (inner loops first; role blocks and branches entered) whose
    bounds and enclosing conditions are the same for every replica of the agent, whose
    step is a positive constant, whose bounds and variable the body does not assign, and
    whose body, role blocks entered, is exactly A B C D as above: A's mma without
    accumulator reads B from the slot of a >= 2-stage cross-partition pipe K and its other
    inputs are not written in the body (nor the loop variable read); B has no wgmma, no
    cross-partition synchronization and no scheduler barrier; C's mma accumulates into
    an expression E and reads B from the slot of another such pipe V; D has only
    same-partition pipe operations and one assignment of the product; D neither reads
    the loop variable nor anything A or B write, and A, B do not read what D writes; C
    and D do not read what A writes. Anything else is rendered as written."""
    consts = dict(kernel.constexpr_values)
    tainted = _replica_tainted(stmts, kernel)

    def dirty(e):
        return any(isinstance(x, ir.Call) and x.op == "replica_id" for x in ir.subexprs(e)) \
            or bool(ir.expr_names(e) & tainted)

    def rewrite(block, uniform):
        out = []
        for s in block:
            if isinstance(s, ir.For):
                ok = uniform and not any(dirty(e) for e in (s.start, s.stop, s.step))
                s = ir.For(s.var, s.start, s.stop, s.step, rewrite(s.body, ok), s.loc)
                plan = _overlap_plan(s, kernel, placement, consts) if ok else None
                if plan:
                    out.extend(plan)
                    continue
            elif isinstance(s, ir.If):
                ok = uniform and not dirty(s.cond)
                s = ir.If(s.cond, rewrite(s.body, ok), rewrite(s.orelse, ok), s.loc)
            elif isinstance(s, ir.RoleBlock):
                s = ir.RoleBlock(s.role, rewrite(s.body, uniform), s.loc)
            out.append(s)
        return tuple(out)

    return rewrite(stmts, True)


def _overlap_plan(loop: ir.For, kernel, placement, consts):
    try:
        step = evaluate(loop.step, consts)
    except (NotConstant, TypeError):
        return None
    if not isinstance(step, int) or step <= 0:
        return None
    leaves = list(_leaves(loop.body))
    calls = _mma_calls(loop.body)
    tops = [s for s in leaves if isinstance(s, ir.Assign) and isinstance(s.value, ir.Call)
            and s.value.op in ("mma", "mma_wait")]
    if len(calls) != 4 or len(tops) != 4:
        return None
    a = _issue_segment(leaves, 0, kernel, placement)
    if a is None:
        return None
    k_wait, a_issue, a_mma, a_wait, k_rel, i = a
    ci = next((j for j in range(i, len(leaves)) if isinstance(leaves[j], ir.SyncOp)
               and leaves[j].verb == "wait" and isinstance(kernel.sync_object(leaves[j].obj), ir.Pipe)
               and placement.crosses(kernel.sync_object(leaves[j].obj))), None)
    if ci is None:
        return None
    body_b = leaves[i:ci]
    c = _issue_segment(leaves, ci, kernel, placement)
    if c is None:
        return None
    v_wait, c_issue, c_mma, c_wait, v_rel, i = c
    body_d = leaves[i:]
    if v_wait.obj == k_wait.obj:
        return None
    s_name, pv = a_mma.targets[0], c_mma.targets[0]
    if s_name == pv or len(a_mma.value.args) > 2 and not (
            isinstance(a_mma.value.args[2], ir.Const) and a_mma.value.args[2].value is None):
        return None
    if len(c_mma.value.args) < 3 or isinstance(c_mma.value.args[2], ir.Const) and c_mma.value.args[2].value is None:
        return None
    # B: the softmax, no wgmma and no synchronization with another partition
    for st in ir.walk(body_b):
        if isinstance(st, (SchedBarrier, HoldInit, MmaDrain, OverlapWait)):
            return None
        if isinstance(st, ir.SyncOp):
            obj = kernel.sync_object(st.obj)
            if isinstance(obj, ir.Barrier) or placement.crosses(obj):
                return None
    # D: same-partition hand-offs of the product, one assignment y = product
    alias, handoff, y = {ir.Name(pv)}, set(), None
    for st in body_d:
        if isinstance(st, ir.SyncOp):
            obj = kernel.sync_object(st.obj)
            if not isinstance(obj, ir.Pipe) or placement.crosses(obj):
                return None
            if st.verb == "wait" and st.target:
                alias |= {ir.Attr(ir.Name(st.target), f) for p, f in handoff if p == st.obj}
        elif isinstance(st, ir.SlotWrite) and st.value in alias:
            if placement.crosses(kernel.sync_object(st.pipe)):
                return None
            handoff.add((st.pipe, st.field))
        elif isinstance(st, ir.Assign) and len(st.targets) == 1 and st.value in alias and y is None:
            y = st.targets[0]
        else:
            return None
    if y is None or y in (pv, s_name):
        return None
    # commutation: A_{n+1} moves before B_n, D_{n-1}, C_n; D_{n-1} after A_n, A_{n+1}, B_n
    a_st = a_issue + [a_wait, k_rel]
    ra, wa = _reads(a_st), _writes(a_st)
    rb, wb = _reads(body_b), _writes(body_b)
    rc, wc = _reads(c_issue + [c_wait, v_rel]), _writes(c_issue + [c_wait, v_rel])
    rd, wd = _reads(body_d), _writes(body_d)
    body_w = _writes(loop.body)
    if loop.var in body_w or loop.var in ra or loop.var in rc or loop.var in rd:
        return None
    if (ir.expr_names(loop.start) | ir.expr_names(loop.stop)) & body_w:
        return None
    if (wb | wc | wd) & (ra | wa):
        return None
    if (rc | rd) & wa or wd & (ra | wa | rb | wb) or rd & (wa | wb) - {pv}:
        return None
    if (ra - {k_wait.target, s_name}) & body_w:     # A's inputs (Q) are loop-invariant
        return None
    # the rotated loop
    loc = loop.loc
    body = (*a_issue, *c_issue,
            OverlapWait((s_name, pv), 1, a_wait.loc, "S of this block completes; the previous PV stays in flight"),
            k_rel, *body_b,
            OverlapWait((pv,), 0, c_wait.loc, "the previous PV completes (it overlapped this softmax)"),
            *body_d, v_rel)
    new_loop = ir.For(loop.var, ir.BinOp("+", loop.start, loop.step), loop.stop, loop.step, body, loc)
    prologue = (*a_issue, a_wait, k_rel, ir.Assign((loop.var,), loop.start, loc), *body_b)
    epilogue = (*c_issue, OverlapWait((pv,), 0, c_wait.loc, "the last PV completes"), *body_d, v_rel)
    return [ir.If(ir.Compare("<", loop.start, loop.stop), (*prologue, new_loop, *epilogue), (), loc)]

class NvidiaRenderer(PythonRenderer):
    def __init__(self, kernel: ir.KernelIR, placement: Placement, allocation: Allocation,
                 options: dict | None = None):
        self.kernel = kernel
        self.placement = placement
        self.allocation = allocation
        self.options = dict(options or {})
        self.debug_hang = bool(self.options.get("debug_hang", False))
        self.bars_smem = int(self.options.get("bars_smem", 0))
        self.timeout_ms = int(self.options.get("hang_timeout_ms", 2000))
        self.consts = dict(kernel.constexpr_values)
        self.layouts: dict[str, str] = {}        # constant name -> layout constructor
        self.layout_notes: dict[str, str] = {}
        self.wait_sites: list[WaitSite] = []
        self.tensors: dict[str, TensorUse] = {}
        self.bar_base: dict[str, int] = {}       # "tiles:full" -> index base in xs_bars
        self.bar_count: dict[str, int] = {}
        self.num_bars = 0
        self.tmp = 0
        self._check_supported()
        self._collect_tensors()
        self._assign_barriers()

    # ------------------------------------------------------------ errors
    def fail(self, what, loc=None, objects=(), fix=""):
        raise BackendError(what, loc=loc or self.kernel.loc, objects=tuple(objects), fix=fix)

    def _check_supported(self):
        for p in self.kernel.pipes:
            if self.placement.crosses(p):
                for f in p.fields:
                    if len(f.shape) != 2:
                        self.fail(f"pipe '{p.name}' field '{f.name}' has shape {list(f.shape)}; the Hopper "
                                  f"lowering keeps 2-D tiles in shared memory", loc=p.loc, objects=(p.name,),
                                  fix="use 2-D tiles for pipe fields")

    # ------------------------------------------------------------ constants
    def cval(self, e, what, loc):
        try:
            return evaluate(e, self.consts)
        except (NotConstant, TypeError):
            self.fail(f"{what} must be a compile-time constant", loc=loc,
                      fix="use literals and constexpr parameters")

    def shape_of(self, e, loc) -> tuple:
        items = e.items if isinstance(e, ir.TupleExpr) else (e,)
        return tuple(int(self.cval(x, "a tile shape", loc)) for x in items)

    # ------------------------------------------------------------ analysis
    def _collect_tensors(self):
        for p in self.kernel.params:
            if p.kind == "tensor":
                self.tensors[p.name] = TensorUse(p.name, p.dtype)
        tma_pipes = {p.name for p in self.kernel.pipes if self.placement.crosses(p) and is_tma_pipe(self.kernel, p)}
        tma_loads = set()
        for s in ir.walk(self.kernel.body):
            if isinstance(s, ir.SlotWrite) and s.pipe in tma_pipes:
                call = s.value
                t = call.args[0].id
                shape = self.shape_of(call.args[2], s.loc)
                spec = self.kernel.sync_object(s.pipe).field(s.field)
                if tuple(spec.shape) != shape:
                    self.fail(f"xs.load of {list(shape)} into field '{s.field}' {list(spec.shape)} of pipe "
                              f"'{s.pipe}'", loc=s.loc, objects=(s.pipe,), fix="load the field's shape")
                use = self.tensors[t]
                if spec.dtype != use.dtype:
                    self.fail(f"TMA copy of `{t}` ({use.dtype.name}) into field '{s.field}' "
                              f"({spec.dtype.name}) of pipe '{s.pipe}'", loc=s.loc, objects=(s.pipe,),
                              fix="declare the field with the tensor's dtype (a.dtype)")
                use.descs.setdefault(shape, None)
                tma_loads.add(id(call))
        for s in ir.walk(self.kernel.body):
            exprs = []
            if isinstance(s, ir.Store):
                self.tensors[s.tensor].pointer = True
                exprs = [s.value, *s.offsets, *(s.bounds or ())]
            elif isinstance(s, (ir.Assign, ir.SlotWrite)):
                exprs = [s.value]
            elif isinstance(s, ir.For):
                exprs = [s.start, s.stop, s.step]
            elif isinstance(s, ir.If):
                exprs = [s.cond]
            for e in exprs:
                for c in ir.expr_calls(e):
                    if c.op == "load" and id(c) not in tma_loads:
                        self.tensors[c.args[0].id].pointer = True
                    elif c.op == "load_scalar":
                        self.tensors[c.args[0].id].table = True
        for use in self.tensors.values():
            many = len(use.descs) > 1
            for shape in list(use.descs):
                use.descs[shape] = f"{use.name}_desc" + (f"_{shape[0]}x{shape[1]}" if many else "")

    def _assign_barriers(self):
        # mbarrier groups as the allocation sized them (rings x stages, from the skeleton)
        k = 0
        for g in self.allocation.mbarriers:
            self.bar_base[f"{g.obj}:{g.side}"] = k
            self.bar_count[f"{g.obj}:{g.side}"] = g.barriers
            k += g.barriers
        self.num_bars = k

    def _paired(self, obj) -> int:
        """Replica count when obj links replica i to replica i (each pair has its own ring)."""
        link = self.allocation.skeleton.link(obj.name)
        return link.rings if link.paired else 0

    def barrier_threads(self, b: ir.Barrier) -> int:
        return self.allocation.named_barrier(b.name).threads

    # ------------------------------------------------------------ layouts
    def layout_const(self, name: str, ctor: str, note: str) -> str:
        self.layouts.setdefault(name, ctor)
        self.layout_notes.setdefault(name, note)
        return name

    def layout2d(self, shape) -> str:
        """Distributed layout of a 2-D register tile in the current partition."""
        r, c = shape
        if self.warps == 4 and c % 8 == 0 and 8 <= c <= 256:
            # The wgmma accumulator layout depends on the column count only, so every
            # [*, c] tile of a consumer warpgroup shares it (no layout conversions).
            return self.layout_const(
                f"ACC_N{c}",
                f"gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, {c}, 16])",
                f"wgmma accumulator layout: [*, {c}] tiles of a consumer warpgroup")
        w = self.warps
        return self.layout_const(
            f"BLOCKED_{w}W", f"gl.BlockedLayout([1, 4], [4, 8], [{w}, 1], [1, 0])",
            f"2-D register tiles in {w}-warp partitions")

    def layout1d(self) -> str:
        w = self.warps
        return self.layout_const(f"ROW_{w}W", f"gl.BlockedLayout([1], [32], [{w}], [0])",
                                 f"1-D register tiles in {w}-warp partitions")

    def smem_layout(self, shape, dtype) -> str:
        name = f"SMEM_{dtype.name.upper()}_{shape[0]}x{shape[1]}"
        return self.layout_const(name, nvmma_shared_repr(shape, dtype),
                                 f"shared-memory tile [{shape[0]}, {shape[1]}] {dtype.name}")

    # ------------------------------------------------------------ expressions
    def dtype(self, d) -> str:
        return GL_DTYPES[d.name]

    def const(self, v) -> str:
        if isinstance(v, DType):
            return self.dtype(v)
        return float_literal(v) if isinstance(v, float) else repr(v)

    def fresh(self, stem: str) -> str:
        self.tmp += 1
        return f"xs_{stem}{self.tmp}"

    def want_cvt(self, code: str, t: T, want: str | None, name: str | None = None):
        if t.kind == "tile" and want is not None and t.layout != want:
            if name is not None and len(t.shape) == 1 and not want.startswith(("ROW_", "BLOCKED_")):
                self.prefs.setdefault(name, want)
            return f"gl.convert_layout({code}, {want})", T("tile", t.shape, t.dtype, want)
        return code, t

    def tx(self, e, want: str | None = None, parent: int = 0):
        """Render expression ``e`` -> (code, type). ``want``: layout the result must have."""
        if isinstance(e, ir.Const):
            return self.const(e.value), SCALAR
        if isinstance(e, ir.Name):
            if e.id in self.consts:
                return e.id, SCALAR
            t = self.env.get(e.id, SCALAR)
            if t.kind == "smem":
                code = e.id
                lay = want or self.layout2d(t.shape)
                return f"{code}.load({lay})", T("tile", t.shape, t.dtype, lay)
            return self.want_cvt(e.id, t, want, e.id)
        if isinstance(e, (ir.BinOp, ir.Compare)):
            p = _PRECEDENCE["cmp" if isinstance(e, ir.Compare) else e.op]
            lt, rt = self.peek(e.left), self.peek(e.right)
            shape, lay = self.bshape([lt, rt], want)
            lc, lt = self.tx(e.left, self.child_want(lt, shape, lay), p + (isinstance(e, ir.Compare)))
            rc, rt = self.tx(e.right, self.child_want(rt, shape, lay), p + 1)
            code = f"{lc} {e.op} {rc}"
            if p < parent:
                code = f"({code})"
            if shape is None:
                return code, SCALAR
            dt = DType("int1", 8) if isinstance(e, ir.Compare) else self.promote(lt, rt)
            return code, T("tile", shape, dt, lay)
        if isinstance(e, ir.BoolOp):
            p = _PRECEDENCE[e.op]
            ts = [self.peek(v) for v in e.values]
            shape, lay = self.bshape(ts, want)
            parts = [self.tx(v, self.child_want(t, shape, lay), p + 1)[0] for v, t in zip(e.values, ts)]
            if shape is None:
                code = f" {e.op} ".join(parts)
                return (f"({code})" if p < parent else code), SCALAR
            code = " & ".join(f"({x})" for x in parts) if e.op == "and" else " | ".join(f"({x})" for x in parts)
            return f"({code})", T("tile", shape, DType("int1", 8), lay)
        if isinstance(e, ir.UnaryOp):
            c, t = self.tx(e.operand, want, _PRECEDENCE["unary"])
            if e.op == "not":
                return (f"not {c}" if t.kind == "scalar" else f"~({c})"), t
            return f"{e.op}{c}", t
        if isinstance(e, ir.TupleExpr):
            return "[" + ", ".join(self.tx(i)[0] for i in e.items) + "]", SCALAR
        if isinstance(e, ir.Subscript):
            return self.subscript(e, want)
        if isinstance(e, ir.Cast):
            c, t = self.tx(e.value, want, 99)
            if t.kind == "scalar":
                return f"{c}.to({self.dtype(e.dtype)})", SCALAR
            return f"{c}.to({self.dtype(e.dtype)})", T("tile", t.shape, e.dtype, t.layout)
        if isinstance(e, ir.Attr):
            view, t = self.field_view(e)
            if t.kind == "smem":
                lay = want or self.layout2d(t.shape)
                return f"{view}.load({lay})", T("tile", t.shape, t.dtype, lay)
            return self.want_cvt(view, t, want)
        if isinstance(e, ir.Call):
            return self.call_tx(e, want)
        raise TypeError(f"cannot render {e!r}")

    def peek(self, e) -> T:
        """Type of ``e`` without keeping the rendering (used to plan layouts)."""
        saved = (self.tmp, dict(self.prefs), self.out, list(self.last_mma_reads))
        self.out = Emitter()
        try:
            return self.tx(e)[1]
        finally:
            self.tmp, self.prefs, self.out, self.last_mma_reads = saved

    def bshape(self, ts, want):
        tiles = [t for t in ts if t.kind == "tile"]
        if not tiles:
            return None, None
        rank = max(len(t.shape) for t in tiles)
        shape = [1] * rank
        for t in tiles:
            for i, d in enumerate((1,) * (rank - len(t.shape)) + tuple(t.shape)):
                shape[i] = max(shape[i], d)
        shape = tuple(shape)
        if want is not None:
            return shape, want
        full = [t.layout for t in tiles if tuple(t.shape) == shape and t.layout]
        if full:
            # prefer a layout some computation produced over a default one (ROW_/BLOCKED_)
            derived = [lay for lay in full if not lay.startswith(("ROW_", "BLOCKED_"))]
            return shape, (derived or full)[0]
        if rank == 2:
            return shape, self.layout2d(shape)
        lays = [t.layout for t in tiles if t.layout]
        return shape, lays[0] if lays else self.layout1d()

    @staticmethod
    def child_want(t, shape, lay):
        if shape is None or t.kind != "tile":
            return None
        return lay

    @staticmethod
    def promote(*ts):
        dts = [t.dtype for t in ts if t.kind == "tile" and t.dtype is not None]
        for name in ("float32", "bfloat16", "float16"):
            for d in dts:
                if d.name == name:
                    return d
        return dts[0] if dts else None

    def subscript(self, e: ir.Subscript, want):
        inner = self.peek(e.value)
        idx = ", ".join("None" if i is None else ":" for i in e.index)
        if inner.kind != "tile" or len(inner.shape) != 1 or len(e.index) != 2:
            c, t = self.tx(e.value, None, 99)
            return f"{c}[{idx}]", t
        dim = e.index.index(None)           # expanded axis
        shape = (1, inner.shape[0]) if dim == 0 else (inner.shape[0], 1)
        parent = want or (inner.layout[len(f"gl.SliceLayout({dim}, "):-1]
                          if inner.layout and inner.layout.startswith(f"gl.SliceLayout({dim}, ") else None)
        if parent is None:
            # the other extent is unknown here: guess the agent's usual column count (the
            # second rendering pass fixes a wrong guess through the recorded preferences)
            cols = inner.shape[0] if dim == 0 else self.usual_cols or inner.shape[0]
            parent = self.layout2d((64, cols))
        c, _ = self.tx(e.value, f"gl.SliceLayout({dim}, {parent})", 99)
        return f"{c}[{idx}]", T("tile", shape, inner.dtype, parent)

    def field_view(self, e: ir.Attr):
        slot = e.value.id
        pipe = self.slot_pipe.get(slot)
        if pipe is None:
            self.fail(f"`{slot}.{e.attr}` is not a slot field here")
        spec = pipe.field(e.attr)
        if not self.placement.crosses(pipe):
            t = self.env.get(f"{pipe.name}_{e.attr}", T("tile", spec.shape, spec.dtype, None))
            return f"{pipe.name}_{e.attr}", t
        return f"{pipe.name}_{e.attr}.index({slot})", T("smem", spec.shape, spec.dtype, self.smem_layout(spec.shape, spec.dtype))

    def smem_operand(self, e):
        """Shared-memory view for an mma operand, or None if it lives in registers."""
        if isinstance(e, ir.Attr) and isinstance(e.value, ir.Name) and e.value.id in self.slot_pipe \
                and self.placement.crosses(self.slot_pipe[e.value.id]):
            view, t = self.field_view(e)
            return view, t
        if isinstance(e, ir.Call) and e.op == "trans":
            inner = self.smem_operand(e.args[0])
            if inner is not None:
                view, t = inner
                return f"{view}.permute((1, 0))", T("smem", tuple(reversed(t.shape)), t.dtype, t.layout)
        return None

    def call_tx(self, e: ir.Call, want):
        op = e.op
        if op in ("program_id", "num_programs", "cdiv"):
            return f"{_GL_OPS[op]}({', '.join(self.tx(a)[0] for a in e.args)})", SCALAR
        if op == "replica_id":
            return "REPLICA", SCALAR
        if op in ("maximum", "minimum", "exp2", "log2"):
            ts = [self.peek(a) for a in e.args]
            shape, lay = self.bshape(ts, want)
            args = [self.tx(a, self.child_want(t, shape, lay))[0] for a, t in zip(e.args, ts)]
            if shape is None:
                return f"{_GL_OPS[op]}({', '.join(args)})", SCALAR
            dt = self.promote(*ts)
            return f"{_GL_OPS[op]}({', '.join(args)})", T("tile", shape, dt, lay)
        if op == "where":
            ts = [self.peek(a) for a in e.args]
            shape, lay = self.bshape(ts, want)
            args = [self.tx(a, self.child_want(t, shape, lay))[0] for a, t in zip(e.args, ts)]
            return f"gl.where({', '.join(args)})", T("tile", shape, self.promote(*ts[1:]), lay)
        if op == "arange":
            a, b = (int(self.cval(x, "xs.arange bounds", self.loc)) for x in e.args)
            if not _pow2(b - a):
                self.fail(f"xs.arange({a}, {b}): the length must be a power of two", loc=self.loc)
            lay = want or self.layout1d()
            return f"gl.arange({a}, {b}, layout={lay})", T("tile", (b - a,), DType("int32", 32), lay)
        if op in ("zeros", "full"):
            shape = self.shape_of(e.args[0], self.loc)
            dt = e.args[-1].value
            lay = want or (self.layout2d(shape) if len(shape) == 2 else self.layout1d())
            dims = "[" + ", ".join(map(str, shape)) + "]"
            if op == "zeros":
                return f"gl.zeros({dims}, {self.dtype(dt)}, {lay})", T("tile", shape, dt, lay)
            v = self.tx(e.args[1])[0]
            return f"gl.full({dims}, {v}, {self.dtype(dt)}, {lay})", T("tile", shape, dt, lay)
        if op in ("max", "sum"):
            axis = int(self.cval(e.args[1], "the reduction axis", self.loc))
            c, t = self.tx(e.args[0])
            lay = f"gl.SliceLayout({axis}, {t.layout})"
            shape = tuple(d for i, d in enumerate(t.shape) if i != axis)
            return self.want_cvt(f"gl.{op}({c}, {axis})", T("tile", shape, t.dtype, lay), want)
        if op == "trans":
            c, t = self.tx(e.args[0])
            shape = tuple(reversed(t.shape))
            lay = want or self.layout2d(shape)
            return f"gl.convert_layout(gl.permute({c}, (1, 0)), {lay})", T("tile", shape, t.dtype, lay)
        if op == "load":
            return self.pointer_load(e, want)
        if op == "load_scalar":
            t = e.args[0].id
            return f"gl.load({t} + {self.tx(e.args[1], None, _PRECEDENCE['+'] + 1)[0]})", SCALAR
        if op == "mma":
            return self.mma(e, want)
        if op == "mma_wait":
            c, t = self.tx(e.args[0])
            n = int(self.cval(e.kwarg("pending", ir.Const(0)), "mma_wait pending", self.loc))
            return f"warpgroup_mma_wait({n}, deps=[{c}])", t
        self.fail(f"xs.{op} has no Hopper lowering yet", loc=self.loc)

    def mma(self, e: ir.Call, want):
        if self.warps != 4:
            self.fail("xs.mma outside a 4-warp consumer partition", loc=self.loc)
        a, b = e.args[0], e.args[1]
        bs = self.smem_operand(b)
        if bs is None:
            self.fail("the B operand of xs.mma must come from a pipe slot (wgmma reads B from shared "
                      "memory)", loc=self.loc, fix="pass B through a pipe from its producer role")
        bview, bt = bs
        at = self.peek(a) if self.smem_operand(a) is None else self.smem_operand(a)[1]
        m, n = at.shape[0], bt.shape[1]
        acc_l = self.layout2d((m, n))
        if not acc_l.startswith("ACC_") or m % 64:
            self.fail(f"xs.mma result [{m}, {n}] has no wgmma layout (M must be a multiple of 64, "
                      f"N a multiple of 8 up to 256)", loc=self.loc)
        reads = [bview]
        asm = self.smem_operand(a)
        if asm is not None:
            acode = asm[0]
            reads.insert(0, acode)
        else:
            bits = (at.dtype.bits if at.dtype else 16)
            dot_l = f"gl.DotOperandLayout(operand_index=0, parent={acc_l}, k_width={32 // bits})"
            if isinstance(a, ir.Name) and a.id not in self.consts and at.kind == "tile" and at.layout != dot_l:
                # a register A operand held in a variable (Q in attention): give its
                # definition the operand layout (next rendering pass), so a loop does
                # not convert it on every iteration
                self.prefs.setdefault(a.id, dot_l)
            acode, _ = self.tx(a, dot_l)
        if len(e.args) > 2 and not (isinstance(e.args[2], ir.Const) and e.args[2].value is None):
            ccode, _ = self.tx(e.args[2], acc_l)
        else:
            ccode = f"gl.zeros([{m}, {n}], gl.float32, {acc_l})"
        self.last_mma_reads = reads
        return (f"warpgroup_mma({acode}, {bview}, {ccode}, is_async=True)",
                T("tile", (m, n), DType("float32", 32), acc_l))

    def pointer_load(self, e: ir.Call, want):
        t = e.args[0].id
        use = self.tensors[t]
        shape = self.shape_of(e.args[2], self.loc)
        offs = e.args[1].items
        if len(shape) != 2:
            self.fail("xs.load reads 2-D tiles", loc=self.loc)
        lay = want or self.layout2d(shape)
        r, c = self.fresh("rows"), self.fresh("cols")
        self.out.line(f"{r} = {self.tx(offs[0])[0]} + gl.arange(0, {shape[0]}, layout=gl.SliceLayout(1, {lay}))")
        self.out.line(f"{c} = {self.tx(offs[1])[0]} + gl.arange(0, {shape[1]}, layout=gl.SliceLayout(0, {lay}))")
        code = (f"gl.load({t} + {r}[:, None].to(gl.int64) * {t}_stride + {c}[None, :], "
                f"mask=({r}[:, None] < {t}_rows) & ({c}[None, :] < {t}_cols), other=0.0)")
        return code, T("tile", shape, use.dtype, lay)

    # ------------------------------------------------------------ statements
    def render_agent_body(self, agent, replica_count, stmts):
        self.env: dict[str, T] = {}
        self.slot_pipe: dict[str, ir.Pipe] = {}
        self.tmp = 0
        self.mma_reads: dict[str, list] = {}
        self.last_mma_reads = []
        self.loc = self.kernel.loc
        self.agent = agent
        self.usual_cols = None
        self.role = agent.roles[0]
        self.block(stmts)

    def block(self, stmts):
        if not stmts:
            self.out.line("pass")
        for s in stmts:
            self.loc = getattr(s, "loc", self.loc)
            self.stmt(s)

    def stmt(self, s):
        o = self.out
        if isinstance(s, ir.Assign):
            self.assign(s)
        elif isinstance(s, ir.SlotWrite):
            self.slot_write(s)
        elif isinstance(s, ir.Store):
            self.store(s)
        elif isinstance(s, ir.RoleBlock):
            o.line(f"# role '{s.role}' (line {s.loc.line})")
            self.role = s.role
            self.block(s.body)
        elif isinstance(s, ir.For):
            o.line(f"for {s.var} in range({self.tx(s.start)[0]}, {self.tx(s.stop)[0]}, {self.tx(s.step)[0]}):"
                   f"  # line {s.loc.line}")
            self.env[s.var] = SCALAR
            o.indent()
            self.block(s.body)
            o.dedent()
        elif isinstance(s, ir.If):
            o.line(f"if {self.tx(s.cond)[0]}:  # line {s.loc.line}")
            o.indent()
            self.block(s.body)
            o.dedent()
            if s.orelse:
                o.line("else:")
                o.indent()
                self.block(s.orelse)
                o.dedent()
        elif isinstance(s, DeferredRelease):
            self.deferred_release(s)
        elif isinstance(s, ir.SyncOp):
            self.sync(s)
        elif isinstance(s, HoldInit):
            o.line(f"{s.flag} = 0  # defer_mma_wait: 1 while a slot of '{s.pipe}' is held until the next "
                   f"wgmma wait")
            self.env[s.flag] = SCALAR
        elif isinstance(s, SchedBarrier):
            self.sched_barrier(s)
        elif isinstance(s, OverlapWait):
            o.line(f"{', '.join(s.targets)} = warpgroup_mma_wait({s.pending}, deps=[{', '.join(s.targets)}])"
                   f"  # line {s.loc.line}: overlap_softmax: {s.note}")
        elif isinstance(s, MmaDrain):
            o.line(f"{s.target} = warpgroup_mma_wait(0, deps=[{s.target}])  # line {s.loc.line}: defer_mma_wait: "
                   f"the loop's last wgmma completes")
        else:
            raise TypeError(f"cannot render {s!r}")

    def assign(self, s: ir.Assign):
        o = self.out
        v = s.value
        if len(s.targets) > 1:
            if not isinstance(v, ir.TupleExpr):
                self.fail("tuple assignment needs a tuple", loc=s.loc)
            parts = [self.tx(x) for x in v.items]
            o.line(f"{', '.join(s.targets)} = {', '.join(c for c, _ in parts)}")
            for n, (_, t) in zip(s.targets, parts):
                self.env[n] = t
            return
        target = s.targets[0]
        want = self.prefs.get(target)
        prev = self.env.get(target)
        if want is None and prev is not None and prev.kind == "tile":
            # A loop-carried value must keep one layout. If the new value's natural layout
            # differs, the next rendering pass gives the first definition that layout.
            natural = self.peek(v)
            if natural.kind == "tile" and natural.layout and natural.layout != prev.layout \
                    and not natural.layout.startswith(("ROW_", "BLOCKED_")):
                self.prefs.setdefault(target, natural.layout)
            want = prev.layout
        if isinstance(v, ir.Call) and v.op == "mma_wait":
            c, t = self.tx(v.args[0], want)
            n = int(self.cval(v.kwarg("pending", ir.Const(0)), "mma_wait pending", s.loc))
            reads = self.mma_reads.get(v.args[0].id, []) if isinstance(v.args[0], ir.Name) else []
            deps = [c] + reads
            lhs = target + (", " + ", ".join("_" for _ in reads) if reads else "")
            o.line(f"{lhs} = warpgroup_mma_wait({n}, deps=[{', '.join(deps)}])"
                   f"  # line {s.loc.line}: wait until <= {n} wgmma in flight")
            self.env[target] = t
            return
        self.last_mma_reads = []
        if want is not None and want.startswith("gl.DotOperandLayout(") and not (
                isinstance(v, ir.Call) and v.op in ("mma", "mma_wait")):
            # operand layout: compute in the natural layout, convert once here
            code, t = self.tx(v)
            code, t = self.want_cvt(code, t, want)
        else:
            code, t = self.tx(v, want)
            if t.kind == "tile" and want is not None and t.layout != want and (
                    target in self.prefs or (prev is not None and prev.kind == "tile"
                                             and t.shape == prev.shape)):
                # a value defined again (a loop-carried one, or a peeled copy of a loop body)
                # keeps one layout: convert where the expression does not produce it
                code, t = self.want_cvt(code, t, want)
        if t.kind == "tile" and len(t.shape) == 2 and t.shape[1] > 1 and self.usual_cols is None:
            self.usual_cols = t.shape[1]
        note = f"  # line {s.loc.line}: async wgmma" if isinstance(v, ir.Call) and v.op == "mma" else ""
        o.line(f"{target} = {code}{note}")
        if self.last_mma_reads:
            self.mma_reads[target] = list(self.last_mma_reads)
        self.env[target] = t

    def store(self, s: ir.Store):
        o = self.out
        c, t = self.tx(s.value)
        if t.kind != "tile" or len(t.shape) != 2:
            self.fail("xs.store writes 2-D tiles", loc=s.loc)
        lay = t.layout
        tn = s.tensor
        val = self.fresh("val")
        r, cc = self.fresh("rows"), self.fresh("cols")
        o.line(f"# line {s.loc.line}: xs.store({tn}, ...) -- out-of-bounds parts are masked off")
        o.line(f"{val} = {c}")
        o.line(f"{r} = {self.tx(s.offsets[0])[0]} + gl.arange(0, {t.shape[0]}, layout=gl.SliceLayout(1, {lay}))")
        o.line(f"{cc} = {self.tx(s.offsets[1])[0]} + gl.arange(0, {t.shape[1]}, layout=gl.SliceLayout(0, {lay}))")
        mask = f"({r}[:, None] < {tn}_rows) & ({cc}[None, :] < {tn}_cols)"
        if s.bounds:
            b0, b1 = (self.tx(x)[0] for x in s.bounds)
            mask += f" & ({r}[:, None] < {b0}) & ({cc}[None, :] < {b1})"
        o.line(f"gl.store({tn} + {r}[:, None].to(gl.int64) * {tn}_stride + {cc}[None, :], "
               f"{val}.to({self.dtype(self.tensors[tn].dtype)}), mask={mask})")

    def slot_write(self, s: ir.SlotWrite):
        o = self.out
        pipe = self.kernel.sync_object(s.pipe)
        spec = pipe.field(s.field)
        if not self.placement.crosses(pipe):
            c, t = self.tx(s.value)
            o.line(f"{pipe.name}_{s.field} = {c}  # line {s.loc.line}: {s.slot}.{s.field} (same partition: registers)")
            self.env[f"{pipe.name}_{s.field}"] = t
            return
        full = self.bar_index(pipe, "full", s.slot)
        if is_tma_pipe(self.kernel, pipe):
            call = s.value
            t = call.args[0].id
            desc = self.tensors[t].descs[tuple(spec.shape)]
            offs = ", ".join(self.tx(x)[0] for x in call.args[1].items)
            o.line(f"xs_tma_load({desc}, [{offs}], {full}, {pipe.name}_{s.field}.index({s.slot}))"
                   f"  # line {s.loc.line}: {s.slot}.{s.field} = xs.load(...)")
            return
        c, t = self.tx(s.value)
        if t.kind == "tile" and t.dtype is not None and t.dtype != spec.dtype:
            c = f"({c}).to({self.dtype(spec.dtype)})"
        o.line(f"{pipe.name}_{s.field}.index({s.slot}).store({c})  # line {s.loc.line}: {s.slot}.{s.field} = ...")

    # ------------------------------------------------------------ sync
    def ring_slot(self, pipe, counter: str) -> str:
        base = f"REPLICA * {pipe.stages} + " if self._paired(pipe) else ""
        return f"{base}{counter} % {pipe.stages}"

    def bar_index(self, obj, side, slot: str) -> str:
        return f"xs_bars.index({obj.name.upper()}_{side.upper()} + {slot})"

    def bar_wait(self, obj, side: str, index_expr: str, parity: str, verb: str, counter: str, line: int, what: str):
        bar = f"xs_bars.index({obj.name.upper()}_{side.upper()} + {index_expr})"
        if self.debug_hang:
            site = len(self.wait_sites)
            self.wait_sites.append(WaitSite(site, self.agent.name, self.role, verb, obj.name, line, what))
            self.out.line(f"xs_debug_wait({obj.name.upper()}_{side.upper()} + {index_expr}, {parity}, "
                          f"xs_dbg, AGENT_ID, {site}, {counter})  # bounded poll first (XSYNC_DEBUG_HANG)")
        self.out.line(f"mbarrier.wait({bar}, {parity})  # line {line}: {what}")

    def sync(self, s: ir.SyncOp):
        o, line = self.out, s.loc.line
        obj = self.kernel.sync_object(s.obj)
        if isinstance(obj, ir.Pipe):
            self.pipe_op(s, obj)
        elif isinstance(obj, ir.Event):
            if not self.placement.crosses(obj):
                o.line(f"# line {line}: xs.{'signal' if s.verb == 'signal' else 'wait'}({obj.name}) -- "
                       f"same partition: program order")
                return
            idx = "REPLICA" if self._paired(obj) else "0"
            if s.verb == "signal":
                o.line(f"mbarrier.arrive(xs_bars.index({obj.name.upper()}_EVENT + {idx}), count=1)"
                       f"  # line {line}: xs.signal({obj.name})")
            else:
                cnt = f"{obj.name}_waited"
                self.bar_wait(obj, "event", idx, f"{cnt} & 1", "wait", cnt, line, f"xs.wait({obj.name})")
                o.line(f"{cnt} += 1")
        else:
            # member roles sharing this partition meet once per meeting (skeleton.points)
            point = self.allocation.skeleton.renders(self.agent.name, s)
            if point is None:
                at = self.allocation.skeleton.point(self.agent.name, s).at.loc.line
                o.line(f"# line {line}: {obj.name}.{s.verb}() -- met once for this partition at line {at}")
                return
            bid = self.allocation.barrier_id(obj.name)
            n = self.barrier_threads(obj)
            fn = "xs_named_barrier_sync" if point.waits else "xs_named_barrier_arrive"
            verb = "sync" if point.waits else "arrive"
            o.line(f"{fn}({bid}, {n})  # line {line}: {obj.name}.{verb}() -- named barrier {bid}, {n} threads")

    def pipe_op(self, s: ir.SyncOp, pipe: ir.Pipe):
        o, line, name, st = self.out, s.loc.line, pipe.name, pipe.stages
        if s.target:
            self.slot_pipe[s.target] = pipe
        if not self.placement.crosses(pipe):
            o.line(f"# line {line}: {name}.{s.verb}() -- '{pipe.src}' and '{pipe.dst}' share this "
                   f"partition: the slot is a register value")
            return
        if s.verb == "acquire":
            slot = s.target or self.fresh("slot")
            o.line(f"{slot} = {self.ring_slot(pipe, f'{name}_acquired')}")
            self.bar_wait(pipe, "empty", slot, f"(({name}_acquired // {st}) & 1) ^ 1", "acquire",
                          f"{name}_acquired", line, f"{s.target or ''}{' = ' if s.target else ''}{name}.acquire()")
            o.line(f"{name}_acquired += 1")
            if is_tma_pipe(self.kernel, pipe):
                o.line(f"mbarrier.expect({self.bar_index(pipe, 'full', slot)}, {pipe.slot_bytes})"
                       f"  # TMA completes the slot: {pipe.slot_bytes} bytes")
            self.env[slot] = SCALAR
        elif s.verb == "commit":
            if is_tma_pipe(self.kernel, pipe):
                o.line(f"# line {line}: {name}.commit() -- the TMA engine completes the full barrier")
                return
            o.line("fence_async_shared()")
            o.line(f"mbarrier.arrive({self.bar_index(pipe, 'full', self.ring_slot(pipe, f'{name}_committed'))}, "
                   f"count=1)  # line {line}: {name}.commit()")
            o.line(f"{name}_committed += 1")
        elif s.verb == "wait":
            slot = s.target or self.fresh("slot")
            o.line(f"{slot} = {self.ring_slot(pipe, f'{name}_waited')}")
            self.bar_wait(pipe, "full", slot, f"({name}_waited // {st}) & 1", "wait", f"{name}_waited", line,
                          f"{s.target or ''}{' = ' if s.target else ''}{name}.wait()")
            o.line(f"{name}_waited += 1")
            self.env[slot] = SCALAR
        else:
            o.line(f"mbarrier.arrive({self.bar_index(pipe, 'empty', self.ring_slot(pipe, f'{name}_released'))}, "
                   f"count=1)  # line {line}: {name}.release()")
            o.line(f"{name}_released += 1")

    def deferred_release(self, s: DeferredRelease):
        """Release the slot held back by defer_mma_wait, if one is held."""
        o, pipe = self.out, self.kernel.sync_object(s.obj)
        name = pipe.name
        which = "the last slot" if s.final else "the previous iteration's slot"
        o.line(f"mbarrier.arrive({self.bar_index(pipe, 'empty', self.ring_slot(pipe, f'{name}_released'))}, "
               f"count=1, pred={s.flag} > 0)  # line {s.loc.line}: {name}.release() of {which} "
               f"(held back: its wgmma has completed)")
        o.line(f"{name}_released += {s.flag}")
        if not s.final:
            o.line(f"{s.flag} = 1")

    def pingpong_where(self):
        """Placement of the pingpong rewrite, or None when off (option ``pingpong``:
        False/0 off, True/1 the default placement, or a placement name)."""
        v = self.options.get("pingpong", PINGPONG_DEFAULT)
        if isinstance(v, str):
            v = v.strip().lower()
            if v in ("", "0", "false", "off", "no"):
                return None
            return PINGPONG_PLACEMENTS[0] if v in ("1", "true", "on", "yes") else v
        return PINGPONG_PLACEMENTS[0] if v else None

    def pingpong_threads(self, agent) -> int:
        return 32 * sum(p.warps for p in self.allocation.partitions_of(agent.name))

    def sched_barrier(self, s: SchedBarrier):
        o = self.out
        if s.kind == "sync":
            o.line(f"xs_named_barrier_sync({s.bar} + REPLICA, {s.threads})  # pingpong: {s.note} "
                   f"(named barrier {s.bar} + replica)")
        elif s.kind == "arrive":
            o.line(f"xs_named_barrier_arrive({s.bar + 1} - REPLICA, {s.threads})  # pingpong: {s.note} "
                   f"(named barrier {s.bar} + 1 - replica)")
        else:
            who = 1 if s.kind == "first" else 0
            o.line(f"if REPLICA == {who}:  # pingpong (line {s.loc.line}): {s.note}")
            o.line(f"    xs_named_barrier_arrive({s.bar}, {s.threads})")

    def counters(self, stmts):
        """Per-agent pipe/event counters this agent needs."""
        names = []
        for s in ir.walk(stmts):
            if isinstance(s, ir.SyncOp):
                obj = self.kernel.sync_object(s.obj)
                if isinstance(obj, ir.Barrier) or not self.placement.crosses(obj):
                    continue
                if isinstance(obj, ir.Pipe):
                    if s.verb == "commit" and is_tma_pipe(self.kernel, obj):
                        continue
                    n = {"acquire": "acquired", "commit": "committed", "wait": "waited", "release": "released"}[s.verb]
                    names.append((f"{obj.name}_{n}", f"pipe '{obj.name}': slots {n}"))
                elif s.verb == "wait":
                    names.append((f"{obj.name}_waited", f"event '{obj.name}': signals waited"))
        return list(dict.fromkeys(names))

    # ------------------------------------------------------------ module
    def regs(self):
        opts = self.options
        prod = int(opts.get("producer_regs", 40))
        parts = self.allocation.partitions
        n_consumers = sum(1 for p in parts if not p.agent.startswith("producer"))
        prod_groups = math.ceil(sum(p.warps for p in parts if p.agent.startswith("producer")) / 4)
        cons = opts.get("consumer_regs")
        if cons is None:
            cons = min(232, _round8((512 - prod_groups * prod) / max(1, n_consumers)))
        return prod, int(cons)

    def render(self) -> RenderResult:
        k = self.kernel
        self.out = body_out = Emitter()
        prod_regs, cons_regs = self.regs()
        parts = []
        for part in self.allocation.partitions:
            agent = next(a for a in self.placement.agents if a.name == part.agent)
            regs = prod_regs if part.agent.startswith("producer") else cons_regs
            parts.append((part.label, agent, part.replica, part.warps, regs))
        if parts[0][3] != 4:
            self.fail("the default partition must be a 4-warp consumer warpgroup",
                      fix="give the kernel at least one matrix or vector role")
        agent_ids = {p[0]: i for i, p in enumerate(parts)}

        # kernel parameters
        params = []          # (name, kind, extra)
        for p in k.params:
            if p.kind == "constexpr":
                continue
            if p.kind == "tensor":
                use = self.tensors[p.name]
                for shape, dname in use.descs.items():
                    params.append((dname, "desc", (p.name, shape)))
                if use.table and not use.pointer:
                    params.append((p.name, "table", p.name))
                if use.pointer:
                    params.append((p.name, "ptr", p.name))
                    params.append((f"{p.name}_rows", "rows", p.name))
                    params.append((f"{p.name}_cols", "cols", p.name))
                    params.append((f"{p.name}_stride", "stride", p.name))
            else:
                params.append((p.name, "scalar", p.name))
        if self.debug_hang:
            params.append(("xs_dbg", "dbg", None))
        pnames = [n for n, _, _ in params]

        smem_args = []
        for p in k.pipes:
            if self.placement.crosses(p):
                smem_args += [f"{p.name}_{f.name}" for f in p.fields]
        ws_args = pnames + smem_args + ["xs_bars"]

        # agent functions (render twice: the first pass learns 1-D layout preferences)
        agent_src = {}
        for agent in self.placement.agents:
            warps = self.allocation.partitions_of(agent.name)[0].warps
            self.warps = warps
            stmts = slice_agent(k.body, agent.roles)
            if self.options.get("fuse_mma", True):
                stmts = fuse_accumulating_mma(stmts, k, self.placement)
            if self.options.get("defer_mma_wait", True):
                stmts = defer_mma_wait(stmts, k, self.placement)
            pp = self.pingpong_where()
            bar = dict(self.allocation.barrier_ids).get(f"{agent.name}:pingpong")
            overlap = self.options.get("overlap_softmax", OVERLAP_DEFAULT)
            if overlap and self.options.get("pingpong") is None:
                # pingpong not asked for explicitly: an agent whose loop overlap_softmax
                # rotates runs without the scheduler barriers (measured faster, see
                # OVERLAP_DEFAULT); any other agent keeps the default ping-pong
                rotated = overlap_softmax(stmts, k, self.placement)
                if rotated != stmts:
                    stmts, pp, overlap = rotated, None, False
            if pp and agent.replicas == 2 and bar is not None:
                stmts = pingpong_schedule(stmts, k, agent, bar, self.pingpong_threads(agent), pp)
            if overlap:
                stmts = overlap_softmax(stmts, k, self.placement)
            self.prefs = {}
            first_site = len(self.wait_sites)
            # render until the layout preferences settle: a use may ask an earlier definition
            # for a layout (a loop-carried value, a peeled copy of the loop body)
            for attempt in range(4):
                settled = dict(self.prefs)
                del self.wait_sites[first_site:]
                self.out = Emitter()
                self.out.depth = 1
                self.render_agent_body(agent, agent.replicas, stmts)
                if attempt >= 1 and self.prefs == settled:
                    break
            agent_src[agent.name] = (self.out, stmts)

        o = body_out
        o.line(f"# Generated by xsync from kernel '{k.name}' ({k.file}:{k.loc.line}) for NVIDIA Hopper "
               f"(Triton 3.6-3.9 Gluon, sm_90a).")
        o.line("# Do not edit: change the kernel and regenerate (XSYNC_DUMP=<dir> writes this file).")
        if self.debug_hang:
            o.line(f"# Hang debug mode (XSYNC_DEBUG_HANG=1): every mbarrier wait first polls for at most "
                   f"{self.timeout_ms} ms, then reports and traps.")
        o.line("from triton.experimental import gluon")
        o.line("from triton.experimental.gluon import language as gl")
        o.line("from triton.experimental.gluon.language.nvidia.hopper import (")
        o.line("    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)")
        o.line()
        o.line(TMA_LOAD_ALIAS)
        o.line()
        if k.constexprs:
            o.line("# constexprs of this specialization")
            for name, value in k.constexprs:
                o.line(f"{name} = gl.constexpr({self.const(value) if isinstance(value, DType) else repr(value)})")
            o.line()
        o.line("# layouts")
        for name, ctor in self.layouts.items():
            o.line(f"{name} = gl.constexpr({ctor})  # {self.layout_notes[name]}")
        o.line()
        o.line(f"# mbarriers: one array xs_bars[{max(1, self.num_bars)}]; index bases per sync object "
               f"(from the allocation table)")
        for key, base in self.bar_base.items():
            obj, side = key.split(":")
            n = self.bar_count[key]
            cnt = self._init_count(obj, side)
            o.line(f"{obj.upper()}_{side.upper()} = gl.constexpr({base})  # {obj} {side}: "
                   f"xs_bars[{base}:{base + n}], arrive count {cnt}")
        o.line(f"XS_NUM_BARS = gl.constexpr({max(1, self.num_bars)})")
        if self.debug_hang:
            o.line(f"XS_BARS_SMEM = gl.constexpr({self.bars_smem})  # byte offset of xs_bars in shared "
                   f"memory (read back from a first compile)")
        o.line()
        self.helpers(o)

        for agent in self.placement.agents:
            out, stmts = agent_src[agent.name]
            o.line()
            o.line()
            o.line("@gluon.jit")
            o.line(f"def {k.name}_{agent.name}({', '.join(ws_args)}, REPLICA: gl.constexpr, AGENT_ID: gl.constexpr):")
            o.indent()
            o.line(f'"""{agent.hardware}: roles {", ".join(agent.roles)}'
                   + (f" ({agent.replicas} replicas)" if agent.replicas > 1 else "") + '."""')
            for cname, note in self.counters(stmts):
                o.line(f"{cname} = 0  # {note}")
            o.dedent()
            o.lines += out.lines

        o.line()
        o.line()
        o.line("@gluon.jit")
        o.line(f"def {k.name}({', '.join(pnames)}):")
        o.indent()
        for p in k.pipes:
            if not self.placement.crosses(p):
                continue
            ring = p.stages * (self._paired(p) or 1)
            o.line(f"# pipe '{p.name}' (line {p.loc.line}): {p.src} -> {p.dst}, {p.stages} stage(s)"
                   + (f" x {self._paired(p)} replica pairs" if self._paired(p) else ""))
            for f in p.fields:
                lay = self.smem_layout(f.shape, f.dtype)
                o.line(f"{p.name}_{f.name} = gl.allocate_shared_memory({self.dtype(f.dtype)}, "
                       f"[{ring}, {f.shape[0]}, {f.shape[1]}], {lay})")
        o.line("xs_bars = gl.allocate_shared_memory(gl.int64, [XS_NUM_BARS, 1], mbarrier.MBarrierLayout())")
        for key, base in self.bar_base.items():
            obj, side = key.split(":")
            cnt = self._init_count(obj, side)
            for i in range(self.bar_count[key]):
                o.line(f"mbarrier.init(xs_bars.index({obj.upper()}_{side.upper()} + {i}), count={cnt})")
        if not self.bar_base:
            o.line("mbarrier.init(xs_bars.index(0), count=1)  # unused")
        o.line("fence_async_shared()")
        calls = []
        for label, agent, replica, warps, regs in parts:
            calls.append((f"({k.name}_{agent.name}, ({', '.join(ws_args)}, {replica}, {agent_ids[label]}))",
                          label, warps, regs))
        if len(calls) == 1:
            o.line(f"{k.name}_{parts[0][1].name}({', '.join(ws_args)}, 0, 0)")
        else:
            o.line("gl.warp_specialize([")
            for i, (c, label, warps, regs) in enumerate(calls):
                kind = "default partition" if i == 0 else f"worker {i}"
                o.line(f"    {c},  # {label}: {kind}, {warps} warp(s)" + (f", {regs} registers" if i else ""))
            o.line(f"], {[w for _, _, w, _ in calls[1:]]}, {[r for _, _, _, r in calls[1:]]})")
        o.dedent()

        # move the layouts the agent bodies discovered into the module header
        src = o.source()
        lay_lines = "\n".join(f"{n} = gl.constexpr({c})  # {self.layout_notes[n]}" for n, c in self.layouts.items())
        src = re.sub(r"# layouts\n(?:[A-Z0-9_x]+ = gl\.constexpr\(.*\n)*", "# layouts\n" + lay_lines + "\n", src, count=1)

        desc_layouts = {}
        for n, kind, extra in params:
            if kind == "desc":
                t, shape = extra
                desc_layouts[n] = (t, list(shape), self.tensors[t].dtype)
        return RenderResult(src, k.name, params, self.tensors,
                            [(lb, a.name, r, w, g) for lb, a, r, w, g in parts], 4,
                            self.wait_sites, agent_ids, self.num_bars, self.debug_hang, desc_layouts)

    def _init_count(self, obj, side):
        return self.allocation.mbarrier(obj, side).arrive_count

    def helpers(self, o: Emitter):
        o.line()
        o.line("@gluon.jit")
        o.line("def xs_named_barrier_sync(BAR_ID: gl.constexpr, NTHREADS: gl.constexpr):")
        o.line('    """bar.sync: wait until NTHREADS threads (this partition included) reached BAR_ID."""')
        o.line('    gl.inline_asm_elementwise("bar.sync $1, $2; mov.b32 $0, 0;", "=r,n,n,~{memory}", '
               '[BAR_ID, NTHREADS], dtype=gl.int32, is_pure=False, pack=1)')
        o.line()
        o.line()
        o.line("@gluon.jit")
        o.line("def xs_named_barrier_arrive(BAR_ID: gl.constexpr, NTHREADS: gl.constexpr):")
        o.line('    """bar.arrive: count this partition at BAR_ID without waiting."""')
        o.line('    gl.inline_asm_elementwise("bar.arrive $1, $2; mov.b32 $0, 0;", "=r,n,n,~{memory}", '
               '[BAR_ID, NTHREADS], dtype=gl.int32, is_pure=False, pack=1)')
        if not self.debug_hang:
            return
        timeout_ns = self.timeout_ms * 1_000_000
        grace_ns = min(timeout_ns // 4, 300_000_000)
        asm = (
            "{ .reg .pred p, q; .reg .u32 a, c, n, v, old; .reg .u64 t0, t1, dt, rec; "
            "mov.u32 a, global_smem; add.u32 a, a, $1; mov.u64 t0, %globaltimer; "
            "XS_POLL: mbarrier.try_wait.parity.shared::cta.b64 p, [a], $2; @p bra.uni XS_DONE; "
            "mov.u64 t1, %globaltimer; sub.u64 dt, t1, t0; "
            f"setp.lt.u64 p, dt, {timeout_ns}; @p bra.uni XS_POLL; "
            # timed out: the first CTA to time out reports; each of its stuck agents writes a record
            "mov.u32 c, %ctaid.z; mov.u32 n, %nctaid.y; mov.u32 v, %ctaid.y; mad.lo.u32 c, c, n, v; "
            "mov.u32 n, %nctaid.x; mov.u32 v, %ctaid.x; mad.lo.u32 c, c, n, v; add.u32 c, c, 1; "
            "atom.global.cas.b32 old, [$3], 0, c; setp.eq.u32 p, old, 0; setp.eq.or.u32 p, old, c, p; "
            "mov.u32 v, $4; mul.wide.u32 rec, v, 16; add.u64 rec, rec, $3; add.u64 rec, rec, 16; "
            "mov.u32 v, $5; @p st.global.b32 [rec+4], v; @p st.global.b32 [rec+8], $6; "
            "mov.u32 v, 1; @p st.global.b32 [rec], v; membar.sys; "
            "mov.u64 t0, %globaltimer; "
            f"XS_GRACE: mov.u64 t1, %globaltimer; sub.u64 dt, t1, t0; setp.lt.u64 q, dt, {grace_ns}; "
            "@q bra.uni XS_GRACE; trap; "
            "XS_DONE: mov.b32 $0, 0; }"
        )
        o.line()
        o.line()
        o.line("@gluon.jit")
        o.line("def xs_debug_wait(index, phase, dbg, AGENT: gl.constexpr, SITE: gl.constexpr, count):")
        o.line('    """Bounded mbarrier.try_wait.parity poll (hang debug mode).')
        o.line()
        o.line(f"    Polls xs_bars[index] for {self.timeout_ms} ms (%globaltimer). On timeout the first CTA to")
        o.line("    time out writes {1, SITE, count} at dbg[4 + 4 * AGENT] (dbg[0] = that CTA + 1),")
        o.line("    waits a grace period so other stuck agents can report too, and traps.")
        o.line('    """')
        o.line(f"    gl.inline_asm_elementwise(\"{asm}\",")
        o.line('                              "=r,r,r,l,n,n,r,~{memory}", '
               "[XS_BARS_SMEM + index * 8, phase, dbg, AGENT, SITE, count],")
        o.line("                              dtype=gl.int32, is_pure=False, pack=1)")


def render(kernel: ir.KernelIR, placement: Placement, allocation: Allocation, options: dict | None = None):
    return NvidiaRenderer(kernel, placement, allocation, options).render()
