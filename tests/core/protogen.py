"""A seeded generator of random sync protocols, and the differential check that keeps the
verifier honest against the CPU emulator.

``generate(seed)`` writes the source of one ``@xs.kernel``: 2-4 roles (replicas 1-2),
pipes (1-4 stages), events, barriers (some roles or all), a main loop over a run-time
trip count (``range(n)``, ``range(1, n)``, ``range(0, n, 2)``, ``cdiv(n, 2)``, ...),
sometimes a nested loop (constant or the second scalar ``m``), conditions on loop counters
(small moduli and thresholds) and on the scalars, a peeled first iteration, per-role loops,
and -- for about half of them -- one mutation that may break the protocol (a release
dropped on one path, a condition on one side only, a loop one short, a stray signal, a
release before its wait, a barrier call missing in one member). About one in five is then
wrapped in a persistent tile loop (``for tile in xs.tile_range(t, persistent=1)``) whose
body's trip counts may grow with the tile (``n`` becomes ``tile + n``, ``tile % 3 + n``, ...),
as in the attention kernel: the verifier checks those tile by tile.

``check(kernel)`` compares the verifier's CPU verdict with CPU-emulator runs (cooperative
scheduler, every trip count up to ``BOUND``): an accepted kernel that stalls or leaves
something unconsumed for some trip count, or a rejected one whose counterexample runs
cleanly on the emulator (or that runs cleanly for every trip count), is a disagreement.
It also checks that the nvidia and ascend verdicts equal the CPU one unless the placement
changes the protocol and the message says why.

Long run (one command): ``python -m tests.core.protogen --seeds 0:20000``.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field

BOUND = 24          # the emulator runs n = 0 .. BOUND (and m = 0 .. M_BOUND when used)
M_BOUND = 6
TILE_SHARE = 0.2    # protocols wrapped in a persistent tile loop
# tile loops: the emulator runs every (programs, t, n) of these (m as above, up to 3)
TILE_PROGRAMS = (1, 3)
TILE_COUNTS = (0, 1, 2, 3, 4, 5, 6, 9, 13)
TILE_N = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 17)
TILE_SPANS = ("n", "tile + n", "tile % 3 + n", "n + tile // 2", "xs.maximum(n - tile, 0)")
HOLD_SHARE = 0.15   # pipes whose consumer holds two slots (two waits, then two releases)
INTERLEAVE_SHARE = 0.5   # N -> N pipes with even stages that share one ring (interleave=N)
KINDS = ("copy", "matrix", "vector")


# ---------------------------------------------------------------- generation
@dataclass
class _Group:
    """The ops one sync object needs in one place: producer side and consumer side."""

    obj: str
    kind: str                       # pipe | event | barrier
    sides: list                     # [(role, [op lines])]
    cond: str | None = None         # shared condition on the loop counter
    only: int | None = None         # mutation: the condition wraps only this side
    inner: bool = False             # inside the nested loop


@dataclass
class Protocol:
    name: str
    source: str
    mutation: str = ""
    scalars: tuple = ("n",)
    tiles: bool = False         # wrapped in a persistent tile loop over ``t`` tiles


def generate(seed: int, gather: bool = False) -> Protocol:
    """``gather``: pipes may also run from 2 replicas to 1 (N -> 1, ``seed`` otherwise gives the
    same protocol as without)."""
    rnd = random.Random(seed)
    name = f"gen_{seed}"
    n_roles = rnd.randint(2, 4)
    roles = []
    for k in range(n_roles):
        roles.append((f"r{k}", rnd.choice(KINDS), rnd.choice((1, 1, 1, 2))))
    reps = {r: n for r, _, n in roles}
    decls = [f'    {r} = xs.role("{r}", kind="{kind}", replicas={n})' for r, kind, n in roles]
    groups: list[_Group] = []
    names = [r for r, _, _ in roles]
    n_objs = rnd.randint(1, 4)
    used = set()
    for k in range(n_objs):
        kind = rnd.choice(("pipe", "pipe", "event", "barrier"))
        if kind == "barrier" and any(g.kind == "barrier" for g in groups):
            kind = "event"
        if kind == "barrier":
            members = names if rnd.random() < 0.3 else rnd.sample(names, rnd.randint(1, len(names)))
            spelled = "" if members == names else ", ".join(members)
            obj = f"b{k}"
            decls.append(f"    {obj} = xs.barrier({spelled})")
            verb = "arrive" if rnd.random() < 0.15 else "sync"
            sides = [(m, [f"{obj}.{verb if i == 0 else 'sync'}()"]) for i, m in enumerate(members)]
            groups.append(_Group(obj, "barrier", sides))
            used |= set(members)
            continue
        for _ in range(20):
            src, dst = rnd.sample(names, 2)
            if kind == "pipe" and reps[src] not in (1, reps[dst]) and not (gather and reps[dst] == 1):
                continue
            break
        else:
            continue
        if kind == "pipe" and reps[src] not in (1, reps[dst]) and not (gather and reps[dst] == 1):
            continue
        obj = f"{'p' if kind == 'pipe' else 'e'}{k}"
        if kind == "pipe":
            decls.append(f"    {obj} = xs.pipe({src}, {dst}, stages={rnd.randint(1, 4)})")
            groups.append(_Group(obj, "pipe", [(src, [f"{obj}.acquire()", f"{obj}.commit()"]),
                                               (dst, [f"{obj}.wait()", f"{obj}.release()"])]))
        else:
            decls.append(f"    {obj} = xs.event({src}, {dst})")
            groups.append(_Group(obj, "event", [(src, [f"xs.signal({obj})"]),
                                                (dst, [f"xs.wait({obj})"])]))
        used |= {src, dst}
    if not groups:
        src, dst = names[0], names[1]
        decls.append(f"    e9 = xs.event({src}, {dst})")
        groups.append(_Group("e9", "event", [(src, ["xs.signal(e9)"]), (dst, ["xs.wait(e9)"])]))
    # conditions on the loop counter: shared by both sides (balanced); one modulus family
    # per protocol keeps the period (their lcm) at most 8
    base = rnd.choice((2, 3, 4, 8))
    mods = [d for d in (2, 3, 4, 8) if base % d == 0]
    for g in groups:
        if rnd.random() < 0.35:
            m = rnd.choice(mods)
            g.cond = rnd.choice((f"i % {m} == {rnd.randint(0, m - 1)}",
                                 f"i > {rnd.randint(0, 9)}", f"i < {rnd.randint(1, 9)}",
                                 f"i % {m} != {rnd.randint(0, m - 1)}",
                                 f"i != {rnd.randint(0, 9)}"))
    nested = rnd.random() < 0.25
    scalars = ("n", "m") if nested and rnd.random() < 0.25 else ("n",)
    if nested:
        for g in groups:
            if g.cond is None and rnd.random() < 0.5:
                g.inner = True
    inner_bound = "m" if "m" in scalars else str(rnd.randint(2, 3))
    bound = rnd.choice(("n", "n", "n", "1, n", "0, n, 2", "xs.cdiv(n, 2)", "n // 2", "n - 1"))
    per_role = rnd.random() < 0.12 and not nested
    peeled = rnd.random() < 0.12 and not per_role and bound == "n"
    guard = f"n > {rnd.randint(0, 3)}" if rnd.random() < 0.1 else None

    mutation = ""
    if rnd.random() < 0.5:
        mutation = rnd.choice(("drop_release", "one_sided_cond", "short_loop", "stray_signal",
                               "release_first", "barrier_skip", "drop_wait", "reorder"))
    _hold(random.Random(f"hold-{seed}"), groups, decls, reps, mutation)
    # its own generator: the protocols of the seeds not wrapped stay what they were
    tiles = random.Random(f"tiles-{seed}")
    wrapped = tiles.random() < TILE_SHARE
    # a mutation that bites late may bite at a late tile instead (``if tile != 5:``)
    late_var = "tile" if wrapped and tiles.random() < 0.4 else None
    body = _fill(_layout(rnd, groups, names, bound, nested, inner_bound, per_role, peeled, guard,
                         mutation, late_var))
    if wrapped:
        span = tiles.choice(TILE_SPANS)
        body = ["    for tile in xs.tile_range(t, persistent=1):", f"        nt = {span}"] + [
            "    " + re.sub(r"\bn\b", "nt", line) for line in body]
        scalars = scalars + ("t",)
    src = ["import xsync as xs", "", "", "@xs.kernel", f"def {name}({', '.join(scalars)}):"]
    src += decls + body
    return Protocol(name, "\n".join(src) + "\n", mutation, scalars, wrapped)


def _hold(rnd, groups, decls, reps, mutation):
    """Split counters and interleaved rings (issue 39.2), from a generator of their own so the
    other seeds' protocols stay what they were: a pipe's consumer may wait twice before it
    releases twice (its producer fills two slots), and an N -> N pipe with even stages may
    share one ring between its pairs. Mutations that pick a pipe side's ops by position keep
    the one-slot form."""
    if mutation in ("drop_release", "release_first", "drop_wait"):
        return
    for g in groups:
        if g.kind != "pipe":
            continue
        (src, prod), (dst, cons) = g.sides
        if rnd.random() < HOLD_SHARE:
            g.sides = [(src, prod + prod), (dst, [cons[0], cons[0], cons[1], cons[1]])]
        k = next(i for i, d in enumerate(decls) if d.startswith(f"    {g.obj} = xs.pipe("))
        m = re.search(r"stages=(\d+)\)", decls[k])
        if reps[src] == reps[dst] == 2 and int(m.group(1)) % 2 == 0 and rnd.random() < INTERLEAVE_SHARE:
            decls[k] = decls[k][:-1] + ", interleave=2)"


def _fill(lines: list[str]) -> list[str]:
    """``pass`` into every block left empty (a loop or branch whose groups all went away)."""
    out = []
    for k, line in enumerate(lines):
        out.append(line)
        if line.rstrip().endswith(":"):
            depth = len(line) - len(line.lstrip())
            nxt = lines[k + 1] if k + 1 < len(lines) else ""
            if not nxt or len(nxt) - len(nxt.lstrip()) <= depth:
                out.append(" " * (depth + 4) + "pass")
    return out


def _layout(rnd, groups, names, bound, nested, inner_bound, per_role, peeled, guard, mutation,
            late_var=None):
    """The kernel body: role blocks in a random order inside one shared loop (or per-role
    loops), each group's sides in their roles' blocks. ``late_var``: what a late-biting
    mutation tests (default: the loop counter)."""
    order = names[:]
    rnd.shuffle(order)
    muts = {"drop_release", "one_sided_cond", "release_first", "drop_wait", "barrier_skip"}
    target = rnd.choice(groups) if mutation in muts else None
    if mutation == "one_sided_cond" and target is not None:
        target.cond = target.cond or f"i % 2 == {rnd.randint(0, 1)}"
        target.only = rnd.randint(0, len(target.sides) - 1)

    # mutations that bite late: the first iteration where they differ is up to 8
    late_m = rnd.choice((2, 4, 8))
    late_pick = rnd.choice((f"%c % {late_m} != {late_m - 1}", f"%c != {rnd.randint(1, 8)}",
                            f"%c < {rnd.randint(2, 9)}"))

    def ops_of(role, inner, counter="i"):
        late = late_pick.replace("%c", late_var or counter)
        lines = []
        for g in groups:
            if g.inner != inner:
                continue
            for k, (r, ops) in enumerate(g.sides):
                if r != role:
                    continue
                ops = list(ops)
                if g is target:
                    if mutation == "drop_release" and g.kind == "pipe" and k == 1:
                        ops = [ops[0], f"if {late}:", "    " + ops[1]]
                    elif mutation == "release_first" and g.kind == "pipe" and k == 1:
                        ops = [ops[1], ops[0]]
                    elif mutation == "drop_wait" and g.kind != "barrier" and k == 1:
                        ops = [f"if {late}:", "    " + ops[0]] + ops[1:]
                    elif mutation == "barrier_skip" and g.kind == "barrier" and k == 0:
                        ops = [f"if {late}:", "    " + ops[0]]
                cond = g.cond if (g.only is None or g.only == k) else None
                if cond:
                    cond = cond.replace("i", counter) if counter != "i" else cond
                    lines.append(f"if {cond}:")
                    lines += ["    " + o for o in ops]
                else:
                    lines += ops
        return lines

    out = []
    pad = "    "
    if peeled:
        out.append(pad + "if n > 0:")
        for role in order:
            ops = ops_of(role, False, "0")
            if ops:
                out.append(pad + f"    with {role}:")
                out += [pad + "        " + o for o in ops]
        bound = "1, n"
    if per_role:
        other = "n - 1" if mutation == "short_loop" else bound
        for k, role in enumerate(order):
            ops = ops_of(role, False)
            if not ops:
                continue
            out.append(pad + f"with {role}:")
            out.append(pad + f"    for i in range({other if k == len(order) - 1 else bound}):")
            out += [pad + "        " + o for o in ops]
        return out
    if guard:
        out.append(pad + f"if {guard}:")
        pad += "    "
    loop_bound = bound
    out.append(pad + f"for i in range({loop_bound}):")
    lp = pad + "    "
    blocks = order[:]
    if mutation == "reorder":
        rnd.shuffle(blocks)
    first = len(out)
    for role in blocks:
        ops = ops_of(role, False)
        if ops:
            out.append(lp + f"with {role}:")
            out += [lp + "    " + o for o in ops]
    if nested:
        out.append(lp + f"for j in range({inner_bound}):")
        inner = len(out)
        for role in blocks:
            ops = ops_of(role, True, "j")
            if ops:
                out.append(lp + f"    with {role}:")
                out += [lp + "        " + o for o in ops]
        if len(out) == inner:
            out.append(lp + "    pass")
    if len(out) == first:
        out.append(lp + "pass")
    if mutation == "short_loop" and not per_role:
        # the last group's consumer side also runs once more after the loop
        g = groups[-1]
        if g.kind != "barrier":
            role, ops = g.sides[0]
            out.append(pad + f"with {role}:")
            out += [pad + "    " + o for o in ops]
    if mutation == "stray_signal":
        ev = [g for g in groups if g.kind == "event"]
        if ev:
            role, ops = ev[0].sides[0]
            out.append(pad + f"with {role}:")
            out.append(pad + "    " + ops[0])
    return out


# ---------------------------------------------------------------- checking
@dataclass
class Outcome:
    name: str
    verdicts: dict = field(default_factory=dict)   # backend -> "ok" | error class name
    emulator: str = ""
    disagreement: str = ""


def load(protocols: list[Protocol], directory: str):
    """Write the kernels to one module in ``directory`` and import it (the frontend reads
    kernel sources with inspect, so they must live in a real file)."""
    path = os.path.join(directory, f"protos_{protocols[0].name}.py")
    with open(path, "w") as f:
        f.write("import xsync as xs\n\n")
        for p in protocols:
            f.write("\n\n" + p.source.split("\n", 3)[3])
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_MATCH = {"DeadlockError": "StallError", "LeftoverError": "LeftoverError",
          "SlotOrderError": "SlotOrderError"}


def _verdict(kernel, backend):
    from xsync.errors import XSyncError

    try:
        # a bounded verdict is accepted here: the emulator runs decide whether it holds
        kernel.lower(backend, check=True, accept_bounded=True)
        return "ok", None
    except XSyncError as err:
        return type(err).__name__, err


def _emulate(kernel, scalars, values, programs=1):
    import xsync as xs
    from xsync.errors import XSyncError

    args = [values.get(s, 0) for s in scalars]
    with xs.options(verify=False, cpu_mode="cooperative", cpu_timeout=30):
        try:
            kernel[(programs,)](*args, backend="cpu")
            return "ok", None
        except XSyncError as err:
            return type(err).__name__, err


def _tile_grid(proto: Protocol):
    """(programs, values) the emulator runs a tile-loop protocol at."""
    ms = range(4) if "m" in proto.scalars else (0,)
    return [(p, {"t": t, "n": n, "m": m}) for p in TILE_PROGRAMS for t in TILE_COUNTS
            for n in TILE_N for m in ms]


def check(kernel, proto: Protocol) -> Outcome:
    out = Outcome(proto.name)
    cpu, err = _verdict(kernel, "cpu")
    out.verdicts["cpu"] = cpu
    if proto.tiles and (cpu == "ok" or cpu in _MATCH):
        # a counterexample of the tile-by-tile check names a tile's coordinates, not a launch:
        # a rejected protocol must fail on the emulator at its counterexample where that is a
        # launch, else somewhere on the grid; an accepted one nowhere
        grid = _tile_grid(proto)
        values = getattr(err, "scalars", None) or {}
        if cpu != "ok":
            # the scalars the counterexample names keep their values on the grid
            known = {v: values[v] for v in proto.scalars if v in values}
            grid = [(programs, dict(point, **known)) for programs, point in grid]
            if len(known) == len(proto.scalars):
                grid.insert(0, (values.get("xs.num_programs(0)", 1), known))
        for programs, values in grid:
            got, e = _emulate(kernel, proto.scalars, values, programs)
            if got != "ok":
                out.emulator = got
                if cpu == "ok":
                    out.disagreement = (f"accepted, but the emulator raises {got} with {programs} "
                                        f"program(s), {values}:\n{e}")
                    return out
                break
        else:
            out.emulator = "ok"
            if cpu != "ok":
                out.disagreement = (f"rejected with {cpu}, but the emulator runs cleanly on every "
                                    f"grid point:\n{err}")
                return out
    elif cpu == "ok":
        grid = [(n, m) for n in range(BOUND + 1) for m in range(M_BOUND + 1)] \
            if "m" in proto.scalars else [(n, 0) for n in range(BOUND + 1)]
        for n, m in grid:
            got, e = _emulate(kernel, proto.scalars, {"n": n, "m": m})
            if got != "ok":
                out.emulator = got
                out.disagreement = (f"accepted, but the emulator raises {got} with n = {n}, m = {m}:\n{e}")
                return out
        out.emulator = "ok"
    elif cpu in _MATCH:
        values = getattr(err, "scalars", {})
        got, e = _emulate(kernel, proto.scalars, values)
        out.emulator = got
        if got != _MATCH[cpu]:
            shown = ", ".join(f"{k} = {v}" for k, v in values.items())
            out.disagreement = (f"rejected with {cpu} at {shown or 'no scalars'}, but the emulator "
                                f"gives {got} there:\n{err}\n{e or ''}")
            return out
    else:
        out.emulator = "-"    # a source or placement error: nothing to run
    for backend in ("nvidia", "ascend"):
        v, e = _verdict(kernel, backend)
        out.verdicts[backend] = v
        if v != cpu and v != "ok" and not _explained(e):
            out.disagreement = (f"cpu says {cpu}, {backend} says {v} without saying why the "
                                f"placement changes the protocol:\n{e}")
            return out
    return out


def _explained(err) -> bool:
    """A verdict that differs from the CPU's names the placement fact behind it."""
    from xsync.errors import CounterLimitError

    msg = str(err)
    return isinstance(err, CounterLimitError) or "placement: " in msg or "share agent" in msg \
        or "one after another" in msg or "no arrive-only form" in msg


