"""Unrolling: the compiled form of a skeleton's programs (``XLet``, ``XLoop``, ``XBranch``
around action indices) run under one scalar assignment to each instance's list of actions,
interpreted (``unroll_fast``, ``unroll_steps``) or as a generated function per program
(``compile_unroller``)."""
from __future__ import annotations

from dataclasses import dataclass

from xsync.lowering.protocol import Act
from xsync.lowering.verifier.codegen import CACHE_CAP
from xsync.lowering.verifier.forms import EVALUATION_FAILS, FAILS, trip

COMPILE_AFTER = 16    # unrolls interpreted before the programs are compiled (compiling costs ~1 ms)
UNROLLERS: dict = {}       # generated unroller source -> factory (process-wide cache)
_NESTING_CAP = 12          # deeper programs keep the interpreter (Python's block limit is 20)


@dataclass(frozen=True)
class Step:
    """One unrolled action with the loop iterations that led to it (for messages)."""

    action: Act
    iters: tuple[tuple[str, int], ...]


@dataclass
class XLet:
    targets: tuple
    fns: tuple           # one evaluator per target (tuple unpacking) or a single one
    line: int
    opaque: bool = False


@dataclass
class XLoop:
    var: str
    bounds: object       # evaluator -> (start, stop, step), or None when opaque
    opaque: str | None
    body: list
    line: int
    same: bool = False   # every iteration unrolls to the same actions (an episode loop)


@dataclass
class XBranch:
    cond: object
    opaque: str | None
    body: list
    orelse: list
    line: int


def unroll_fast(prog, env, steps, values, overrides):
    for n in prog:
        if n.__class__ is int:
            steps.append(n)
        elif isinstance(n, XLet):
            for t, f in zip(n.targets, n.fns):
                if (t, n.line) in overrides:
                    env[t] = overrides[(t, n.line)]
                elif f is not None:
                    try:
                        env[t] = f(env)
                    except EVALUATION_FAILS:
                        env.pop(t, None)
        elif isinstance(n, XLoop):
            if n.opaque:
                start, count, step = 0, values[n.opaque], 1
            else:
                start, stop, step = n.bounds(env)
                count = trip(start, stop, step)
            body, var = n.body, n.var
            if len(body) == 1 and body[0].__class__ is int:
                steps.extend(body * count)      # a loop of one action
                if count:
                    env[var] = start + (count - 1) * step
                continue
            for i in range(count):
                env[var] = start + i * step
                unroll_fast(body, env, steps, values, overrides)
        elif isinstance(n, XBranch):
            value = values[n.opaque] if n.opaque else n.cond(env)
            unroll_fast(n.body if value else n.orelse, env, steps, values, overrides)


