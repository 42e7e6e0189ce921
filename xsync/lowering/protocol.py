"""The synchronization skeleton of a kernel under a placement: the one meaning of its
protocol.

:func:`derive` computes it once; the verifier, the allocator, the CPU runtime and the
renderers read it, and nothing downstream re-derives replica pairing or barrier
membership, or parses display text to get them back.

* :class:`Instance` -- one running copy of an agent (agent x replica).
* :class:`Endpoint` -- one replica of one role, and the instance that runs it (an agent
  that runs the replicas of a role in sequence, like the Ascend cube for replicated
  matrix roles, runs several endpoints of that role).
* :class:`Link` -- a pipe or an event after replica pairing, as explicit
  :class:`Channel` s: ``1 -> 1``; ``1 -> N`` broadcast (one channel, every replica of the
  destination receives every slot or signal; a slot is free once all of them released
  it); ``N -> N`` paired (channel i links replica i to replica i); ``N -> 1`` gather (one
  channel whose consumer needs every source: an event's k-th wait every source's k-th
  signal; a pipe's k-th wait the k-th commit of every producer replica, each into its own
  ring, ``slot[r].field`` reading ring r, and its k-th release frees slot k of every ring).
  Arrive counts follow: a channel's consumers release each slot, its producers each signal.
* :class:`BarrierMembership` -- the instances that meet at a barrier, each once: member
  roles that share an agent, and replicas that one agent runs in sequence, meet once per
  meeting.
* :class:`BarrierPoint` -- where an agent meets a barrier: the barrier calls of its
  member roles that form one meeting, and the one it performs (``at``, the last of them
  in the agent's program order, so every member role of the agent has done its part
  before the agent arrives). Renderers emit the barrier at ``at`` only.
* per instance, a program: the sync actions (:class:`Act`) it performs, inside the loops
  (:class:`Loop`) and branches (:class:`Branch`) that repeat or select them, with the
  scalar assignments (:class:`Let`) those bounds and conditions read. Loop bounds and
  conditions stay expressions: the verifier evaluates them from the kernel's run-time
  scalars (``xsync.lowering.verifier.candidates``), so related loops stay consistent.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

from xsync.errors import ProtocolError, SourceLoc
from xsync.lowering import ir
from xsync.lowering.ir import BARRIER_VERBS, TileOp, Verb
from xsync.lowering.placement import Placement, Target

PAIRINGS = ("1 -> 1", "1 -> N broadcast", "N -> N paired", "N -> 1 gather")


# ---------------------------------------------------------------- scalar evaluation
class NotConstant(Exception):
    pass


_BIN = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
        "%": operator.mod, "&": operator.and_, "|": operator.or_, "^": operator.xor,
        "<<": operator.lshift, ">>": operator.rshift, "/": operator.truediv}
_CMP = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
        "==": operator.eq, "!=": operator.ne}
SCALAR_CALLS = (TileOp.CDIV, TileOp.MINIMUM, TileOp.MAXIMUM)


def evaluate(e: ir.Expr, env: dict):
    """Value of a scalar expression over ``env``; raises NotConstant otherwise."""
    if isinstance(e, ir.Const):
        return e.value
    if isinstance(e, ir.Name):
        if e.id in env:
            return env[e.id]
        raise NotConstant(e.id)
    if isinstance(e, ir.BinOp):
        return _BIN[e.op](evaluate(e.left, env), evaluate(e.right, env))
    if isinstance(e, ir.Compare):
        return _CMP[e.op](evaluate(e.left, env), evaluate(e.right, env))
    if isinstance(e, ir.UnaryOp):
        v = evaluate(e.operand, env)
        return {"-": operator.neg, "not": operator.not_, "~": operator.invert, "+": operator.pos}[e.op](v)
    if isinstance(e, ir.BoolOp):
        vals = [evaluate(v, env) for v in e.values]
        return all(vals) if e.op == "and" else any(vals)
    if isinstance(e, ir.Call):
        if e.op is TileOp.REPLICA_ID and "__replica__" in env:
            return env["__replica__"]
        if e.op is TileOp.CDIV:
            a, b = (evaluate(x, env) for x in e.args)
            return -(-a // b)
        if e.op in (TileOp.MINIMUM, TileOp.MAXIMUM):
            a, b = (evaluate(x, env) for x in e.args)
            return min(a, b) if e.op is TileOp.MINIMUM else max(a, b)
    raise NotConstant(type(e).__name__)


def evaluated(e: ir.Expr, env: dict):
    """:func:`evaluate`'s value, or None where ``e`` is not a constant over ``env`` (a name
    outside it, or operands its operator does not take)."""
    try:
        return evaluate(e, env)
    except (NotConstant, TypeError):
        return None


def text(e: ir.Expr) -> str:
    """Compact source-like text of an expression (keys and messages)."""
    if isinstance(e, ir.Const):
        return repr(e.value)
    if isinstance(e, ir.Name):
        return e.id
    if isinstance(e, ir.BinOp):
        return f"({text(e.left)} {e.op} {text(e.right)})"
    if isinstance(e, ir.Compare):
        return f"{text(e.left)} {e.op} {text(e.right)}"
    if isinstance(e, ir.UnaryOp):
        return f"{e.op} {text(e.operand)}" if e.op == "not" else f"{e.op}{text(e.operand)}"
    if isinstance(e, ir.BoolOp):
        return f" {e.op} ".join(text(v) for v in e.values)
    if isinstance(e, ir.Call):
        args = [text(a) for a in e.args] + [f"{k}={text(v)}" for k, v in e.kwargs]
        return f"xs.{e.op}({', '.join(args)})"
    if isinstance(e, ir.Attr):
        part = "" if e.part is None else f"[{e.part}]"
        return f"{text(e.value)}{part}.{e.attr}"
    if isinstance(e, ir.Cast):
        return f"{text(e.value)}.to(xs.{e.dtype.name})"
    if isinstance(e, ir.Subscript):
        return f"{text(e.value)}[{', '.join('None' if i is None else ':' for i in e.index)}]"
    if isinstance(e, ir.TupleExpr):
        return f"[{', '.join(text(i) for i in e.items)}]"
    return "?"


def source_text(e: ir.Expr) -> str:
    """Like :func:`text` without the outermost parentheses (for messages)."""
    t = text(e)
    return t[1:-1] if t.startswith("(") and t.endswith(")") and isinstance(e, ir.BinOp) else t


# ---------------------------------------------------------------- instances and links
@dataclass(frozen=True)
class Instance:
    """One running copy of an agent."""

    index: int
    agent: str
    replica: int
    replicas: int               # instances of this agent
    roles: tuple[str, ...]
    serial: tuple[str, ...]     # roles whose replicas this instance runs one after another
    hardware: str
    unit: str = ""              # producer / consumer, cube / vector, thread (placement.Agent)

    @property
    def label(self) -> str:
        return self.agent if self.replicas == 1 else f"{self.agent}[{self.replica}]"


@dataclass(frozen=True)
class Endpoint:
    """Replica ``replica`` of role ``role``, run by instance ``instance``."""

    role: str
    replica: int
    instance: int


@dataclass(frozen=True)
class Channel:
    """One producer -> consumer link of a pipe or event after replica pairing.

    ``ring``: which ring of slots / which mbarrier group it uses (N -> N: the replica)."""

    obj: str
    ring: int
    producers: tuple[Endpoint, ...]   # several only for an N -> 1 gather
    consumers: tuple[Endpoint, ...]   # several for a 1 -> N broadcast


@dataclass(frozen=True)
class Link:
    """A pipe or event under the placement."""

    obj: str
    kind: str            # "pipe" | "event"
    src: str
    dst: str
    pairing: str         # one of PAIRINGS
    channels: tuple[Channel, ...]
    crosses: bool        # links two agents (needs hardware sync)
    stages: int          # pipes: declared slots; events: 0
    loc: SourceLoc
    in_memory: bool = False   # inside one agent, but a ring of `stages` slots (Agent.memory_pipes)
    interleave: int = 1       # N > 1: the N channels share one ring of `stages`, stride N

    @property
    def capacity(self) -> int:
        """Slots that may be committed-or-held at once: inside one agent a pipe is a register
        hand-off (one value, program order), whatever its stages, unless the agent keeps its
        pipes in memory. An interleaved ring gives each replica pair stages // interleave."""
        return self.stages // self.interleave if self.crosses or self.in_memory else 1

    @property
    def register_handoff(self) -> bool:
        """A pipe inside one agent that holds one value at a time (stages do not help)."""
        return self.kind == "pipe" and not self.crosses and not self.in_memory

    @property
    def rings(self) -> int:
        """Rings of slots / mbarrier groups: one per channel, and of a gather pipe one per
        producer replica (replica r commits into ring r)."""
        return len(self.channels[0].producers) if self.gather_pipe else len(self.channels)

    @property
    def paired(self) -> bool:
        return self.pairing == "N -> N paired"

    @property
    def gather_pipe(self) -> bool:
        """An N -> 1 pipe: one ring per producer replica, each slot waited and released once
        for all rings."""
        return self.kind == "pipe" and self.pairing == "N -> 1 gather"

    def ring_of(self, ep: Endpoint) -> int:
        """The ring ``ep`` writes or reads (a gather pipe's consumer reads every ring: 0)."""
        if self.gather_pipe:
            prods = self.channels[0].producers
            return prods.index(ep) if ep in prods else 0
        return self.channel_of(ep).ring

    @property
    def consumer_arrivals(self) -> int:
        """Releases (pipe) that free one slot: the empty mbarrier's arrive count."""
        return len(self.channels[0].consumers)

    @property
    def producer_arrivals(self) -> int:
        """Signals (event) that complete one phase: the event mbarrier's arrive count."""
        return len(self.channels[0].producers)

    def channel_of(self, ep: Endpoint) -> Channel:
        for ch in self.channels:
            if ep in ch.producers or ep in ch.consumers:
                return ch
        raise KeyError(ep)


