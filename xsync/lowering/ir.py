"""Protocol IR: what the frontend produces and every renderer consumes.

A :class:`KernelIR` holds the kernel's parameters, its roles and sync objects (with
constexprs already folded into stages, replica counts and tile shapes), and a body of
structured statements. Expressions form a small closed language (constants, names,
arithmetic, comparisons, calls of the tile ops in ``xsync.api.TILE_OPS``, field and
subscript access) so that each node has an obvious rendering in Gluon, triton-ascend
and torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Union

from xsync.dtypes import DType
from xsync.errors import SourceLoc


# ---------------------------------------------------------------- vocabularies
# Typed names shared by every layer (frontend, passes, verifier, allocators, renderers, trace):
# compare with the members (``s.verb is Verb.WAIT``), never with text. They are StrEnums so
# that generated source and messages spell them as the kernel author wrote them.
class Verb(StrEnum):
    """A synchronization action (:class:`SyncOp`)."""

    ACQUIRE = "acquire"   # pipe, producer side: wait for a free slot
    COMMIT = "commit"     # pipe, producer side: the slot is full
    WAIT = "wait"         # pipe, consumer side: wait for a full slot; event: wait for a signal
    RELEASE = "release"   # pipe, consumer side: the slot is free again
    SIGNAL = "signal"     # event: one more signal
    SYNC = "sync"         # barrier: arrive and wait for the meeting
    ARRIVE = "arrive"     # barrier: arrive without waiting

    @property
    def producer_side(self) -> bool:
        """A pipe verb of the producer (source) role."""
        return self in (Verb.ACQUIRE, Verb.COMMIT)


PIPE_VERBS = (Verb.ACQUIRE, Verb.COMMIT, Verb.WAIT, Verb.RELEASE)
EVENT_VERBS = (Verb.SIGNAL, Verb.WAIT)
BARRIER_VERBS = (Verb.SYNC, Verb.ARRIVE)


class TileOp(StrEnum):
    """A tile operation of the vocabulary (``xsync.api.TILE_OPS``), as a :class:`Call` names it."""

    PROGRAM_ID = "program_id"
    NUM_PROGRAMS = "num_programs"
    REPLICA_ID = "replica_id"
    # a cluster kernel's program numbering (xs.cluster): the frontend spells them in program_id
    # and num_programs before the kernel leaves it (xsync/lowering/cluster.py)
    CLUSTER_RANK = "cluster_rank"
    CLUSTER_ID = "cluster_id"
    NUM_CLUSTERS = "num_clusters"
    CDIV = "cdiv"
    ARANGE = "arange"
    ZEROS = "zeros"
    FULL = "full"
    LOAD = "load"
    LOAD_SCALAR = "load_scalar"
    MMA = "mma"
    MMA_WAIT = "mma_wait"
    TRANS = "trans"
    MAX = "max"
    SUM = "sum"
    EXP2 = "exp2"
    LOG2 = "log2"
    WHERE = "where"
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    EXP = "exp"
    LOG = "log"
    TANH = "tanh"
    ERF = "erf"
    SIGMOID = "sigmoid"
    ABS = "abs"
    POW = "pow"


# elementwise math computed in float32 with a float32 result (xsync.api); ABS keeps the dtype
FLOAT_MATH = (TileOp.SQRT, TileOp.RSQRT, TileOp.EXP, TileOp.LOG, TileOp.TANH, TileOp.ERF,
              TileOp.SIGMOID, TileOp.POW)
UNARY_MATH = FLOAT_MATH[:-1] + (TileOp.ABS,)
MAX_INT_POWER = 16     # `x ** n` with an integer n up to this multiplies; larger is refused


class ParamKind(StrEnum):
    """What a kernel parameter is (:class:`Param`)."""

    TENSOR = "tensor"
    SCALAR = "scalar"         # a run-time int or float
    CONSTEXPR = "constexpr"   # folded into the specialization


class RoleKind(StrEnum):
    """What a role does (``xs.role(kind=...)``): it decides where placements put the role."""

    COPY = "copy"       # data movement: TMA producer warp / cube MTE
    MATRIX = "matrix"   # mma work: wgmma warpgroup / cube core
    VECTOR = "vector"   # elementwise work: warpgroup / vector cores


class RolePlacement(StrEnum):
    """Where a vector role asks to run (``xs.role(..., placement=...)``; unset: the backend's
    rule decides). Hopper: its own consumer warpgroup(s), or merged into the warpgroup of the
    matrix role with its replica count. Ascend and the CPU emulator always give a vector role
    agents of its own: there the request is accepted and reported as not applicable."""

    OWN = "own"
    MERGED = "merged"


class StoreReduce(StrEnum):
    """How ``xs.store(..., reduce=...)`` combines the tile with what the tensor holds."""

    ADD = "add"         # element-wise add into the tensor (atomic per element on the devices)


def _coerce(obj, name: str, kind: type) -> None:
    """Store field ``name`` of a frozen IR node as its vocabulary member (constructors may pass
    the text; nothing downstream compares text)."""
    value = getattr(obj, name)
    if type(value) is not kind:
        object.__setattr__(obj, name, kind(value))


# ---------------------------------------------------------------- expressions
@dataclass(frozen=True)
class Const:
    value: Union[int, float, bool, None, DType]


@dataclass(frozen=True)
class Name:
    id: str


@dataclass(frozen=True)
class BinOp:
    op: str  # one of + - * / // % & | ^ << >>
    left: "Expr"
    right: "Expr"


@dataclass(frozen=True)
class UnaryOp:
    op: str  # "-", "not", "~"
    operand: "Expr"


@dataclass(frozen=True)
class Compare:
    op: str  # one of < <= > >= == !=
    left: "Expr"
    right: "Expr"


@dataclass(frozen=True)
class BoolOp:
    op: str  # "and" / "or"
    values: tuple["Expr", ...]


@dataclass(frozen=True)
class Call:
    """A tile op from ``xsync.api.TILE_OPS``."""

    op: TileOp
    args: tuple["Expr", ...]
    kwargs: tuple[tuple[str, "Expr"], ...] = ()

    def __post_init__(self):
        _coerce(self, "op", TileOp)

    def kwarg(self, name: str, default=None):
        return dict(self.kwargs).get(name, default)


@dataclass(frozen=True)
class Attr:
    """``slot.a`` (a pipe payload field) or ``q.dtype``-like folded attributes. ``part``: the
    producer replica whose value ``slot[part].a`` reads from a slot of an N -> 1 pipe."""

    value: "Expr"
    attr: str
    part: int | None = None


@dataclass(frozen=True)
class Cast:
    value: "Expr"
    dtype: DType


@dataclass(frozen=True)
class Subscript:
    """Broadcast indexing: each index is ":" (keep) or None (new axis)."""

    value: "Expr"
    index: tuple[Union[str, None], ...]


@dataclass(frozen=True)
class TupleExpr:
    items: tuple["Expr", ...]


Expr = Union[Const, Name, BinOp, UnaryOp, Compare, BoolOp, Call, Attr, Cast, Subscript, TupleExpr]


# ---------------------------------------------------------------- declarations
@dataclass(frozen=True)
class Role:
    name: str
    kind: RoleKind
    replicas: int
    loc: SourceLoc
    placement: RolePlacement | None = None   # the author's request (None: the backend decides)

    def __post_init__(self):
        _coerce(self, "kind", RoleKind)
        if self.placement is not None:
            _coerce(self, "placement", RolePlacement)


@dataclass(frozen=True)
class TileSpec:
    name: str
    shape: tuple[int, ...]
    dtype: DType
    multicast: bool = False   # the same tile in every program of the cluster (xs.cluster)

    @property
    def bytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * self.dtype.bytes


@dataclass(frozen=True)
class Pipe:
    name: str
    src: str
    dst: str
    stages: int
    fields: tuple[TileSpec, ...]
    loc: SourceLoc
    made_by: str = ""      # the schedule pass that declared it ("" = the kernel source)
    origin: str = ""       # a pass-made pipe: the source pipe it stands for (part of)
    interleave: int = 1    # N > 1: N replica pairs share one ring, stride N (xsync/lowering/holding.py)

    @property
    def lane_stages(self) -> int:
        """Slots of the ring one replica pair may hold (all of them unless interleaved)."""
        return self.stages // self.interleave

    @property
    def slot_bytes(self) -> int:
        return sum(f.bytes for f in self.fields)

    def field(self, name: str) -> TileSpec | None:
        return next((f for f in self.fields if f.name == name), None)

    @property
    def multicast(self) -> bool:
        """Some field is shared by the programs of a cluster: every program's release gates
        every program's next write of the slot."""
        return any(f.multicast for f in self.fields)


