"""Run-time scalars: which values of a kernel's free scalars the verifier tries, and the
programs it unrolls for each.

A kernel's trip counts and conditions are functions of its *free scalars*: scalar
parameters (``n``, ``K``), ``xs.load_scalar`` results (sequence offsets), and
``xs.program_id`` / ``xs.num_programs`` (0 <= id < programs). Every loop bound and branch
condition is evaluated from them, with the kernel's own assignments in program order, so
related loops stay consistent: ``range(0, n)`` and ``range(1, n)`` under ``if n > 0``,
``cdiv(K, BK)`` and ``K // BK``.

Which values (``Scalars.assignments``)
-------------------------------------
1. Symbolic pass: every bound and condition is written over the free scalars (assignments
   inlined; the loop counters stay symbols). Its *observations* are what the protocol can
   depend on: the trip count of every loop whose bounds do not involve a loop counter, the
   truth of every such condition, and, for bounds and conditions that involve a loop
   counter (``if i == n - 1``), the values of their counter-free parts (``n - 1``).
   Two scalar assignments with equal observations unroll to the same programs.
2. Candidate values per free scalar x: with u the least common multiple of the divisors,
   moduli and loop steps it meets, x = q * u + r for q = 0 .. Q and r in the residues
   where some floor division, modulus or comparison of x changes (0, 1, u - 1, and the
   residues of the constants it is compared with or offset by, +-1), plus -1 and every
   compared constant +-1. Q grows until every loop depending on x reaches its trip-count
   bound (``Scalars.loop_bounds``; see ``xsync.lowering.verify`` for why that bound
   suffices). A named scalar whose inputs appear nowhere else (``q_len = end - start``)
   is enumerated itself: over the integers when it adds or subtracts a free scalar, else
   over the values its definition takes.
3. Assignments = the product of the candidate sets (program ids: every id < programs for
   1..4 programs), deduplicated by observations.

The candidates are exact for bounds and conditions linear in the scalars with constant
divisors, moduli and steps; for a product of two run-time scalars, or a division by one,
they are a sample around the constants involved.

What is not covered: a bound or condition computed from tensor data other than
``xs.load_scalar`` (``xs.max(...)`` of a tile) is *opaque*: it gets its own free value
(a trip count, a truth value) per source expression, the same at every evaluation.
Scalars follow Python's integer semantics (floor division), as the CPU emulator does.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from xsync.lowering import ir
from xsync.lowering.protocol import Act, Branch, Let, Loop, Skeleton, text

TRIP_CAP = 512        # no loop bound beyond this many iterations is tried
EPISODE_TRIPS = 3     # iterations of an episode loop checked (see episode_loops)
EPISODE_EXTRA = 256   # counters of an episode loop added beyond the sweep's (_episode_dims)
Q_CAP = 64            # candidate multiples of a scalar's unit
PERIOD_CAP = 64
# what evaluating a value, bound or condition raises where it has no value at some scalars
EVALUATION_FAILS = (KeyError, TypeError, ZeroDivisionError, ValueError)
COMPILE_AFTER = 16    # unrolls interpreted before the programs are compiled (compiling costs ~1 ms)


# ---------------------------------------------------------------- symbolic forms
@dataclass(frozen=True)
class Atom:
    key: str        # "n", "xs.program_id(0)", "xs.load_scalar(cu_q, b)"
    kind: str       # "int" (free integer) | "pid" | "np" (program ids)


@dataclass(frozen=True)
class LoopVar:
    var: str
    line: int


@dataclass(frozen=True)
class Named:
    """The value of a kernel assignment (kept to find scalars to enumerate by name)."""

    name: str
    line: int
    value: object


@dataclass(frozen=True)
class CutVar:
    """A named scalar enumerated itself (its inputs appear nowhere else)."""

    name: str
    line: int


@dataclass(frozen=True)
class Select:
    cond: object
    a: object
    b: object


@dataclass(frozen=True)
class Opaque:
    key: str


DYN = "dyn"          # a value carried across loop iterations


def _children(x):
    if isinstance(x, (ir.BinOp, ir.Compare)):
        return (x.left, x.right)
    if isinstance(x, ir.UnaryOp):
        return (x.operand,)
    if isinstance(x, ir.BoolOp):
        return x.values
    if isinstance(x, ir.Call):
        return x.args
    if isinstance(x, Named):
        return (x.value,)
    if isinstance(x, Select):
        return (x.cond, x.a, x.b)
    if isinstance(x, tuple):
        return x
    return ()


# id(form) -> (form, its nodes) / (form, its free scalars): forms are immutable and the
# entry keeps its form alive, so an id found here is that form's (the walks are repeated
# for the same observations by every pass over them)
_NODES: dict[int, tuple] = {}
_FREE: dict[int, tuple] = {}
_WALK_CAP = 100_000


def _nodes(x) -> tuple:
    """Every node of ``x`` in pre-order (a tuple, computed once per form: nested generators
    pass each node up through every level, which made the walks quadratic in the depth)."""
    got = _NODES.get(id(x))
    if got is not None and got[0] is x:
        return got[1]
    out, stack = [], [x]
    while stack:
        n = stack.pop()
        out.append(n)
        kids = _children(n)
        if kids:
            stack.extend(reversed(kids))
    if len(_NODES) >= _WALK_CAP:
        _NODES.clear()
    out = _NODES[id(x)] = (x, tuple(out))
    return out[1]


def _has(x, pred) -> bool:
    for n in _nodes(x):
        if pred(n):
            return True
    return False


def _dynamic(x) -> bool:
    for n in _nodes(x):
        if n is DYN or isinstance(n, (LoopVar, Opaque)):
            return True
    return False


def _free(x) -> set:
    got = _FREE.get(id(x))
    if got is None or got[0] is not x:
        if len(_FREE) >= _WALK_CAP:
            _FREE.clear()
        got = _FREE[id(x)] = (x, frozenset(n for n in _nodes(x) if isinstance(n, (Atom, CutVar, Opaque))))
    return set(got[1])


def _subst(x, fn):
    """Rebuild ``x`` bottom-up with ``fn(node)`` (None: keep)."""
    r = fn(x)
    if r is not None:
        return r
    if isinstance(x, ir.BinOp):
        return ir.BinOp(x.op, _subst(x.left, fn), _subst(x.right, fn))
    if isinstance(x, ir.Compare):
        return ir.Compare(x.op, _subst(x.left, fn), _subst(x.right, fn))
    if isinstance(x, ir.UnaryOp):
        return ir.UnaryOp(x.op, _subst(x.operand, fn))
    if isinstance(x, ir.BoolOp):
        return ir.BoolOp(x.op, tuple(_subst(v, fn) for v in x.values))
    if isinstance(x, ir.Call):
        return ir.Call(x.op, tuple(_subst(a, fn) for a in x.args))
    if isinstance(x, Named):
        return Named(x.name, x.line, _subst(x.value, fn))
    if isinstance(x, Select):
        return Select(_subst(x.cond, fn), _subst(x.a, fn), _subst(x.b, fn))
    if isinstance(x, tuple):
        return tuple(_subst(v, fn) for v in x)
    return x


# ---------------------------------------------------------------- code generation
def _py(x, var) -> str:
    """Python source of a symbolic form; ``var(node)`` names atoms / cut vars / named values."""
    if isinstance(x, ir.Const):
        return repr(x.value)
    if isinstance(x, (Atom, CutVar, Opaque, Named)):
        return var(x)
    if isinstance(x, ir.BinOp):
        return f"({_py(x.left, var)} {x.op} {_py(x.right, var)})"
    if isinstance(x, ir.Compare):
        return f"({_py(x.left, var)} {x.op} {_py(x.right, var)})"
    if isinstance(x, ir.UnaryOp):
        return f"({x.op} {_py(x.operand, var)})" if x.op == "not" else f"({x.op}{_py(x.operand, var)})"
    if isinstance(x, ir.BoolOp):
        return "(" + f" {x.op} ".join(_py(v, var) for v in x.values) + ")"
    if isinstance(x, ir.Call):
        a = [_py(v, var) for v in x.args]
        if x.op == "cdiv":
            return f"(-((-{a[0]}) // {a[1]}))"
        if x.op in ("minimum", "maximum"):
            return f"{'min' if x.op == 'minimum' else 'max'}({a[0]}, {a[1]})"
        if x.op == "where":
            return f"({a[1]} if {a[0]} else {a[2]})"
    if isinstance(x, Select):
        return f"({_py(x.a, var)} if {_py(x.cond, var)} else {_py(x.b, var)})"
    raise TypeError(f"no scalar code for {x!r}")


_EVALUATORS: dict = {}      # generated code -> compiled evaluator (process-wide cache)


def _env_ref(key: str) -> str:
    return f"E[{key!r}]"


def _cdiv(a, b):
    return -(-a // b)


def trip(start, stop, step) -> int:
    """Iterations of range(start, stop, step)."""
    return max(0, -((start - stop) // step))


# ---------------------------------------------------------------- executable programs
@dataclass(frozen=True)
class Step:
    """One unrolled action with the loop iterations that led to it (for messages)."""

    action: Act
    iters: tuple[tuple[str, int], ...]


@dataclass
class _XLet:
    targets: tuple
    fns: tuple           # one evaluator per target (tuple unpacking) or a single one
    line: int
    opaque: bool = False


@dataclass
class _XLoop:
    var: str
    bounds: object       # evaluator -> (start, stop, step), or None when opaque
    opaque: str | None
    body: list
    line: int
    same: bool = False   # every iteration unrolls to the same actions (an episode loop)


@dataclass
class _XBranch:
    cond: object
    opaque: str | None
    body: list
    orelse: list
    line: int


@dataclass(frozen=True)
class Observation:
    kind: str            # "trip" | "cond" | "raw"
    form: object         # symbolic form (trip: (start, stop, step))
    guard: tuple         # ((cond form, polarity), ...) of enclosing counter-free branches
    loop_line: int = 0   # trip: the loop
    uses_var: bool = False


@dataclass
class LoopFacts:
    """What the body of one loop does with its counter (for the trip-count bound)."""

    line: int
    key: str
    period: int = 1
    threshold: int = 0
    periodic: bool = True      # False: a bound/condition grows with the counter
    why: str = ""              # why not periodic
    objects: set = field(default_factory=set)


@dataclass(frozen=True)
class Assignment:
    """Values of the free scalars for one verification run."""

    values: tuple[tuple[str, object], ...]      # atom key / cut name / opaque key -> value
    overrides: tuple[tuple[tuple[str, int], object], ...] = ()   # (name, line) -> value

    def get(self, key, default=None):
        return dict(self.values).get(key, default)


class Scalars:
    """The scalar side of one skeleton (see the module docstring)."""

    def __init__(self, kernel: ir.KernelIR, skel: Skeleton, episodes: bool = False):
        self.kernel, self.skel = kernel, skel
        self.consts = dict(kernel.constexpr_values)
        self.params = {p.name: p.kind for p in kernel.params}
        self.observations: dict[Observation, None] = {}
        # loops whose bounds read an outer loop's counter and a free scalar (no observation
        # of their own: their trip counts change from one iteration of the outer loop to the next)
        self._counter_trips: dict[Observation, None] = {}
        self.loops: dict[int, LoopFacts] = {}
        self.opaque: dict[str, str] = {}      # key -> "bool" | "trip"
        self.programs = []
        self._unrollers = None    # one generated function per program (see _unroller)
        self._unrolled = 0        # unrolls so far (the first few are interpreted)
        self._tracers = None      # the unrollers' control decisions only (see tracer)
        self.acts: list[Act] = []                 # action index -> action
        self.act_inst: list[int] = []             # action index -> instance
        self._carried = False      # some bound or condition reads a value carried across iterations
        self._atoms: set = set()   # every free scalar any assignment, bound or condition reads
        # episodes: check each episode loop iteration by iteration (see episode_loops)
        self.episodes = episode_loops(skel) if episodes else {}
        # episode loops: (name, line) of the counter and the values computed from it -> the
        # values they take (see episode_loops)
        self.episode_images: dict[tuple[str, int], list[int]] = {}
        self.episode_trip_lines = {episode_trips(line): line for line in self.episodes}
        self._episode_more: dict[int, _EpisodeSweep] = {}   # episode loop line -> (_episode_dims)
        programs = list(skel.programs)
        if self.episodes:
            self._inst = skel.instances[0]
            self._opaque_names = set()
            first = _acting(programs)[0]
            for line in self.episodes:
                self.params[episode_trips(line)] = "scalar"
                original = next(n for n in first if isinstance(n, Loop) and n.loc.line == line)
                self.loops[line] = LoopFacts(line, original.key)
            self.episode_images = self._episode_images(first)
            programs = [_as_episodes(p, self.episodes) for p in programs]
        for inst in skel.instances:
            self._inst = inst
            self._opaque_names: set[str] = set()
            self.programs.append(self._compile_block(programs[inst.index]))
            self._static_pass(programs[inst.index], {}, (), [])
        if self._carried:
            # a carried value can depend on any scalar: observe them all by value
            for a in sorted(self._atoms, key=lambda a: a.key):
                self.observations[Observation("raw", a, ())] = None
        self._cuts()
        self._unit_memo: dict = {}      # free scalar -> _unit_and_constants (observations final)

    # ------------------------------------------------------------ expressions
    def _sym(self, e, env):
        """Symbolic form of IR expression ``e`` (names through ``env``)."""
        out = self._sym1(e, env)
        if isinstance(out, Atom):
            self._atoms.add(out)
        return out

    def _sym1(self, e, env):
        if isinstance(e, ir.Const):
            return e
        if isinstance(e, ir.Name):
            n = e.id
            if n in env:
                return env[n]
            if n in self.consts:
                v = self.consts[n]
                return ir.Const(v)
            if self.params.get(n) == "scalar":
                return Atom(n, "int")
            return Opaque(f"value `{n}`")
        if isinstance(e, ir.BinOp):
            left, right = self._sym(e.left, env), self._sym(e.right, env)
            if isinstance(left, ir.Const) and isinstance(right, ir.Const):
                try:
                    return ir.Const(eval(f"a {e.op} b", {}, {"a": left.value, "b": right.value}))
                except Exception:  # noqa: BLE001 - division by zero etc.: leave symbolic
                    pass
            return ir.BinOp(e.op, left, right)
        if isinstance(e, ir.Compare):
            return ir.Compare(e.op, self._sym(e.left, env), self._sym(e.right, env))
        if isinstance(e, ir.UnaryOp):
            v = self._sym(e.operand, env)
            if isinstance(v, ir.Const) and e.op == "-":
                return ir.Const(-v.value)
            return ir.UnaryOp(e.op, v)
        if isinstance(e, ir.BoolOp):
            return ir.BoolOp(e.op, tuple(self._sym(v, env) for v in e.values))
        if isinstance(e, ir.Call):
            if e.op in ("cdiv", "minimum", "maximum", "where"):
                return ir.Call(e.op, tuple(self._sym(a, env) for a in e.args))
            if e.op in ("program_id", "num_programs") and isinstance(e.args[0], ir.Const):
                return Atom(f"xs.{e.op}({e.args[0].value})", "pid" if e.op == "program_id" else "np")
            if e.op == "load_scalar":
                return Atom(text(e), "int")
            if e.op == "replica_id":
                return ir.Const(self._inst.replica)
        return Opaque(f"`{text(e)}`")

    def _evaluator(self, e, env_names):
        """A compiled evaluator ``f(E) -> value`` of IR expression ``e``, or None if opaque
        (instances share the evaluators of the code they replicate)."""
        code = self._code(e)
        if code is None:
            return None
        fn = _EVALUATORS.get(code)
        if fn is None:
            fn = _EVALUATORS[code] = eval(f"lambda E: {code}", {"_cdiv": _cdiv})  # noqa: S307
        return fn

    def _code(self, e, ref=None):
        """Python source of IR expression ``e`` (None: opaque). ``ref(key)`` spells a read of
        the value named ``key`` (a name, ``xs.program_id(0)``, ``xs.load_scalar(cu, b)``);
        by default ``E[key]``, a lookup in the evaluator's environment."""
        if ref is None:
            ref = _env_ref
        if isinstance(e, ir.Const):
            return repr(e.value)
        if isinstance(e, ir.Name):
            if e.id in self.consts:
                return repr(self.consts[e.id])
            if self.params.get(e.id) == "tensor" or e.id in self._opaque_names:
                return None
            return ref(e.id)
        if isinstance(e, (ir.BinOp, ir.Compare)):
            a, b = self._code(e.left, ref), self._code(e.right, ref)
            return None if a is None or b is None else f"({a} {e.op} {b})"
        if isinstance(e, ir.UnaryOp):
            a = self._code(e.operand, ref)
            return None if a is None else (f"(not {a})" if e.op == "not" else f"({e.op}{a})")
        if isinstance(e, ir.BoolOp):
            parts = [self._code(v, ref) for v in e.values]
            return None if None in parts else "(" + f" {e.op} ".join(parts) + ")"
        if isinstance(e, ir.TupleExpr):
            parts = [self._code(v, ref) for v in e.items]
            return None if None in parts else "(" + "".join(p + ", " for p in parts) + ")"
        if isinstance(e, ir.Call):
            if e.op in ("program_id", "num_programs", "load_scalar"):
                return ref(text(e))
            if e.op == "replica_id":
                return repr(self._inst.replica)
            parts = [self._code(a, ref) for a in e.args]
            if None in parts:
                return None
            if e.op == "cdiv":
                return f"_cdiv({parts[0]}, {parts[1]})"
            if e.op in ("minimum", "maximum"):
                return f"{'min' if e.op == 'minimum' else 'max'}({parts[0]}, {parts[1]})"
            if e.op == "where":
                return f"({parts[1]} if {parts[0]} else {parts[2]})"
        return None

    def _reads(self, e) -> list[str]:
        """The environment keys the evaluator of ``e`` reads, in order of first use."""
        found: dict[str, None] = {}

        def ref(key):
            found[key] = None
            return _env_ref(key)
        self._code(e, ref)
        return list(found)

    # ------------------------------------------------------------ compile programs
    def _compile_block(self, nodes) -> list:
        out = []
        for n in nodes:
            if isinstance(n, Act):
                self.acts.append(n)
                self.act_inst.append(self._inst.index)
                out.append(len(self.acts) - 1)     # actions are unrolled as indices
            elif isinstance(n, Let):
                if len(n.targets) == 1:
                    fns = (self._evaluator(n.value, None),)
                else:
                    items = n.value.items if isinstance(n.value, ir.TupleExpr) else ()
                    fns = tuple(self._evaluator(v, None) for v in items) or (None,) * len(n.targets)
                for t, f in zip(n.targets, fns):
                    # a value computed from tile data: what reads it is opaque (its own free value)
                    if f is None:
                        self._opaque_names.add(t)
                    else:
                        self._opaque_names.discard(t)
                out.append(_XLet(n.targets, fns, n.loc.line, None in fns))
            elif isinstance(n, Loop):
                f = self._evaluator(ir.TupleExpr((n.start, n.stop, n.step)), None)
                key = None
                if f is None:
                    key = f"trip count of `{n.key}` (line {n.loc.line})"
                    self.opaque[key] = "trip"
                # an episode loop (_as_episodes): its body reads no value an iteration
                # carries to the next (episode_loops, 4) and the tile's values are set before
                # it, so each iteration computes the same values and unrolls the same actions
                same = n.loc.line in self.episodes and n.var == f"{self.episodes[n.loc.line]}@iteration"
                out.append(_XLoop(n.var, f, key, self._compile_block(n.body), n.loc.line, same))
            elif isinstance(n, Branch):
                f = self._evaluator(n.cond, None)
                key = None
                if f is None:
                    key = f"condition `{text(n.cond)}` (line {n.loc.line})"
                    self.opaque[key] = "bool"
                out.append(_XBranch(f, key, self._compile_block(n.body),
                                    self._compile_block(n.orelse), n.loc.line))
        return out

    # ------------------------------------------------------------ symbolic pass
    def _static_pass(self, nodes, env, guard, loops):
        """Observations and per-loop facts, walking the program in order.

        env: name -> symbolic value; loops: the enclosing loops (innermost last)."""
        for n in nodes:
            if isinstance(n, Act):
                for lp in loops:
                    self.loops[lp.loc.line].objects.add(n.obj)
            elif isinstance(n, Let):
                if len(n.targets) == 1:
                    values = [self._sym(n.value, env)]
                elif isinstance(n.value, ir.TupleExpr):
                    values = [self._sym(v, env) for v in n.value.items]
                else:
                    values = [Opaque(f"`{text(n.value)}`")] * len(n.targets)
                for t, v in zip(n.targets, values):
                    if loops:
                        if _dynamic(v):
                            # counter-free values are observed where a bound or condition
                            # reads them (inlined there)
                            self._dynamic_form(v, guard, loops)
                        env[t] = v if not _has(v, lambda x: x is DYN) else DYN
                    elif (t, n.loc.line) in self.episode_images:
                        env[t] = CutVar(t, n.loc.line)
                    else:
                        env[t] = v if isinstance(v, (ir.Const, Opaque)) else Named(t, n.loc.line, v)
            elif isinstance(n, Loop):
                forms = tuple(self._sym(x, env) for x in (n.start, n.stop, n.step))
                self.loops.setdefault(n.loc.line, LoopFacts(n.loc.line, n.key))
                for lp in loops:
                    self._counter_use(forms, lp, bound_of=n)
                if any(_has(f, lambda x: x is DYN) for f in forms):
                    facts = self.loops[n.loc.line]
                    facts.periodic = False
                    facts.why = "its trip count is a value carried across the iterations of a loop"
                if any(_has(f, lambda x: isinstance(x, Opaque)) for f in forms):
                    pass   # an opaque trip count: enumerated on its own
                elif not any(_dynamic(f) for f in forms):
                    uses = _reads_var(n.body, n.var)
                    self.observations[Observation("trip", forms, guard, n.loc.line, uses)] = None
                else:
                    self._dynamic_form(forms, guard, loops)
                    if _free(forms):
                        # bounded by an outer counter and a scalar (range(tile % 3 + n)): it
                        # must reach its bound through the scalar (_reach)
                        self._counter_trips[Observation("trip", forms, guard, n.loc.line)] = None
                # names assigned in the body are per-iteration values: unknown before their
                # assignment in an iteration, and after the loop
                assigned = _assigned(n.body)
                inner = dict(env)
                for t in assigned:
                    inner[t] = DYN
                inner[n.var] = LoopVar(n.var, n.loc.line)
                self._static_pass(n.body, inner, guard, loops + [n])
                for t in assigned:
                    env[t] = DYN
                env.pop(n.var, None)
            elif isinstance(n, Branch):
                form = self._sym(n.cond, env)
                for lp in loops:
                    self._counter_use((form,), lp)
                if _has(form, lambda x: isinstance(x, Opaque)):
                    self._static_pass(n.body, env, guard, loops)
                    self._static_pass(n.orelse, env, guard, loops)
                    continue
                if isinstance(form, ir.Const):       # a compile-time condition: one arm
                    self._static_pass(n.body if form.value else n.orelse, env, guard, loops)
                    continue
                if not _dynamic(form):
                    self.observations[Observation("cond", form, guard)] = None
                    then_env, else_env = dict(env), dict(env)
                    self._static_pass(n.body, then_env, guard + ((form, True),), loops)
                    self._static_pass(n.orelse, else_env, guard + ((form, False),), loops)
                    for t in set(then_env) | set(else_env):
                        a, b = then_env.get(t, DYN), else_env.get(t, DYN)
                        env[t] = a if a == b else (DYN if DYN in (a, b) else Select(form, a, b))
                else:
                    self._dynamic_form(form, guard, loops)
                    self._static_pass(n.body, env, guard, loops)
                    self._static_pass(n.orelse, env, guard, loops)

    def _dynamic_form(self, form, guard, loops):
        """Counter-dependent bounds/conditions: observe their counter-free parts."""
        if _has(form, lambda x: x is DYN):
            self._carried = True
        for part in _static_parts(form):
            self.observations[Observation("raw", part, guard)] = None

    def _counter_use(self, forms, loop: Loop, bound_of: Loop | None = None):
        """Record how the body of ``loop`` depends on its counter: the period (moduli of the
        counter) and the threshold (constants it is compared with) after which the body
        repeats; a nested bound that grows with the counter, or a value carried across
        iterations, makes the body not periodic."""
        facts = self.loops.setdefault(loop.loc.line, LoopFacts(loop.loc.line, loop.key))
        mine = lambda x: isinstance(x, LoopVar) and x.var == loop.var and x.line == loop.loc.line  # noqa: E731
        step = self._sym(loop.step, {})
        step = step.value if isinstance(step, ir.Const) and isinstance(step.value, int) and step.value else None
        start = self._sym(loop.start, {})
        start = abs(start.value) if isinstance(start, ir.Const) and isinstance(start.value, int) else 0
        for f in forms:
            if _has(f, lambda x: x is DYN):
                if facts.periodic:
                    facts.periodic = False
                    facts.why = "a bound or condition in its body reads a value carried across iterations"
                # a carried value compared with a constant c: a value that moves by one or more
                # per iteration meets it within c iterations, so the bounded check goes that far
                consts = _int_constants(_nodes(f))
                if consts:
                    facts.threshold = max(facts.threshold, min(PERIOD_CAP, max(consts) + 2))
            if not _has(f, mine):
                continue
            if bound_of is not None and _linear_in(f, mine):
                facts.periodic = False
                facts.why = (f"the bound of the loop at line {bound_of.loc.line} grows with its "
                             f"counter `{loop.var}`")
            for node in _nodes(f):
                m = None
                div = _division(node)
                if div is not None and _has(div[0], mine):
                    if isinstance(div[1], ir.Const) and isinstance(div[1].value, int):
                        m = div[1].value
                    elif not isinstance(div[1], ir.Const) and facts.periodic:
                        # the counter divided by a run-time value: the body's period is that value
                        facts.periodic = False
                        facts.why = f"its counter `{loop.var}` is divided by (or taken modulo) a run-time value"
                if m is not None and abs(m) > 1:
                    m = abs(m)
                    p = m // math.gcd(m, step) if step else m
                    facts.period = facts.period * p // math.gcd(facts.period, p)
                    if facts.period > PERIOD_CAP:
                        facts.period, facts.periodic = PERIOD_CAP, False
                        facts.why = f"the period of its conditions exceeds {PERIOD_CAP} iterations"
            for node in _nodes(f):
                linear = None
                if isinstance(node, ir.Compare):
                    linear = (node.left, node.right)
                elif isinstance(node, ir.Call) and node.op in ("minimum", "maximum"):
                    linear = tuple(node.args)
                if linear and any(_linear_in(x, mine) for x in linear):
                    consts = [abs(c.value) for x in linear for c in _nodes(x)
                              if isinstance(c, ir.Const) and isinstance(c.value, (int, float))
                              and not isinstance(c.value, bool)]
                    k = (max(consts, default=0) + start) / (abs(step) if step else 1)
                    facts.threshold = max(facts.threshold, min(TRIP_CAP, int(math.ceil(k)) + 1))

    def outside_actions(self, line: int, objects: set) -> int:
        """Actions on ``objects`` outside the loop at ``line``, over all instances (loops of
        known trip count counted that many times, run-time loops once)."""
        def count(nodes, inside, mult):
            total = 0
            for n in nodes:
                if isinstance(n, Act):
                    total += 0 if inside or n.obj not in objects else mult
                elif isinstance(n, Loop):
                    k = self._const_trip(n)
                    total += count(n.body, inside or n.loc.line == line,
                                   mult * (k if k is not None else 1))
                elif isinstance(n, Branch):
                    total += max(count(n.body, inside, mult), count(n.orelse, inside, mult))
            return total
        return sum(count(p, False, 1) for p in self.skel.programs)

    def _const_trip(self, n: Loop):
        forms = [self._sym(x, {}) for x in (n.start, n.stop, n.step)]
        if all(isinstance(f, ir.Const) and isinstance(f.value, int) for f in forms) and forms[2].value:
            return min(TRIP_CAP, trip(*(f.value for f in forms)))
        return None

    # ------------------------------------------------------------ episode loops
    def _episode_images(self, program) -> dict[tuple[str, int], list[int]]:
        """The values an episode loop's counter and the values computed from it take: the
        loop run concretely for small values of the scalars its bounds and those values read
        (every program id below 1 .. 4 programs; other scalars a few multiples of the
        divisors they meet)."""
        images: dict[tuple[str, int], set] = {}
        before = []
        for n in program:
            if isinstance(n, Let):
                before.append(n)
            if not (isinstance(n, Loop) and n.loc.line in self.episodes):
                continue
            hoisted, _ = _episode_split(n)
            # the tile's coordinates: values computed from the counter and from what the
            # loop's bounds read, nothing else (a value that also reads a loaded sequence
            # length stays an expression over the coordinates and that length)
            pure, known = {n.var}, {n.var} | {t for m in before for t in m.targets} | {
                name for name, kind in self.params.items() if kind == "scalar"} | set(self.consts)
            for m in hoisted:
                names = _value_names(m.value)
                loads = any(c.op == "load_scalar" for c in ir.expr_calls(m.value))
                if len(m.targets) == 1 and names & pure and names <= known | pure and not loads:
                    pure.add(m.targets[0])
            hoisted = [m for m in hoisted if m.targets[0] in pure]
            exprs = [m.value for m in before] + [n.start, n.stop, n.step] + [m.value for m in hoisted]
            keys = set()
            for e in exprs:
                for x in ir.subexprs(e):
                    if isinstance(x, ir.Call) and x.op in ("program_id", "num_programs", "load_scalar"):
                        keys.add(text(x))
                    elif isinstance(x, ir.Name) and self.params.get(x.id) == "scalar":
                        keys.add(x.id)
            unit = self._divisor_unit(exprs)
            small = sorted({k * unit + r for k in range(4) for r in (0, 1, unit - 1) if k * unit + r >= 0})
            axes = sorted({k[k.index("("):] for k in keys if k.startswith(("xs.program_id", "xs.num_programs"))})
            others = sorted(k for k in keys if not k.startswith(("xs.program_id", "xs.num_programs")))
            dims = [[(p, m) for m in range(1, 5) for p in range(m)] for _ in axes] + [small for _ in others]
            inner = [(m, [self._evaluator(m.value, None)]) for m in hoisted]
            targets = [(n.var, n.loc.line)] + [(m.targets[0], m.loc.line) for m, _ in inner]
            for key in targets:
                images.setdefault(key, set())
            size = math.prod(len(d) for d in dims)
            stride = max(1, size // 50_000)      # a spread sample when the product is large
            evaluate = self._episode_sweep(n, before, inner, axes, others, dims, stride, targets, images)
            step = self._sym(n.step, {})
            step = abs(step.value) if isinstance(step, ir.Const) and isinstance(step.value, int) else None

            def resweep(extra, loop=n, before=before, inner=inner, axes=axes, others=others,
                        small=small, targets=targets):
                """The sweep again, with ``extra`` among the values of the scalars the loop's
                bounds and coordinates read: their images there."""
                wider = sorted(set(small) | {x for x in extra if x >= 0})
                grid = [[(p, m) for m in range(1, 5) for p in range(m)] for _ in axes] + \
                    [wider for _ in others]
                into = {key: set() for key in targets}
                self._episode_sweep(loop, before, inner, axes, others, grid,
                                    max(1, math.prod(len(d) for d in grid) // 50_000), targets, into)
                return into
            self._episode_more[n.loc.line] = _EpisodeSweep(
                targets, evaluate, resweep, step,
                # a coordinate that divides the counter by a constant d needs d times the counters
                min(self._divisor_unit([m.value for m, _ in inner]), 64),
                not isinstance(self._sym(n.stop, {}), ir.Const), unit)
        # a value whose definition never evaluated stays symbolic (no image, no guess)
        return {k: sorted(v) for k, v in images.items() if v}

    def _divisor_unit(self, exprs) -> int:
        """The least common multiple of the constant divisors (> 1) in IR expressions ``exprs``."""
        unit = 1
        for e in exprs:
            for x in ir.subexprs(e):
                div = _division(x)
                d = self._sym(div[1], {}) if div is not None else None
                if isinstance(d, ir.Const) and isinstance(d.value, int) and d.value > 1:
                    unit = unit * d.value // math.gcd(unit, d.value)
        return unit

    def _episode_sweep(self, loop, before, inner, axes, others, dims, stride, targets, images):
        """Add to ``images`` the values of ``targets`` (the counter of episode loop ``loop`` and
        the tile coordinates computed from it by ``inner``) over the combinations of ``dims``
        whose index in their product is a multiple of ``stride``: for each, the assignments
        ``before`` the loop and its bounds are evaluated (a combination where one of them
        fails is skipped), then the loop's first 16 iterations run.

        One generated function does it (``_sweep_source``): nested loops over ``dims``, each
        assignment evaluated at the depth of the last dimension it reads, and the iterations
        run once per distinct (bounds, values the coordinates read) -- nothing else reaches
        them, so the images are those of running every combination."""
        where: dict[str, tuple[str, int]] = {}      # environment key -> (local name, depth)
        for j, axis in enumerate(axes):
            where[f"xs.program_id{axis}"] = (f"p{j}", j)
            where[f"xs.num_programs{axis}"] = (f"q{j}", j)
        for j, key in enumerate(others, len(axes)):
            where[key] = (f"v{j}", j)
        lets: list[tuple[int, str, str, frozenset]] = []   # (depth, local, code, locals read)

        def spelled(e):
            """(code over the locals, depth, the locals it reads), or None when every
            combination fails there."""
            reads = self._reads(e)
            if any(k not in where for k in reads):
                return None          # reads a value no combination defines: a KeyError
            code = self._code(e, lambda k: where[k][0])
            return (code, max((where[k][1] for k in reads), default=-1),
                    frozenset(where[k][0] for k in reads))

        for m in before:
            values = (m.value,) if len(m.targets) == 1 else getattr(m.value, "items", ())
            for t, v in zip(m.targets, values):
                if self._code(v) is None:
                    continue         # opaque: left unset, as the evaluator would
                got = spelled(v)
                if got is None:
                    return
                local = f"a{len(lets)}"
                lets.append((got[1], local, got[0], got[2]))
                where[t] = (local, got[1])
        bounds_expr = ir.TupleExpr((loop.start, loop.stop, loop.step))
        if self._code(bounds_expr) is None:
            return                   # opaque bounds: every combination fails to unpack them
        bounds = spelled(bounds_expr)
        if bounds is None:
            return
        # what the iterations read from the environment before the loop
        seen_keys: dict[str, None] = {}
        for m, (f,) in inner:
            if f is not None:
                seen_keys.update(dict.fromkeys(self._reads(m.value)))
        carried = [k for k in seen_keys if k in where]
        depth = max([bounds[1]] + [d for d, _, _, _ in lets] + [where[k][1] for k in carried])
        lens = [len(d) for d in dims]
        source = _sweep_source(lens, len(axes), stride, lets, bounds, [where[k][0] for k in carried], depth)
        fn = tile_fn = _generated(source, "_sweep", "episode sweep")
        # the persistent form (range(program_id, stop, num_programs), the program ids read by
        # nothing else): the same visits, the program ids innermost (_sweep_source ``tiles``)
        pid = {"p0", "q0"}
        stop = spelled(loop.stop)
        if (stride == 1 and len(axes) == 1 and stop is not None and not stop[2] & pid
                and text(loop.start) == f"xs.program_id{axes[0]}"
                and text(loop.step) == f"xs.num_programs{axes[0]}"
                and not any(r & pid for _, _, _, r in lets)
                and not {where[k][0] for k in carried} & pid):
            rest = max([stop[1]] + [d for d, _, _, _ in lets] + [where[k][1] for k in carried])
            tile_fn = _generated(_sweep_source(lens, 1, 1, lets, stop, [where[k][0] for k in carried],
                                               max(rest, 0), tiles=True), "_sweep", "episode sweep")
        fns = [f for _, (f,) in inner]
        names = [key[0] for key in targets[1:]]

        def iteration(env, counter, into=images):
            """One iteration: the counter's and the coordinates' images (``env`` updated)."""
            env[loop.var] = counter
            into[targets[0]].add(counter)
            for f, key in zip(fns, targets[1:]):
                try:
                    env[key[0]] = f(env)
                    into[key].add(env[key[0]])
                except EVALUATION_FAILS:
                    env.pop(key[0], None)

        def iterations(start, stop, step, values):
            """The original iteration loop (the values persist from one iteration to the next)."""
            env = dict(zip(carried, values))
            for counter in itertools.islice(range(start, stop, step), 16):
                iteration(env, counter)

        # An iteration that reads only the counter, the values before the loop and the
        # coordinates it computed itself is a function of (counter, those values): each such
        # pair is run once. Its images are then the same sets as running every iteration;
        # where a value is not a plain int the set's members could depend on the order they
        # were added in (1 == 1.0), so that case runs the iterations in their original order.
        def evaluate(more):
            """The counter and the coordinates computed from the counter alone (and constants)
            at counters ``more``; a coordinate that reads anything else has no value here."""
            into = {key: set() for key in targets}
            for counter in more:
                iteration({}, counter, into)
            return into

        reads = [set(self._reads(m.value)) if f is not None else set() for (m, (f,)) in inner]
        independent = len(set(names)) == len(names) and loop.var not in names and all(
            r <= (set(carried) - set(names)) | {loop.var} | set(names[:k]) for k, r in enumerate(reads))
        if independent:
            counters: dict[tuple, set] = {}

            def collect(start, stop, step, values):
                got = counters.get(values)
                if got is None:
                    got = counters[values] = set()
                got.update(itertools.islice(range(start, stop, step), 16))
            snapshot = {key: set(v) for key, v in images.items()}
            tile_fn(dims, collect)
            _generated(self._images_source(loop, inner, carried, names), "_images", "episode images")(
                counters, [images[key] for key in targets])
            if all(type(x) is int for key in targets for x in images[key]):
                return evaluate
            images.update(snapshot)      # run again in the original order
        fn(dims, iterations)
        return evaluate

    def _images_source(self, loop, inner, carried, names) -> str:
        """Source of ``_images(counters, outs)``: ``iteration`` over every (carried values,
        counter) of ``counters`` (values -> counters), in the same order, spelled over locals
        (``c<i>`` the carried values, ``t`` the counter, ``x<k>`` the k-th coordinate): each
        coordinate's value added to ``outs[k]``; one that fails, or reads one that failed or
        is opaque, adds nothing, as ``iteration`` pops it from its environment."""
        where = {key: f"c{i}" for i, key in enumerate(carried)}
        where[loop.var] = "t"
        coordinate: dict[str, int] = {}     # name -> k of the coordinates spelled so far
        out = ["def _images(counters, outs):",
               "    " + "".join(f"o{k}, " for k in range(len(names) + 1)) + "= outs",
               "    for values, seen in counters.items():"]
        if carried:
            out.append("        " + "".join(f"c{i}, " for i in range(len(carried))) + "= values")
        out += ["        for t in sorted(seen):", "            o0.add(t)"]
        for k, (m, _) in enumerate(inner, 1):
            code = self._code(m.value, lambda key: where[key])
            # the earlier coordinates it reads: each must have a value
            ok = " and ".join(f"k{coordinate[key]}" for key in self._reads(m.value) if key in coordinate)
            pad = "            "
            where[names[k - 1]], coordinate[names[k - 1]] = f"x{k}", k
            if code is None:
                out.append(pad + f"k{k} = False")
                continue
            if ok:
                out.append(pad + f"k{k} = False")
                out.append(pad + f"if {ok}:")
                pad += "    "
            out += [pad + "try:", pad + f"    x{k} = {code}", pad + f"    o{k}.add(x{k})",
                    pad + f"    k{k} = True", pad + f"except {_FAILS}:", pad + f"    k{k} = False"]
        return "\n".join(out) + "\n"

    def _episode_dims(self, free, trips, bounds) -> dict:
        """Candidate values of episode loops' counters and coordinates for ``enumerate``.

        The sweep (``_episode_images``) runs the loop for small values of what its bounds and
        coordinates read, so its counter stops after a few iterations and a coordinate such as
        ``tile % heads`` stays below a few; a condition such as ``i != 6`` or ``h != 12`` in the
        body, or a nested ``range(i)`` that must reach its bound, needs more.

        1. The counter and the coordinates computed from it alone (and constants): where the
           loop's bound reads a run-time value (every larger counter in its stride is
           reachable), counters are added up to what their observations tell apart (their
           constants + 1 and the trip counts their nested loops must reach, times the constant
           divisors of those coordinates' definitions, at most EPISODE_EXTRA strides), and
           those coordinates evaluated there.
        2. A coordinate that also reads other values (a scalar, a value set before the loop):
           where its observations compare it with a constant c beyond its values, the sweep
           runs again with c - 1 .. c + 1 (and those times the divisors' unit) among the values
           of every scalar it reads, and its values there are added; so where a nested loop's
           bound reads this coordinate and no other scalar, up to what that loop must reach.
           (A bound that reads other scalars too reaches its bound through them.)"""
        wanted = {(v.name, v.line) for v in free if isinstance(v, CutVar)}
        out = {}
        for sweep in self._episode_more.values():
            targets, evaluate = sweep.targets, sweep.evaluate
            if not wanted.intersection(targets):
                continue
            counters = self.episode_images.get(targets[0])
            if not counters:
                continue
            got: dict = {key: set(self.episode_images.get(key, ())) for key in targets}
            own = {key for key, seen in evaluate([min(counters)]).items() if seen}
            low, high = min(counters), max(counters)
            stride = sweep.step or math.gcd(*(x - low for x in counters))
            if sweep.open_ended and stride:
                top = high
                for key in targets:
                    if key in wanted and key in own:
                        var = CutVar(*key)
                        consts = self._unit_and_constants(var)[2]
                        top = max(top, self._reach(var, trips, bounds),
                                  max((abs(c) for c in consts), default=0) + 1)
                top = low + min((top + 1) * sweep.coord_unit, EPISODE_EXTRA * stride)
                if top > high:
                    for key, seen in evaluate(range(low, top + 1, stride)).items():
                        if key in own:
                            got[key] |= seen
            need = 0
            for key in targets:
                if key in wanted and key not in own and got[key]:
                    var = CutVar(*key)
                    consts = self._unit_and_constants(var)[2]
                    c = max((abs(c) for c in consts), default=0) + 1
                    # a nested loop whose bound reads no other scalar reaches its bound only
                    # through this value (one that reads others reaches it through them)
                    alone = [o for o in trips if set().union(*(_free(x) for x in o.form[:2])) == {var}]
                    if alone:
                        c = max(c, self._reach(var, alone, bounds))
                    if c > max(got[key]):
                        need = max(need, c)
            if need:
                unit = sweep.unit
                for key, seen in sweep.resweep({need - 1, need, need + 1, need * unit - 1,
                                                need * unit, need * unit + 1}).items():
                    got[key] |= seen
            for key in targets:
                if got[key] != set(self.episode_images.get(key, ())):
                    out[key] = sorted(got[key])
        return out

    # ------------------------------------------------------------ cut variables
    def _cuts(self):
        """Named scalars whose inputs appear nowhere else are enumerated by name."""
        self.cut: dict[tuple[str, int], object] = {}   # (name, line) -> definition
        for key in self.episode_images:
            self.cut[key] = Opaque(f"episode value {key[0]}")
        forms = self._all_forms()
        while True:
            named = sorted({n for f in forms for n in _nodes(f) if isinstance(n, Named)},
                           key=lambda n: -_size(n))
            chosen = None
            for nm in named:
                inside = _free(nm.value)
                if not inside or not all(isinstance(a, (Atom, CutVar)) for a in inside):
                    continue
                if not all(_private(f, nm, inside) for f in forms):
                    continue
                kinds = {a.kind for a in inside if isinstance(a, Atom)}
                if _surjective(nm.value) or (kinds <= {"pid", "np"} and not any(isinstance(a, CutVar) for a in inside)):
                    chosen = nm
                    break
            if chosen is None:
                break
            self.cut[(chosen.name, chosen.line)] = chosen.value
            repl = CutVar(chosen.name, chosen.line)
            sub = lambda x, c=chosen, r=repl: r if x == c else None  # noqa: E731
            self.observations = {Observation(o.kind, _subst(o.form, sub), _subst(o.guard, sub),
                                             o.loop_line, o.uses_var): None
                                 for o in self.observations}
            forms = self._all_forms()

    def _all_forms(self):
        out = []
        for o in self.observations:
            out.append(o.form)
            out.extend(g for g, _ in o.guard)
        return out

    # ------------------------------------------------------------ enumeration
    def free(self) -> list:
        """Free scalars the observations read (atoms and cut names), in a stable order."""
        found = {}
        for f in self._all_forms():
            for n in _nodes(f):
                if isinstance(n, (Atom, CutVar)):
                    found[n] = None
        return sorted(found, key=lambda a: (isinstance(a, CutVar), getattr(a, "key", getattr(a, "name", ""))))

    def _unit_and_constants(self, var):
        # the observations are final once the cuts are made (__init__): one walk per scalar
        got = self._unit_memo.get(var)
        if got is None:
            got = self._unit_memo[var] = self._unit_and_constants_of(var)
        return got

    def _unit_and_constants_of(self, var):
        divisors, consts = set(), set()
        quotient = 0      # the largest small constant an observation where var divides meets
        for o in self.observations:
            parts = [o.form] + [g for g, _ in o.guard]
            for f in parts:
                if var not in _free(f):
                    continue
                nodes = _nodes(f)
                if any(div is not None and var in _free(div[1]) for div in map(_division, nodes)):
                    quotient = max([quotient] + [c for c in _int_constants(nodes) if c <= Q_CAP])
                for node in nodes:
                    if isinstance(node, ir.BinOp) and node.op in ("//", "%") and \
                            isinstance(node.right, ir.Const) and isinstance(node.right.value, int) \
                            and node.right.value > 1 and var in _free(node.left):
                        divisors.add(node.right.value)
                    if isinstance(node, ir.Call) and node.op == "cdiv" and \
                            isinstance(node.args[1], ir.Const) and isinstance(node.args[1].value, int) \
                            and var in _free(node.args[0]):
                        divisors.add(abs(node.args[1].value))
                    if isinstance(node, ir.Const) and isinstance(node.value, int) and \
                            not isinstance(node.value, bool) and abs(node.value) <= 1 << 20:
                        consts.add(node.value)
            if o.kind == "trip" and any(var in _free(x) for x in o.form[:2]) and \
                    isinstance(o.form[2], ir.Const) and isinstance(o.form[2].value, int) \
                    and abs(o.form[2].value) > 1:
                divisors.add(abs(o.form[2].value))
        unit = 1
        for d in divisors:
            unit = unit * d // math.gcd(unit, d)
        if unit > 4096:
            unit = max(divisors)
        return unit, divisors, consts, quotient

    def candidates(self, var, reach: int) -> list[int]:
        """Candidate values of a free integer scalar (see the module docstring)."""
        unit, divisors, consts, quotient = self._unit_and_constants(var)
        # residue 0 and 1 tell a multiple of the unit from a non-multiple (x // u against
        # cdiv(x, u)); a constant c offsets those breakpoints to -c and c (and +-1 around them);
        # a smaller divisor m adds its own multiples
        residues = {0, 1 % unit}
        for c in consts:
            if c % unit:
                for d in (-1, 0, 1):
                    residues.add((c + d) % unit)
                    residues.add((-c + d) % unit)
        for m in divisors:
            if m < unit and unit // m <= 16:
                for k in range(1, unit // m):
                    for d in (-1, 0, 1):
                        residues.add((k * m + d) % unit)
        if len(residues) > 48:
            residues = set(sorted(residues)[:: max(1, len(residues) // 48)]) | {0, 1 % unit, unit - 1}
        # where var divides (x // d, x % d, with d reading var), d must pass the constants that
        # quotient or remainder is compared with: var reaches quotient + 1 units
        q_max = min(Q_CAP, max(-(-reach // max(1, unit)), quotient + 1)) if unit > 1 else 0
        values = {-1} | {q * unit + r for q in range(q_max + 1) for r in residues}
        if unit == 1:
            values |= set(range(0, min(max(reach, quotient + 1), TRIP_CAP) + 2))
        for c in consts:
            values |= {c - 1, c, c + 1}
        # non-negative values first: the first value giving an observation represents it
        return sorted(values, key=lambda v: (v < 0, v))

    def unit(self, var) -> int:
        return self._unit_and_constants(var)[0]

    def enumerate(self, bounds: dict[int, int], limit: int = 400_000, fixed=None):
        """Distinct observations -> (Assignment, observation values), smallest first; None
        when the product of the candidate sets exceeds ``limit``.

        ``bounds``: loop line -> the trip count every loop must reach (when it can).
        ``fixed``: free scalar key -> the values it takes (instead of its candidates).
        The limit fits the flagship attention after the Hopper passes (its rotated loop has
        a prologue and epilogue, so its bound is 44 trips: 96 x 96 x 4 x 7 candidates, ~1 s)."""
        free = self.free()
        # scalars that branch conditions read go first: the loops over the others are then
        # skipped wherever those conditions rule the rest out
        in_guards = {v for o in self.observations for g, _ in o.guard for v in _free(g)}
        free.sort(key=lambda v: v not in in_guards)
        trips = [o for o in self.observations if o.kind == "trip" and _free(o.form)]
        reaching = trips + list(self._counter_trips)
        episode_dims = self._episode_dims(free, trips, bounds) if self._episode_more else {}
        scale = 1
        while True:
            dims, names = [], []
            pid_axes = sorted({a.key[a.key.index("("):] for a in free
                               if isinstance(a, Atom) and a.kind in ("pid", "np")})
            for axis in pid_axes:
                names.append(("pid", axis))
                dims.append([(p, n) for n in range(1, 5) for p in range(n)])
            for v in free:
                if isinstance(v, Atom) and v.kind in ("pid", "np"):
                    continue
                names.append(v)
                if fixed and isinstance(v, Atom) and v.key in fixed:
                    dims.append(list(fixed[v.key]))
                elif isinstance(v, CutVar) and (v.name, v.line) in self.episode_images:
                    dims.append(episode_dims.get((v.name, v.line)) or
                                self.episode_images[(v.name, v.line)])
                elif isinstance(v, CutVar) and not _surjective(self.cut[(v.name, v.line)]):
                    dims.append(self._image(v))
                else:
                    dims.append(self.candidates(v, self._reach(v, reaching, bounds) * scale))
            for key, kind in sorted(self.opaque.items()):
                names.append(Opaque(key))
                dims.append([False, True] if kind == "bool" else
                            list(range(0, max(bounds.values(), default=8) + 2)))
            found = self._enumerate(names, dims, limit)
            if found is None:
                return None, names
            # every loop reaches its bound, where the scalars allow it
            short = [o for o in trips if o.loop_line in bounds and
                     max((_trip_of(v) for v in self._column(found, o)), default=-1) < bounds[o.loop_line]]
            if not short or scale >= 8:
                return found, names
            scale *= 2

    def _column(self, found, o) -> list:
        """The value of observation ``o`` in every assignment of ``found``."""
        k = self.obs_index.get(o)
        return [None] * len(found) if k is None else [values.values[k] for _, values in found]

    def _reach(self, var, trips, bounds) -> int:
        """A value of ``var`` by which every loop it bounds has run its bound."""
        unit = self.unit(var)
        out = 4
        for o in trips:
            if not any(var in _free(x) for x in o.form[:2]):
                continue
            step = o.form[2].value if isinstance(o.form[2], ir.Const) and isinstance(o.form[2].value, int) else 1
            consts = [c for x in o.form[:2] for c in _int_constants(_nodes(x))]
            n = bounds.get(o.loop_line, 8)
            out = max(out, n * max(abs(step) or 1, unit) + max(consts, default=0))
        return out

    def _image(self, cv: CutVar) -> list:
        definition = self.cut[(cv.name, cv.line)]
        atoms = sorted(_free(definition), key=lambda a: a.key)
        axes = sorted({a.key[a.key.index("("):] for a in atoms})
        out = set()
        for combo in itertools.product(*[[(p, n) for n in range(1, 5) for p in range(n)] for _ in axes]):
            env = {}
            for axis, (p, n) in zip(axes, combo):
                env[f"xs.program_id{axis}"] = p
                env[f"xs.num_programs{axis}"] = n
            try:
                out.add(eval(_py(definition, lambda x: repr(env.get(x.key, 0))), {}))  # noqa: S307
            except Exception:  # noqa: BLE001
                pass
        return sorted(out)

    def _enumerate(self, names, dims, limit):
        """Run the observation function over the product of ``dims``: nested loops, each
        observation computed at the depth of the last scalar it reads, and the deeper loops
        skipped when every deeper observation sits under a branch not taken.

        Scalars that share no observation are enumerated apart (``_independent``): the
        distinct observation tuples of the product are the combinations of each group's, and
        the first assignment of each (in the product's loop order) combines each group's first."""
        obs = self.obs_list = list(self.observations)
        self.obs_index = {o: k for k, o in enumerate(obs)}
        size = 1
        for d in dims:
            size *= max(1, len(d))
        if size > limit:
            return None
        found = self._independent(names, dims, obs)
        if found is None:
            found = self._product(names, dims, obs)
        result = [(self._assignment(names, combo), ObsValues(self, key)) for key, combo in found.items()]
        result.sort(key=lambda item: _magnitude(obs, item[1].values))
        return result

    @staticmethod
    def _slots(names) -> dict:
        """Environment key -> (dimension, local name) in the generated enumeration."""
        index = {}
        for i, n in enumerate(names):
            if isinstance(n, tuple):
                index[f"xs.program_id{n[1]}"] = (i, f"v{i}[0]")
                index[f"xs.num_programs{n[1]}"] = (i, f"v{i}[1]")
            elif isinstance(n, Atom):
                index[n.key] = (i, f"v{i}")
            elif isinstance(n, CutVar):
                index[("cut", n.name, n.line)] = (i, f"v{i}")
            else:
                index[("opaque", n.key)] = (i, f"v{i}")
        return index

    def _independent(self, names, dims, obs):
        """``_product``'s dict for the whole product, built from groups of dimensions that no
        observation links, or None where that does not apply (one group; a dimension with
        repeated values; an observation that divides or steps by a scalar, whose
        failures skip the rest of the product in loop order)."""
        n = len(dims)
        if n < 2:
            return None
        index = self._slots(names)

        def dim_of(x):
            if isinstance(x, Atom):
                return index[x.key][0]
            if isinstance(x, CutVar):
                return index[("cut", x.name, x.line)][0]
            return index.get(("opaque", x.key), (-1,))[0]

        reads = []
        for o in obs:
            forms = (list(o.form) if o.kind == "trip" else [o.form]) + [g for g, _ in o.guard]
            if (o.kind == "trip" and not isinstance(o.form[2], ir.Const)) or any(
                    _divides_by_scalar(f) for f in forms):
                return None
            reads.append({dim_of(v) for f in forms for v in _free(f)} - {-1})
        if any(len(set(d)) != len(d) for d in dims):
            return None
        parent = list(range(n))

        def root(i):
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i
        for r in reads:
            r = sorted(r)
            for j in r[1:]:
                parent[root(j)] = root(r[0])
        groups: dict[int, list[int]] = {}
        for j in range(n):
            groups.setdefault(root(j), []).append(j)
        if len(groups) < 2:
            return None
        if any(not d for d in dims):
            return {}                    # an empty dimension: the product is empty
        parts = []       # per group: (dimensions, observations, [(key, combo, indices)])
        for g, (first, members) in enumerate(sorted(groups.items())):
            mine = [k for k, r in enumerate(reads) if (r and root(min(r)) == first) or (not r and g == 0)]
            sub = self._product([names[j] for j in members], [dims[j] for j in members],
                                [obs[k] for k in mine])
            where = [{v: i for i, v in enumerate(dims[j])} for j in members]
            rows = [(key, combo, tuple(w[v] for w, v in zip(where, combo))) for key, combo in sub.items()]
            parts.append((members, mine, rows))
        out = []
        for pick in itertools.product(*(rows for _, _, rows in parts)):
            key, combo, order = [None] * len(obs), [None] * n, [0] * n
            for (members, mine, _), (k, c, idx) in zip(parts, pick):
                for at, v in zip(mine, k):
                    key[at] = v
                for j, v, i in zip(members, c, idx):
                    combo[j], order[j] = v, i
            out.append((tuple(order), tuple(key), tuple(combo)))
        # the product's loops meet each key first at its first combination: in index order
        out.sort(key=lambda item: item[0])
        return {key: combo for _, key, combo in out}

    def _product(self, names, dims, obs) -> dict:
        """Observation tuple -> the first combination of ``dims`` (in loop order) giving it."""
        index = self._slots(names)

        def slot(x):
            if isinstance(x, Atom):
                return index[x.key]
            if isinstance(x, CutVar):
                return index[("cut", x.name, x.line)]
            return index.get(("opaque", x.key), (-1, "None"))

        def depth(forms) -> int:
            return max((slot(v)[0] for f in forms for v in _free(f)), default=-1)

        # A named value is computed once, at the depth of the last scalar it reads, into a
        # local (``n0 = ...``) that every observation reading it shares -- where no
        # observation can fail (nothing divides by a scalar or by zero): evaluated ahead of
        # the guards it sits under, it then gives the same values and raises nothing.
        shared = not any(
            (o.kind == "trip" and not isinstance(o.form[2], ir.Const))
            or any(_divides_by_scalar(f) or _divides_by_zero(f)
                   for f in (list(o.form) if o.kind == "trip" else [o.form]) + [g for g, _ in o.guard])
            for o in obs)
        # Where every scalar value is a plain int, a sum in an observation of the innermost
        # scalar is regrouped: its terms that do not read that scalar become one named value
        # (``v2 + n3`` for ``((v0 + 128) + v2) - v1``, n3 = (v0 + 128) - v1), computed outside
        # the innermost loop. Integer sums do not depend on the order of their terms, and
        # nothing here fails (``shared``), so the values are the same; the innermost loop is
        # then built once per value of n3 rather than per (v0, v1) (``last``).
        n = len(dims)
        int_dims = {i for i, d in enumerate(dims) if d and all(
            type(x) is int or (type(x) is tuple and all(type(y) is int for y in x)) for x in d)}
        exact = shared and n >= 2 and n - 1 in int_dims
        if exact:
            inner_dim = n - 1

            def reads_inner(x) -> bool:
                return any(slot(v)[0] == inner_dim for v in _free(x))

            def int_safe(x) -> bool:
                """Whether ``x`` is an exact int whatever the (int) scalars are."""
                if isinstance(x, ir.Const):
                    return type(x.value) is int
                if isinstance(x, (Atom, CutVar)):
                    return slot(x)[0] in int_dims
                if isinstance(x, Named):
                    return int_safe(x.value)
                if isinstance(x, ir.BinOp):
                    return x.op in ("+", "-", "*", "//", "%") and int_safe(x.left) and int_safe(x.right)
                if isinstance(x, ir.UnaryOp):
                    return x.op == "-" and int_safe(x.operand)
                if isinstance(x, ir.Call):
                    if x.op in ("cdiv", "minimum", "maximum"):
                        return all(int_safe(a) for a in x.args)
                    return x.op == "where" and int_safe(x.args[1]) and int_safe(x.args[2])
                if isinstance(x, Select):
                    return int_safe(x.a) and int_safe(x.b)
                return False

            def chain(terms):
                sign, acc = terms[0]
                acc = acc if sign > 0 else ir.UnaryOp("-", acc)
                for sign, t in terms[1:]:
                    acc = ir.BinOp("+" if sign > 0 else "-", acc, t)
                return acc

            def top(x):
                """The regrouped sum ``x`` (None: not one; its parts are looked at)."""
                if not (isinstance(x, ir.BinOp) and x.op in ("+", "-") and reads_inner(x)):
                    return None
                terms: list = []

                def flat(y, sign):
                    if isinstance(y, ir.BinOp) and y.op in ("+", "-"):
                        flat(y.left, sign)
                        flat(y.right, sign if y.op == "+" else -sign)
                    else:
                        terms.append((sign, y))
                flat(x, 1)
                rest = [(sg, t) for sg, t in terms if not reads_inner(t)]
                if len(rest) < 2 or not all(int_safe(t) for _, t in terms):
                    return None
                mine = [(sg, _subst(t, top)) for sg, t in terms if reads_inner(t)]
                return ir.BinOp("+", chain(mine), Named("_outer", 0, chain(rest)))

            obs = [Observation(o.kind, _subst(o.form, top), tuple((_subst(g, top), pol) for g, pol in o.guard),
                               o.loop_line, o.uses_var) for o in obs]
        locals_of: dict = {}            # Named -> local name
        defs: dict[int, list[tuple[str, str]]] = {}   # depth -> (local, code) of the named values there
        # the locals the line being spelled reads (a stack: a named value's definition is
        # spelled inside the line that first reads it), and per generated local (n<i>, o<k>)
        # the locals its line reads
        reading: list[set] = [set()]
        line_reads: dict[str, set] = {}

        def var(x):
            if isinstance(x, Named):
                if not shared:
                    return _py(x.value, var)
                got = locals_of.get(x)
                if got is None:
                    reading.append(set())
                    code = _py(x.value, var)      # the named values it reads come first
                    got = locals_of[x] = f"n{len(locals_of)}"
                    line_reads[got] = reading.pop()
                    defs.setdefault(depth([x.value]), []).append((got, code))
                reading[-1].add(got)
                return got
            name = slot(x)[1]
            reading[-1].add(name.split("[")[0])     # v0[0]: the program-id pair v0
            return name

        # so is a sub-form that several observations (or guards) repeat
        spelled = {}                    # observation -> (form, guard) as rendered
        if shared:
            counts: dict = {}
            for o in obs:
                for f in (list(o.form) if o.kind == "trip" else [o.form]) + [g for g, _ in o.guard]:
                    for x in _nodes(f):
                        if isinstance(x, (ir.BinOp, ir.Compare, ir.UnaryOp, ir.BoolOp, ir.Call, Select)):
                            counts[x] = counts.get(x, 0) + 1
            common = {x: Named("_shared", k, x) for k, x in enumerate(x for x, c in counts.items()
                                                                    if c > 1 and _free(x))}
            if common:
                sub = common.get
                for o in obs:
                    spelled[o] = (_subst(o.form, sub), tuple((_subst(g, sub), p) for g, p in o.guard))

        levels: dict[int, list[str]] = {}
        risky: dict[int, bool] = {}     # a level divides by a scalar (or steps by one)
        guard_depth, obs_depth, obs_forms = [], [], []
        shown = [Observation(o.kind, *spelled[o], o.loop_line, o.uses_var) if o in spelled else o
                 for o in obs]
        for k, o in enumerate(obs):
            guards = [g for g, _ in o.guard]
            forms = list(o.form) if o.kind == "trip" else [o.form]
            o = shown[k]
            d = depth(forms + guards)
            if (o.kind == "trip" and not isinstance(o.form[2], ir.Const)) or any(
                    _divides_by_scalar(f) for f in forms + guards):
                risky[d] = True
            obs_depth.append(d)
            obs_forms.append(forms + guards)
            guard_depth.append(depth(guards))
            reading.append(set())
            guard = " and ".join(f"({_py(g, var)})" if pol else f"(not {_py(g, var)})"
                                 for g, pol in o.guard) or "True"
            if o.kind == "trip":
                s0, s1, s2 = (_py(x, var) for x in o.form)
                t = f"max(0, -((({s0}) - ({s1})) // ({s2})))"
                value = f"({t}, {s0}, {s2})" if o.uses_var else t
            elif o.kind == "cond":
                value = f"bool({_py(o.form, var)})"
            else:
                value = _py(o.form, var)
            line_reads[f"o{k}"] = reading.pop()
            levels.setdefault(d, []).append(f"o{k} = ({value}) if ({guard}) else None")
        for d, pairs in defs.items():
            levels[d] = [f"{local} = {code}" for local, code in pairs] + levels.get(d, [])
        n = len(dims)
        keys = ", ".join(f"o{k}" for k in range(len(obs)))
        keys = f"({keys}{',' if len(obs) == 1 else ''})"
        out = ["def _run(D, out):"]
        pad = "    "
        out += [pad + ln for ln in levels.get(-1, [])]

        def emit(level, pad):
            # all observations of depth <= level are computed here
            deeper = [k for k in range(len(obs)) if obs_depth[k] > level]
            if level == n - 1 or not deeper:
                rest = ", ".join(f"v{j}" if j <= level else f"D[{j}][0]" for j in range(n))
                rest = f"({rest}{',' if n == 1 else ''})"
                for k in deeper:
                    out.append(pad + f"o{k} = None")
                out.append(pad + f"key = {keys}")
                out.append(pad + f"if key not in out: out[key] = {rest}")
                return
            if level >= 0 and all(guard_depth[k] <= level and obs[k].guard for k in deeper):
                live = " or ".join(
                    "(" + (" and ".join(f"({_py(g, var)})" if pol else f"(not {_py(g, var)})"
                                        for g, pol in shown[k].guard)) + ")" for k in deeper)
                out.append(pad + f"if not ({live}):")
                rest = ", ".join(f"v{j}" if j <= level else f"D[{j}][0]" for j in range(n))
                rest = f"({rest}{',' if n == 1 else ''})"
                for k in deeper:
                    out.append(pad + f"    o{k} = None")
                out.append(pad + f"    key = {keys}")
                out.append(pad + f"    if key not in out: out[key] = {rest}")
                out.append(pad + "    continue")
            j = level + 1
            if j == n - 1:
                last(j, pad)
                return
            out.append(pad + f"for v{j} in D[{j}]:")
            inner = pad + "    "
            if levels.get(j) and risky.get(j):
                out.append(inner + "try:")
                for ln in levels[j]:
                    out.append(inner + "    " + ln)
                out.append(inner + "except (ZeroDivisionError, ValueError):")
                out.append(inner + "    continue")
            else:
                out.extend(inner + ln for ln in levels.get(j, []))
            emit(j, inner)

        def last(j, pad):
            # The innermost loop. Its observations read v{j} and a few outer scalars; for given
            # values of those they are one list, whatever the other outer scalars are: built
            # once (``_memo``), keeping the first value of v{j} for each distinct tuple of them
            # -- a later one gives a key already in ``out``. ``_added[outer observations]``
            # holds the tuples whose key is in ``out``: a prefix whose tuples are all there
            # adds nothing.
            here = [k for k in range(len(obs)) if obs_depth[k] == j]
            outer = [k for k in range(len(obs)) if obs_depth[k] < j]
            reads = sorted({slot(v)[0] for k in here for f in obs_forms[k] for v in _free(f)} - {j, -1})
            key = [f"v{i}" for i in reads]
            values_of = None      # the locals the observations here read (see below)
            if exact:
                # the loop is a function of the outer locals its code reads: keyed by those
                # where each is an exact int or a bool (equal keys, the same values)
                named = {name: x for x, name in locals_of.items()}
                inner_defs = [local for local, _ in defs.get(j, [])]
                used = [u for u in dict.fromkeys(u for name in inner_defs + [f"o{k}" for k in here]
                                                 for u in sorted(line_reads[name]))
                        if u not in inner_defs and u != f"v{j}"]

                def exact_local(u) -> bool:
                    if u[0] == "v":
                        return int(u[1:]) in int_dims
                    x = named.get(u)
                    return x is not None and (int_safe(x.value) or isinstance(x.value, ir.Compare))
                if all(map(exact_local, used)):
                    key = used
                # the observations read v{j} only through the values defined at this depth:
                # they are a function of those and of outer locals, each an exact int or bool,
                # so a tuple of them computed once stands for every v{j} that gives it
                seen_by = sorted(set().union(*(line_reads[f"o{k}"] for k in here))) if here else []
                if _OBS_MEMO and here and not risky.get(j) and f"v{j}" not in seen_by and all(map(exact_local, seen_by)):
                    values_of = seen_by
            mine = "(" + "".join(f"o{k}, " for k in here) + ")"
            rest = "(" + "".join(f"v{i}, " for i in range(n)) + ")"
            out.append(pad + "_mk = (" + "".join(f"{u}, " for u in key) + ")")
            out.append(pad + "_got = _memo.get(_mk)")
            out.append(pad + "if _got is None:")
            if values_of is not None and inner_defs:
                # The values defined here, for every v{j} at once: where they and the outer
                # locals the observations read repeat, so does the list (_vm)
                gens = "".join(f" for {local} in ({code},)" for local, code in defs[j])
                cols = "(" + "".join(f"{u}, " for u in inner_defs) + ")"
                outer_read = [u for u in values_of if u not in inner_defs]
                out.append(pad + f"    _col = tuple([{cols} for v{j} in D[{j}]{gens}])")
                out.append(pad + "    _vk = (_col, " + "".join(f"{u}, " for u in outer_read) + ")")
                out.append(pad + "    _got = _vm.get(_vk)")
                out.append(pad + "    if _got is None:")
                pad += "    "
                out.append(pad + "    _lst = []")
                out.append(pad + "    _seen = set()")
                out.append(pad + f"    for v{j}, {cols} in zip(D[{j}], _col):")
            else:
                out.append(pad + "    _lst = []")
                out.append(pad + "    _seen = set()")
                out.append(pad + f"    for v{j} in D[{j}]:")
            inner = pad + "        "
            if risky.get(j):
                out.append(inner + "try:")
                out.extend(inner + "    " + ln for ln in levels[j])
                out.append(inner + "except (ZeroDivisionError, ValueError):")
                out.append(inner + "    continue")
                out.append(inner + f"_t = {mine}")
            elif values_of is not None:
                out.append(inner + "_ok = (" + "".join(f"{u}, " for u in values_of) + ")")
                out.append(inner + "_t = _om.get(_ok)")
                out.append(inner + "if _t is None:")
                out.extend(inner + "    " + ln for ln in levels[j][len(inner_defs):])
                out.append(inner + f"    _t = _om[_ok] = {mine}")
            else:
                out.extend(inner + ln for ln in levels[j])
                out.append(inner + f"_t = {mine}")
            out.append(inner + "if _t not in _seen:")
            out.append(inner + "    _seen.add(_t)")
            out.append(inner + f"    _lst.append((v{j}, _t))")
            if values_of is not None and inner_defs:
                out.append(pad + "    _got = _vm[_vk] = (_lst, _seen)")
                pad = pad[:-4]
                out.append(pad + "    _memo[_mk] = _got")
            else:
                out.append(pad + "    _got = _memo[_mk] = (_lst, _seen)")
            out.append(pad + "_pk = (" + "".join(f"o{k}, " for k in outer) + ")")
            out.append(pad + "_add = _added.get(_pk)")
            out.append(pad + "if _add is None:")
            out.append(pad + "    _add = _added[_pk] = set()")
            out.append(pad + "if _got[1] <= _add:")
            out.append(pad + ("    continue" if j > 0 else "    return"))
            out.append(pad + f"for v{j}, _t in _got[0]:")
            out.append(pad + "    if _t in _add:")
            out.append(pad + "        continue")
            out.append(pad + "    _add.add(_t)")
            out.append(pad + f"    {mine} = _t")
            out.append(pad + f"    key = {keys}")
            out.append(pad + f"    if key not in out: out[key] = {rest}")

        if n == 0:
            out.append(pad + f"key = {keys}")
            out.append(pad + "out[key] = ()")
        else:
            out.append(pad + "_memo, _added, _om, _vm = {}, {}, {}, {}")
            emit(-1, pad)
        source = "\n".join(out) + "\n"
        fn = _PRODUCTS.get(source)
        if fn is None:
            if len(_PRODUCTS) >= _CACHE_CAP:
                _PRODUCTS.clear()
            ns: dict = {}
            exec(compile(source, "<xsync scalars>", "exec"), ns)  # noqa: S102
            fn = _PRODUCTS[source] = ns["_run"]
        found: dict = {}
        fn(dims, found)
        return found

    def _assignment(self, names, combo) -> Assignment:
        values, overrides = [], []
        for n, v in zip(names, combo):
            if isinstance(n, tuple):
                axis = n[1]
                values += [(f"xs.program_id{axis}", v[0]), (f"xs.num_programs{axis}", v[1])]
            elif isinstance(n, Atom):
                values.append((n.key, v))
            elif isinstance(n, CutVar):
                values.append((n.name, v))
                overrides.append(((n.name, n.line), v))
            else:
                values.append((n.key, v))
        return Assignment(tuple(values), tuple(overrides))

    def pumped(self, a: Assignment, var, delta: int) -> Assignment:
        """``a`` with one free scalar moved by ``delta``."""
        key = var.key if isinstance(var, Atom) else var.name
        values = tuple((k, v + delta if k == key else v) for k, v in a.values)
        overrides = tuple(((n, ln), v + delta if n == key else v) for (n, ln), v in a.overrides)
        return Assignment(values, overrides)

    # ------------------------------------------------------------ unrolling
    def unroll(self, a: Assignment, iters: bool = False) -> list[list]:
        """Each instance's sync actions under assignment ``a``: action indices (``self.acts``),
        or Steps with their loop iterations when ``iters``."""
        values, overrides = dict(a.values), dict(a.overrides)
        out = []
        if not iters:
            self._unrolled += 1
            if self._unrollers is None and self._unrolled > COMPILE_AFTER:
                self._unrollers = [_unroller(prog, False, set(self.cut)) for prog in self.programs]
            if self._unrollers is None:
                for prog in self.programs:
                    steps: list = []
                    _run_fast(prog, dict(values), steps, values, overrides)
                    out.append(steps)
                return out
            for fn in self._unrollers:
                steps = []
                fn(dict(values), steps, values, overrides)
                out.append(steps)
            return out
        for prog in self.programs:
            steps = []
            env = dict(values)
            _run(prog, env, (), steps, values, overrides, self.acts)
            out.append(steps)
        return out

    def repeating_episode(self) -> str | None:
        """The iteration-count scalar (``iterations@L``) of the one episode loop that holds
        every action of every program, or None. The rest of each program only sets values,
        and the loop's iterations unroll alike (``_XLoop.same``), so an assignment with c
        iterations unrolls to c copies of the programs of the same assignment with one."""
        lines = set()
        for prog in self.programs:
            if not _acts_in(prog):
                continue            # an instance with no action: empty at any count
            loops = [n for n in prog if isinstance(n, _XLoop) and n.same]
            rest = [n for n in prog if not (isinstance(n, _XLoop) and n.same)]
            if len(loops) != 1 or _acts_in(rest):
                return None
            lines.add(loops[0].line)
        return episode_trips(lines.pop()) if len(lines) == 1 else None

    def tracer(self):
        """``trace(a)``: a key of the programs ``unroll(a)`` gives -- the control decisions of
        every instance's unroll (``_unroller(trace=True)``): equal keys, equal programs. None
        where a program is too deep to generate."""
        if self._tracers is None:
            self._tracers = [_unroller(prog, True, set(self.cut)) for prog in self.programs]
        fns = self._tracers
        if any(fn is None for fn in fns):
            return None

        def trace(a: Assignment) -> tuple:
            values, overrides = dict(a.values), dict(a.overrides)
            out = []
            for fn in fns:
                fn(dict(values), out, values, overrides)
                out.append(-1)      # the end of an instance's decisions
            return tuple(out)
        return trace

    def describe(self, a: Assignment, keys=None) -> str:
        """``n = 3, K = 130`` for the free scalars the observations read."""
        parts = []
        for k, v in a.values:
            if keys is not None and k not in keys:
                continue
            parts.append(f"{k} = {v}")
        return ", ".join(parts)


def _run_fast(prog, env, steps, values, overrides):
    for n in prog:
        if n.__class__ is int:
            steps.append(n)
        elif isinstance(n, _XLet):
            for t, f in zip(n.targets, n.fns):
                if (t, n.line) in overrides:
                    env[t] = overrides[(t, n.line)]
                elif f is not None:
                    try:
                        env[t] = f(env)
                    except EVALUATION_FAILS:
                        env.pop(t, None)
        elif isinstance(n, _XLoop):
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
                _run_fast(body, env, steps, values, overrides)
        elif isinstance(n, _XBranch):
            value = values[n.opaque] if n.opaque else n.cond(env)
            _run_fast(n.body if value else n.orelse, env, steps, values, overrides)


# the enumeration's memos in its innermost loop (``Scalars._product``): off only to test that
# they change nothing (tests/core/test_verifier_work.py)
_OBS_MEMO = True
_UNROLLERS: dict = {}       # generated unroller source -> factory (process-wide cache)
_PRODUCTS: dict = {}        # generated enumeration source -> function (process-wide cache)
_CACHE_CAP = 512            # generated functions kept per cache
_NESTING_CAP = 12           # deeper programs keep the interpreter (Python's block limit is 20)


def _unroller(prog, trace: bool = False, overridable=None):
    """``_run_fast`` for one program as a generated function ``fn(env, steps, values,
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
            if isinstance(n, _XLet):
                for t, f in zip(n.targets, n.fns):
                    key = repr((t, n.line))
                    if overridable is not None and (t, n.line) not in overridable:
                        if f is not None:
                            lines.append(pad + "try:")
                            lines.append(pad + f"    E[{t!r}] = {const(f)}(E)")
                            lines.append(pad + f"except {_FAILS}:")
                            lines.append(pad + f"    E.pop({t!r}, None)")
                        continue
                    lines.append(pad + f"if {key} in OV:")
                    lines.append(pad + f"    E[{t!r}] = OV[{key}]")
                    if f is not None:
                        lines.append(pad + "else:")
                        lines.append(pad + "    try:")
                        lines.append(pad + f"        E[{t!r}] = {const(f)}(E)")
                        lines.append(pad + f"    except {_FAILS}:")
                        lines.append(pad + f"        E.pop({t!r}, None)")
            elif isinstance(n, _XLoop):
                if n.opaque:
                    lines.append(pad + f"s{u}, c{u}, d{u} = 0, V[{n.opaque!r}], 1")
                else:
                    lines.append(pad + f"s{u}, e{u}, d{u} = {const(n.bounds)}(E)")
                    lines.append(pad + f"c{u} = trip(s{u}, e{u}, d{u})")
                if trace and _acts_in(n.body):
                    lines.append(pad + f"ext(c{u})")
                if n.body and all(x.__class__ is int for x in n.body):
                    # the body only appends: as _run_fast's loop of one action
                    if not trace:
                        lines.append(pad + f"ext({tuple(n.body)!r} * c{u})")
                    lines.append(pad + f"if c{u}:")
                    lines.append(pad + f"    E[{n.var!r}] = s{u} + (c{u} - 1) * d{u}")
                elif n.same:
                    # unroll one iteration, repeat its actions (_XLoop.same)
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
            elif isinstance(n, _XBranch):
                cond = f"V[{n.opaque!r}]" if n.opaque else f"{const(n.cond)}(E)"
                marks = trace and (_acts_in(n.body) or _acts_in(n.orelse))
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
        return lambda env, steps, values, overrides: _run_fast(prog, env, steps, values, overrides)
    names = "".join(f"C{k}, " for k in range(len(consts)))
    source = (f"def _factory({names}):\n"
              f"    def _unroll(E, S, V, OV):\n"
              f"        ext = S.{'append' if trace else 'extend'}\n" + "\n".join(lines) + "\n"
              f"    return _unroll\n")
    factory = _UNROLLERS.get(source)
    if factory is None:
        if len(_UNROLLERS) >= _CACHE_CAP:
            _UNROLLERS.clear()       # a long run of many kernels (the differential test)
        ns = {"trip": trip}
        exec(compile(source, "<xsync unroll>", "exec"), ns)  # noqa: S102
        factory = _UNROLLERS[source] = ns["_factory"]
    return factory(*consts)


def _division(node):
    """(dividend, divisor) of ``a // b``, ``a % b`` or ``xs.cdiv(a, b)``; None for another node."""
    if isinstance(node, ir.BinOp) and node.op in ("//", "%"):
        return node.left, node.right
    if isinstance(node, ir.Call) and node.op == "cdiv" and len(node.args) == 2:
        return node.args[0], node.args[1]
    return None


def _int_constants(nodes) -> list[int]:
    """The absolute values of the integer constants among ``nodes`` (booleans are not)."""
    return [abs(c.value) for c in nodes if isinstance(c, ir.Const) and isinstance(c.value, int)
            and not isinstance(c.value, bool)]


@dataclass(frozen=True)
class _EpisodeSweep:
    """What ``Scalars._episode_dims`` needs of one episode loop's tile sweep."""

    targets: list           # (name, line) of the counter, then of its coordinates
    evaluate: object        # counters -> key -> values: the counter and its own coordinates there
    resweep: object         # extra scalar values -> key -> values: the sweep run with them too
    step: int | None        # the counter's constant stride (None: not constant)
    coord_unit: int         # lcm of the constant divisors in the coordinates' definitions
    open_ended: bool        # the loop's bound reads a run-time value
    unit: int               # lcm of the constant divisors the sweep's scalars meet


def _acts_in(nodes) -> bool:
    """Whether a compiled block unrolls to any action (else its decisions add none)."""
    for n in nodes:
        if n.__class__ is int:
            return True
        if isinstance(n, _XLoop) and _acts_in(n.body):
            return True
        if isinstance(n, _XBranch) and (_acts_in(n.body) or _acts_in(n.orelse)):
            return True
    return False


def _run(prog, env, iters, steps, values, overrides, acts):
    for n in prog:
        if n.__class__ is int:
            steps.append(Step(acts[n], iters))
        elif isinstance(n, _XLet):
            for t, f in zip(n.targets, n.fns):
                if (t, n.line) in overrides:
                    env[t] = overrides[(t, n.line)]
                elif f is not None:
                    try:
                        env[t] = f(env)
                    except EVALUATION_FAILS:
                        env.pop(t, None)
        elif isinstance(n, _XLoop):
            if n.opaque:
                start, count, step = 0, values[n.opaque], 1
            else:
                start, stop, step = n.bounds(env)
                count = trip(start, stop, step)
            for i in range(count):
                v = start + i * step
                env[n.var] = v
                _run(n.body, env, iters + ((n.var, v),), steps, values, overrides, acts)
        elif isinstance(n, _XBranch):
            value = values[n.opaque] if n.opaque else n.cond(env)
            _run(n.body if value else n.orelse, env, iters, steps, values, overrides, acts)


_SWEEPS: dict = {}          # generated sweep source -> function (process-wide cache)
_FAILS = "(" + ", ".join(e.__name__ for e in EVALUATION_FAILS) + ")"   # as generated code spells it


def _generated(source: str, name: str, label: str):
    """Function ``name`` of generated ``source``, compiled once per process (``_SWEEPS``):
    the episode sweep (``_sweep_source``) and its images (``Scalars._images_source``)."""
    fn = _SWEEPS.get(source)
    if fn is None:
        if len(_SWEEPS) >= _CACHE_CAP:
            _SWEEPS.clear()
        ns = {"_cdiv": _cdiv}
        exec(compile(source, f"<xsync {label}>", "exec"), ns)  # noqa: S102
        fn = _SWEEPS[source] = ns[name]
    return fn


def _sweep_source(lens, n_axes, stride, lets, bounds, carried, depth, tiles=False) -> str:
    """Source of ``_sweep(D, visit)`` for ``Scalars._episode_sweep``: loops over dimensions
    0 .. ``depth`` (the deeper ones change nothing the iterations see: they only count, for
    the sample), ``lets`` = (depth, local, code, locals read) evaluated at their depth, a
    failure skipping every combination below, then ``visit(start, stop, step, carried
    values)`` once per distinct (first 16 counters of the range, carried values): a visit
    reads no more. With ``stride`` > 1 a prefix is visited only if the block of product
    indices under it holds a multiple of the stride.

    Without a stride, a dimension whose value nothing reads except assignments that read
    only it (``a1 = cdiv(max_q, 128)``) loops over the distinct values of those assignments
    instead (``U3``, computed once, in first-occurrence order, the failing values left
    out): everything below it sees only those values, so a repeated one would visit nothing
    new (``seen``), and a failing one skips what the loop's ``continue`` skips.

    ``tiles``: the loop is ``range(program_id, stop, num_programs)`` over the one program-id
    axis, dimension 0, which nothing else reads, and ``bounds`` spells ``stop`` alone. The
    program ids then loop innermost, once per distinct (stop, carried values) with stop
    capped at ``cap``: the first 16 counters of ``range(p, stop, q)`` are the same for every
    stop >= cap = max p + 16 max q. The same visits, in another order (``stride`` 1 only)."""
    out = ["def _sweep(D, visit):", "    seen = set()"]
    if tiles:
        out += ["    if not D[0]:", "        return",
                "    cap = max(p for p, _ in D[0]) + 16 * max(q for _, q in D[0])", "    tops = set()"]
    bounds_code, bounds_depth, bounds_reads = bounds
    # a visit reads the first 16 counters only: calls whose ranges agree there are one
    key = "(r, " + "".join(c + ", " for c in carried) + ")"
    own_lets: dict[int, list] = {}      # dimension -> its own assignments (local, code)
    if stride == 1:
        for j in range(1 if tiles else 0, depth + 1):
            mine = {f"p{j}", f"q{j}"} if j < n_axes else {f"v{j}"}
            own = []
            for d, local, code, reads in lets:
                if d == j and reads <= mine | {lc for lc, _ in own}:
                    own.append((local, code))
            owned = {lc for lc, _ in own}
            rest = [reads for _, local, _, reads in lets if local not in owned] + [
                bounds_reads, set(carried)]
            if any(r & mine for r in rest):
                continue             # the value itself is read: every value is looped over
            own_lets[j] = own
            unpack = f"p{j}, q{j} = x{j}" if j < n_axes else f"v{j} = x{j}"
            t = "(" + "".join(lc + ", " for lc, _ in own) + ")"
            out += [f"    U{j}, u{j} = [], set()", f"    for x{j} in D[{j}]:", f"        {unpack}"]
            if own:
                out.append("        try:")
                out.extend(f"            {lc} = {code}" for lc, code in own)
                out.append(f"        except {_FAILS}:")
                out.append("            continue")
            out += [f"        t{j} = {t}", f"        if t{j} not in u{j}:",
                    f"            u{j}.add(t{j})", f"            U{j}.append(t{j})"]

    def body(level, pad):
        # what is computed once the dimensions up to ``level`` are fixed
        owned = {lc for lc, _ in own_lets.get(level, ())}
        here = [(local, code) for d, local, code, _ in lets if d == level and local not in owned]
        if here or bounds_depth == level:
            out.append(pad + "try:")
            out.extend(pad + f"    {local} = {code}" for local, code in here)
            if bounds_depth == level:
                out.append(pad + (f"    stop = {bounds_code}" if tiles else
                                  f"    start, stop, step = {bounds_code}"))
            out.append(pad + f"except {_FAILS}:")
            out.append(pad + ("    return" if level < 0 else "    continue"))
            if bounds_depth == level and not tiles:
                out.append(pad + "if not step:")
                out.append(pad + ("    return" if level < 0 else "    continue"))

    def visit_once(pad, bounds_args):
        # a visit per distinct (first 16 counters, carried values)
        out.append(pad + f"r = range({bounds_args})[:16]")
        out.append(pad + f"k = {key}")
        out.append(pad + "if k not in seen:")
        out.append(pad + "    seen.add(k)")
        out.append(pad + f"    visit(r.start, r.stop, r.step, ({''.join(c + ', ' for c in carried)}))")

    def loops(level, pad):
        body(level, pad)
        if level == depth:
            if stride > 1:
                below = math.prod(lens[level + 1:])
                if not below:
                    return
                # indices [f * below, (f + 1) * below) hold a multiple of the stride
                out.append(pad + f"if -((-f{level} * {below}) // {stride}) * {stride} >= "
                                 f"(f{level} + 1) * {below}:")
                out.append(pad + "    continue")
            elif not math.prod(lens[level + 1:]):
                return
            if tiles:
                out.append(pad + "t = (min(stop, cap), " + "".join(c + ", " for c in carried) + ")")
                out.append(pad + "if t in tops:")
                out.append(pad + "    continue" if level > 0 else pad + "    return")
                out.append(pad + "tops.add(t)")
                out.append(pad + "for p0, q0 in D[0]:")
                pad += "    "
                out.append(pad + "if not q0:")
                out.append(pad + "    continue")
                visit_once(pad, "p0, stop, q0")
                return
            visit_once(pad, "start, stop, step")
            return
        j = level + 1
        if j in own_lets:
            own = own_lets[j]
            out.append(pad + f"for ({''.join(lc + ', ' for lc, _ in own)}) in U{j}:")
            loops(j, pad + "    ")
            return
        if stride > 1:
            out.append(pad + f"for i{j}, x{j} in enumerate(D[{j}]):")
            prev = f"f{level} * {lens[j]} + " if level >= 0 else ""
            out.append(pad + f"    f{j} = {prev}i{j}")
        else:
            out.append(pad + f"for x{j} in D[{j}]:")
        if j < n_axes:
            out.append(pad + f"    p{j}, q{j} = x{j}")
        else:
            out.append(pad + f"    v{j} = x{j}")
        loops(j, pad + "    ")

    if tiles:           # dimension 0 is looped over innermost
        body(-1, "    ")
        loops(0, "    ")
    elif depth < 0:     # no dimension read: one visit if the product is not empty
        body(-1, "    ")
        if not math.prod(lens):
            out.append("    return")
        else:
            out.append(f"    visit(start, stop, step, ({''.join(c + ', ' for c in carried)}))")
    else:
        loops(-1, "    ")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- episode loops
def episode_scalar(var: str, line: int) -> str:
    return f"{var}@{line}"


def episode_loops(skel: Skeleton) -> dict[int, str]:
    """Loops whose iterations are independent episodes: line -> counter name.

    A persistent tile loop (``for tile in range(program_id, tiles, num_programs)`` around
    the whole kernel) has bounds and conditions in its body that grow with its counter, so
    the periodicity argument does not apply to it. It does not need it: a loop L is an
    episode loop when

    1. L is a top-level statement of every instance's program (every agent runs it, under
       no condition),
    2. its bounds read no value derived from ``xs.replica_id()`` (every instance runs the
       same number of iterations),
    3. every sync object used in L is used only in L, and
    4. no value assigned in L's body is read by a bound or condition before the body assigns
       it again (nothing the protocol depends on is carried from one iteration to the next).

    Then, by confluence (see ``xsync.lowering.verify``), every run ends as the run that lets
    all agents finish iteration i before any starts i + 1 does; in that run each iteration
    starts with every channel empty and behaves as a one-iteration kernel whose counter is
    a free scalar. So the verifier replaces the counter with a free scalar
    (``tile@96``: every value it can take is tried) and checks L up to EPISODE_TRIPS
    iterations: one decides deadlock and leftovers for every iteration, the further ones
    expose leads that grow across iteration boundaries (pumped like any other). Where the
    target bounds no lead and L holds every action, one iteration stands for any number
    (``Scalars.repeating_episode``, ``verify._check``). An instance with no action at all
    takes part in nothing, so the conditions are over the others."""
    programs = _acting(skel.programs)
    if not programs:
        return {}
    tops = [{n.loc.line: n for n in prog if isinstance(n, Loop)} for prog in programs]
    common = set(tops[0]).intersection(*tops[1:])
    inside_objs: dict[int, set] = {ln: set() for ln in common}
    outside: set = set()
    for prog in programs:
        for n in prog:
            if isinstance(n, Loop) and n.loc.line in common:
                inside_objs[n.loc.line] |= _objects(n.body)
            else:
                outside |= _objects([n])
    out = {}
    for line in sorted(common):
        loops = [t[line] for t in tops]
        if any(_replica_derived(prog, loop) for prog, loop in zip(programs, loops)):
            continue
        if inside_objs[line] & outside or not inside_objs[line]:
            continue
        others = {ln for ln in common if ln != line}
        if any(inside_objs[line] & inside_objs[o] for o in others):
            continue
        if any(_carries(loop.body) for loop in loops):
            continue
        out[line] = loops[0].var
    return out


def tile_loops(skel: Skeleton, episodes: dict[int, str]) -> set[int]:
    """The episode loops spread over programs: their bounds read ``xs.program_id`` or
    ``xs.num_programs`` (a persistent tile loop, ``xs.tile_range``)."""
    out = set()
    for n in (_acting(skel.programs) or [()])[0]:
        if isinstance(n, Loop) and n.loc.line in episodes and any(
                isinstance(x, ir.Call) and x.op in ("program_id", "num_programs")
                for e in (n.start, n.stop, n.step) for x in ir.subexprs(e)):
            out.add(n.loc.line)
    return out


def episode_trips(line: int) -> str:
    return f"iterations@{line}"


def _episode_split(loop: Loop) -> tuple[list, list]:
    """(hoisted, rest): the top-level assignments of the body computed from nothing the body
    assigns except earlier hoisted ones (the tile's coordinates), and the other nodes."""
    body = list(loop.body)
    assigned = _assigned(body)
    hoisted, known = [], {loop.var}
    for i, m in enumerate(body):
        if not isinstance(m, Let) or set(m.targets) & _assigned(body[:i] + body[i + 1:]):
            continue
        if (_value_names(m.value) & assigned) - known:
            continue
        hoisted.append(m)
        known |= set(m.targets)
        body[i] = None
    return hoisted, [m for m in body if m is not None]


def _as_episodes(nodes, episodes: dict[int, str]) -> tuple:
    """The program with each episode loop's counter and the values computed from it taken
    as free scalars (set once, before the loop) and its trip count a free scalar."""
    out = []
    for n in nodes:
        if isinstance(n, Loop) and n.loc.line in episodes:
            hoisted, rest = _episode_split(n)
            out.append(Let((n.var,), ir.Const(0), n.loc))     # overridden: a cut variable
            out.extend(hoisted)
            n = Loop(f"{n.var}@iteration", ir.Const(0), ir.Name(episode_trips(n.loc.line)),
                     ir.Const(1), tuple(rest), n.loc)
        out.append(n)
    return tuple(out)


def _value_names(e) -> set[str]:
    """Names whose values ``e`` reads (an xs.load_scalar result is a free scalar of its own,
    whatever its index)."""
    if isinstance(e, ir.Call) and e.op == "load_scalar":
        return set()
    if isinstance(e, ir.Name):
        return {e.id}
    out = set()
    for c in ir.children(e):
        out |= _value_names(c)
    return out


def _acting(programs) -> list:
    """The programs that hold an action (an instance with none takes part in nothing)."""
    return [p for p in programs if _objects(p)]


def _objects(nodes) -> set:
    out = set()
    for n in nodes:
        if isinstance(n, Act):
            out.add(n.obj)
        elif isinstance(n, Loop):
            out |= _objects(n.body)
        elif isinstance(n, Branch):
            out |= _objects(n.body) | _objects(n.orelse)
    return out


def _replica_derived(prog, loop: Loop) -> bool:
    """Whether ``loop``'s bounds read xs.replica_id(), directly or through an assignment."""
    tainted: set[str] = set()

    def derived(e) -> bool:
        return bool(ir.expr_names(e) & tainted) or any(c.op == "replica_id" for c in ir.expr_calls(e))

    for n in prog:
        if n is loop:
            return any(derived(x) for x in (loop.start, loop.stop, loop.step))
        for t in _assigned([n]):
            if isinstance(n, Let) and not derived(n.value):
                tainted.discard(t)
            else:
                tainted.add(t)      # assigned from the replica, or inside a loop or branch
    return True


def _carries(body) -> bool:
    """Whether a bound or condition in ``body`` can read a value assigned in an earlier
    iteration of the loop around it (a name assigned in the body, read before that)."""
    assigned = _assigned(body)
    defined: set[str] = set()

    def walk(nodes, defined) -> bool:
        for n in nodes:
            if isinstance(n, Let):
                if (ir.expr_names(n.value) & assigned) - defined:
                    defined -= set(n.targets)       # carried: every later read is carried too
                    return True
                defined |= set(n.targets)
            elif isinstance(n, Loop):
                if any((ir.expr_names(x) & assigned) - defined for x in (n.start, n.stop, n.step)):
                    return True
                if walk(n.body, set(defined) | {n.var}):
                    return True
            elif isinstance(n, Branch):
                if (ir.expr_names(n.cond) & assigned) - defined:
                    return True
                a, b = set(defined), set(defined)
                if walk(n.body, a) or walk(n.orelse, b):
                    return True
                defined |= a & b
        return False

    return walk(body, defined)


# ---------------------------------------------------------------- helpers
def _assigned(nodes) -> set:
    out = set()
    for n in nodes:
        if isinstance(n, Let):
            out |= set(n.targets)
        elif isinstance(n, Loop):
            out |= _assigned(n.body) | {n.var}
        elif isinstance(n, Branch):
            out |= _assigned(n.body) | _assigned(n.orelse)
    return out


def _reads_var(nodes, var) -> bool:
    for n in nodes:
        if isinstance(n, Let) and var in ir.expr_names(n.value):
            return True
        if isinstance(n, Loop):
            if any(var in ir.expr_names(x) for x in (n.start, n.stop, n.step)) or _reads_var(n.body, var):
                return True
        if isinstance(n, Branch):
            if var in ir.expr_names(n.cond) or _reads_var(n.body, var) or _reads_var(n.orelse, var):
                return True
    return False


def _static_parts(form) -> list:
    """Maximal counter-free sub-forms of ``form`` that read a free scalar."""
    if not _dynamic(form):
        return [form] if _free(form) else []
    out = []
    for c in _children(form):
        out += _static_parts(c)
    return out


def _divides_by_scalar(form) -> bool:
    for n in _nodes(form):
        if isinstance(n, ir.BinOp) and n.op in ("//", "%", "/") and not isinstance(n.right, ir.Const):
            return True
        if isinstance(n, ir.Call) and n.op == "cdiv" and not isinstance(n.args[1], ir.Const):
            return True
    return False


def _divides_by_zero(form) -> bool:
    for n in _nodes(form):
        right = n.right if isinstance(n, ir.BinOp) and n.op in ("//", "%", "/") else (
            n.args[1] if isinstance(n, ir.Call) and n.op == "cdiv" else None)
        if isinstance(right, ir.Const) and not right.value:
            return True
    return False


def _linear_in(x, mine) -> bool:
    """Whether the counter occurs in ``x`` outside every modulus (so ``x`` grows with it)."""
    if mine(x):
        return True
    if isinstance(x, ir.BinOp) and x.op == "%":
        return False
    return any(_linear_in(c, mine) for c in _children(x))


def _private(form, nm: Named, inside) -> bool:
    """Every occurrence of ``inside`` in ``form`` lies within an occurrence of ``nm``."""
    if form == nm:
        return True
    if isinstance(form, (Atom, CutVar)):
        return form not in inside
    return all(_private(c, nm, inside) for c in _children(form))


def _surjective(value) -> bool:
    """``value`` adds or subtracts a free integer scalar occurring once: it takes every integer."""
    counts: dict = {}
    for n in _nodes(value):
        if isinstance(n, (Atom, CutVar)):
            counts[n] = counts.get(n, 0) + 1

    def walk(x):
        if isinstance(x, Named):
            return walk(x.value)
        if isinstance(x, Atom) and x.kind == "int" and counts.get(x) == 1:
            return True
        if isinstance(x, CutVar) and counts.get(x) == 1:
            return True
        if isinstance(x, ir.BinOp) and x.op in ("+", "-"):
            return walk(x.left) or walk(x.right)
        if isinstance(x, ir.UnaryOp) and x.op == "-":
            return walk(x.operand)
        return False
    return walk(value)


def _size(x) -> int:
    return sum(1 for _ in _nodes(x))


def _trip_of(v) -> int:
    if v is None:
        return 0
    return v[0] if isinstance(v, tuple) else v


def _magnitude(obs, values) -> tuple:
    """Order assignments: fewer / shorter loops first (smallest counterexamples)."""
    total, biggest = 0, 0
    for o, v in zip(obs, values):
        if o.kind == "trip" and v is not None:
            t = v[0] if isinstance(v, tuple) else v
            total += t
            biggest = max(biggest, t)
    return (biggest, total)


class ObsValues:
    """The observation values of one assignment (a mapping Observation -> value)."""

    def __init__(self, sc: "Scalars", values: tuple):
        self.sc, self.values = sc, values

    def items(self):
        return zip(self.sc.obs_list, self.values)

    def get(self, o, default=None):
        k = self.sc.obs_index.get(o)
        return default if k is None else self.values[k]