@dataclass(frozen=True)
class BarrierMembership:
    """The instances that meet at a barrier, each once per meeting."""

    obj: str
    member_roles: tuple[str, ...]
    members: tuple[int, ...]          # instance indices
    agents: tuple[str, ...]           # agents with a member instance, each once
    arrive_waits: bool                # the target has no arrive-only barrier
    loc: SourceLoc

    @property
    def arrivals(self) -> int:
        return len(self.members)


@dataclass(frozen=True)
class BarrierPoint:
    """Where ``agent`` meets barrier ``obj``: ``ops`` (its member roles' calls that form one
    meeting, in program order) and ``at``, the one performed and rendered."""

    obj: str
    agent: str
    ops: tuple[ir.SyncOp, ...]
    roles: tuple[str, ...]            # the role of each op
    at: ir.SyncOp
    waits: bool                       # sync (True) or arrive-only (False) after merging

    @property
    def merged(self) -> bool:
        return len(self.ops) > 1


# ---------------------------------------------------------------- programs
@dataclass(frozen=True)
class Act:
    """One sync action. verb: acquire commit wait release (pipes), signal wait (events,
    ``event``), sync arrive (barriers: a meeting -- arrive, then wait when ``waits``)."""

    verb: Verb
    obj: str
    endpoint: Endpoint
    loc: SourceLoc
    waits: bool = False               # meeting: sync (True) or arrive-only after merging
    merged: tuple[int, ...] = ()      # meeting: source lines of the calls this meeting stands for
    source_waits: bool = False        # meeting: the source calls it (some sync), before the target
    event: bool = False               # an event's signal or wait (else a pipe's or barrier's)

    @property
    def meeting(self) -> bool:
        """A barrier meeting (sync or arrive)."""
        return self.verb in BARRIER_VERBS

    @property
    def event_wait(self) -> bool:
        """A wait on an event (a pipe's wait waits for a committed slot)."""
        return self.event and self.verb is Verb.WAIT