def compile_unroller(prog, trace: bool = False, overridable=None):
    """``unroll_fast`` for one program as a generated function ``fn(env, steps, values,
    overrides)``: the same statements in the same order, without the interpretation -- a run
    of consecutive actions is one ``extend`` of a constant tuple, and a loop whose body holds
    only actions extends by the body times its trip count.

    With ``trace`` it appends, instead of the actions, the control decisions in the order they
    are taken: the trip count of each loop and the arm (1 / 0) of each branch that holds an
    action (the others add none, whatever they decide). The actions follow from those and the
    program (which arm, how many iterations of which block), so equal traces unroll to equal
    programs; the evaluations are the unroller's, in its order (the same
    values, the same exceptions). None where the program is too deep to generate.
    ``overridable``: the (name, line) an assignment can override (its cut names; None: any)."""
    consts: list = []           # the evaluators, passed to the factory as C0, C1, ...

    def const(x) -> str:
        consts.append(x)
        return f"C{len(consts) - 1}"

    lines: list[str] = []
    depth = [0]

    def block(nodes, pad, level):
        depth[0] = max(depth[0], level)
        start = len(lines)
        run: list[int] = []

        def flush():
            if run and not trace:
                lines.append(pad + f"ext({tuple(run)!r})")
            run.clear()
        for n in nodes:
            if n.__class__ is int:
                run.append(n)
                continue
            flush()
            u = len(lines)
            if isinstance(n, XLet):
                for t, f in zip(n.targets, n.fns):
                    key = repr((t, n.line))
                    if overridable is not None and (t, n.line) not in overridable:
                        if f is not None:
                            lines.append(pad + "try:")
                            lines.append(pad + f"    E[{t!r}] = {const(f)}(E)")
                            lines.append(pad + f"except {FAILS}:")
                            lines.append(pad + f"    E.pop({t!r}, None)")
                        continue
                    lines.append(pad + f"if {key} in OV:")
                    lines.append(pad + f"    E[{t!r}] = OV[{key}]")
                    if f is not None:
                        lines.append(pad + "else:")
                        lines.append(pad + "    try:")
                        lines.append(pad + f"        E[{t!r}] = {const(f)}(E)")
                        lines.append(pad + f"    except {FAILS}:")
                        lines.append(pad + f"        E.pop({t!r}, None)")
            elif isinstance(n, XLoop):
                if n.opaque:
                    lines.append(pad + f"s{u}, c{u}, d{u} = 0, V[{n.opaque!r}], 1")
                else:
                    lines.append(pad + f"s{u}, e{u}, d{u} = {const(n.bounds)}(E)")
                    lines.append(pad + f"c{u} = trip(s{u}, e{u}, d{u})")
                if trace and holds_actions(n.body):
                    lines.append(pad + f"ext(c{u})")
                if n.body and all(x.__class__ is int for x in n.body):
                    # the body only appends: as unroll_fast's loop of one action
                    if not trace:
                        lines.append(pad + f"ext({tuple(n.body)!r} * c{u})")
                    lines.append(pad + f"if c{u}:")
                    lines.append(pad + f"    E[{n.var!r}] = s{u} + (c{u} - 1) * d{u}")
                elif n.same:
                    # unroll one iteration, repeat its actions (XLoop.same)
                    lines.append(pad + f"if c{u}:")
                    lines.append(pad + f"    m{u} = len(S)")
                    lines.append(pad + f"    E[{n.var!r}] = s{u}")
                    block(n.body, pad + "    ", level + 1)
                    lines.append(pad + f"    if c{u} > 1:")
                    if not trace:
                        lines.append(pad + f"        ext(S[m{u}:] * (c{u} - 1))")
                    lines.append(pad + f"        E[{n.var!r}] = s{u} + (c{u} - 1) * d{u}")
                else:
                    lines.append(pad + f"for i{u} in range(c{u}):")
                    lines.append(pad + f"    E[{n.var!r}] = s{u} + i{u} * d{u}")
                    block(n.body, pad + "    ", level + 1)
            elif isinstance(n, XBranch):
                cond = f"V[{n.opaque!r}]" if n.opaque else f"{const(n.cond)}(E)"
                marks = trace and (holds_actions(n.body) or holds_actions(n.orelse))
                lines.append(pad + f"if {cond}:")
                if marks:
                    lines.append(pad + "    ext(1)")
                block(n.body, pad + "    ", level + 1)
                lines.append(pad + "else:")
                if marks:
                    lines.append(pad + "    ext(0)")
                block(n.orelse, pad + "    ", level + 1)
        flush()
        if len(lines) == start:
            lines.append(pad + "pass")

    block(prog, "        ", 1)
    if depth[0] > _NESTING_CAP:
        if trace:
            return None
        return lambda env, steps, values, overrides: unroll_fast(prog, env, steps, values, overrides)
    names = "".join(f"C{k}, " for k in range(len(consts)))
    source = (f"def _factory({names}):\n"
              f"    def _unroll(E, S, V, OV):\n"
              f"        ext = S.{'append' if trace else 'extend'}\n" + "\n".join(lines) + "\n"
              f"    return _unroll\n")
    factory = UNROLLERS.get(source)
    if factory is None:
        if len(UNROLLERS) >= CACHE_CAP:
            UNROLLERS.clear()       # a long run of many kernels (the differential test)
        ns = {"trip": trip}
        exec(compile(source, "<xsync unroll>", "exec"), ns)  # noqa: S102
        factory = UNROLLERS[source] = ns["_factory"]
    return factory(*consts)


def holds_actions(nodes) -> bool:
    """Whether a compiled block unrolls to any action (else its decisions add none)."""
    for n in nodes:
        if n.__class__ is int:
            return True
        if isinstance(n, XLoop) and holds_actions(n.body):
            return True
        if isinstance(n, XBranch) and (holds_actions(n.body) or holds_actions(n.orelse)):
            return True
    return False


def unroll_steps(prog, env, iters, steps, values, overrides, acts):
    for n in prog:
        if n.__class__ is int:
            steps.append(Step(acts[n], iters))
        elif isinstance(n, XLet):
            for t, f in zip(n.targets, n.fns):
                if (t, n.line) in overrides:
                    env[t] = overrides[(t, n.line)]
                elif f is not None:
                    try:
                        env[t] = f(env)
                    except EVALUATION_FAILS:
                        env.pop(t, None)
        elif isinstance(n, XLoop):
            if n.opaque:
                start, count, step = 0, values[n.opaque], 1
            else:
                start, stop, step = n.bounds(env)
                count = trip(start, stop, step)
            for i in range(count):
                v = start + i * step
                env[n.var] = v
                unroll_steps(n.body, env, iters + ((n.var, v),), steps, values, overrides, acts)
        elif isinstance(n, XBranch):
            value = values[n.opaque] if n.opaque else n.cond(env)
            unroll_steps(n.body if value else n.orelse, env, iters, steps, values, overrides, acts)
