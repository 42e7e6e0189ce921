"""Episode loops: loops whose iterations are independent (``episode_loops``), checked
iteration by iteration with the counter and the values computed from it taken as free
scalars (``as_episodes``); the values those take (``episode_images``, a concrete sweep of the
loop run as generated code) and more of them where observations need it (``episode_candidates``)."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from xsync.lowering import ir
from xsync.lowering.ir import ParamKind, TileOp
from xsync.lowering.protocol import Act, Branch, Let, Loop, Skeleton, text
from xsync.lowering.verifier.codegen import generated, sweep_source
from xsync.lowering.verifier.forms import EVALUATION_FAILS, FAILS, CutVar, division_of, free_scalars

EPISODE_TRIPS = 3     # iterations of an episode loop checked (see episode_loops)
EPISODE_EXTRA = 256   # counters of an episode loop added beyond the sweep's (episode_candidates)


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
    2. its bounds read no value derived from ``xs.replica_id()`` and are the same expressions in
       every instance (every instance runs the same number of iterations; the copies of a
       cluster's programs read their rank, ``xsync.lowering.cluster_protocol``),
    3. every sync object used in L is used only in L, and
    4. no value assigned in L's body is read by a bound or condition before the body assigns
       it again (nothing the protocol depends on is carried from one iteration to the next).

    Then, by confluence (see ``xsync.lowering.verifier.check``), every run ends as the run that lets
    all agents finish iteration i before any starts i + 1 does; in that run each iteration
    starts with every channel empty and behaves as a one-iteration kernel whose counter is
    a free scalar. So the verifier replaces the counter with a free scalar
    (``tile@96``: every value it can take is tried) and checks L up to EPISODE_TRIPS
    iterations: one decides deadlock and leftovers for every iteration, the further ones
    expose leads that grow across iteration boundaries (pumped like any other). Where the
    target bounds no lead and L holds every action, one iteration stands for any number
    (``Scalars.repeating_episode``, ``check._check``). An instance with no action at all
    takes part in nothing, so the conditions are over the others."""
    programs = acting_programs(skel.programs)
    if not programs:
        return {}
    tops = [{n.loc.line: n for n in prog if isinstance(n, Loop)} for prog in programs]
    common = set(tops[0]).intersection(*tops[1:])
    inside_objs: dict[int, set] = {ln: set() for ln in common}
    outside: set = set()
    for prog in programs:
        for n in prog:
            if isinstance(n, Loop) and n.loc.line in common:
                inside_objs[n.loc.line] |= sync_objects(n.body)
            else:
                outside |= sync_objects([n])
    out = {}
    for line in sorted(common):
        loops = [t[line] for t in tops]
        if any(replica_derived(prog, loop) for prog, loop in zip(programs, loops)):
            continue
        if len({(lp.start, lp.stop, lp.step) for lp in loops}) > 1:
            continue    # bounds that differ by instance (a cluster's copies: `range(n + xs.cluster_rank())`)
        if inside_objs[line] & outside or not inside_objs[line]:
            continue
        others = {ln for ln in common if ln != line}
        if any(inside_objs[line] & inside_objs[o] for o in others):
            continue
        if any(carries_values(loop.body) for loop in loops):
            continue
        out[line] = loops[0].var
    return out


def tile_loops(skel: Skeleton, episodes: dict[int, str]) -> set[int]:
    """The episode loops spread over programs: their bounds read ``xs.program_id`` or
    ``xs.num_programs`` (a persistent tile loop, ``xs.tile_range``)."""
    out = set()
    for n in (acting_programs(skel.programs) or [()])[0]:
        if isinstance(n, Loop) and n.loc.line in episodes and any(
                isinstance(x, ir.Call) and x.op in (TileOp.PROGRAM_ID, TileOp.NUM_PROGRAMS)
                for e in (n.start, n.stop, n.step) for x in ir.subexprs(e)):
            out.add(n.loc.line)
    return out


