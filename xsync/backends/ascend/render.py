"""Ascend renderer: protocol IR + placement + allocation -> triton-ascend Python source.

The generated module holds one ``@triton.jit`` kernel. Placement (``placement.py``)
puts copy and matrix roles on the cube core (AIC) and vector roles on the vector cores
(AIV); ``xsync.lowering.alloc`` has already chosen every flag (event ID), every
``sync_block_all`` mode and the GM workspace layout, and ``replicas.py`` has decided each role's
core, which agents run their replicas in lockstep, and checked what a source form cannot
express (its numbered rules) — this module only spells them.

Two source forms
----------------
``release`` (triton-ascend 3.2.0, the PyPI release): there is no core scope. The
compiler splits ONE body into a cube part and a vector part by op kind (``tl.dot`` and
what feeds it / drains it -> cube, elementwise -> vector) and keeps scalar control flow
in both. So the kernel body is the cube agent's statements followed by the vector
agent's statements, each valid on its own core: every cross-core hand-off is an
explicit GM store, ``tl.sync_block_set(src, dst, ID)``, ``tl.sync_block_wait(src, dst,
ID)``, GM load. The set/wait ops name their cores, so each lands on the right side.

``scope`` (triton-ascend 3.2.1+, detected by import): the same two parts, each inside
``with al.scope(core_mode="cube"|"vector")``, sync ops spelled
``al.sync_block_set/wait(sender, receiver, ID, sender_pipe, receiver_pipe)`` with the pipes
each hand-off needs (see ``flag_op``), vector replicas mapped onto the two vector cores with
``al.sub_vec_id()`` and barriers among vector replicas as ``all_sub_vector`` (the two vector
cores of one AI core; 3.2.0 only has the grid-wide ``all_vector``). Chosen automatically
when ``triton.language.extra.cann.extension`` imports; forced with ``form=`` or
``XSYNC_ASCEND_FORM=release|scope``.

Both forms are written for the HIVM compiler that follows triton-ascend (verified with
``bishengir-compile`` by the ascend test matrix, see ``hivm.py``): tensors are addressed with
unit column stride (a run-time column stride makes it give every tile element its own 32-byte
block of unified buffer), kernels are compiled and launched with the compiler's automatic
cross-core sync off (``disable_auto_inject_block_sync``), and the flag IDs come from the top of
the range CANN documents (see ``xsync.lowering.alloc``).

Pipes (``xs.pipe``) between cores
---------------------------------
Per cross-core pipe the allocation gives a FULL flag (src -> dst), an EMPTY flag
(dst -> src) and a ring of ``stages`` slots in a per-program GM workspace that the host
allocates (``programs x Allocation.workspace_bytes``) and passes as one extra pointer
argument per element type (``xs_ws_fp32``, ``xs_ws_bf16``: typed views of ONE buffer;
3.2.0's adapter does not rescale offsets across pointer casts, so the kernel never casts
pointers). The ring has ``max(stages, 2)`` GM slots (a 1-slot ring would be a loop-invariant
store address, on which the compiler's cv-pipelining pass never terminates) and slot i is
``i % slots``; counters are plain loop-carried ints.

    producer:  acquire  -> if n_acq >= stages: wait(EMPTY) [fence]  (starts with `stages` free)
               slot.f = v -> tl.store(ring[slot].f, v)           (GM write: FIX / MTE3)
               commit   -> set(FULL)                              (on the writer's pipe)
               end      -> drain: wait(EMPTY) once per slot still outstanding
                           (min(n_acq, stages)), so every flag ends at zero and nothing
                           leaks into the next launch
    consumer:  wait     -> wait(FULL); load every field of ring[slot] (GM read: MTE2)
               release  -> [fence] set(EMPTY)

``[fence]`` is the 3.2.0 form's ``tl.debug_barrier()`` (``pipe_barrier(PIPE_ALL)``); the
scope form instead sets EMPTY on MTE2 and waits for it on the writer's pipe.

Pending sets never exceed ``stages`` (<= 15, checked by alloc) on either flag. A pipe
whose ends share a core is program order: the payload is a plain value
(``tiles_a``), no flag, no workspace. Events become one flag; group barriers become
``sync_block_all(mode, ID)`` with the allocated mode (an ``arrive`` is rendered as a
full ``sync_block_all``: the hardware has no arrive-only form).

Replicas without ``sub_vec_id`` (the 3.2.0 fallback): the lockstep, drawn in ``replicas.py``.

3.2.0 op-kind hazard: the compiler places work that does not feed or drain a
``tl.dot`` on the vector core. A cube-side producer writing a slot with a value not
computed by ``xs.mma`` would run on the vector core while its set runs on the cube: the
release form rejects it (BackendError) instead of racing. A kernel with cross-core sync
but no ``xs.mma`` at all is compiled vector-only (``mix_mode = "aiv"``) and would hang:
rejected too.

Vector-only kernels (copy and vector roles, no matrix work): the placement puts every role on
one vector core (``placement.vector_only_agent``), so nothing crosses cores. A pipe there is a
GM ring of ``stages`` slots written and read in program order (``ring_sync``): no flag, a
``tl.debug_barrier()`` orders a slot's write before its read and its last read before it is
written again; events are program order.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from xsync.backends.ascend.addressing import tensor_args, window
from xsync.backends.ascend.reduce_add import ReduceAddSpelling
# FORMS: the launcher reads it here
from xsync.backends.ascend.replicas import (  # noqa: F401
    FORMS, Core, ReplicaAnalysis, analyze, has_sync)
from xsync.backends.spelling import Spelling
from xsync.backends.source import Emitter, PythonRenderer, doc_text, label, spell_math
from xsync.lowering import ir
from xsync.lowering.alloc import Allocation
from xsync.lowering.passes.subtile_replicas import subtiled
from xsync.lowering.placement import Agent, Placement
from xsync.lowering.slicing import slice_agent
from xsync.lowering.tile_launch import tensor_ranks


@dataclass(frozen=True)
class CorePart:
    """Lines first..last (1-based, inclusive) of the kernel body hold one core's statements:
    the release form's cube or vector half, or one ``with al.scope(...)`` block."""

    core: Core
    agent: str
    first: int
    last: int


