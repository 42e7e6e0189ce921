"""Scalar candidates: which values of a kernel's free scalars the verifier tries, and the
programs it unrolls for each.

A kernel's trip counts and conditions are functions of its *free scalars*: scalar
parameters (``n``, ``K``), ``xs.load_scalar`` results (sequence offsets), and
``xs.program_id`` / ``xs.num_programs`` (0 <= id < programs). Every loop bound and branch
condition is evaluated from them, with the kernel's own assignments in program order, so
related loops stay consistent: ``range(0, n)`` and ``range(1, n)`` under ``if n > 0``,
``cdiv(K, BK)`` and ``K // BK``.

Which values (``Scalars.assignments``):
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
   bound (``Scalars.loop_bounds``; see ``xsync.lowering.verifier.check`` for why that bound
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

from xsync.lowering import ir
from xsync.lowering.ir import ParamKind, TileOp
from xsync.lowering.protocol import Act, Branch, Let, Loop, Skeleton, text
from xsync.lowering.verifier.enumeration import independent, product, thinned
from xsync.lowering.verifier.relaxation import relax_one
from xsync.lowering.verifier.episodes import (EpisodeSweep, acting_programs, as_episodes, assigned_names,
                                              episode_candidates, episode_images, episode_loops, episode_trips,
                                              reads_var)
from xsync.lowering.verifier.forms import (DYN, Atom, CutVar, LoopVar, Named, Opaque, Select, cdiv,
                                           division_of, env_ref, form_nodes, form_size, free_scalars, has_node,
                                           int_constants, is_dynamic, is_private, is_surjective, iterations_ahead,
                                           linear_in, static_parts, substitute, to_python, trip)
from xsync.lowering.verifier.observations import Assignment, LoopFacts, Observation, ObsValues, magnitude, trip_of
from xsync.lowering.verifier.unroll import (COMPILE_AFTER, XBranch, XLet, XLoop, compile_unroller, holds_actions,
                                            unroll_fast, unroll_steps)

TRIP_CAP = 512        # no loop bound beyond this many iterations is tried
Q_CAP = 64            # candidate multiples of a scalar's unit
PERIOD_CAP = 64
_EVALUATORS: dict = {}      # generated code -> compiled evaluator (process-wide cache)


class Scalars:
    """The scalar side of one skeleton (see the module docstring)."""

    def __init__(self, kernel: ir.KernelIR, skel: Skeleton, episodes: bool = False):
        self.kernel, self.skel = kernel, skel
        self.consts = dict(kernel.constexpr_values)
        self.params = {p.name: p.kind for p in kernel.params}
        self.observations: dict[Observation, None] = {}
        # loops bounded by an outer counter and a free scalar (trips change with the outer loop)
        self._counter_trips: dict[Observation, None] = {}
        self.loops: dict[int, LoopFacts] = {}
        self.branches: dict[Observation, tuple[int, str]] = {}   # cond -> (line, condition's text)
        self.opaque: dict[str, str] = {}      # key -> "bool" | "trip"
        self.programs = []
        self._unrollers = None    # one generated function per program (see compile_unroller)
        self._unrolled = 0        # unrolls so far (the first few are interpreted)
        self._tracers = None      # the unrollers' control decisions only (see tracer)
        self.acts: list[Act] = []                 # action index -> action
        self.act_inst: list[int] = []             # action index -> instance
        self.carried = False      # some bound or condition reads a value carried across iterations
        self._atoms: set = set()   # every free scalar any assignment, bound or condition reads
        # episodes: check each episode loop iteration by iteration (see episode_loops)
        self.episodes = episode_loops(skel) if episodes else {}
        self.episodes_wanted = episodes
        # episode loops: (name, line) of the counter and values computed from it -> their values
        self.episode_images: dict[tuple[str, int], list[int]] = {}
        self.episode_trip_lines = {episode_trips(line): line for line in self.episodes}
        self.episode_more: dict[int, EpisodeSweep] = {}   # episode loop line -> (episode_candidates)
        programs = list(skel.programs)
        if self.episodes:
            self._inst = skel.instances[0]
            self._opaque_names = set()
            first = acting_programs(programs)[0]
            for line in self.episodes:
                self.params[episode_trips(line)] = ParamKind.SCALAR
                original = next(n for n in first if isinstance(n, Loop) and n.loc.line == line)
                self.loops[line] = LoopFacts(line, original.key)
            self.episode_images = episode_images(self, first)
            programs = [as_episodes(p, self.episodes) for p in programs]
        for inst in skel.instances:
            self._inst = inst
            self._opaque_names: set[str] = set()
            self.programs.append(self._compile_block(programs[inst.index]))
            self._static_pass(programs[inst.index], {}, (), [])
        if self.carried:
            # a carried value can depend on any scalar: observe them all by value
            for a in sorted(self._atoms, key=lambda a: a.key):
                self.observations[Observation("raw", a, ())] = None
        self.relaxed: dict[tuple[str, int], object] = {}   # (name, line) -> definition (relax)
        self._cuts()
        self._unit_memo: dict = {}      # free scalar -> unit_and_constants (observations final)

    # ------------------------------------------------------------ expressions
    def sym(self, e, env):
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
            if self.params.get(n) is ParamKind.SCALAR:
                return Atom(n, "int")
            return Opaque(f"value `{n}`")
        if isinstance(e, ir.BinOp):
            left, right = self.sym(e.left, env), self.sym(e.right, env)
            if isinstance(left, ir.Const) and isinstance(right, ir.Const):
                try:
                    return ir.Const(eval(f"a {e.op} b", {}, {"a": left.value, "b": right.value}))
                except Exception:  # noqa: BLE001 - division by zero etc.: leave symbolic
                    pass
            return ir.BinOp(e.op, left, right)
        if isinstance(e, ir.Compare):
            return ir.Compare(e.op, self.sym(e.left, env), self.sym(e.right, env))
        if isinstance(e, ir.UnaryOp):
            v = self.sym(e.operand, env)
            if isinstance(v, ir.Const) and e.op == "-":
                return ir.Const(-v.value)
            return ir.UnaryOp(e.op, v)
        if isinstance(e, ir.BoolOp):
            return ir.BoolOp(e.op, tuple(self.sym(v, env) for v in e.values))
        if isinstance(e, ir.Call):
            if e.op in (TileOp.CDIV, TileOp.MINIMUM, TileOp.MAXIMUM, TileOp.WHERE):
                return ir.Call(e.op, tuple(self.sym(a, env) for a in e.args))
            if e.op in (TileOp.PROGRAM_ID, TileOp.NUM_PROGRAMS) and isinstance(e.args[0], ir.Const):
                return Atom(f"xs.{e.op}({e.args[0].value})", "pid" if e.op is TileOp.PROGRAM_ID else "np")
            if e.op is TileOp.LOAD_SCALAR:
                return Atom(text(e), "int")
            if e.op is TileOp.REPLICA_ID:
                return ir.Const(self._inst.replica)
        return Opaque(f"`{text(e)}`")

    def evaluator(self, e, env_names):
        """A compiled evaluator ``f(E) -> value`` of IR expression ``e``, or None if opaque
        (instances share the evaluators of the code they replicate)."""
        code = self.code(e)
        if code is None:
            return None
        fn = _EVALUATORS.get(code)
        if fn is None:
            fn = _EVALUATORS[code] = eval(f"lambda E: {code}", {"_cdiv": cdiv})  # noqa: S307
        return fn

    def code(self, e, ref=None):
        """Python source of IR expression ``e`` (None: opaque). ``ref(key)`` spells a read of
        the value named ``key`` (a name, ``xs.program_id(0)``, ``xs.load_scalar(cu, b)``);
        by default ``E[key]``, a lookup in the evaluator's environment."""
        if ref is None:
            ref = env_ref
        if isinstance(e, ir.Const):
            return repr(e.value)
        if isinstance(e, ir.Name):
            if e.id in self.consts:
                return repr(self.consts[e.id])
            if self.params.get(e.id) is ParamKind.TENSOR or e.id in self._opaque_names:
                return None
            return ref(e.id)
        if isinstance(e, (ir.BinOp, ir.Compare)):
            a, b = self.code(e.left, ref), self.code(e.right, ref)
            return None if a is None or b is None else f"({a} {e.op} {b})"
        if isinstance(e, ir.UnaryOp):
            a = self.code(e.operand, ref)
            return None if a is None else (f"(not {a})" if e.op == "not" else f"({e.op}{a})")
        if isinstance(e, ir.BoolOp):
            parts = [self.code(v, ref) for v in e.values]
            return None if None in parts else "(" + f" {e.op} ".join(parts) + ")"
        if isinstance(e, ir.TupleExpr):
            parts = [self.code(v, ref) for v in e.items]
            return None if None in parts else "(" + "".join(p + ", " for p in parts) + ")"
        if isinstance(e, ir.Call):
            if e.op in (TileOp.PROGRAM_ID, TileOp.NUM_PROGRAMS, TileOp.LOAD_SCALAR):
                return ref(text(e))
            if e.op is TileOp.REPLICA_ID:
                return repr(self._inst.replica)
            parts = [self.code(a, ref) for a in e.args]
            if None in parts:
                return None
            if e.op is TileOp.CDIV:
                return f"_cdiv({parts[0]}, {parts[1]})"
            if e.op in (TileOp.MINIMUM, TileOp.MAXIMUM):
                return f"{'min' if e.op is TileOp.MINIMUM else 'max'}({parts[0]}, {parts[1]})"
            if e.op is TileOp.WHERE:
                return f"({parts[1]} if {parts[0]} else {parts[2]})"
        return None

    def reads(self, e) -> list[str]:
        """The environment keys the evaluator of ``e`` reads, in order of first use."""
        found: dict[str, None] = {}

        def ref(key):
            found[key] = None
            return env_ref(key)
        self.code(e, ref)
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
                    fns = (self.evaluator(n.value, None),)
                else:
                    items = n.value.items if isinstance(n.value, ir.TupleExpr) else ()
                    fns = tuple(self.evaluator(v, None) for v in items) or (None,) * len(n.targets)
                for t, f in zip(n.targets, fns):
                    # a value computed from tile data: what reads it is opaque (its own free value)
                    if f is None:
                        self._opaque_names.add(t)
                    else:
                        self._opaque_names.discard(t)
                out.append(XLet(n.targets, fns, n.loc.line, None in fns))
            elif isinstance(n, Loop):
                f = self.evaluator(ir.TupleExpr((n.start, n.stop, n.step)), None)
                key = None
                if f is None:
                    key = f"trip count of `{n.key}` (line {n.loc.line})"
                    self.opaque[key] = "trip"
                # an episode loop (as_episodes): its body reads no value an iteration
                # carries to the next (episode_loops, 4) and the tile's values are set before
                # it, so each iteration computes the same values and unrolls the same actions
                same = n.loc.line in self.episodes and n.var == f"{self.episodes[n.loc.line]}@iteration"
                out.append(XLoop(n.var, f, key, self._compile_block(n.body), n.loc.line, same))
            elif isinstance(n, Branch):
                f = self.evaluator(n.cond, None)
                key = None
                if f is None:
                    key = f"condition `{text(n.cond)}` (line {n.loc.line})"
                    self.opaque[key] = "bool"
                out.append(XBranch(f, key, self._compile_block(n.body),
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
                    values = [self.sym(n.value, env)]
                elif isinstance(n.value, ir.TupleExpr):
                    values = [self.sym(v, env) for v in n.value.items]
                else:
                    values = [Opaque(f"`{text(n.value)}`")] * len(n.targets)
                for t, v in zip(n.targets, values):
                    if loops:
                        if is_dynamic(v):
                            # counter-free values are observed where a bound or condition
                            # reads them (inlined there)
                            self._dynamic_form(v, guard, loops)
                        if has_node(v, lambda x: x is DYN):
                            env[t] = DYN
                        elif is_dynamic(v) or isinstance(v, (ir.Const, Opaque)) or not free_scalars(v):
                            env[t] = v
                        else:
                            # the same value at every iteration: named, so that it can be relaxed
                            env[t] = Named(t, n.loc.line, v, in_loop=True)
                    elif (t, n.loc.line) in self.episode_images:
                        env[t] = CutVar(t, n.loc.line)
                    else:
                        env[t] = v if isinstance(v, (ir.Const, Opaque)) else Named(t, n.loc.line, v)
            elif isinstance(n, Loop):
                forms = tuple(self.sym(x, env) for x in (n.start, n.stop, n.step))
                self.loops.setdefault(n.loc.line, LoopFacts(n.loc.line, n.key))
                for lp in loops:
                    self._counter_use(forms, lp, bound_of=n)
                if any(has_node(f, lambda x: x is DYN) for f in forms):
                    facts = self.loops[n.loc.line]
                    facts.periodic = False
                    facts.why = "its trip count is a value carried across the iterations of a loop"
                if any(has_node(f, lambda x: isinstance(x, Opaque)) for f in forms):
                    pass   # an opaque trip count: enumerated on its own
                elif not any(is_dynamic(f) for f in forms):
                    body_env = {**env, **dict.fromkeys(assigned_names(n.body), DYN), n.var: LoopVar(n.var, n.loc.line)}
                    uses = reads_var(n.body, n.var, lambda c: iterations_ahead(
                        self.sym(c, body_env), body_env[n.var], forms[1], forms[2]))
                    self.observations[Observation("trip", forms, guard, n.loc.line, uses)] = None
                else:
                    self._dynamic_form(forms, guard, loops)
                    if free_scalars(forms):
                        # bounded by an outer counter and a scalar (range(tile % 3 + n)): it
                        # must reach its bound through the scalar (_reach)
                        self._counter_trips[Observation("trip", forms, guard, n.loc.line)] = None
                # names assigned in the body are per-iteration values: unknown before their
                # assignment in an iteration, and after the loop
                assigned = assigned_names(n.body)
                inner = dict(env)
                for t in assigned:
                    inner[t] = DYN
                inner[n.var] = LoopVar(n.var, n.loc.line)
                self._static_pass(n.body, inner, guard, loops + [n])
                for t in assigned:
                    env[t] = DYN
                env.pop(n.var, None)
            elif isinstance(n, Branch):
                form = self.sym(n.cond, env)
                for lp in loops:
                    self._counter_use((form,), lp)
                if has_node(form, lambda x: isinstance(x, Opaque)):
                    self._static_pass(n.body, env, guard, loops)
                    self._static_pass(n.orelse, env, guard, loops)
                    continue
                if isinstance(form, ir.Const):       # a compile-time condition: one arm
                    self._static_pass(n.body if form.value else n.orelse, env, guard, loops)
                    continue
                if not is_dynamic(form):
                    self.observations[cond := Observation("cond", form, guard)] = None
                    if n.written:       # named in counterexamples
                        self.branches.setdefault(cond, (n.loc.line, text(n.cond)))
                    then_env, else_env = dict(env), dict(env)
                    self._static_pass(n.body, then_env, guard + ((form, True),), loops)
                    self._static_pass(n.orelse, else_env, guard + ((form, False),), loops)
                    for t in set(then_env) | set(else_env):
                        a, b = then_env.get(t, DYN), else_env.get(t, DYN)
                        env[t] = a if a == b else (DYN if DYN in (a, b) else Select(form, a, b))
                else:
                    if not any(iterations_ahead(form, LoopVar(lp.var, lp.loc.line), self.sym(lp.stop, env),
                                                self.sym(lp.step, env)) for lp in loops):
                        self._dynamic_form(form, guard, loops)
                    self._static_pass(n.body, env, guard, loops)
                    self._static_pass(n.orelse, env, guard, loops)

    def _dynamic_form(self, form, guard, loops):
        """Counter-dependent bounds/conditions: observe their counter-free parts."""
        if has_node(form, lambda x: x is DYN):
            self.carried = True
        for part in static_parts(form):
            self.observations[Observation("raw", part, guard)] = None

    def _counter_use(self, forms, loop: Loop, bound_of: Loop | None = None):
        """Record how the body of ``loop`` depends on its counter: the period (moduli of the
        counter) and the threshold (constants it is compared with) after which the body
        repeats; a nested bound that grows with the counter, or a value carried across
        iterations, makes the body not periodic."""
        facts = self.loops.setdefault(loop.loc.line, LoopFacts(loop.loc.line, loop.key))
        mine = lambda x: isinstance(x, LoopVar) and x.var == loop.var and x.line == loop.loc.line  # noqa: E731
        step = self.sym(loop.step, {})
        step = step.value if isinstance(step, ir.Const) and isinstance(step.value, int) and step.value else None
        start = self.sym(loop.start, {})
        start = abs(start.value) if isinstance(start, ir.Const) and isinstance(start.value, int) else 0
        for f in forms:
            if has_node(f, lambda x: x is DYN):
                if facts.periodic:
                    facts.periodic = False
                    facts.why = "a bound or condition in its body reads a value carried across iterations"
                # a carried value compared with a constant c: a value that moves by one or more
                # per iteration meets it within c iterations, so the bounded check goes that far
                consts = int_constants(form_nodes(f))
                if consts:
                    facts.threshold = max(facts.threshold, min(PERIOD_CAP, max(consts) + 2))
            if not has_node(f, mine):
                continue
            if bound_of is not None and linear_in(f, mine):
                facts.periodic = False
                facts.why = (f"the bound of the loop at line {bound_of.loc.line} grows with its "
                             f"counter `{loop.var}`")
            for node in form_nodes(f):
                m = None
                div = division_of(node)
                if div is not None and has_node(div[0], mine):
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
            for node in form_nodes(f):
                linear = None
                if isinstance(node, ir.Compare):
                    linear = (node.left, node.right)
                elif isinstance(node, ir.Call) and node.op in (TileOp.MINIMUM, TileOp.MAXIMUM):
                    linear = tuple(node.args)
                if linear and any(linear_in(x, mine) for x in linear):
                    consts = [abs(c.value) for x in linear for c in form_nodes(x)
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
        forms = [self.sym(x, {}) for x in (n.start, n.stop, n.step)]
        if all(isinstance(f, ir.Const) and isinstance(f.value, int) for f in forms) and forms[2].value:
            return min(TRIP_CAP, trip(*(f.value for f in forms)))
        return None


    # ------------------------------------------------------------ cut variables
    def _cuts(self):
        """Named scalars whose inputs appear nowhere else are enumerated by name."""
        self.cut: dict[tuple[str, int], object] = {}   # (name, line) -> definition
        for key in self.episode_images:
            self.cut[key] = Opaque(f"episode value {key[0]}")
        forms = self._all_forms()
        while True:
            named = sorted({n for f in forms for n in form_nodes(f) if isinstance(n, Named)},
                           key=lambda n: -form_size(n))
            chosen = None
            for nm in named:
                if nm.in_loop:
                    continue
                inside = free_scalars(nm.value)
                if not inside or not all(isinstance(a, (Atom, CutVar)) for a in inside):
                    continue
                if not all(is_private(f, nm, inside) for f in forms):
                    continue
                kinds = {a.kind for a in inside if isinstance(a, Atom)}
                if is_surjective(nm.value) or (kinds <= {"pid", "np"} and not any(isinstance(a, CutVar) for a in inside)):
                    chosen = nm
                    break
            if chosen is None:
                break
            self.cut[(chosen.name, chosen.line)] = chosen.value
            repl = CutVar(chosen.name, chosen.line)
            sub = lambda x, c=chosen, r=repl: r if x == c else None  # noqa: E731
            self.observations = {Observation(o.kind, substitute(o.form, sub), substitute(o.guard, sub),
                                             o.loop_line, o.uses_var): None
                                 for o in self.observations}
            forms = self._all_forms()

    def relax(self) -> str | None:
        """Take one more named value as a free integer of its own (``relaxation.relax_one``)."""
        return relax_one(self)

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
            for n in form_nodes(f):
                if isinstance(n, (Atom, CutVar)):
                    found[n] = None
        return sorted(found, key=lambda a: (isinstance(a, CutVar), getattr(a, "key", getattr(a, "name", ""))))

    def unit_and_constants(self, var):
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
                if var not in free_scalars(f):
                    continue
                nodes = form_nodes(f)
                if any(div is not None and var in free_scalars(div[1]) for div in map(division_of, nodes)):
                    quotient = max([quotient] + [c for c in int_constants(nodes) if c <= Q_CAP])
                for node in nodes:
                    if isinstance(node, ir.BinOp) and node.op in ("//", "%") and \
                            isinstance(node.right, ir.Const) and isinstance(node.right.value, int) \
                            and node.right.value > 1 and var in free_scalars(node.left):
                        divisors.add(node.right.value)
                    if isinstance(node, ir.Call) and node.op is TileOp.CDIV and \
                            isinstance(node.args[1], ir.Const) and isinstance(node.args[1].value, int) \
                            and var in free_scalars(node.args[0]):
                        divisors.add(abs(node.args[1].value))
                    if isinstance(node, ir.Const) and isinstance(node.value, int) and \
                            not isinstance(node.value, bool) and abs(node.value) <= 1 << 20:
                        consts.add(node.value)
            if o.kind == "trip" and any(var in free_scalars(x) for x in o.form[:2]) and \
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
        unit, divisors, consts, quotient = self.unit_and_constants(var)
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
        return self.unit_and_constants(var)[0]

    def enumerate(self, bounds: dict[int, int], limit: int = 2_000_000, fixed=None, sample=None,
                  keep=None):
        """Distinct observations -> (Assignment, observation values), smallest first; None
        when the product of the candidate sets exceeds ``limit``.

        ``bounds``: loop line -> the trip count every loop must reach (when it can).
        ``fixed``: free scalar key -> the values it takes (instead of its candidates).
        The limit bounds the product of the candidate sets before the branches prune it: the
        flagship attention after the Hopper passes (its rotated loop has a prologue and
        epilogue, so its bound is 44 trips) has 96 x 96 x 4 x 7 candidates (~1 s); the causal
        dK/dV kernel on the Ascend placement 28 x 64 x 14 x 2 x 28 = 1.4M, which its causal
        branches prune to 184 assignments (0.3 s). Past the limit the candidates are thinned
        and the verdict is not proven.

        ``sample`` (a ``random.Random``): each candidate set is cut to a random subset so that
        the product stays within ``limit`` (``check.falsify``: looking for a bug among values the
        smallest ones leave out; never a proof). ``keep``: only so many assignments (the smallest;
        with ``sample``, a random choice)."""
        free = self.free()
        # scalars that branch conditions read go first: the loops over the others are then
        # skipped wherever those conditions rule the rest out
        in_guards = {v for o in self.observations for g, _ in o.guard for v in free_scalars(g)}
        free.sort(key=lambda v: v not in in_guards)
        trips = [o for o in self.observations if o.kind == "trip" and free_scalars(o.form)]
        reaching = trips + list(self._counter_trips)
        episode_dims = episode_candidates(self, free, trips, bounds) if self.episode_more else {}
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
                elif isinstance(v, CutVar) and (v.name, v.line) in self.relaxed:
                    dims.append(self.candidates(v, self.reach(v, reaching, bounds) * scale))
                elif isinstance(v, CutVar) and (v.name, v.line) in self.episode_images:
                    dims.append(episode_dims.get((v.name, v.line)) or
                                self.episode_images[(v.name, v.line)])
                elif isinstance(v, CutVar) and not is_surjective(self.cut[(v.name, v.line)]):
                    dims.append(self._image(v))
                else:
                    dims.append(self.candidates(v, self.reach(v, reaching, bounds) * scale))
            for key, kind in sorted(self.opaque.items()):
                names.append(Opaque(key))
                dims.append([False, True] if kind == "bool" else
                            list(range(0, max(bounds.values(), default=8) + 2)))
            if sample is not None:
                dims = thinned(dims, limit, sample)
            found = self._enumerate(names, dims, limit, keep, sample)
            if found is None:
                return None, names
            # every loop reaches its bound, where the scalars allow it
            short = [o for o in trips if o.loop_line in bounds and
                     max((trip_of(v) for v in self._column(found, o)), default=-1) < bounds[o.loop_line]]
            if not short or scale >= 8 or sample is not None:
                return found, names
            scale *= 2

    def _column(self, found, o) -> list:
        """The value of observation ``o`` in every assignment of ``found``."""
        k = self.obs_index.get(o)
        return [None] * len(found) if k is None else [values.values[k] for _, values in found]

    def reach(self, var, trips, bounds) -> int:
        """A value of ``var`` by which every loop it bounds has run its bound."""
        unit = self.unit(var)
        out = 4
        for o in trips:
            if not any(var in free_scalars(x) for x in o.form[:2]):
                continue
            step = o.form[2].value if isinstance(o.form[2], ir.Const) and isinstance(o.form[2].value, int) else 1
            consts = [c for x in o.form[:2] for c in int_constants(form_nodes(x))]
            n = bounds.get(o.loop_line, 8)
            out = max(out, n * max(abs(step) or 1, unit) + max(consts, default=0))
        return out

    def _image(self, cv: CutVar) -> list:
        definition = self.cut[(cv.name, cv.line)]
        atoms = sorted(free_scalars(definition), key=lambda a: a.key)
        axes = sorted({a.key[a.key.index("("):] for a in atoms})
        out = set()
        for combo in itertools.product(*[[(p, n) for n in range(1, 5) for p in range(n)] for _ in axes]):
            env = {}
            for axis, (p, n) in zip(axes, combo):
                env[f"xs.program_id{axis}"] = p
                env[f"xs.num_programs{axis}"] = n
            try:
                out.add(eval(to_python(definition, lambda x: repr(env.get(x.key, 0))), {}))  # noqa: S307
            except Exception:  # noqa: BLE001
                pass
        return sorted(out)

    def _enumerate(self, names, dims, limit, keep=None, rng=None):
        """Run the observation function over the product of ``dims``: nested loops, each
        observation computed at the depth of the last scalar it reads, and the deeper loops
        skipped when every deeper observation sits under a branch not taken.

        Scalars that share no observation are enumerated apart (``enumeration.independent``): the
        distinct observation tuples of the product are the combinations of each group's, and
        the first assignment of each (in the product's loop order) combines each group's first."""
        obs = self.obs_list = list(self.observations)
        self.obs_index = {o: k for k, o in enumerate(obs)}
        size = 1
        for d in dims:
            size *= max(1, len(d))
        if size > limit:
            return None
        found = independent(names, dims, obs)
        if found is None:
            found = product(names, dims, obs)
        order = lambda item: magnitude(obs, item[0])  # noqa: E731
        items = sorted(found.items(), key=order)   # stable: loop order
        if keep is not None and len(items) > keep:
            # a sample (check.falsify) keeps assignments from every size, not the smallest only
            items = sorted(rng.sample(items, keep), key=order) if rng is not None else items[:keep]
        return [(self._assignment(names, combo), ObsValues(self, key)) for key, combo in items]


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
                self._unrollers = [compile_unroller(prog, False, set(self.cut)) for prog in self.programs]
            if self._unrollers is None:
                for prog in self.programs:
                    steps: list = []
                    unroll_fast(prog, dict(values), steps, values, overrides)
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
            unroll_steps(prog, env, (), steps, values, overrides, self.acts)
            out.append(steps)
        return out

    def repeating_episode(self) -> str | None:
        """The iteration-count scalar (``iterations@L``) of the one episode loop that holds
        every action of every program, or None. The rest of each program only sets values,
        and the loop's iterations unroll alike (``XLoop.same``), so an assignment with c
        iterations unrolls to c copies of the programs of the same assignment with one."""
        lines = set()
        for prog in self.programs:
            if not holds_actions(prog):
                continue            # an instance with no action: empty at any count
            loops = [n for n in prog if isinstance(n, XLoop) and n.same]
            rest = [n for n in prog if not (isinstance(n, XLoop) and n.same)]
            if len(loops) != 1 or holds_actions(rest):
                return None
            lines.add(loops[0].line)
        return episode_trips(lines.pop()) if len(lines) == 1 else None

    def tracer(self):
        """``trace(a)``: a key of the programs ``unroll(a)`` gives -- the control decisions of
        every instance's unroll (``compile_unroller(trace=True)``): equal keys, equal programs. None
        where a program is too deep to generate."""
        if self._tracers is None:
            self._tracers = [compile_unroller(prog, True, set(self.cut)) for prog in self.programs]
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