@dataclass(frozen=True)
class Event:
    name: str
    src: str
    dst: str
    loc: SourceLoc


@dataclass(frozen=True)
class Barrier:
    """A group barrier. ``all_roles``: declared as ``xs.barrier()`` (every role meets);
    ``members`` then lists every role of the kernel."""

    name: str
    members: tuple[str, ...]
    loc: SourceLoc
    all_roles: bool = False
    made_by: str = ""      # the schedule pass that declared it ("" = the kernel source)


SyncObject = Union[Pipe, Event, Barrier]


# ---------------------------------------------------------------- statements
@dataclass(frozen=True)
class Assign:
    targets: tuple[str, ...]  # more than one: tuple unpacking of a TupleExpr
    value: Expr
    loc: SourceLoc


@dataclass(frozen=True)
class SlotWrite:
    """``slot.field = value`` in the producer role of ``pipe``."""

    pipe: str
    slot: str
    field: str
    value: Expr
    loc: SourceLoc


@dataclass(frozen=True)
class Store:
    tensor: str
    offsets: tuple[Expr, ...]
    value: Expr
    loc: SourceLoc
    bounds: tuple[Expr, ...] | None = None  # absolute ends, one per offset; beyond is dropped
    # reduce-add (``reduce="add"``): the tile is added into the tensor, not written over it;
    # ``deterministic``: the adds of every program land in a fixed order (docs/tutorial.md)
    reduce: StoreReduce | None = None
    deterministic: bool = False
    # the value's rank (1 or 2: the tile spans the tensor's last dimensions), as the shape check
    # (xsync.lowering.shapes) found it before the kernel leaves the frontend; 0: not known there
    value_rank: int = field(default=0, compare=False)

    @property
    def tile_rank(self) -> int:
        return self.value_rank or min(2, len(self.offsets))

    def __post_init__(self):
        if self.reduce is not None:
            _coerce(self, "reduce", StoreReduce)