@dataclass(frozen=True)
class AscendModule:
    source: str
    form: str
    parts: tuple[CorePart, ...]
    names: Spelling | None = None     # how the source spells the kernel's names (spelling.py)

    @property
    def entry(self) -> str:
        """The @triton.jit function's name."""
        return self.names(self.names.kernel.name) if self.names is not None else ""
class FlagOp(StrEnum):
    """A cross-core flag operation: ``sync_block_set`` or ``sync_block_wait``."""

    SET = "set"
    WAIT = "wait"


class HandOff(StrEnum):
    """What a flag operation orders (see :meth:`AscendRenderer.flag_op`)."""

    FULL = "full"     # the producer's GM write before the consumer's read
    EMPTY = "empty"   # the consumer's GM read before the producer's next write into the slot
    DRAIN = "drain"   # the producer's final EMPTY waits: nothing is written after them
    ANY = "any"       # events: everything before the set before everything after the wait


# Which pipe of a core issues a set and which pipe blocks on a wait. A hand-off orders a GM
# write before a GM read (FULL) or a GM read before the next GM write into the slot (EMPTY):
#   FULL:  set on the producer's write pipe (cube FIX, vector MTE3); the consumer's read (MTE2)
#          waits.
#   EMPTY: set on the consumer's read pipe (MTE2), so it follows the read; the producer's write
#          pipe waits.
WRITE_PIPE = {Core.CUBE: "PIPE_FIX", Core.VECTOR: "PIPE_MTE3"}
READ_PIPE = "PIPE_MTE2"
TL_DTYPES = {"float16": "tl.float16", "bfloat16": "tl.bfloat16", "float32": "tl.float32",
             "int32": "tl.int32", "int1": "tl.int1"}
SIG_DTYPES = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32", "int32": "*i32",
              "int1": "*i1"}
WS_SHORT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "int32": "i32", "int1": "i8"}
_TL_OPS = {op: f"tl.{op}" for op in (
    ir.TileOp.CDIV, ir.TileOp.ARANGE, ir.TileOp.ZEROS, ir.TileOp.FULL, ir.TileOp.TRANS,
    ir.TileOp.MAX, ir.TileOp.SUM, ir.TileOp.EXP2, ir.TileOp.LOG2, ir.TileOp.WHERE,
    ir.TileOp.MAXIMUM, ir.TileOp.MINIMUM, ir.TileOp.PROGRAM_ID, ir.TileOp.NUM_PROGRAMS)}

# math that HIVM compiles and the simulator runs (tl.tanh: no interpreter op; from tl.exp)
TL_MATH = frozenset({ir.TileOp.SQRT, ir.TileOp.RSQRT, ir.TileOp.EXP, ir.TileOp.LOG, ir.TileOp.ERF,
                     ir.TileOp.SIGMOID, ir.TileOp.ABS})


def workspace_dtypes(kernel: ir.KernelIR, allocation: Allocation) -> list:
    """Element types of the workspace pointer arguments, in order of first use."""
    out = []
    for ring in allocation.workspace:
        for f in kernel.sync_object(ring.pipe).fields:
            if f.dtype not in out:
                out.append(f.dtype)
    return out


def workspace_arg(dtype) -> str:
    return f"xs_ws_{WS_SHORT[dtype.name]}"