@dataclass(frozen=True)
class Let:
    """A scalar assignment that a loop bound or condition reads."""

    targets: tuple[str, ...]
    value: ir.Expr
    loc: SourceLoc


@dataclass(frozen=True)
class Loop:
    var: str
    start: ir.Expr
    stop: ir.Expr
    step: ir.Expr
    body: tuple
    loc: SourceLoc

    @property
    def key(self) -> str:
        return f"range({text(self.start)}, {text(self.stop)}, {text(self.step)})"


@dataclass(frozen=True)
class Branch:
    cond: ir.Expr
    body: tuple
    orelse: tuple
    loc: SourceLoc
    written: bool = False    # the kernel's own `if` (ir.If.written)


Node = Act | Let | Loop | Branch


@dataclass(frozen=True)
class Note:
    """How the placement changes the protocol, for messages (``objects``: what it is about)."""

    objects: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class Skeleton:
    kernel: str
    target: Target
    instances: tuple[Instance, ...]
    endpoints: tuple[Endpoint, ...]
    links: tuple[Link, ...]
    barriers: tuple[BarrierMembership, ...]
    points: tuple[BarrierPoint, ...]
    programs: tuple[tuple, ...]       # per instance
    notes: tuple[Note, ...]
    env: tuple[tuple[str, object], ...]   # compile-time values (constexprs)

    @property
    def backend(self) -> str:
        """The target's name, for messages ("on the nvidia placement")."""
        return self.target.name

    def link(self, name: str) -> Link:
        return next(x for x in self.links if x.obj == name)

    def barrier(self, name: str) -> BarrierMembership:
        return next(b for b in self.barriers if b.obj == name)

    def membership(self, obj: str, instance: int) -> BarrierMembership:
        """The members ``instance`` meets at barrier ``obj`` (a cluster: those of its program)."""
        return next(b for b in self.barriers if b.obj == obj and instance in b.members)

    def endpoints_of(self, role: str) -> tuple[Endpoint, ...]:
        return tuple(e for e in self.endpoints if e.role == role)

    def endpoint(self, role: str, replica: int) -> Endpoint:
        return next(e for e in self.endpoints if e.role == role and e.replica == replica)

    def instances_of(self, agent: str) -> tuple[Instance, ...]:
        return tuple(i for i in self.instances if i.agent == agent)

    def point(self, agent: str, op: ir.SyncOp) -> BarrierPoint:
        """The meeting a barrier call belongs to in ``agent``."""
        for p in self.points:
            if p.agent == agent and any(o is op or o == op for o in p.ops):
                return p
        raise KeyError((agent, op))

    def renders(self, agent: str, op: ir.SyncOp) -> BarrierPoint | None:
        """The meeting to emit at barrier call ``op`` of ``agent``, or None when the agent meets
        that barrier at another call of the same meeting (``point(...).at``)."""
        p = self.point(agent, op)
        return p if (p.at is op or p.at == op) else None

    def who(self, ep: Endpoint) -> str:
        """A role replica in messages: ``work``, ``softmax[1]``, with the instance that runs
        it when that has another name: ``work (consumer)``, ``mma[1] (cube)``."""
        inst = self.instances[ep.instance]
        reps = sum(1 for e in self.endpoints if e.role == ep.role)
        name = ep.role if reps == 1 else f"{ep.role}[{ep.replica}]"
        return name if name == inst.label else f"{name} ({inst.label})"

    def replica_name(self, ep: Endpoint) -> str:
        """``work`` or, for a replicated role, ``work[1]``."""
        reps = sum(1 for e in self.endpoints if e.role == ep.role)
        return ep.role if reps == 1 else f"{ep.role}[{ep.replica}]"

    def endpoint_label(self, ep: Endpoint) -> str:
        inst = self.instances[ep.instance]
        return f"{inst.label}:{ep.role}[{ep.replica}]" if ep.role in inst.serial else inst.label

    def notes_for(self, names) -> list[str]:
        names = set(names)
        return [n.text for n in self.notes if names & set(n.objects)]