def episode_trips(line: int) -> str:
    return f"iterations@{line}"


def episode_split(loop: Loop) -> tuple[list, list]:
    """(hoisted, rest): the top-level assignments of the body computed from nothing the body
    assigns except earlier hoisted ones (the tile's coordinates), and the other nodes."""
    body = list(loop.body)
    assigned = assigned_names(body)
    hoisted, known = [], {loop.var}
    for i, m in enumerate(body):
        if not isinstance(m, Let) or set(m.targets) & assigned_names(body[:i] + body[i + 1:]):
            continue
        if (value_names(m.value) & assigned) - known:
            continue
        hoisted.append(m)
        known |= set(m.targets)
        body[i] = None
    return hoisted, [m for m in body if m is not None]


def as_episodes(nodes, episodes: dict[int, str]) -> tuple:
    """The program with each episode loop's counter and the values computed from it taken
    as free scalars (set once, before the loop) and its trip count a free scalar."""
    out = []
    for n in nodes:
        if isinstance(n, Loop) and n.loc.line in episodes:
            hoisted, rest = episode_split(n)
            out.append(Let((n.var,), ir.Const(0), n.loc))     # overridden: a cut variable
            out.extend(hoisted)
            n = Loop(f"{n.var}@iteration", ir.Const(0), ir.Name(episode_trips(n.loc.line)),
                     ir.Const(1), tuple(rest), n.loc)
        out.append(n)
    return tuple(out)


def value_names(e) -> set[str]:
    """Names whose values ``e`` reads (an xs.load_scalar result is a free scalar of its own,
    whatever its index)."""
    if isinstance(e, ir.Call) and e.op is TileOp.LOAD_SCALAR:
        return set()
    if isinstance(e, ir.Name):
        return {e.id}
    out = set()
    for c in ir.children(e):
        out |= value_names(c)
    return out


def acting_programs(programs) -> list:
    """The programs that hold an action (an instance with none takes part in nothing)."""
    return [p for p in programs if sync_objects(p)]


def sync_objects(nodes) -> set:
    out = set()
    for n in nodes:
        if isinstance(n, Act):
            out.add(n.obj)
        elif isinstance(n, Loop):
            out |= sync_objects(n.body)
        elif isinstance(n, Branch):
            out |= sync_objects(n.body) | sync_objects(n.orelse)
    return out


def replica_derived(prog, loop: Loop) -> bool:
    """Whether ``loop``'s bounds read xs.replica_id(), directly or through an assignment."""
    tainted: set[str] = set()

    def derived(e) -> bool:
        return bool(ir.expr_names(e) & tainted) or any(c.op is TileOp.REPLICA_ID for c in ir.expr_calls(e))

    for n in prog:
        if n is loop:
            return any(derived(x) for x in (loop.start, loop.stop, loop.step))
        for t in assigned_names([n]):
            if isinstance(n, Let) and not derived(n.value):
                tainted.discard(t)
            else:
                tainted.add(t)      # assigned from the replica, or inside a loop or branch
    return True


def carries_values(body) -> bool:
    """Whether a bound or condition in ``body`` can read a value assigned in an earlier
    iteration of the loop around it (a name assigned in the body, read before that)."""
    assigned = assigned_names(body)
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
def assigned_names(nodes) -> set:
    out = set()
    for n in nodes:
        if isinstance(n, Let):
            out |= set(n.targets)
        elif isinstance(n, Loop):
            out |= assigned_names(n.body) | {n.var}
        elif isinstance(n, Branch):
            out |= assigned_names(n.body) | assigned_names(n.orelse)
    return out