def signature(kernel: ir.KernelIR, allocation: Allocation, scalars: dict | None = None,
              names: Spelling | None = None) -> dict:
    """triton signature of the generated kernel ({arg: type}), in argument order; ``names``:
    how the source spells the kernel's parameters."""
    scalars = dict(scalars or {})
    spell = names if names is not None else Spelling(kernel)
    sig, ranks = {}, tensor_ranks(kernel)
    for p in kernel.params:
        if p.kind is ir.ParamKind.CONSTEXPR:
            continue
        if p.kind is ir.ParamKind.TENSOR:
            sig[spell(p.name)] = SIG_DTYPES[p.dtype.name]
            for a in tensor_args(p.name, ranks.get(p.name, 2)):
                sig[a] = "i32"
        else:
            sig[spell(p.name)] = scalars.get(p.name, "i32")
    for d in workspace_dtypes(kernel, allocation):
        sig[workspace_arg(d)] = SIG_DTYPES[d.name]
    return sig


class AscendRenderer(ReduceAddSpelling, PythonRenderer):
    """Spells the kernel for one source form; every decision comes from the
    :class:`~xsync.backends.ascend.replicas.ReplicaAnalysis` (rules there)."""

    def __init__(self, kernel: ir.KernelIR, placement: Placement, allocation: Allocation,
                 analysis: ReplicaAnalysis, names: Spelling | None = None):
        self.kernel, self.placement, self.alloc = kernel, placement, allocation
        self.defer: list | None = None     # slot loads waiting for the replicas' next run
        self.ranks = tensor_ranks(kernel)
        self.names = names if names is not None else Spelling(kernel)
        self.analysis, self.form = analysis, analysis.form
        self.ids = dict(allocation.event_ids)
        self.rings = {r.pipe: r for r in allocation.workspace}
        self.ws_dtypes = workspace_dtypes(kernel, allocation)
        self.out = Emitter()
        # per-agent rendering state
        self.local: set[str] = set()       # role-local names (renamed per unrolled replica)
        self.shared: list[set[str]] = []   # loop vars shared by replicas in lockstep
        self.rep: int | None = None        # unrolled replica being emitted (None: not unrolled)
        self.rid_expr = "0"                # replica_id when not unrolled
        self.slot_pipe: dict[str, str] = {}
        self.parts: list[CorePart] = []
        self.dead_arms = 0                 # depth inside arms a constexpr turns off

    def emit_if(self, s: ir.If, body):
        """As written; an arm a constexpr turns off is spelled but never compiled (Triton folds
        the test), so what it would refuse is not refused there."""
        test = ir.constant_test(self.kernel, s.cond)

        def arm(stmts, live):
            self.dead_arms += not live
            try:
                body(stmts)
            finally:
                self.dead_arms -= not live

        super().emit_if(s, lambda stmts: arm(stmts, test is None or bool(test.value) == (stmts is s.body)))

    # ------------------------------------------------------------ decided facts
    def core(self, role: str) -> Core:
        return self.analysis.core(role)

    def agent_core(self, agent: Agent) -> str:
        return self.core(agent.roles[0])

    def crossing(self, obj) -> bool:
        return self.placement.crosses(obj)

    def in_gm(self, pipe: ir.Pipe) -> bool:
        """Whether the pipe's payload lives in a GM workspace ring (a cross-core pipe, or one
        a vector-only kernel keeps in memory on its core) rather than in a plain value."""
        return pipe.name in self.rings

    def slots(self, pipe: ir.Pipe) -> int:
        """GM slots of a cross-core pipe's ring (the slot of the i-th hand-off is i % slots)."""
        ring = self.rings.get(pipe.name)
        return ring.slots if ring is not None else pipe.stages

    def barrier_mode(self, name: str) -> str:
        return self.analysis.barrier_modes[name]

    # ------------------------------------------------------------ expressions
    def dtype(self, d) -> str:
        return TL_DTYPES[d.name]

    def replica_name(self, n: str) -> str:
        """A role-local name of the unrolled replica being emitted (a name the generator builds
        from the kernel's: spelled from the name as written), else the name as written."""
        if self.rep is not None and n in self.local and not any(n in s for s in self.shared):
            return f"{n}_r{self.rep}"
        return n

    def name(self, n: str) -> str:
        r = self.replica_name(n)
        return r if r != n else self.names(n)

    def slot_field(self, slot: str, field: str, part: int | None = None) -> str:
        """A slot field's variable (``part``: the producer replica of an N -> 1 pipe's slot)."""
        pipe = self.kernel.sync_object(self.slot_pipe.get(slot, ""))
        if pipe is not None and not self.in_gm(pipe):
            return self.payload_name(pipe, field, part)
        return f"{self.replica_name(slot)}{'' if part is None else f'_p{part}'}_{field}"

    def payload_name(self, pipe: ir.Pipe, field: str, part: int | None = None) -> str:
        """Variable of a same-core pipe's payload (per replica only for N -> N and N -> 1 pipes:
        a gather's consumer reads replica ``part``'s)."""
        link = self.alloc.skeleton.link(pipe.name)
        rep = self.rep if part is None else part
        return f"{pipe.name}_{field}_r{rep}" if (link.paired or link.gather_pipe) and rep is not None \
            else f"{pipe.name}_{field}"

    def attr(self, e: ir.Attr) -> str:
        if isinstance(e.value, ir.Name):
            return self.slot_field(e.value.id, e.attr, e.part)
        return super().attr(e)

    def load_slot(self, pipe: ir.Pipe, target: str):
        """Load the fields of the slot a wait took: of the replica being emitted (its ring), or
        for the consumer of an N -> 1 pipe, of every producer replica's ring (``slot[r].f``)."""
        o, saved = self.out, self.rep
        link = self.alloc.skeleton.link(pipe.name)
        parts = [(None, str(r)) for r in range(link.rings)] if link.gather_pipe else \
            [(r, None) for r in (self.reps if self.rep is None else [self.rep])]
        for rep, ring in parts:
            self.rep = saved if link.gather_pipe else rep
            of = "" if ring is None else f"_p{ring}"
            for f in pipe.fields:
                ptr = self.field_ptr(pipe, f.name, f"{target}_i", ring or self.ring_of(pipe))
                o.line(f"{self.replica_name(target)}{of}_{f.name} = tl.load({ptr})")
        self.rep = saved

    def call(self, e: ir.Call) -> str:
        if e.op is ir.TileOp.REPLICA_ID:
            return str(self.rep) if self.rep is not None else self.rid_expr
        if e.op is ir.TileOp.MMA:
            return f"tl.dot({self.args(e)}, out_dtype=tl.float32)" if len(e.args) == 2 else \
                f"tl.dot({self.args(e)})"
        if e.op is ir.TileOp.MMA_WAIT:
            return self.expr(e.args[0])   # tl.dot is synchronous on the cube: no-op
        if e.op is ir.TileOp.LOAD:
            t, offs, shape = e.args[0].id, e.args[1].items, e.args[2].items
            w = window(self.names(t), t, len(offs), [self.expr(x) for x in offs], len(shape))
            block = "(" + ", ".join(self.expr(x) for x in shape) + ("," if len(shape) == 1 else "") + ")"
            return f"tl.load({w.block_ptr(block)}, boundary_check={w.boundary_check}, padding_option=\"zero\")"
        if e.op in ir.UNARY_MATH or e.op is ir.TileOp.POW:     # float32 math, abs keeps the dtype
            x = f"({self.expr(e.args[0])})" + ("" if e.op is ir.TileOp.ABS else ".to(tl.float32)")
            return spell_math(e.op, x, "tl", TL_MATH, e.args[1].value if len(e.args) > 1 else None)
        if e.op is ir.TileOp.LOAD_SCALAR:
            t = e.args[0].id
            return f"tl.load({self.names(t)} + ({self.expr(e.args[1])}) * {tensor_args(t)[2]})"
        return f"{_TL_OPS[e.op]}({self.args(e)})"

    # ------------------------------------------------------------ sync spelling
    def flag_op(self, verb: FlagOp, sender: Core, receiver: Core, flag: int, hand_off: HandOff,
                why: str) -> list[str]:
        """One cross-core set or wait, with the ordering its hand-off needs.

        hand_off: FULL (orders the producer's GM write before the consumer's read), EMPTY
        (orders the consumer's GM read before the producer's next write into the slot),
        DRAIN (the producer's final EMPTY waits: nothing is written after them) or ANY
        (events: order everything before the set against everything after the wait).

        The scope form names the pipes (al.sync_block_*(..., sender_pipe, receiver_pipe)). The
        3.2.0 release form cannot: its set is queued on the sender core's write pipe (FIX /
        MTE3) and its wait blocks the receiver's MTE2 (verified in the HIVM IR). That is right for
        FULL; for EMPTY the set would not wait for the MTE2 read and the wait would not hold
        back the FIX / MTE3 write, so the release form adds ``tl.debug_barrier()`` (HIVM
        ``pipe_barrier[<PIPE_ALL>]``) before such a set and after such a wait.
        """
        op = "sync_block_set" if verb is FlagOp.SET else "sync_block_wait"
        fence_before = verb is FlagOp.SET and hand_off in (HandOff.EMPTY, HandOff.ANY)
        fence_after = verb is FlagOp.WAIT and hand_off in (HandOff.EMPTY, HandOff.ANY)
        if self.form == "scope":
            if hand_off in (HandOff.EMPTY, HandOff.DRAIN):
                pipes = (READ_PIPE, WRITE_PIPE[receiver])
            else:
                pipes = (WRITE_PIPE[sender], READ_PIPE)
            call = (f"al.{op}(\"{sender}\", \"{receiver}\", {flag}, al.PIPE.{pipes[0]}, "
                    f"al.PIPE.{pipes[1]})  # {why}")
            fence_before = fence_before and hand_off is HandOff.ANY
            fence_after = fence_after and hand_off is HandOff.ANY
        else:
            call = f"tl.{op}(\"{sender}\", \"{receiver}\", {flag})  # {why}"
        fence = "tl.debug_barrier()  # pipe_barrier(PIPE_ALL): see flag_op in xsync/backends/ascend/render.py"
        return ([fence] if fence_before else []) + [call] + ([fence] if fence_after else [])

    def emit(self, lines: list[str]):
        for line in lines:
            self.out.line(line)

    def barrier_op(self, mode: str, flag: int, why: str) -> list[str]:
        """sync_block_all orders all cores' work on both sides (it waits on one pipe only)."""
        mod = "al" if self.form == "scope" else "tl"
        fence = "tl.debug_barrier()"
        return [fence, f"{mod}.sync_block_all(\"{mode}\", {flag})  # {why}", fence]

    # ------------------------------------------------------------ workspace
    def field_ptr(self, pipe: ir.Pipe, field: str, slot_index: str, ring: str) -> str:
        r = self.rings[pipe.name]
        spec = pipe.field(field)
        eb = spec.dtype.bytes
        base = r.offset + dict(r.fields)[field]
        stride = r.slot_stride
        assert base % eb == 0 and stride % eb == 0
        if r.interleave > 1:    # the pairs' slots alternate: stride rings (ring 0 included)
            slot_index = f"({slot_index} * {r.rings} + {ring})"
        elif ring != "0":
            slot_index = f"({ring} * {r.slots} + {slot_index})"
        if len(spec.shape) == 2:
            rows, cols = spec.shape
            tile = f"tl.arange(0, {rows})[:, None] * {cols} + tl.arange(0, {cols})[None, :]"
        elif len(spec.shape) == 1:
            tile = f"tl.arange(0, {spec.shape[0]})"
        else:   # 1-D or 2-D power-of-two tiles only (replicas.py, rule 5)
            raise TypeError(f"cannot address field {field!r} of shape {spec.shape}")
        return f"{workspace_arg(spec.dtype)} + ({base // eb} + {slot_index} * {stride // eb}) + {tile}"

    # ------------------------------------------------------------ module
    def render(self) -> str:
        k, o = self.kernel, self.out
        form_text = ("triton-ascend 3.2.0 release form: one body, the compiler splits cube and "
                     "vector work by op kind" if self.form == "release" else
                     "triton-ascend 3.2.1+ scope form: al.scope(core_mode=...) per core")
        o.line(f'"""Generated by xsync: kernel \'{k.name}\' ({k.file}) for Ascend.')
        o.line()
        o.line(f"{form_text}.")
        o.line("Flags, sync_block_all modes and the GM workspace come from the xsync allocation:")
        for r in self.alloc.rows:
            o.line(doc_text(f"    {r.obj}: {r.what}: {r.resource}" + (f" ({r.rule})" if r.rule else "")))
        o.line('"""')
        o.line("import triton")
        o.line("import triton.language as tl")
        if self.form == "scope":
            o.line("import triton.language.extra.cann.extension as al")
        o.line()
        for name, value in k.constexprs:
            o.line(f"{self.names(name)} = tl.constexpr({self.const(value)})")
        if self.alloc.workspace_bytes:
            o.line(f"XS_WS_BYTES = tl.constexpr({self.alloc.workspace_bytes})  # GM workspace per program")
        o.line('XS_COMPILE_OPTIONS = {"disable_auto_inject_block_sync": True}  # xsync places every flag')
        o.line()
        o.line()
        params = []
        for p in k.params:
            if p.kind is ir.ParamKind.CONSTEXPR:
                continue
            params.append(self.names(p.name))
            if p.kind is ir.ParamKind.TENSOR:
                params += tensor_args(p.name, self.ranks.get(p.name, 2))
        params += [workspace_arg(d) for d in self.ws_dtypes]
        o.line("@triton.jit")
        o.line(f"def {self.names(k.name)}({', '.join(params)}):")
        o.indent()
        agents = sorted(self.placement.agents, key=lambda a: self.agent_core(a) is not Core.CUBE)
        for agent in agents:
            self.agent_part(agent)
        o.dedent()
        return o.source()

    def agent_part(self, agent: Agent):
        first = len(self.out.lines) + 1
        self._agent_part(agent)
        self.parts.append(CorePart(self.agent_core(agent), agent.name, first, len(self.out.lines)))

    def _agent_part(self, agent: Agent):
        o, k = self.out, self.kernel
        core = self.agent_core(agent)
        hw = "cube core (AIC)" if core is Core.CUBE else "vector cores (AIV)"
        body = slice_agent(k.body, agent.roles)
        plan = self.analysis.agents[agent.name]
        unroll = plan.unroll
        self.agent, self.plan = agent, plan
        o.line(f"# {'=' * 8} {hw}: role(s) {', '.join(label(r) for r in agent.roles)}"
               + (f" x {agent.replicas} replicas" if agent.replicas > 1 else "") + f" {'=' * 8}")
        serial = plan.serial
        if unroll or serial:
            who = f"{agent.replicas} replicas" if unroll else \
                "replicas of " + ", ".join(f"'{r}'" for r in serial)
            o.line(f"# {who} run in lockstep on this core (replica_id unrolled): each flag is "
                   "waited once before and set once after all replicas")
        elif agent.replicas == 2:
            o.line("# replica_id = al.sub_vec_id(): one replica per vector core")
        if self.form == "scope":
            o.line(f"with al.scope(core_mode=\"{core}\"):")
            o.indent()
        self.local = _role_locals(body)
        self.shared, self.rep, self.slot_pipe = [], None, {}
        self.rid_expr = "xs_rid" if plan.sub_vec_id else "0"
        if self.rid_expr == "xs_rid":
            o.line("xs_rid = al.sub_vec_id()")
        self.preamble(agent)
        self.reps = [None]
        self.block(body)
        self.drain(agent)
        if self.form == "scope":
            o.dedent()
        o.line()

    def preamble(self, agent: Agent):
        o, k = self.out, self.kernel
        if self.ws_dtypes:
            o.line("xs_prog = (tl.program_id(2) * tl.num_programs(1) + tl.program_id(1)) * "
                   "tl.num_programs(0) + tl.program_id(0)")
            for d in self.ws_dtypes:
                a = workspace_arg(d)
                o.line(f"{a} = {a} + xs_prog.to(tl.int64) * (XS_WS_BYTES // {d.bytes})")
        for p in k.pipes:
            if not self.crossing(p) and not self.in_gm(p):
                continue
            if p.src in agent.roles:
                o.line(f"xs_{p.name}_acq = 0  # slots acquired from pipe '{p.name}'")
            if p.dst in agent.roles:
                o.line(f"xs_{p.name}_got = 0  # slots waited on pipe '{p.name}'")

    def drain(self, agent: Agent):
        o = self.out
        for p in self.kernel.pipes:
            if self.crossing(p) and p.src in agent.roles:
                s, d = self.core(p.src), self.core(p.dst)
                o.line(f"# drain pipe '{p.name}': wait for the slots still held by '{p.dst}' so its "
                       f"EMPTY flag ends at zero")
                o.line(f"for xs_d in tl.static_range({p.lane_stages}):")
                o.indent()
                o.line(f"if xs_d < xs_{p.name}_acq:")
                o.indent()
                o.line(self.flag_op(FlagOp.WAIT, d, s, self.ids[f"{p.name}:empty"], HandOff.DRAIN,
                                    f"{p.name} EMPTY: drain, pipe declared at line {p.loc.line}")[0])
                o.dedent()
                o.dedent()

    # ------------------------------------------------------------ statements
    def block(self, stmts):
        """Replicated (unannotated) statements: emitted once."""
        o = self.out
        n0 = len(o.lines)
        for s in stmts:
            if isinstance(s, ir.RoleBlock):
                o.line(f"# role '{label(s.role)}' (line {s.loc.line})")
                self.reps = self.reps_for(s.role)
                # sub-tile replicas (passes/subtile_replicas.py): a wait's slot is loaded at the
                # head of each replica's run of statements, so one replica's tiles live at a time
                self.defer = [] if self.reps != [None] and subtiled(self.kernel, self.placement, s.role) else None
                self.role_body(s.body)
                self.reps, self.defer = [None], None
            elif isinstance(s, ir.For):
                self.emit_for(s, self.block)
            elif isinstance(s, ir.If):
                self.emit_if(s, self.block)
            else:
                self.simple(s)
        if no_code(o, n0):
            o.line("pass")

    def reps_for(self, role: str) -> list:
        """Replicas of ``role`` this core emits in lockstep ([None]: one instance, not unrolled)."""
        return self.plan.reps(role, self.kernel.role(role).replicas)

    def role_body(self, stmts):
        """Statements of a role: lockstep over the unrolled replicas."""
        o = self.out
        n0 = len(o.lines)
        reps = self.reps
        if reps == [None]:
            for s in stmts:
                self.role_stmt(s)
        else:
            segment = []
            for s in list(stmts) + [None]:
                if s is not None and not has_sync(s):
                    segment.append(s)
                    continue
                flush = s is None or not isinstance(s, ir.SyncOp) or s.verb is ir.Verb.RELEASE
                for r in reps:
                    self.rep = r
                    for pipe, target in (self.defer or []) if segment or flush else []:
                        self.load_slot(pipe, target)
                    for x in segment:
                        self.role_stmt(x)
                self.rep = None
                if segment or flush:
                    self.defer = [] if self.defer is not None else None
                segment = []
                if s is None:
                    break
                self.lockstep_compound(s)
        if len(o.lines) == n0:
            o.line("pass")

    def compound_body(self, stmts):
        """The body of a loop or branch shared by the replicas in lockstep (a statement at least)."""
        n0 = len(self.out.lines)
        self.role_body(stmts)
        if no_code(self.out, n0):
            self.out.line("pass")

    def lockstep_compound(self, s):
        """A sync op, or a loop/branch holding sync ops, shared by all unrolled replicas."""
        o = self.out
        if isinstance(s, ir.SyncOp):
            self.sync(s)
            return
        # replicas reach every sync point together (replicas.py, rule 4)
        self.rep = self.reps[0]
        if isinstance(s, ir.For):
            head = (f"for {self.names(s.var)} in range({self.expr(s.start)}, {self.expr(s.stop)}, "
                    f"{self.expr(s.step)}):")
            self.rep = None
            o.line(head)
            o.indent()
            self.shared.append({s.var})
            self.compound_body(s.body)
            self.shared.pop()
            o.dedent()
        elif isinstance(s, ir.If):
            cond = self.expr(s.cond)
            self.rep = None
            o.line(f"if {cond}:")
            o.indent()
            self.compound_body(s.body)
            o.dedent()
            if s.orelse:
                o.line("else:")
                o.indent()
                self.compound_body(s.orelse)
                o.dedent()
        else:
            raise TypeError(f"cannot render {s!r}")

    def role_stmt(self, s):
        o = self.out
        if isinstance(s, ir.For):
            self.emit_for(s, self.role_body_plain)
        elif isinstance(s, ir.If):
            self.emit_if(s, self.role_body_plain)
        elif isinstance(s, ir.SyncOp):
            self.sync(s)
        else:
            self.simple(s)

    def role_body_plain(self, stmts):
        n0 = len(self.out.lines)
        for s in stmts:
            self.role_stmt(s)
        if no_code(self.out, n0):
            self.out.line("pass")

    def simple(self, s):
        o = self.out
        if isinstance(s, ir.Assign):
            o.line(f"{', '.join(self.name(t) for t in s.targets)} = {self.expr(s.value)}")
        elif isinstance(s, ir.SlotWrite):
            pipe = self.kernel.sync_object(s.pipe)
            if not self.in_gm(pipe):
                o.line(f"{self.payload_name(pipe, s.field)} = {self.expr(s.value)}"
                       f"  # {pipe.name}.{s.field}: same core, plain value")
                return
            ring = self.ring_of(pipe)
            dt = self.dtype(pipe.field(s.field).dtype)
            o.line(f"tl.store({self.field_ptr(pipe, s.field, f'{s.slot}_i', ring)}, "
                   f"({self.expr(s.value)}).to({dt}))  # {pipe.name}.{s.field} -> GM slot")
        elif isinstance(s, ir.Store):
            t = s.tensor
            dtype = next(p.dtype for p in self.kernel.params if p.name == t)
            offs = [self.expr(x) for x in s.offsets]
            o.line(f"xs_v = {self.expr(s.value)}")
            bounds = [self.expr(x) for x in s.bounds] if getattr(s, "bounds", None) else None
            w = window(self.names(t), t, len(offs), offs, s.tile_rank, bounds)
            if s.reduce is ir.StoreReduce.ADD:
                self.atomic_add(s, t, dtype, w)
                return
            block = "(xs_v.shape[0], xs_v.shape[1])" if len(w.sizes) == 2 else "(xs_v.shape[0],)"
            o.line(f"tl.store({w.block_ptr(block)}, xs_v.to({self.dtype(dtype)}), "
                   f"boundary_check={w.boundary_check})")
        else:
            raise TypeError(f"cannot render {s!r}")

    def ring_of(self, pipe: ir.Pipe) -> str:
        """Which ring of a pipe the replica being emitted uses (N -> N pipes: its own)."""
        if self.rings[pipe.name].rings == 1:
            return "0"
        return str(self.rep) if self.rep is not None else self.rid_expr

    def sync(self, s: ir.SyncOp):
        """One sync verb: the flag operation once per core, slot bookkeeping per replica."""
        o, k = self.out, self.kernel
        obj = k.sync_object(s.obj)
        line = s.loc.line
        if isinstance(obj, ir.Pipe):
            if s.target:
                self.slot_pipe[s.target] = obj.name
            if not self.crossing(obj) and self.in_gm(obj):
                self.ring_sync(s, obj)
                return
            if not self.crossing(obj):
                o.line(f"# {obj.name}.{s.verb}() (line {line}): same core, program order")
                return
            src, dst = self.core(obj.src), self.core(obj.dst)
            full, empty = self.ids[f"{obj.name}:full"], self.ids[f"{obj.name}:empty"]
            if s.verb is ir.Verb.ACQUIRE:
                o.line(f"# {obj.name}.acquire() (line {line})")
                o.line(f"if xs_{obj.name}_acq >= {obj.lane_stages}:")
                o.indent()
                self.emit(self.flag_op(FlagOp.WAIT, dst, src, empty, HandOff.EMPTY,
                                       f"{obj.name} EMPTY: a free slot, {obj.name}.acquire() line {line}"))
                o.dedent()
                if s.target:
                    o.line(f"{s.target}_i = xs_{obj.name}_acq % {self.slots(obj)}")
                o.line(f"xs_{obj.name}_acq += 1")
            elif s.verb is ir.Verb.COMMIT:
                self.emit(self.flag_op(FlagOp.SET, src, dst, full, HandOff.FULL,
                                       f"{obj.name} FULL: {obj.name}.commit() line {line}"))
            elif s.verb is ir.Verb.WAIT:
                self.emit(self.flag_op(FlagOp.WAIT, src, dst, full, HandOff.FULL,
                                       f"{obj.name} FULL: {obj.name}.wait() line {line}"))
                target = s.target or f"xs_{obj.name}_slot"
                o.line(f"{target}_i = xs_{obj.name}_got % {self.slots(obj)}")
                o.line(f"xs_{obj.name}_got += 1")
                if self.defer is not None:
                    self.defer.append((obj, target))
                else:
                    self.load_slot(obj, target)
            else:
                self.emit(self.flag_op(FlagOp.SET, dst, src, empty, HandOff.EMPTY,
                                       f"{obj.name} EMPTY: {obj.name}.release() line {line}"))
        elif isinstance(obj, ir.Event):
            if not self.crossing(obj):
                o.line(f"# xs.{s.verb}({obj.name}) (line {line}): same core, program order")
                return
            src, dst = self.core(obj.src), self.core(obj.dst)
            flag = self.ids[obj.name]
            if s.verb is ir.Verb.SIGNAL:
                self.emit(self.flag_op(FlagOp.SET, src, dst, flag, HandOff.ANY,
                                       f"xs.signal({obj.name}) line {line}"))
            else:
                self.emit(self.flag_op(FlagOp.WAIT, src, dst, flag, HandOff.ANY,
                                       f"xs.wait({obj.name}) line {line}"))
        else:
            # member roles sharing this core meet once per meeting (skeleton.points)
            if self.alloc.skeleton.renders(self.agent.name, s) is None:
                at = self.alloc.skeleton.point(self.agent.name, s).at.loc.line
                o.line(f"# {obj.name}.{s.verb}() (line {line}): met once for this core at line {at}")
                return
            mode = self.barrier_mode(obj.name)
            note = "" if s.verb is ir.Verb.SYNC else " (arrive: no arrive-only form, full barrier)"
            self.emit(self.barrier_op(mode, self.ids[obj.name], f"{obj.name}.{s.verb}() line {line}{note}"))

    def ring_sync(self, s: ir.SyncOp, pipe: ir.Pipe):
        """A verb of a pipe kept in a GM ring on one core (vector-only kernels): program order
        orders the roles, so no flag; a fence orders the GM write (MTE3) before the read (MTE2)
        of a slot, and the read before the slot is written again."""
        o, line = self.out, s.loc.line
        fence = "tl.debug_barrier()  # pipe_barrier(PIPE_ALL): GM ring on this core"
        if s.verb is ir.Verb.ACQUIRE:
            o.line(f"# {pipe.name}.acquire() (line {line}): same core, GM ring in program order")
            o.line(f"if xs_{pipe.name}_acq >= {pipe.lane_stages}:")
            o.indent()
            o.line(f"{fence}, the slot's last read before it is written again")
            o.dedent()
            if s.target:
                o.line(f"{s.target}_i = xs_{pipe.name}_acq % {self.slots(pipe)}")
            o.line(f"xs_{pipe.name}_acq += 1")
        elif s.verb is ir.Verb.WAIT:
            o.line(f"{fence}, the slot's write before this read ({pipe.name}.wait() line {line})")
            target = s.target or f"xs_{pipe.name}_slot"
            o.line(f"{target}_i = xs_{pipe.name}_got % {self.slots(pipe)}")
            o.line(f"xs_{pipe.name}_got += 1")
            self.load_slot(pipe, target)
        else:
            o.line(f"# {pipe.name}.{s.verb}() (line {line}): same core, GM ring in program order")