# ---------------------------------------------------------------- derivation
def derive(kernel: ir.KernelIR, placement: Placement) -> Skeleton:
    """The skeleton of ``kernel`` under ``placement`` (see the module docstring)."""
    target = placement.target
    instances = []
    for a in placement.agents:
        for r in range(a.replicas):
            instances.append(Instance(len(instances), a.name, r, a.replicas, a.roles, a.serial,
                                      a.hardware, a.unit))
    endpoints = []
    for role in kernel.roles:
        agent = placement.agent_of(role.name)
        mine = [i for i in instances if i.agent == agent.name]
        for q in range(role.replicas):
            if role.name in agent.serial or len(mine) == 1:
                inst = mine[0]
            else:
                assert len(mine) == role.replicas, (role.name, agent)
                inst = mine[q]
            endpoints.append(Endpoint(role.name, q, inst.index))
    by_role = {r.name: [e for e in endpoints if e.role == r.name] for r in kernel.roles}
    links = tuple(_link(obj, "pipe" if isinstance(obj, ir.Pipe) else "event", by_role, placement)
                  for obj in kernel.pipes + kernel.events)
    points = _barrier_points(kernel, placement, target)
    barriers = []
    for b in kernel.barriers:
        members = tuple(i.index for i in instances if set(i.roles) & set(b.members))
        agents = tuple(dict.fromkeys(instances[m].agent for m in members))
        barriers.append(BarrierMembership(b.name, b.members, members, agents,
                                          target.barrier_arrive_waits, b.loc))
    skel = Skeleton(kernel.name, target, tuple(instances), tuple(endpoints),
                    links, tuple(barriers), points, (), (), tuple(kernel.constexprs))
    programs = tuple(_program(kernel, skel, inst) for inst in instances)
    notes = _notes(kernel, placement, skel)
    return Skeleton(kernel.name, target, tuple(instances), tuple(endpoints),
                    links, tuple(barriers), points, programs, notes, tuple(kernel.constexprs))


