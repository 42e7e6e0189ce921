"""Relaxation: a named value taken as a free integer of its own, so that a kernel whose scalars
are too many to combine is still proven (docs/verifier.md, "Relaxed values")."""
from __future__ import annotations

from xsync.lowering.verifier.forms import Atom, CutVar, Named, form_nodes, form_size, free_scalars, substitute
from xsync.lowering.verifier.observations import Observation


def relax_one(sc) -> str | None:
    """Take one more named value as a free integer of its own (``docs/verifier.md``,
    "Relaxed values"): the largest one that a bound or condition reads, whose definition is
    the same in every instance and reads only free scalars. The runs it then allows include
    every run the kernel can make (its value is one of the integers tried, whatever the
    other scalars are), and more: a verdict found clean is a proof, a bug found may be one
    no real values reach (``check.falsify`` looks for them). None: nothing left to relax."""
    forms = sc._all_forms()
    named = {n for f in forms for n in form_nodes(f) if isinstance(n, Named)}
    by_key: dict = {}
    for n in named:
        by_key.setdefault((n.name, n.line), set()).add(n)
    for nm in sorted(named, key=lambda n: (-form_size(n), n.name, n.line)):
        key = (nm.name, nm.line)
        inside = free_scalars(nm.value)
        if len(by_key[key]) > 1 or key in sc.cut or key in sc.episode_images:
            continue          # per instance (a replica's rows): one value would merge them
        if not inside or not all(isinstance(a, (Atom, CutVar)) for a in inside):
            continue
        sc.cut[key] = nm.value
        sc.relaxed[key] = nm.value
        repl = CutVar(nm.name, nm.line)
        sub = lambda x, c=nm, r=repl: r if x == c else None  # noqa: E731
        sc.observations = {Observation(o.kind, substitute(o.form, sub), substitute(o.guard, sub),
                                       o.loop_line, o.uses_var): None
                           for o in sc.observations}
        sc._counter_trips = {Observation(o.kind, substitute(o.form, sub), substitute(o.guard, sub),
                                         o.loop_line, o.uses_var): None
                             for o in sc._counter_trips}
        sc._unit_memo.clear()
        sc._unrollers = sc._tracers = None
        return nm.name
    return None