# ---------------------------------------------------------------- helpers
def no_code(out: Emitter, first: int) -> bool:
    """Whether the lines emitted since line index ``first`` hold no statement (only comments:
    a block then needs ``pass``)."""
    return all(not ln.strip() or ln.lstrip().startswith("#") for ln in out.lines[first:])


def _role_locals(body) -> set[str]:
    out: set[str] = set()
    for s in ir.walk(body):
        if isinstance(s, ir.RoleBlock):
            for x in ir.walk(s.body):
                if isinstance(x, ir.Assign):
                    out |= set(x.targets)
                elif isinstance(x, ir.For):
                    out.add(x.var)
                elif isinstance(x, ir.SyncOp) and x.target:
                    out.add(x.target)
    return out


def render(kernel: ir.KernelIR, placement: Placement, allocation: Allocation,
           form: str = "release") -> str:
    return render_module(kernel, placement, allocation, form).source


def render_module(kernel: ir.KernelIR, placement: Placement, allocation: Allocation,
                  form: str = "release") -> "AscendModule":
    """The generated source and where each core's part of the kernel body lies in it."""
    analysis = analyze(kernel, placement, allocation, form)
    # the kernel's names spelled apart from the generator's (xsync/backends/spelling.py): a probe
    # render tells which names the generator writes
    probe = Spelling.probe(kernel)
    names = probe.settle(AscendRenderer(kernel, placement, allocation, analysis, probe).render())
    r = AscendRenderer(kernel, placement, allocation, analysis, names)
    source = r.render()
    return AscendModule(source, form, tuple(r.parts), names)