def _link(obj, kind, by_role, placement) -> Link:
    src, dst = by_role[obj.src], by_role[obj.dst]
    if len(src) == len(dst) and len(src) > 1:
        pairing = "N -> N paired"
        channels = tuple(Channel(obj.name, i, (src[i],), (dst[i],)) for i in range(len(src)))
    elif len(src) == 1:
        pairing = "1 -> 1" if len(dst) == 1 else "1 -> N broadcast"
        channels = (Channel(obj.name, 0, tuple(src), tuple(dst)),)
    else:
        assert len(dst) == 1, obj   # the frontend rejects the rest
        pairing = "N -> 1 gather"
        channels = (Channel(obj.name, 0, tuple(src), tuple(dst)),)
    stages = obj.stages if kind == "pipe" else 0
    crosses = placement.crosses(obj)
    in_memory = kind == "pipe" and not crosses and placement.agent_of(obj.src).memory_pipes
    return Link(obj.name, kind, obj.src, obj.dst, pairing, channels, crosses, stages, obj.loc,
                in_memory, obj.interleave if kind == "pipe" and len(channels) > 1 else 1)


# ---------------------------------------------------------------- barrier meetings
def _barrier_points(kernel, placement, target) -> tuple[BarrierPoint, ...]:
    """Group each agent's barrier calls into meetings (see BarrierPoint)."""
    out = []
    for agent in placement.agents:
        for bar in kernel.barriers:
            mine = [r for r in agent.roles if r in bar.members]
            if not mine:
                continue
            calls = []   # (scope path, role, op) in source order
            _collect_calls(_body(kernel, agent.name), bar.name, set(mine), (), None, calls, kernel)
            if len({role for _, role, _ in calls}) <= 1:
                for _, role, op in calls:
                    out.append(BarrierPoint(bar.name, agent.name, (op,), (role,), op,
                                            op.verb is Verb.SYNC or target.barrier_arrive_waits))
                continue
            out += _merged_points(kernel, placement, agent, bar, mine, calls, target)
    return tuple(out)


def _body(kernel, agent: str) -> tuple:
    """The statements ``agent`` runs: the program a schedule pass gave it, else the kernel
    body (of which it runs its role blocks and the replicated code)."""
    prog = kernel.program(agent)
    return prog.body if prog is not None else kernel.body


def acting_role(kernel: ir.KernelIR, op: ir.SyncOp, roles) -> str | None:
    """The role a sync operation acts for when it sits outside a role block (schedule passes
    emit such operations): a pipe's producer for acquire/commit and consumer for
    wait/release, an event's source for signal and destination for wait, a barrier's one
    member among ``roles`` (the agent's roles). None when that is ambiguous."""
    obj = kernel.sync_object(op.obj)
    if isinstance(obj, ir.Pipe):
        role = obj.src if op.verb.producer_side else obj.dst
    elif isinstance(obj, ir.Event):
        role = obj.src if op.verb is Verb.SIGNAL else obj.dst
    elif isinstance(obj, ir.Barrier):
        mine = [r for r in obj.members if r in roles]
        role = mine[0] if len(mine) == 1 else None
    else:
        role = None
    return role if role in roles else None


def _collect_calls(stmts, bar, roles, scope, role, out, kernel=None):
    for s in stmts:
        if isinstance(s, ir.RoleBlock):
            if s.role in roles:
                _collect_calls(s.body, bar, roles, scope, s.role, out, kernel)
        elif isinstance(s, ir.For):
            _collect_calls(s.body, bar, roles, scope + (id(s),), role, out, kernel)
        elif isinstance(s, ir.If):
            _collect_calls(s.body, bar, roles, scope + (id(s), "then"), role, out, kernel)
            _collect_calls(s.orelse, bar, roles, scope + (id(s), "else"), role, out, kernel)
        elif isinstance(s, ir.SyncOp) and s.obj == bar:
            acting = role if role is not None else acting_role(kernel, s, roles) if kernel else None
            if acting is not None:
                out.append((scope, acting, s))


