"""Generated Python source, compiled once per process: the episode sweep
(``sweep_source``) and the compile-and-cache step every generated function of the verifier
goes through (``generated``)."""
from __future__ import annotations

import math

from xsync.lowering.verifier.forms import FAILS, cdiv

CACHE_CAP = 512            # generated functions kept per cache
SWEEPS: dict = {}          # generated sweep source -> function (process-wide cache)


def generated(source: str, name: str, label: str):
    """Function ``name`` of generated ``source``, compiled once per process (``SWEEPS``):
    the episode sweep (``sweep_source``) and its images (``episodes.images_source``)."""
    fn = SWEEPS.get(source)
    if fn is None:
        if len(SWEEPS) >= CACHE_CAP:
            SWEEPS.clear()
        ns = {"_cdiv": cdiv}
        exec(compile(source, f"<xsync {label}>", "exec"), ns)  # noqa: S102
        fn = SWEEPS[source] = ns[name]
    return fn


def sweep_source(lens, n_axes, stride, lets, bounds, carried, depth, tiles=False) -> str:
    """Source of ``_sweep(D, visit)`` for ``episodes.episode_sweep``: loops over dimensions
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
    own_lets = (_distinct_values(out, n_axes, lets, bounds_reads, carried, depth, tiles)
                if stride == 1 else {})

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
            out.append(pad + f"except {FAILS}:")
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


def _distinct_values(out: list, n_axes, lets, bounds_reads, carried, depth, tiles) -> dict[int, list]:
    """For ``sweep_source`` without a stride: dimension -> its own assignments (local, code),
    for each dimension whose value nothing else reads; ``out`` gets the loop that computes
    the distinct values of those assignments (``U<j>``) once."""
    own_lets: dict[int, list] = {}      # dimension -> its own assignments (local, code)
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
            out.append(f"        except {FAILS}:")
            out.append("            continue")
        out += [f"        t{j} = {t}", f"        if t{j} not in u{j}:",
                f"            u{j}.add(t{j})", f"            U{j}.append(t{j})"]
    return own_lets
