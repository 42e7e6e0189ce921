"""Read a cost-model :class:`~xsync.backends.ascend.cost.Design` from an xsync kernel lowered
for Ascend: its allocation (GM workspace rings: bytes, slots, replica rings), its pipes (the
same-core slots the cube loads each step, and tiles it loads outside any pipe), the schedule
passes (is the cube's next product issued before it waits?) and the statements of its step loop (mmad FLOPs and operand bytes on
the cube, elementwise operations on a vector core), walked as the memory model walks them
(xsync.backends.ascend.memory).

The step loop is the innermost loop of each agent holding its work. Statements under a run-time
``if`` inside it (boundary-block masks) are left out: most steps skip them.
"""
from __future__ import annotations

import math
import re

from xsync.backends.ascend import memory
from xsync.backends.ascend.cost import Design
from xsync.lowering import ir
from xsync.lowering.placement import Unit


class _Counter(memory._Walker):
    """The memory walker, also counting per loop depth: mmad FLOPs and operand elements (cube),
    elementwise and reduction elements split by last dimension (vector)."""

    def __init__(self, kernel, placement, agent):
        super().__init__(kernel, placement, agent)
        self.ifs: list[int] = []     # loop depth of each enclosing run-time if
        self.flops: dict[int, float] = {}
        self.operands: dict[int, float] = {}
        self.elems: dict[int, dict[int, float]] = {}   # depth -> last dim -> elements
        self.loaded: dict[int, float] = {}   # depth -> bytes of tiles loaded into a plain value
        self.acquired: dict[str, int] = {}   # pipe -> the deepest loop its slots are acquired in

    def _static(self, cond):
        """The value of an ``if`` on a constexpr (the frontend keeps them), else None."""
        if isinstance(cond, ir.Const) and isinstance(cond.value, (int, bool)):
            return bool(cond.value)
        if isinstance(cond, ir.Name) and isinstance(self.consts.get(cond.id), (int, bool)):
            return bool(self.consts[cond.id])
        return None

    def stmt(self, s, loops, inside):
        if isinstance(s, ir.If) and self._static(s.cond) is not None:
            self.block(s.body if self._static(s.cond) else s.orelse, loops, inside)
            return
        if isinstance(s, ir.SyncOp) and s.verb is ir.Verb.ACQUIRE:
            self.acquired[s.obj] = max(self.acquired.get(s.obj, 0), len(loops))
        if inside and isinstance(s, ir.Assign) and isinstance(s.value, ir.Call) \
                and s.value.op is ir.TileOp.LOAD and not self._skipped(loops):
            # a tile loaded outside any pipe (cross-agent-pipeline rule 9 loads one again)
            args = s.value.args
            dtype = self.tensors.get(args[0].id) if isinstance(args[0], ir.Name) else None
            nbytes = math.prod(self.shape(args[2])) * (dtype.bytes if dtype else 4)
            self.loaded[len(loops)] = self.loaded.get(len(loops), 0) + nbytes
        if isinstance(s, ir.If) and loops:
            self.ifs.append(len(loops))
            try:
                super().stmt(s, loops, inside)
            finally:
                self.ifs.pop()
            return
        super().stmt(s, loops, inside)

    def _skipped(self, loops) -> bool:
        """Inside a run-time if of the same (innermost) loop: not every step runs it."""
        return bool(self.ifs) and self.ifs[-1] == len(loops)

    def _count(self, loops, shape):
        if self._skipped(loops) or not shape:
            return
        depth = self.elems.setdefault(len(loops), {})
        depth[shape[-1]] = depth.get(shape[-1], 0) + math.prod(shape)

    def _shape_of(self, e) -> tuple:
        if isinstance(e, ir.Name):
            v = self.env.get(e.id)
            return v.shape if v else ()
        if isinstance(e, ir.Attr) and isinstance(e.value, ir.Name) and e.value.id in self.slots:
            pipe = self.pipes[self.slots[e.value.id]]
            spec = next((f for f in pipe.fields if f.name == e.attr), None)
            return tuple(self.const(d) for d in spec.shape) if spec else ()
        if isinstance(e, ir.Call) and e.op is ir.TileOp.TRANS:
            return tuple(reversed(self._shape_of(e.args[0])))
        if isinstance(e, ir.Cast):
            return self._shape_of(e.value)
        return ()

    def call(self, e, step, loops):
        # an mmad under a run-time if of the step loop still runs every step (the pipeline
        # pass guards the next step's product so); masks (vector) are the boundary fix-ups
        if e.op is ir.TileOp.MMA:
            a, b = self._shape_of(e.args[0]), self._shape_of(e.args[1])
            if len(a) == 2 and len(b) == 2:
                d = len(loops)
                self.flops[d] = self.flops.get(d, 0) + 2 * a[0] * a[1] * b[1]
                self.operands[d] = self.operands.get(d, 0) + math.prod(a) + math.prod(b)
        if e.op in memory.REDUCTIONS:
            self._count(loops, self._shape_of(e.args[0]))
        return super().call(e, step, loops)

    def elementwise(self, operands, shape, dtype, step, what):
        self._count(step.loops, tuple(shape))
        return super().elementwise(operands, shape, dtype, step, what)