@dataclass(frozen=True)
class SyncOp:
    """One synchronization action.

    verb: pipe  -> ACQUIRE | COMMIT | WAIT | RELEASE   (:data:`PIPE_VERBS`)
          event -> SIGNAL | WAIT                      (:data:`EVENT_VERBS`)
          barrier -> SYNC | ARRIVE                    (:data:`BARRIER_VERBS`)
    ``target`` names the slot variable bound by acquire/wait (may be None).
    ``guard`` (schedule passes only): the action happens only when this scalar condition
    holds -- the protocol reads it as ``if guard: action``; renderers may predicate instead
    of branching. ``note`` says why a pass put the action here (generated-code comments).
    """

    verb: Verb
    obj: str
    target: str | None
    loc: SourceLoc
    guard: "Expr | None" = None
    note: str = field(default="", compare=False)
    slot: str | None = field(default=None, compare=False)   # release(slot): the slot it names

    def __post_init__(self):
        _coerce(self, "verb", Verb)


@dataclass(frozen=True)
class MmaWait:
    """Made by schedule passes: wait until at most ``pending`` asynchronous mmas of this
    agent are in flight; ``targets`` (results of earlier mmas) are complete afterwards and
    rebound. Unlike the source form ``x = xs.mma_wait(x, pending=n)`` it names only the
    values, not the shared-memory operands of their mmas: a pass puts it where those
    operands' slots may be out of scope (after a loop, in a rotated iteration)."""

    targets: tuple[str, ...]
    pending: int
    loc: SourceLoc
    note: str = field(default="", compare=False)


@dataclass(frozen=True)
class For:
    var: str
    start: Expr
    stop: Expr
    step: Expr
    body: tuple["Stmt", ...]
    loc: SourceLoc
    # ``xs.tile_range(total, persistent=False)``: the loop ``range(program_id(0), total,
    # num_programs(0))`` launched with one program per tile, so each program runs at most its
    # first iteration. Renderers spell it without a loop (``tile = program_id(0); if tile <
    # total:``); the verifier checks the loop, of which that program is one run.
    single_tile: bool = False
    # the loop of ``xs.tile_range`` (persistent or not): each iteration is one tile, and the
    # author says tiles write disjoint outputs (the Hopper renderer may then store by TMA inside
    # it; bulk copies to one location are not ordered)
    tile_loop: bool = False


@dataclass(frozen=True)
class If:
    cond: Expr
    body: tuple["Stmt", ...]
    orelse: tuple["Stmt", ...]
    loc: SourceLoc
    written: bool = False    # the kernel's own `if` (a pass's guard is not: messages name only these)


@dataclass(frozen=True)
class RoleBlock:
    role: str
    body: tuple["Stmt", ...]
    loc: SourceLoc


Stmt = Union[Assign, SlotWrite, Store, SyncOp, MmaWait, For, If, RoleBlock]


@dataclass(frozen=True)
class AgentProgram:
    """One agent's own program, as a schedule pass rewrote it: the agent's role blocks and
    the replicated statements it needs (what ``xsync.lowering.slicing.slice_agent`` gives
    for an agent no pass touched)."""

    agent: str
    body: tuple[Stmt, ...]


# ---------------------------------------------------------------- the kernel
@dataclass(frozen=True)
class Param:
    name: str
    kind: ParamKind
    dtype: DType | None = None  # tensors: element type of this specialization

    def __post_init__(self):
        _coerce(self, "kind", ParamKind)