def run(seeds, directory=None, batch=50, verbose=False, gather=False) -> list[Outcome]:
    """Generate, load and check protocols for ``seeds`` (``gather``: with N -> 1 pipes, see
    :func:`generate`); return every outcome."""
    own = directory is None
    directory = directory or tempfile.mkdtemp(prefix="xsync-protos-")
    if directory not in sys.path:
        sys.path.insert(0, directory)
    outcomes = []
    seeds = list(seeds)
    for start in range(0, len(seeds), batch):
        protos = [generate(s, gather) for s in seeds[start:start + batch]]
        module = load(protos, directory)
        for p in protos:
            from xsync.errors import XSyncError
            try:
                kernel = getattr(module, p.name)
            except AttributeError:
                continue
            try:
                o = check(kernel, p)
            except XSyncError as err:   # a frontend rejection of the whole kernel
                o = Outcome(p.name, {"cpu": type(err).__name__}, "-")
            if verbose and o.disagreement:
                print(p.source, o.disagreement, sep="\n", flush=True)
            outcomes.append(o)
    if own:
        import shutil
        shutil.rmtree(directory, ignore_errors=True)
    return outcomes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="differential test: verifier vs CPU emulator")
    ap.add_argument("--seeds", default="0:2000", help="range start:stop of generator seeds")
    ap.add_argument("--gather", action="store_true", help="pipes may run from 2 replicas to 1")
    args = ap.parse_args(argv)
    lo, hi = (int(x) for x in args.seeds.split(":"))
    t = time.perf_counter()
    outcomes = run(range(lo, hi), verbose=True, gather=args.gather)
    bad = [o for o in outcomes if o.disagreement]
    counts: dict = {}
    for o in outcomes:
        counts[o.verdicts.get("cpu")] = counts.get(o.verdicts.get("cpu"), 0) + 1
    print(f"{len(outcomes)} protocols in {time.perf_counter() - t:.1f} s; cpu verdicts {counts}; "
          f"{len(bad)} disagreement(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