def _walk(low, unit: Unit) -> tuple[_Counter | None, int]:
    """The counter of the agent on ``unit`` and how many replicas it runs one by one."""
    for agent in low.placement.agents:
        if agent.unit is unit:
            c = _Counter(low.kernel, low.placement, agent)
            c.block(low.kernel.body, ())
            serial = max((low.kernel.role(r).replicas for r in agent.serial), default=1)
            return c, serial
    return None, 1


def _slot_bytes(pipe, consts) -> int:
    return sum(math.prod(consts.get(d, d) if isinstance(d, str) else d for d in f.shape) * f.dtype.bytes
               for f in pipe.fields)


def traffic(low) -> dict:
    """Per step of one AI core: bytes per queue, cube FLOPs, vector ops, flag ops, ring depth."""
    k, pl, alloc = low.kernel, low.placement, low.allocation
    consts = dict(k.constexprs)
    out = dict(cube_mte2=0.0, cube_fixp=0.0, vec_mte2=0.0, vec_mte3=0.0, cube_mte1=0.0)
    cube_flags = vec_flags = 0.0
    slots = []
    for ring in alloc.workspace:
        pipe = k.sync_object(ring.pipe)
        nbytes = _slot_bytes(pipe, consts) * ring.rings
        if pl.agent_of(pipe.src).unit is Unit.CUBE:
            out["cube_fixp"] += nbytes
            out["vec_mte2"] += nbytes / 2          # each vector core reads its half
        else:
            out["vec_mte3"] += nbytes / 2
            out["cube_mte2"] += nbytes
        # a wait and a set per pipe per step on each side: the cube runs its replicas in
        # lockstep (replicas.py), waiting once before and setting once after all of them, so
        # the replica rings of an N -> N pipe share one flag pair
        cube_flags += 2
        vec_flags += 2
        slots.append(ring.slots)
    (cube, serial), (vec, _) = _walk(low, Unit.CUBE), _walk(low, Unit.VECTOR)
    deepest = max(cube.flops) if cube and cube.flops else None
    for pipe in k.pipes:       # same-core slots the cube loads every step (K, V; dK/dV's Q, dO)
        src, dst = pl.agent_of(pipe.src), pl.agent_of(pipe.dst)
        if src is dst and dst.unit is Unit.CUBE and cube and cube.acquired.get(pipe.name) == deepest:
            out["cube_mte2"] += _slot_bytes(pipe, consts)
    flops = operands = 0.0
    if deepest is not None:
        flops, operands = cube.flops[deepest] * serial, cube.operands[deepest] * serial
        out["cube_mte2"] += cube.loaded.get(deepest, 0) * serial
    out["cube_mte1"] = operands * 2
    vec_elems: dict[int, float] = {}
    if vec and vec.elems:
        # the walk counts one replica's statements; a vector core runs every replica's, on its
        # half of each replica's rows (sub-block binding)
        replicas = next((a.replicas for a in pl.agents if a.unit is Unit.VECTOR), 1)
        share = replicas / 2 if cube else 1
        vec_elems = {n: e * share for n, e in vec.elems[max(vec.elems)].items()}
    return {"bytes": out, "flops": flops, "vec_elems": vec_elems, "cube_flag_ops": cube_flags,
            "vec_flag_ops": vec_flags, "slots": min(slots) if slots else 1,
            "ws_bytes": alloc.workspace_bytes}


