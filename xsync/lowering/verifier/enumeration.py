"""The product of the candidate sets, run as generated code: per distinct tuple of
observation values, the first combination of candidates (in loop order) that gives it.
Dimensions that no observation links are enumerated apart (``independent``)."""
from __future__ import annotations

import itertools

from xsync.lowering import ir
from xsync.lowering.ir import TileOp
from xsync.lowering.verifier.codegen import CACHE_CAP
from xsync.lowering.verifier.forms import (Atom, CutVar, Named, Select, divides_by_scalar, divides_by_zero,
                                           form_nodes, free_scalars, substitute, to_python)
from xsync.lowering.verifier.observations import Observation

# the enumeration's memos in its innermost loop (``product``): off only to test that
# they change nothing (tests/core/test_verifier_work.py)
OBS_MEMO = True
PRODUCTS: dict = {}        # generated enumeration source -> function (process-wide cache)


def slots(names) -> dict:
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

def independent(names, dims, obs):
    """``product``'s dict for the whole product, built from groups of dimensions that no
    observation links, or None where that does not apply (one group; a dimension with
    repeated values; an observation that divides or steps by a scalar, whose
    failures skip the rest of the product in loop order)."""
    n = len(dims)
    if n < 2:
        return None
    index = slots(names)

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
                divides_by_scalar(f) for f in forms):
            return None
        reads.append({dim_of(v) for f in forms for v in free_scalars(f)} - {-1})
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
        sub = product([names[j] for j in members], [dims[j] for j in members],
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


def product(names, dims, obs) -> dict:
    """Observation tuple -> the first combination of ``dims`` (in loop order) giving it."""
    source = _ProductSource(names, dims, obs).source()
    fn = PRODUCTS.get(source)
    if fn is None:
        if len(PRODUCTS) >= CACHE_CAP:
            PRODUCTS.clear()
        ns: dict = {}
        exec(compile(source, "<xsync scalars>", "exec"), ns)  # noqa: S102
        fn = PRODUCTS[source] = ns["_run"]
    found: dict = {}
    fn(dims, found)
    return found


class _ProductSource:
    """The source of ``_run(D, out)`` for ``product``: nested loops over the dimensions, each
    observation computed at the depth of the last scalar it reads (``depth``), the deeper
    loops skipped when every deeper observation sits under a branch not taken (``emit``),
    and the innermost loop's list built once per value of what it reads (``last``)."""

    def __init__(self, names, dims, obs):
        self.index = slots(names)
        self.dims = dims
        # A named value is computed once, at the depth of the last scalar it reads, into a
        # local (``n0 = ...``) that every observation reading it shares -- where no
        # observation can fail (nothing divides by a scalar or by zero): evaluated ahead of
        # the guards it sits under, it then gives the same values and raises nothing.
        self.shared = not any(
            (o.kind == "trip" and not isinstance(o.form[2], ir.Const))
            or any(divides_by_scalar(f) or divides_by_zero(f)
                   for f in (list(o.form) if o.kind == "trip" else [o.form]) + [g for g, _ in o.guard])
            for o in obs)
        # Where every scalar value is a plain int, a sum in an observation of the innermost
        # scalar is regrouped: its terms that do not read that scalar become one named value
        # (``v2 + n3`` for ``((v0 + 128) + v2) - v1``, n3 = (v0 + 128) - v1), computed outside
        # the innermost loop. Integer sums do not depend on the order of their terms, and
        # nothing here fails (``shared``), so the values are the same; the innermost loop is
        # then built once per value of n3 rather than per (v0, v1) (``last``).
        n = self.n = len(dims)
        self.int_dims = {i for i, d in enumerate(dims) if d and all(
            type(x) is int or (type(x) is tuple and all(type(y) is int for y in x)) for x in d)}
        self.exact = self.shared and n >= 2 and n - 1 in self.int_dims
        self.obs = self.regrouped(obs) if self.exact else obs
        self.locals_of: dict = {}            # Named -> local name
        self.defs: dict[int, list[tuple[str, str]]] = {}   # depth -> (local, code) of the named values there
        # the locals the line being spelled reads (a stack: a named value's definition is
        # spelled inside the line that first reads it), and per generated local (n<i>, o<k>)
        # the locals its line reads
        self.reading: list[set] = [set()]
        self.line_reads: dict[str, set] = {}
        self.levels: dict[int, list[str]] = {}
        self.risky: dict[int, bool] = {}     # a level divides by a scalar (or steps by one)
        self.guard_depth, self.obs_depth, self.obs_forms = [], [], []
        self.shown: list = []
        self.keys = ""
        self.out: list[str] = []

    def slot(self, x):
        index = self.index
        if isinstance(x, Atom):
            return index[x.key]
        if isinstance(x, CutVar):
            return index[("cut", x.name, x.line)]
        return index.get(("opaque", x.key), (-1, "None"))

    def depth(self, forms) -> int:
        return max((self.slot(v)[0] for f in forms for v in free_scalars(f)), default=-1)

    def int_safe(self, x) -> bool:
        """Whether ``x`` is an exact int whatever the (int) scalars are."""
        if isinstance(x, ir.Const):
            return type(x.value) is int
        if isinstance(x, (Atom, CutVar)):
            return self.slot(x)[0] in self.int_dims
        if isinstance(x, Named):
            return self.int_safe(x.value)
        if isinstance(x, ir.BinOp):
            return x.op in ("+", "-", "*", "//", "%") and self.int_safe(x.left) and self.int_safe(x.right)
        if isinstance(x, ir.UnaryOp):
            return x.op == "-" and self.int_safe(x.operand)
        if isinstance(x, ir.Call):
            if x.op in (TileOp.CDIV, TileOp.MINIMUM, TileOp.MAXIMUM):
                return all(self.int_safe(a) for a in x.args)
            return x.op is TileOp.WHERE and self.int_safe(x.args[1]) and self.int_safe(x.args[2])
        if isinstance(x, Select):
            return self.int_safe(x.a) and self.int_safe(x.b)
        return False

    def regrouped(self, obs) -> list:
        """``obs`` with each sum over the innermost scalar regrouped (see ``__init__``)."""
        inner_dim = self.n - 1
        slot, int_safe = self.slot, self.int_safe

        def reads_inner(x) -> bool:
            return any(slot(v)[0] == inner_dim for v in free_scalars(x))

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
            mine = [(sg, substitute(t, top)) for sg, t in terms if reads_inner(t)]
            return ir.BinOp("+", chain(mine), Named("_outer", 0, chain(rest)))

        return [Observation(o.kind, substitute(o.form, top), tuple((substitute(g, top), pol) for g, pol in o.guard),
                           o.loop_line, o.uses_var) for o in obs]

    def var(self, x):
        """The spelling of a free scalar or named value (a named value's definition on first use)."""
        shared, locals_of, reading, line_reads, defs = (self.shared, self.locals_of, self.reading,
                                                        self.line_reads, self.defs)
        var, depth, slot = self.var, self.depth, self.slot
        if isinstance(x, Named):
            if not shared:
                return to_python(x.value, var)
            got = locals_of.get(x)
            if got is None:
                reading.append(set())
                code = to_python(x.value, var)      # the named values it reads come first
                got = locals_of[x] = f"n{len(locals_of)}"
                line_reads[got] = reading.pop()
                defs.setdefault(depth([x.value]), []).append((got, code))
            reading[-1].add(got)
            return got
        name = slot(x)[1]
        reading[-1].add(name.split("[")[0])     # v0[0]: the program-id pair v0
        return name

    def common_subforms(self) -> dict:
        """Observation -> (form, guard) as spelled, where a sub-form that several observations
        (or guards) repeat is a named value of its own (computed once, as ``var`` spells it)."""
        obs, shared = self.obs, self.shared
        spelled = {}                    # observation -> (form, guard) as rendered
        if shared:
            counts: dict = {}
            for o in obs:
                for f in (list(o.form) if o.kind == "trip" else [o.form]) + [g for g, _ in o.guard]:
                    for x in form_nodes(f):
                        if isinstance(x, (ir.BinOp, ir.Compare, ir.UnaryOp, ir.BoolOp, ir.Call, Select)):
                            counts[x] = counts.get(x, 0) + 1
            common = {x: Named("_shared", k, x) for k, x in enumerate(x for x, c in counts.items()
                                                                    if c > 1 and free_scalars(x))}
            if common:
                sub = common.get
                for o in obs:
                    spelled[o] = (substitute(o.form, sub), tuple((substitute(g, sub), p) for g, p in o.guard))
        return spelled

    def spell_observations(self, spelled: dict):
        """Each observation's line ``o<k> = (value) if (guard) else None``, at its depth."""
        obs, var, depth, reading, line_reads = self.obs, self.var, self.depth, self.reading, self.line_reads
        levels, risky, defs = self.levels, self.risky, self.defs
        guard_depth, obs_depth, obs_forms = self.guard_depth, self.obs_depth, self.obs_forms
        shown = self.shown = [Observation(o.kind, *spelled[o], o.loop_line, o.uses_var) if o in spelled else o
                              for o in obs]
        for k, o in enumerate(obs):
            guards = [g for g, _ in o.guard]
            forms = list(o.form) if o.kind == "trip" else [o.form]
            o = shown[k]
            d = depth(forms + guards)
            if (o.kind == "trip" and not isinstance(o.form[2], ir.Const)) or any(
                    divides_by_scalar(f) for f in forms + guards):
                risky[d] = True
            obs_depth.append(d)
            obs_forms.append(forms + guards)
            guard_depth.append(depth(guards))
            reading.append(set())
            guard = " and ".join(f"({to_python(g, var)})" if pol else f"(not {to_python(g, var)})"
                                 for g, pol in o.guard) or "True"
            if o.kind == "trip":
                s0, s1, s2 = (to_python(x, var) for x in o.form)
                t = f"max(0, -((({s0}) - ({s1})) // ({s2})))"
                value = f"({t}, {s0}, {s2})" if o.uses_var else t
            elif o.kind == "cond":
                value = f"bool({to_python(o.form, var)})"
            else:
                value = to_python(o.form, var)
            line_reads[f"o{k}"] = reading.pop()
            levels.setdefault(d, []).append(f"o{k} = ({value}) if ({guard}) else None")
        for d, pairs in defs.items():
            levels[d] = [f"{local} = {code}" for local, code in pairs] + levels.get(d, [])

    def source(self) -> str:
        self.spell_observations(self.common_subforms())
        obs, n, levels = self.obs, self.n, self.levels
        keys = ", ".join(f"o{k}" for k in range(len(obs)))
        keys = self.keys = f"({keys}{',' if len(obs) == 1 else ''})"
        out = self.out
        out.append("def _run(D, out):")
        pad = "    "
        out += [pad + ln for ln in levels.get(-1, [])]
        if n == 0:
            out.append(pad + f"key = {keys}")
            out.append(pad + "out[key] = ()")
        else:
            out.append(pad + "_memo, _added, _om, _vm = {}, {}, {}, {}")
            self.emit(-1, pad)
        return "\n".join(out) + "\n"

    def emit(self, level, pad):
        obs, shown, out, n, keys = self.obs, self.shown, self.out, self.n, self.keys
        obs_depth, guard_depth, levels, risky, var = (self.obs_depth, self.guard_depth, self.levels,
                                                      self.risky, self.var)
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
                "(" + (" and ".join(f"({to_python(g, var)})" if pol else f"(not {to_python(g, var)})"
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
            self.last(j, pad)
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
        self.emit(j, inner)

    def last(self, j, pad):
        # The innermost loop. Its observations read v{j} and a few outer scalars; for given
        # values of those they are one list, whatever the other outer scalars are: built
        # once (``_memo``), keeping the first value of v{j} for each distinct tuple of them
        # -- a later one gives a key already in ``out``. ``_added[outer observations]``
        # holds the tuples whose key is in ``out``: a prefix whose tuples are all there
        # adds nothing.
        obs, out, n, keys = self.obs, self.out, self.n, self.keys
        obs_depth, levels, risky, defs = self.obs_depth, self.levels, self.risky, self.defs
        here = [k for k in range(len(obs)) if obs_depth[k] == j]
        outer = [k for k in range(len(obs)) if obs_depth[k] < j]
        key, values_of, inner_defs = self.memo_keys(j, here)
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

    def memo_keys(self, j, here) -> tuple:
        """(the locals the innermost loop's list is keyed by, the locals its observations read
        where one tuple of them stands for every v{j} that gives it (None: no such memo), the
        locals defined at depth j)."""
        obs_forms, locals_of, defs, line_reads = self.obs_forms, self.locals_of, self.defs, self.line_reads
        exact, int_dims, int_safe, risky, slot = self.exact, self.int_dims, self.int_safe, self.risky, self.slot
        inner_defs: list = []
        reads = sorted({slot(v)[0] for k in here for f in obs_forms[k] for v in free_scalars(f)} - {j, -1})
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
            if OBS_MEMO and here and not risky.get(j) and f"v{j}" not in seen_by and all(map(exact_local, seen_by)):
                values_of = seen_by
        return key, values_of, inner_defs


def thinned(dims, limit: int, rng) -> list:
    """``dims`` with the largest sets cut, one at a time, to random subsets (order kept) until
    their product is at most ``limit``; every set keeps at least two values (or all it has)."""
    keep = [len(d) for d in dims]

    def size():
        out = 1
        for k in keep:
            out *= max(1, k)
        return out
    while size() > limit:
        i = max(range(len(keep)), key=lambda j: keep[j])
        if keep[i] <= 2:
            break
        keep[i] = max(2, keep[i] // 2)
    return [d if k >= len(d) else [d[j] for j in sorted(rng.sample(range(len(d)), k))]
            for d, k in zip(dims, keep)]