def reads_var(nodes, var, ahead=None) -> bool:
    """Whether ``nodes`` read the counter ``var``; a branch whose condition ``ahead(cond)``
    holds (``forms.iterations_ahead``: its truth follows from the trip count) does not count."""
    for n in nodes:
        if isinstance(n, Let) and var in ir.expr_names(n.value):
            return True
        if isinstance(n, Loop):
            if any(var in ir.expr_names(x) for x in (n.start, n.stop, n.step)) or reads_var(n.body, var, ahead):
                return True
        if isinstance(n, Branch):
            if (var in ir.expr_names(n.cond) and not (ahead and ahead(n.cond))) \
                    or reads_var(n.body, var, ahead) or reads_var(n.orelse, var, ahead):
                return True
    return False


@dataclass(frozen=True)
class EpisodeSweep:
    """What ``episode_candidates`` needs of one episode loop's tile sweep."""

    targets: list           # (name, line) of the counter, then of its coordinates
    evaluate: object        # counters -> key -> values: the counter and its own coordinates there
    resweep: object         # extra scalar values -> key -> values: the sweep run with them too
    step: int | None        # the counter's constant stride (None: not constant)
    coord_unit: int         # lcm of the constant divisors in the coordinates' definitions
    open_ended: bool        # the loop's bound reads a run-time value
    unit: int               # lcm of the constant divisors the sweep's scalars meet