@dataclass(frozen=True)
class KernelIR:
    name: str
    file: str
    params: tuple[Param, ...]
    constexprs: tuple[tuple[str, object], ...]
    roles: tuple[Role, ...]
    pipes: tuple[Pipe, ...]
    events: tuple[Event, ...]
    barriers: tuple[Barrier, ...]
    body: tuple[Stmt, ...]
    loc: SourceLoc
    source: str = field(default="", compare=False)
    # Set by schedule passes that rewrite agents one by one (placement-specific): these
    # agents run their program here instead of their slice of ``body``.
    programs: tuple[AgentProgram, ...] = ()
    # the run-time scalar parameters the kernel uses as integers (loop bounds, offsets), each
    # with the first line that does: the launch refuses a float for them (xsync/lowering/shapes.py)
    int_scalars: tuple[tuple[str, int], ...] = field(default=(), compare=False)
    # programs per cluster (xs.cluster; 1: none) and where it was declared
    cluster: int = 1
    cluster_loc: SourceLoc | None = field(default=None, compare=False)

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.name == name)

    def sync_object(self, name: str) -> SyncObject | None:
        for group in (self.pipes, self.events, self.barriers):
            for obj in group:
                if obj.name == name:
                    return obj
        return None

    @property
    def constexpr_values(self) -> dict[str, object]:
        return dict(self.constexprs)

    def program(self, agent: str) -> AgentProgram | None:
        """The agent's own program when a pass rewrote it (else None: its slice of body)."""
        return next((p for p in self.programs if p.agent == agent), None)

    def describe(self) -> str:
        """The roles and sync objects, one a line with its source line (``xsync check``)."""
        lines = ["roles:"]
        for r in self.roles:
            asked = f" placement={r.placement}" if r.placement else ""
            lines.append(f"  {r.name:<12} kind={r.kind:<7} replicas={r.replicas}{asked}   (line {r.loc.line})")
        lines.append("sync objects:")
        for p in self.pipes:
            fields = ", ".join(f"{f.name}{list(f.shape)} {f.dtype.name}" for f in p.fields) or "no payload"
            lines.append(f"  pipe    {p.name:<10} {p.src} -> {p.dst}, {p.stages} stage(s)"
                         f"{f', interleave={p.interleave}' if p.interleave > 1 else ''}, {fields}"
                         f"   (line {p.loc.line})")
        for e in self.events:
            lines.append(f"  event   {e.name:<10} {e.src} -> {e.dst}   (line {e.loc.line})")
        for b in self.barriers:
            lines.append(f"  barrier {b.name:<10} members {', '.join(b.members)}   (line {b.loc.line})")
        return "\n".join(lines)

    def all_statements(self) -> tuple[Stmt, ...]:
        """The body and every agent program (to search every statement of the kernel)."""
        return self.body + tuple(s for p in self.programs for s in p.body)


def walk(stmts, enter_roles: bool = True):
    """Yield every statement (pre-order) below ``stmts``."""
    for s in stmts:
        yield s
        if isinstance(s, For):
            yield from walk(s.body, enter_roles)
        elif isinstance(s, If):
            yield from walk(s.body, enter_roles)
            yield from walk(s.orelse, enter_roles)
        elif isinstance(s, RoleBlock) and enter_roles:
            yield from walk(s.body, enter_roles)


def constant_test(k: "KernelIR", cond) -> object:
    """The value of a branch condition that is a constant or a constexpr name (left in the IR;
    Triton folds such a test, and the arm it turns off is never compiled); None otherwise."""
    if isinstance(cond, Const):
        return cond
    if isinstance(cond, Name) and cond.id in k.constexpr_values:
        return Const(k.constexpr_values[cond.id])
    return None


def taken_arms(k: "KernelIR", s: If) -> tuple:
    """The statements of the arms of ``s`` that can run: one arm where the test is constant."""
    test = constant_test(k, s.cond)
    if test is not None:
        return s.body if test.value else s.orelse
    return s.body + s.orelse


def children(e) -> tuple:
    """Direct sub-expressions of an expression."""
    if isinstance(e, (BinOp, Compare)):
        return (e.left, e.right)
    if isinstance(e, UnaryOp):
        return (e.operand,)
    if isinstance(e, BoolOp):
        return e.values
    if isinstance(e, Call):
        return e.args + tuple(v for _, v in e.kwargs)
    if isinstance(e, (Attr, Cast, Subscript)):
        return (e.value,)
    if isinstance(e, TupleExpr):
        return e.items
    return ()


def subexprs(e):
    """Yield ``e`` and every expression below it (pre-order)."""
    yield e
    for c in children(e):
        yield from subexprs(c)


def expr_names(e) -> set[str]:
    """Names an expression reads."""
    return {x.id for x in subexprs(e) if isinstance(x, Name)}


def expr_calls(e) -> list[Call]:
    """Every tile-op call inside an expression."""
    return [x for x in subexprs(e) if isinstance(x, Call)]
