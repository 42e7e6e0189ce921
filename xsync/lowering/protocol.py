"""The synchronization skeleton of a kernel under a placement.

For every agent the kernel body is sliced (its roles' blocks plus replicated code) and
reduced to the sync actions it performs, inside the loops and branches that repeat or
select them. Loop trip counts and branch conditions that depend on run-time values stay
symbolic, keyed by their source text: agents that replicate the same loop share the key,
so the verifier gives them the same trip count — and a loop whose bound differs between
agents gets a different key, which the verifier exposes as a counterexample.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

from xsync.errors import SourceLoc
from xsync.lowering import ir
from xsync.lowering.placement import Placement


@dataclass(frozen=True)
class Action:
    verb: str   # acquire commit wait release signal evwait bar_arrive bar_wait
    obj: str
    role: str
    loc: SourceLoc
    replica: int = 0  # which replica of `role` performs it


@dataclass(frozen=True)
class Loop:
    key: str             # source text of the range; same text -> same trip count
    var: str
    trip: int | None     # known at compile time, else None
    start: int | None
    step: int | None
    body: tuple
    loc: SourceLoc
    bounds: tuple = ()   # (start, stop, step) expressions, for evaluation at unroll time
    env: dict = None     # compile-time values they may use

    @property
    def binds(self) -> str | None:
        """`range(a, X, s)` with a, s known binds the run-time name X to a + trip * s."""
        if self.trip is None and self.start is not None and isinstance(self.bounds[1], ir.Name):
            return self.bounds[1].id
        return None


@dataclass(frozen=True)
class Branch:
    key: str
    cond: ir.Expr
    env: dict            # compile-time values (constexprs, replica id)
    loop_vars: frozenset  # enclosing loop counters whose values the unroller knows
    body: tuple
    orelse: tuple
    loc: SourceLoc


class NotConstant(Exception):
    pass


_BIN = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
        "%": operator.mod, "&": operator.and_, "|": operator.or_, "^": operator.xor,
        "<<": operator.lshift, ">>": operator.rshift, "/": operator.truediv}
_CMP = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
        "==": operator.eq, "!=": operator.ne}


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
        if e.op == "replica_id" and "__replica__" in env:
            return env["__replica__"]
        if e.op == "cdiv":
            a, b = (evaluate(x, env) for x in e.args)
            return -(-a // b)
        if e.op in ("minimum", "maximum"):
            a, b = (evaluate(x, env) for x in e.args)
            return min(a, b) if e.op == "minimum" else max(a, b)
    raise NotConstant(type(e).__name__)


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
        return f"{text(e.value)}.{e.attr}"
    if isinstance(e, ir.Cast):
        return f"{text(e.value)}.to(xs.{e.dtype.name})"
    if isinstance(e, ir.Subscript):
        return f"{text(e.value)}[{', '.join('None' if i is None else ':' for i in e.index)}]"
    if isinstance(e, ir.TupleExpr):
        return f"[{', '.join(text(i) for i in e.items)}]"
    return "?"


def agent_skeleton(kernel: ir.KernelIR, roles: tuple[str, ...], replica: int,
                   serial: tuple[str, ...] = ()) -> tuple:
    """The sync skeleton of one agent instance (roles merged in source order).

    Roles in ``serial`` have more replicas than the agent has instances: the agent runs
    all their replicas in lockstep, each sync verb once per replica in replica order (the
    Ascend cube core computing for both vector cores; conditions inside such blocks may
    not depend on the replica)."""
    env = dict(kernel.constexpr_values, __replica__=replica)
    current = [(replica,)]

    def visit(stmts, role, loop_vars=frozenset()):
        out = []
        for s in stmts:
            if isinstance(s, ir.RoleBlock):
                if s.role in serial:
                    current[0] = tuple(range(kernel.role(s.role).replicas))
                    out.extend(visit(s.body, s.role, loop_vars))
                    current[0] = (replica,)
                elif s.role in roles:
                    out.extend(visit(s.body, s.role, loop_vars))
            elif isinstance(s, ir.SyncOp) and role is not None:
                obj = kernel.sync_object(s.obj)
                for r in current[0]:
                    if isinstance(obj, ir.Barrier):
                        out.append(Action("bar_arrive", s.obj, role, s.loc, r))
                        if s.verb == "sync":
                            out.append(Action("bar_wait", s.obj, role, s.loc, r))
                    elif isinstance(obj, ir.Event):
                        verb = "signal" if s.verb == "signal" else "evwait"
                        out.append(Action(verb, s.obj, role, s.loc, r))
                    else:
                        out.append(Action(s.verb, s.obj, role, s.loc, r))
            elif isinstance(s, ir.For):
                try:
                    start, stop, step = (evaluate(x, env) for x in (s.start, s.stop, s.step))
                    trip = max(0, math.ceil((stop - start) / step))
                except (NotConstant, TypeError, ZeroDivisionError):
                    trip = None
                    try:
                        start, step = evaluate(s.start, env), evaluate(s.step, env)
                    except NotConstant:
                        start = step = None
                inner = loop_vars | {s.var} if start is not None else loop_vars
                body = tuple(visit(s.body, role, inner))
                if not body:
                    continue
                key = f"range({text(s.start)}, {text(s.stop)}, {text(s.step)})"
                out.append(Loop(key, s.var, trip, start, step, body, s.loc,
                                (s.start, s.stop, s.step), env))
            elif isinstance(s, ir.If):
                body = tuple(visit(s.body, role, loop_vars))
                orelse = tuple(visit(s.orelse, role, loop_vars))
                if not body and not orelse:
                    continue
                out.append(Branch(text(s.cond), s.cond, env, loop_vars, body, orelse, s.loc))
        return out

    return tuple(visit(kernel.body, None))


def symbolic_keys(tree, bound: frozenset = frozenset()) -> tuple[list[Loop], list[Branch]]:
    """Loops and branches whose trip count / condition is unknown at compile time and
    cannot be computed from the run-time names in ``bound`` (see :func:`binders`)."""
    loops, branches = [], []

    def visit(items):
        for it in items:
            if isinstance(it, Loop):
                if it.trip is None and (it.binds in bound or not _names_known(it.bounds, it.env, bound)):
                    loops.append(it)
                visit(it.body)
            elif isinstance(it, Branch):
                if not _known(it, bound):
                    branches.append(it)
                visit(it.body)
                visit(it.orelse)

    visit(tree)
    return loops, branches


def binders(trees) -> dict[str, Loop]:
    """Run-time names that a symbolic loop's trip count determines, e.g. `n_k` for
    `range(0, n_k, 1)`: other loops and branches that use the name are then evaluated
    with it instead of getting trip counts / truth values of their own (so a tail loop
    `range(n_k - 1, n_k)` or a guard `if n_k > 0` stays consistent with the main loop)."""
    out: dict[str, Loop] = {}

    def visit(items):
        for it in items:
            if isinstance(it, Loop):
                if it.binds and it.binds not in out:
                    out[it.binds] = it
                visit(it.body)
            elif isinstance(it, Branch):
                visit(it.body)
                visit(it.orelse)

    for t in trees:
        visit(t)
    return out


def _names_known(exprs, env, bound) -> bool:
    names = set().union(*(ir.expr_names(e) for e in exprs))
    calls = [c for e in exprs for c in ir.expr_calls(e)]
    return all(n in env or n in bound for n in names) and \
        all(c.op in ("cdiv", "minimum", "maximum") for c in calls)


def _known(branch: Branch, bound: frozenset = frozenset()) -> bool:
    """Whether a condition depends only on compile-time values, loop counters and bound names."""
    names = ir.expr_names(branch.cond)
    return all(n in branch.env or n in branch.loop_vars or n in bound for n in names) and \
        not any(c.op != "replica_id" and c.op not in ("cdiv", "minimum", "maximum")
                for c in ir.expr_calls(branch.cond))


@dataclass(frozen=True)
class Step:
    """One unrolled action with the loop iterations that led to it (for messages)."""

    action: Action
    iters: tuple[tuple[str, int], ...]


def unroll(tree, trips: dict[str, int], conds: dict[str, bool], atoms: dict | None = None) -> list[Step]:
    out: list[Step] = []
    atoms = atoms or {}

    def visit(items, iters, loop_env):
        for it in items:
            if isinstance(it, Action):
                out.append(Step(it, iters))
            elif isinstance(it, Loop):
                n = it.trip
                if n is None and it.key in trips:
                    n = trips[it.key]
                elif n is None:
                    start, stop, step = (evaluate(x, {**it.env, **loop_env, **atoms}) for x in it.bounds)
                    n = max(0, math.ceil((stop - start) / step))
                for i in range(n):
                    value = it.start + i * it.step if it.start is not None else i
                    visit(it.body, iters + ((it.var, value),), {**loop_env, it.var: value})
            elif isinstance(it, Branch):
                try:
                    value = bool(evaluate(it.cond, {**it.env, **loop_env, **atoms}))
                except NotConstant:
                    value = conds[it.key]
                visit(it.body if value else it.orelse, iters, loop_env)

    visit(tree, (), {})
    return out


@dataclass(frozen=True)
class Instance:
    """One running copy of an agent (agent x replica)."""

    agent: str
    replica: int | None
    roles: tuple[str, ...]
    serial: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.agent if self.replica is None else f"{self.agent}[{self.replica}]"


def instances(placement: Placement) -> list[Instance]:
    out = []
    for a in placement.agents:
        for r in range(a.replicas):
            out.append(Instance(a.name, r if a.replicas > 1 else None, a.roles, a.serial))
    return out