# ---------------------------------------------------------------- episode sweeps
def episode_images(sc, program) -> dict[tuple[str, int], list[int]]:
    """The values an episode loop's counter and the values computed from it take: the
    loop run concretely for small values of the scalars its bounds and those values read
    (every program id below 1 .. 4 programs; other scalars a few multiples of the
    divisors they meet)."""
    images: dict[tuple[str, int], set] = {}
    before = []
    for n in program:
        if isinstance(n, Let):
            before.append(n)
        if not (isinstance(n, Loop) and n.loc.line in sc.episodes):
            continue
        hoisted, _ = episode_split(n)
        # the tile's coordinates: values computed from the counter and from what the
        # loop's bounds read, nothing else (a value that also reads a loaded sequence
        # length stays an expression over the coordinates and that length)
        pure, known = {n.var}, {n.var} | {t for m in before for t in m.targets} | {
            name for name, kind in sc.params.items() if kind is ParamKind.SCALAR} | set(sc.consts)
        for m in hoisted:
            names = value_names(m.value)
            loads = any(c.op is TileOp.LOAD_SCALAR for c in ir.expr_calls(m.value))
            if len(m.targets) == 1 and names & pure and names <= known | pure and not loads:
                pure.add(m.targets[0])
        hoisted = [m for m in hoisted if m.targets[0] in pure]
        exprs = [m.value for m in before] + [n.start, n.stop, n.step] + [m.value for m in hoisted]
        keys = set()
        for e in exprs:
            for x in ir.subexprs(e):
                if isinstance(x, ir.Call) and x.op in (TileOp.PROGRAM_ID, TileOp.NUM_PROGRAMS, TileOp.LOAD_SCALAR):
                    keys.add(text(x))
                elif isinstance(x, ir.Name) and sc.params.get(x.id) is ParamKind.SCALAR:
                    keys.add(x.id)
        unit = divisor_unit(sc, exprs)
        small = sorted({k * unit + r for k in range(4) for r in (0, 1, unit - 1) if k * unit + r >= 0})
        axes = sorted({k[k.index("("):] for k in keys if k.startswith(("xs.program_id", "xs.num_programs"))})
        others = sorted(k for k in keys if not k.startswith(("xs.program_id", "xs.num_programs")))
        dims = [[(p, m) for m in range(1, 5) for p in range(m)] for _ in axes] + [small for _ in others]
        inner = [(m, [sc.evaluator(m.value, None)]) for m in hoisted]
        targets = [(n.var, n.loc.line)] + [(m.targets[0], m.loc.line) for m, _ in inner]
        for key in targets:
            images.setdefault(key, set())
        size = math.prod(len(d) for d in dims)
        stride = max(1, size // 50_000)      # a spread sample when the product is large
        evaluate = episode_sweep(sc, n, before, inner, axes, others, dims, stride, targets, images)
        step = sc.sym(n.step, {})
        step = abs(step.value) if isinstance(step, ir.Const) and isinstance(step.value, int) else None

        def resweep(extra, loop=n, before=before, inner=inner, axes=axes, others=others,
                    small=small, targets=targets):
            """The sweep again, with ``extra`` among the values of the scalars the loop's
            bounds and coordinates read: their images there."""
            wider = sorted(set(small) | {x for x in extra if x >= 0})
            grid = [[(p, m) for m in range(1, 5) for p in range(m)] for _ in axes] + \
                [wider for _ in others]
            into = {key: set() for key in targets}
            episode_sweep(sc, loop, before, inner, axes, others, grid,
                                max(1, math.prod(len(d) for d in grid) // 50_000), targets, into)
            return into
        sc.episode_more[n.loc.line] = EpisodeSweep(
            targets, evaluate, resweep, step,
            # a coordinate that divides the counter by a constant d needs d times the counters
            min(divisor_unit(sc, [m.value for m, _ in inner]), 64),
            not isinstance(sc.sym(n.stop, {}), ir.Const), unit)
    # a value whose definition never evaluated stays symbolic (no image, no guess)
    return {k: sorted(v) for k, v in images.items() if v}

def divisor_unit(sc, exprs) -> int:
    """The least common multiple of the constant divisors (> 1) in IR expressions ``exprs``."""
    unit = 1
    for e in exprs:
        for x in ir.subexprs(e):
            div = division_of(x)
            d = sc.sym(div[1], {}) if div is not None else None
            if isinstance(d, ir.Const) and isinstance(d.value, int) and d.value > 1:
                unit = unit * d.value // math.gcd(unit, d.value)
    return unit

def _sweep_locals(sc, loop, before, axes, others):
    """(where, lets, bounds, spelled) for ``episode_sweep``: environment key -> (local name,
    depth); the assignments ``before`` the loop as (depth, local, code, locals read); the
    loop's bounds spelled; and the speller ``spelled(e)``. None where every combination
    fails (an assignment or the bounds read a value no combination defines, or opaque bounds)."""
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
        reads = sc.reads(e)
        if any(k not in where for k in reads):
            return None          # reads a value no combination defines: a KeyError
        code = sc.code(e, lambda k: where[k][0])
        return (code, max((where[k][1] for k in reads), default=-1),
                frozenset(where[k][0] for k in reads))

    for m in before:
        values = (m.value,) if len(m.targets) == 1 else getattr(m.value, "items", ())
        for t, v in zip(m.targets, values):
            if sc.code(v) is None:
                continue         # opaque: left unset, as the evaluator would
            got = spelled(v)
            if got is None:
                return None
            local = f"a{len(lets)}"
            lets.append((got[1], local, got[0], got[2]))
            where[t] = (local, got[1])
    bounds_expr = ir.TupleExpr((loop.start, loop.stop, loop.step))
    if sc.code(bounds_expr) is None:
        return None              # opaque bounds: every combination fails to unpack them
    bounds = spelled(bounds_expr)
    if bounds is None:
        return None
    return where, lets, bounds, spelled


def episode_sweep(sc, loop, before, inner, axes, others, dims, stride, targets, images):
    """Add to ``images`` the values of ``targets`` (the counter of episode loop ``loop`` and
    the tile coordinates computed from it by ``inner``) over the combinations of ``dims``
    whose index in their product is a multiple of ``stride``: for each, the assignments
    ``before`` the loop and its bounds are evaluated (a combination where one of them
    fails is skipped), then the loop's first 16 iterations run.

    One generated function does it (``sweep_source``): nested loops over ``dims``, each
    assignment evaluated at the depth of the last dimension it reads, and the iterations
    run once per distinct (bounds, values the coordinates read) -- nothing else reaches
    them, so the images are those of running every combination."""
    got = _sweep_locals(sc, loop, before, axes, others)
    if got is None:
        return
    where, lets, bounds, spelled = got
    # what the iterations read from the environment before the loop
    seen_keys: dict[str, None] = {}
    for m, (f,) in inner:
        if f is not None:
            seen_keys.update(dict.fromkeys(sc.reads(m.value)))
    carried = [k for k in seen_keys if k in where]
    depth = max([bounds[1]] + [d for d, _, _, _ in lets] + [where[k][1] for k in carried])
    lens = [len(d) for d in dims]
    source = sweep_source(lens, len(axes), stride, lets, bounds, [where[k][0] for k in carried], depth)
    fn = tile_fn = generated(source, "_sweep", "episode sweep")
    # the persistent form (range(program_id, stop, num_programs), the program ids read by
    # nothing else): the same visits, the program ids innermost (sweep_source ``tiles``)
    pid = {"p0", "q0"}
    stop = spelled(loop.stop)
    if (stride == 1 and len(axes) == 1 and stop is not None and not stop[2] & pid
            and text(loop.start) == f"xs.program_id{axes[0]}"
            and text(loop.step) == f"xs.num_programs{axes[0]}"
            and not any(r & pid for _, _, _, r in lets)
            and not {where[k][0] for k in carried} & pid):
        rest = max([stop[1]] + [d for d, _, _, _ in lets] + [where[k][1] for k in carried])
        tile_fn = generated(sweep_source(lens, 1, 1, lets, stop, [where[k][0] for k in carried],
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

    reads = [set(sc.reads(m.value)) if f is not None else set() for (m, (f,)) in inner]
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
        generated(images_source(sc, loop, inner, carried, names), "_images", "episode images")(
            counters, [images[key] for key in targets])
        if all(type(x) is int for key in targets for x in images[key]):
            return evaluate
        images.update(snapshot)      # run again in the original order
    fn(dims, iterations)
    return evaluate


def images_source(sc, loop, inner, carried, names) -> str:
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
        code = sc.code(m.value, lambda key: where[key])
        # the earlier coordinates it reads: each must have a value
        ok = " and ".join(f"k{coordinate[key]}" for key in sc.reads(m.value) if key in coordinate)
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
                pad + f"    k{k} = True", pad + f"except {FAILS}:", pad + f"    k{k} = False"]
    return "\n".join(out) + "\n"

def episode_candidates(sc, free, trips, bounds) -> dict:
    """Candidate values of episode loops' counters and coordinates for ``enumerate``.

    The sweep (``episode_images``) runs the loop for small values of what its bounds and
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
    for sweep in sc.episode_more.values():
        targets, evaluate = sweep.targets, sweep.evaluate
        if not wanted.intersection(targets):
            continue
        counters = sc.episode_images.get(targets[0])
        if not counters:
            continue
        got: dict = {key: set(sc.episode_images.get(key, ())) for key in targets}
        own = {key for key, seen in evaluate([min(counters)]).items() if seen}
        low, high = min(counters), max(counters)
        stride = sweep.step or math.gcd(*(x - low for x in counters))
        if sweep.open_ended and stride:
            top = high
            for key in targets:
                if key in wanted and key in own:
                    var = CutVar(*key)
                    consts = sc.unit_and_constants(var)[2]
                    top = max(top, sc.reach(var, trips, bounds),
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
                consts = sc.unit_and_constants(var)[2]
                c = max((abs(c) for c in consts), default=0) + 1
                # a nested loop whose bound reads no other scalar reaches its bound only
                # through this value (one that reads others reaches it through them)
                alone = [o for o in trips if set().union(*(free_scalars(x) for x in o.form[:2])) == {var}]
                if alone:
                    c = max(c, sc.reach(var, alone, bounds))
                if c > max(got[key]):
                    need = max(need, c)
        if need:
            unit = sweep.unit
            for key, seen in sweep.resweep({need - 1, need, need + 1, need * unit - 1,
                                            need * unit, need * unit + 1}).items():
                got[key] |= seen
        for key in targets:
            if got[key] != set(sc.episode_images.get(key, ())):
                out[key] = sorted(got[key])
    return out