_AHEAD = re.compile(r"cross-agent-pipeline: applied .*?pipe '(\w+)' is issued (one|\d+) iterations? ahead")


def _lookahead(text: str, alloc) -> int:
    """Steps the cube's hand-off runs ahead (the cross-agent-pipeline pass's log), as many as
    its ring has GM slots beyond the one being read."""
    m = _AHEAD.search(text)
    if not m:
        return 0
    depth = 1 if m.group(2) == "one" else int(m.group(2))
    slots = next((r.slots for r in alloc.workspace if r.pipe == m.group(1)), 1)
    return max(0, min(depth, slots - 1))


def design_from_lowered(low, name: str, rows: int, keys: int, d: int, note: str = "") -> Design:
    """The design of a lowered attention-like kernel: ``rows`` query rows (or keys, for dK/dV)
    per program tile, ``keys`` per step, head dim ``d``."""
    t = traffic(low)
    half = rows / 2
    elems = sum(t["vec_elems"].values())
    text = low.passes.text() if low.passes else ""
    lookahead = _lookahead(text, low.allocation)
    b = t["bytes"]
    flops_plain = 4 * rows * keys * d
    return Design(
        name, rows=rows, keys=keys, d=d, lookahead=lookahead, slots=t["slots"],
        cube_flag_ops=t["cube_flag_ops"], vec_flag_ops=t["vec_flag_ops"],
        ops_per_score=elems / (half * keys), ops_per_out=0.0, vec_elems_per_step=elems,
        ws_bytes=t["ws_bytes"], persistent=True,
        traffic={k_: float(v) for k_, v in b.items()},
        flops_per_step=t["flops"] if t["flops"] else flops_plain,
        note=note or text, source="read from the lowered kernel (allocation, pipes, passes, IR)")


def gemm_design(low, name: str = "") -> Design:
    """A lowered GEMM (both roles on the cube, no cross-core ring) as a cost-model design: per
    K step the A and B tiles into L1 (MTE2; one A tile per matrix replica, read from the pipes'
    fields), L1 -> L0A/L0B (MTE1) and the mmad FLOPs; ``rows`` = the program tile's rows (all
    replicas), ``keys`` = BN, ``d`` = BK. The C tile's FIXP store is per output tile, not per
    step (:func:`gemm_estimate`)."""
    k, pl = low.kernel, low.placement
    consts = dict(k.constexprs)
    t = traffic(low)
    mte2 = 0.0
    for pipe in k.pipes:       # the copy roles' loads: one slot per source replica per K step
        if pl.agent_of(pipe.dst).unit is Unit.CUBE:
            mte2 += _slot_bytes(pipe, consts) * k.role(pipe.src).replicas
    replicas = max((r.replicas for r in k.roles if r.kind is ir.RoleKind.MATRIX), default=1)
    bm, bn, bk = (int(consts[c]) for c in ("BM", "BN", "BK"))
    b = dict(t["bytes"], cube_mte2=mte2 or t["bytes"]["cube_mte2"], cube_fixp=0.0)
    return Design(
        name or k.name, rows=replicas * bm, keys=bn, d=bk, lookahead=0, slots=t["slots"],
        cube_flag_ops=t["cube_flag_ops"], vec_flag_ops=0.0, ops_per_score=0.0, ops_per_out=0.0,
        ws_bytes=t["ws_bytes"], persistent=_persistent(low), traffic=b,
        flops_per_step=t["flops"] or 2.0 * replicas * bm * bn * bk,
        note=f"{replicas} x {bm} x {bn} x {bk}", source="read from the lowered kernel (pipes, IR)")


def _persistent(low) -> bool:
    """The mmad sits two loops deep (tiles, then K): one program per core walks the tiles."""
    cube, _ = _walk(low, Unit.CUBE)
    return bool(cube and cube.flops and max(cube.flops) >= 2)