def _merged_points(kernel, placement, agent, bar, mine, calls, target):
    """Member roles sharing one agent: the k-th call of each role in one loop/branch scope
    is one meeting, performed once, at the last of those calls."""
    out = []
    by_scope: dict[tuple, dict[str, list]] = {}
    for scope, role, op in calls:
        by_scope.setdefault(scope, {r: [] for r in mine})[role].append(op)
    for scope, per_role in by_scope.items():
        counts = {r: len(ops) for r, ops in per_role.items()}
        if len(set(counts.values())) != 1:
            have = [r for r, n in counts.items() if n]
            lacking = [r for r, n in counts.items() if n != max(counts.values())]
            first = next(ops[0] for ops in per_role.values() if ops)
            shown = ", ".join(f"'{r}' {n} time(s)" for r, n in counts.items())
            raise ProtocolError(
                f"barrier '{bar.name}': roles {_names(mine)} share agent '{agent.name}' on the "
                f"{placement.backend} placement, so that agent meets the barrier once for all of "
                f"them; their calls must pair up in the same loop and branch, but there "
                f"{shown} call {bar.name}.sync()/arrive()",
                loc=first.loc, objects=(bar.name, *mine),
                fix=(f"call {bar.name}.sync() in {_names(lacking)} at the same point of the same "
                     f"loop as in {_names(have)} (one shared loop over the role blocks), or make "
                     f"only one of them a member of '{bar.name}'"))
        for k in range(max(counts.values())):
            pairs = sorted(((per_role[r][k], r) for r in mine), key=lambda p: p[0].loc.line)
            ops, roles = tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
            waits = any(o.verb is Verb.SYNC for o in ops) or target.barrier_arrive_waits
            out.append(BarrierPoint(bar.name, agent.name, ops, roles, ops[-1], waits))
    return out


def _names(roles) -> str:
    roles = [f"'{r}'" for r in roles]
    return roles[0] if len(roles) == 1 else ", ".join(roles[:-1]) + " and " + roles[-1]


# ---------------------------------------------------------------- per-instance programs
def _program(kernel, skel: Skeleton, inst: Instance) -> tuple:
    """The sync skeleton of one instance: its roles' blocks plus replicated code, reduced to
    sync actions, the loops and branches around them and the scalar assignments their
    bounds and conditions read (found by a liveness fixpoint)."""
    needed: set[str] = set()
    while True:
        builder = _Builder(kernel, skel, inst, needed)
        tree = builder.block(_body(kernel, inst.agent), None)
        if builder.reads <= needed:
            return tree
        needed |= builder.reads