def gemm_estimate(dsn: Design, M: int, N: int, K: int, chip, cal=None, c_bytes: int = 4) -> dict:
    """Time on paper of C[M, N] = A[M, K] @ B[K, N] (bf16 in, fp32 C) for a GEMM design
    (:func:`gemm_design`), with ``cost.step_costs``'s cube pipes and the calibrated factors.

    * a K step: the slowest of mmad, MTE1 and MTE2 when L1 holds the step's tiles twice (the
      compiler double-buffers them: hivm-plan-memory places 2 x (A + B)), else MTE2 after
      the mmad; chip-wide, the active cores' MTE2 bytes over the L2 bandwidth;
    * an output tile: its K steps + the C tile out by FIXP (the compiler places one
      accumulator in L0C, so the next tile's mmad waits for the store) + the first step's
      MTE2 (a non-persistent program starts cold; a persistent one prefetches it during FIXP);
    * the kernel: the busiest core's tiles (waves = ceil(tiles / cores)); at least the HBM
      bytes (A once; B once per group of row blocks when B does not fit half of L2; C) over
      the HBM bandwidth."""
    from xsync.backends.ascend.cost import CALIBRATION, step_costs
    cal = cal or CALIBRATION
    st = step_costs(dsn, chip, cal)
    hz = chip.hz
    mte2_bytes = dsn.step_bytes()["cube_mte2"]
    double = 2 * mte2_bytes <= chip.l1_bytes
    compute = max(st["cube_mmad_us"], st["cube_mte1_us"])
    core_step = (max(compute, st["cube_mte2_us"]) if double else compute + st["cube_mte2_us"]) \
        + dsn.cube_flag_ops * cal.flag_us
    tiles = math.ceil(M / dsn.rows) * math.ceil(N / dsn.keys)
    cores = min(chip.ai_cores, tiles)
    l2_step = mte2_bytes * cores / (chip.l2_tb_s * 1e12) * 1e6
    step = max(core_step, l2_step)
    steps = math.ceil(K / dsn.d)
    fixp = dsn.rows * dsn.keys * c_bytes / (cal.fixp_bytes_per_cycle * hz) * 1e6
    tile_us = steps * step + fixp + (0.0 if dsn.persistent else st["cube_mte2_us"])
    waves = math.ceil(tiles / cores)
    core_us = waves * tile_us + (st["cube_mte2_us"] if dsn.persistent else 0.0)
    b_bytes = K * N * 2
    groups = math.ceil(M / (8 * dsn.rows)) if b_bytes > chip.l2_bytes / 2 else 1   # GROUP_M = 8
    hbm_bytes = M * K * 2 + groups * b_bytes + M * N * c_bytes
    hbm_us = hbm_bytes / (chip.hbm_tb_s * 1e12) * 1e6
    total = max(core_us, hbm_us)
    parts = {"mmad": st["cube_mmad_us"], "MTE1": st["cube_mte1_us"], "MTE2": st["cube_mte2_us"]}
    if total == hbm_us:
        bound = "HBM"
    elif step == l2_step and l2_step > core_step:
        bound = "L2"
    elif steps * step < fixp:
        bound = "FIXP"
    else:
        bound = max(parts, key=parts.get) if double else "MTE2 + mmad (L1 single-buffered)"
    flops = 2.0 * M * N * K
    return {"design": dsn.name, "tile": dsn.note, "M": M, "N": N, "K": K, "tiles": tiles,
            "cores": cores, "waves": waves, "steps_per_tile": steps, "step_us": step,
            "mmad_us": st["cube_mmad_us"], "mte1_us": st["cube_mte1_us"],
            "mte2_us": st["cube_mte2_us"], "l2_step_us": l2_step, "fixp_us": fixp,
            "l1_double_buffered": double, "tile_us": tile_us, "hbm_us": hbm_us,
            "est_us": total, "est_tflops": flops / (total * 1e-6) / 1e12, "bound": bound,
            "mte2_bytes_per_flop": mte2_bytes / dsn.flops_per_step}