class _Builder:
    def __init__(self, kernel, skel, inst, needed):
        self.kernel, self.skel, self.inst, self.needed = kernel, skel, inst, needed
        self.reads: set[str] = set()

    def block(self, stmts, role) -> tuple:
        out = []
        for s in stmts:
            out.extend(self.stmt(s, role))
        return tuple(out)

    def stmt(self, s, role) -> list:
        inst = self.inst
        if isinstance(s, ir.RoleBlock):
            if s.role in inst.roles:
                return list(self.block(s.body, s.role))
            return []
        if isinstance(s, ir.Assign):
            if set(s.targets) & self.needed:
                self.reads |= ir.expr_names(s.value)
                return [Let(s.targets, s.value, s.loc)]
            return []
        if isinstance(s, ir.SyncOp):
            acts = self.action(s, role)
            if s.guard is not None and acts:
                # a guarded action (schedule passes): `if guard: action`
                self.control(role, s.loc, s.guard)
                return [Branch(s.guard, tuple(acts), (), s.loc)]
            return acts
        if isinstance(s, ir.For):
            body = self.block(s.body, role)
            if not body:
                return []
            self.control(role, s.loc, s.start, s.stop, s.step)
            return [Loop(s.var, s.start, s.stop, s.step, body, s.loc)]
        if isinstance(s, ir.If):
            body, orelse = self.block(s.body, role), self.block(s.orelse, role)
            if not body and not orelse:
                return []
            self.control(role, s.loc, s.cond)
            return [Branch(s.cond, body, orelse, s.loc, s.written)]
        return []

    def control(self, role, loc, *exprs):
        names = set().union(*(ir.expr_names(e) for e in exprs))
        self.reads |= names
        if role in self.inst.serial and (any(c.op is TileOp.REPLICA_ID for e in exprs for c in ir.expr_calls(e))):
            raise ProtocolError(
                f"a loop or branch around sync verbs of role '{role}' depends on xs.replica_id(), "
                f"but on the {self.skel.backend} placement agent '{self.inst.agent}' runs the "
                f"replicas of '{role}' one after another in lockstep, so every replica must "
                f"reach every sync point together",
                loc=loc, objects=(role,),
                fix="branch only the work on xs.replica_id(), not the sync verbs")

    def action(self, s: ir.SyncOp, role) -> list:
        if role is None:
            # outside any role block: only schedule passes put sync operations there
            role = acting_role(self.kernel, s, self.inst.roles)
            if role is None:
                raise ProtocolError(f"{s.obj}.{s.verb}() outside a role block of agent "
                                    f"'{self.inst.agent}' acts for no role it runs",
                                    loc=s.loc, objects=(s.obj,),
                                    fix="a schedule pass emitted it: report this as an xsync bug")
        kernel, skel, inst = self.kernel, self.skel, self.inst
        obj = kernel.sync_object(s.obj)
        if isinstance(obj, ir.Barrier):
            point = skel.renders(inst.agent, s)
            if point is None:
                return []
            ep = skel.endpoint(role, 0 if role in inst.serial else inst.replica)
            return [Act(Verb.SYNC if point.waits else Verb.ARRIVE, s.obj, ep, s.loc, point.waits,
                        tuple(o.loc.line for o in point.ops),
                        any(o.verb is Verb.SYNC for o in point.ops))]
        reps = range(kernel.role(role).replicas) if role in inst.serial else (inst.replica,)
        event = isinstance(obj, ir.Event)
        return [Act(s.verb, s.obj, skel.endpoint(role, r), s.loc, event=event) for r in reps]


# ---------------------------------------------------------------- placement notes
def _notes(kernel, placement, skel: Skeleton) -> tuple[Note, ...]:
    out = []
    backend = placement.backend
    for link in skel.links:
        if link.in_memory:
            agent = placement.agent_of(link.src).name
            out.append(Note((link.obj, link.src, link.dst),
                            f"on the {backend} placement '{link.src}' and '{link.dst}' share agent "
                            f"'{agent}', which runs them in source order: pipe '{link.obj}' is a "
                            f"ring of {link.stages} slot(s) in memory inside that agent"))
        elif not link.crosses and link.kind == "pipe":
            agent = placement.agent_of(link.src).name
            out.append(Note((link.obj, link.src, link.dst),
                            f"on the {backend} placement '{link.src}' and '{link.dst}' share agent "
                            f"'{agent}', which runs them in source order: pipe '{link.obj}' is a "
                            f"hand-off inside one agent that holds one value at a time, whatever "
                            f"its stages"))
        elif not link.crosses:
            agent = placement.agent_of(link.src).name
            out.append(Note((link.obj, link.src, link.dst),
                            f"on the {backend} placement '{link.src}' and '{link.dst}' share agent "
                            f"'{agent}': event '{link.obj}' is program order inside it"))
    for a in placement.agents:
        for role in a.serial:
            n = kernel.role(role).replicas
            out.append(Note((role,), f"on the {backend} placement agent '{a.name}' ({a.hardware}) "
                                     f"runs the {n} replicas of '{role}' one after another "
                                     f"(lockstep), as one agent"))
    for p in skel.points:
        if p.merged:
            out.append(Note((p.obj, *p.roles),
                            f"on the {backend} placement {_names(p.roles)} share agent '{p.agent}', "
                            f"which meets barrier '{p.obj}' once for them, at line {p.at.loc.line} "
                            f"(the calls at lines {', '.join(str(o.loc.line) for o in p.ops)} are "
                            f"one meeting)"))
    if skel.target.barrier_arrive_waits:
        for b in kernel.barriers:
            out.append(Note((b.name,), f"on the {backend} placement barrier '{b.name}' is "
                                       f"{skel.target.barrier}, which has no arrive-only form: "
                                       f"{b.name}.arrive() waits like {b.name}.sync()"))
    return tuple(dict.fromkeys(out))

