"""Symbolic forms of a kernel's scalars: what a loop bound or branch condition is, written
over the free scalars (``Atom``, ``CutVar``), loop counters (``LoopVar``), named values
(``Named``), merged branches (``Select``) and values the scalars cannot express (``Opaque``);
their walks, and their Python spelling for generated code."""
from __future__ import annotations

from dataclasses import dataclass

from xsync.lowering import ir
from xsync.lowering.ir import TileOp

# what evaluating a value, bound or condition raises where it has no value at some scalars
EVALUATION_FAILS = (KeyError, TypeError, ZeroDivisionError, ValueError)
# EVALUATION_FAILS as generated code spells it
FAILS = "(" + ", ".join(e.__name__ for e in EVALUATION_FAILS) + ")"


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
    # assigned inside a loop (the same value at every iteration): relaxed only (relaxation.py),
    # never cut exactly, so that the exact check enumerates what it did before
    in_loop: bool = False


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


def form_children(x):
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


def form_nodes(x) -> tuple:
    """Every node of ``x`` in pre-order (a tuple, computed once per form: nested generators
    pass each node up through every level, which made the walks quadratic in the depth)."""
    got = _NODES.get(id(x))
    if got is not None and got[0] is x:
        return got[1]
    out, stack = [], [x]
    while stack:
        n = stack.pop()
        out.append(n)
        kids = form_children(n)
        if kids:
            stack.extend(reversed(kids))
    if len(_NODES) >= _WALK_CAP:
        _NODES.clear()
    out = _NODES[id(x)] = (x, tuple(out))
    return out[1]


def has_node(x, pred) -> bool:
    for n in form_nodes(x):
        if pred(n):
            return True
    return False


def is_dynamic(x) -> bool:
    for n in form_nodes(x):
        if n is DYN or isinstance(n, (LoopVar, Opaque)):
            return True
    return False


def free_scalars(x) -> set:
    got = _FREE.get(id(x))
    if got is None or got[0] is not x:
        if len(_FREE) >= _WALK_CAP:
            _FREE.clear()
        got = _FREE[id(x)] = (x, frozenset(n for n in form_nodes(x) if isinstance(n, (Atom, CutVar, Opaque))))
    return set(got[1])


def substitute(x, fn):
    """Rebuild ``x`` bottom-up with ``fn(node)`` (None: keep)."""
    r = fn(x)
    if r is not None:
        return r
    if isinstance(x, ir.BinOp):
        return ir.BinOp(x.op, substitute(x.left, fn), substitute(x.right, fn))
    if isinstance(x, ir.Compare):
        return ir.Compare(x.op, substitute(x.left, fn), substitute(x.right, fn))
    if isinstance(x, ir.UnaryOp):
        return ir.UnaryOp(x.op, substitute(x.operand, fn))
    if isinstance(x, ir.BoolOp):
        return ir.BoolOp(x.op, tuple(substitute(v, fn) for v in x.values))
    if isinstance(x, ir.Call):
        return ir.Call(x.op, tuple(substitute(a, fn) for a in x.args))
    if isinstance(x, Named):
        return Named(x.name, x.line, substitute(x.value, fn), x.in_loop)
    if isinstance(x, Select):
        return Select(substitute(x.cond, fn), substitute(x.a, fn), substitute(x.b, fn))
    if isinstance(x, tuple):
        return tuple(substitute(v, fn) for v in x)
    return x


# ---------------------------------------------------------------- code generation
def to_python(x, var) -> str:
    """Python source of a symbolic form; ``var(node)`` names atoms / cut vars / named values."""
    if isinstance(x, ir.Const):
        return repr(x.value)
    if isinstance(x, (Atom, CutVar, Opaque, Named)):
        return var(x)
    if isinstance(x, ir.BinOp):
        return f"({to_python(x.left, var)} {x.op} {to_python(x.right, var)})"
    if isinstance(x, ir.Compare):
        return f"({to_python(x.left, var)} {x.op} {to_python(x.right, var)})"
    if isinstance(x, ir.UnaryOp):
        return f"({x.op} {to_python(x.operand, var)})" if x.op == "not" else f"({x.op}{to_python(x.operand, var)})"
    if isinstance(x, ir.BoolOp):
        return "(" + f" {x.op} ".join(to_python(v, var) for v in x.values) + ")"
    if isinstance(x, ir.Call):
        a = [to_python(v, var) for v in x.args]
        if x.op is TileOp.CDIV:
            return f"(-((-{a[0]}) // {a[1]}))"
        if x.op in (TileOp.MINIMUM, TileOp.MAXIMUM):
            return f"{'min' if x.op is TileOp.MINIMUM else 'max'}({a[0]}, {a[1]})"
        if x.op is TileOp.WHERE:
            return f"({a[1]} if {a[0]} else {a[2]})"
    if isinstance(x, Select):
        return f"({to_python(x.a, var)} if {to_python(x.cond, var)} else {to_python(x.b, var)})"
    raise TypeError(f"no scalar code for {x!r}")


def env_ref(key: str) -> str:
    return f"E[{key!r}]"


def cdiv(a, b):
    return -(-a // b)


def trip(start, stop, step) -> int:
    """Iterations of range(start, stop, step)."""
    return max(0, -((start - stop) // step))


def division_of(node):
    """(dividend, divisor) of ``a // b``, ``a % b`` or ``xs.cdiv(a, b)``; None for another node."""
    if isinstance(node, ir.BinOp) and node.op in ("//", "%"):
        return node.left, node.right
    if isinstance(node, ir.Call) and node.op is TileOp.CDIV and len(node.args) == 2:
        return node.args[0], node.args[1]
    return None


def int_constants(nodes) -> list[int]:
    """The absolute values of the integer constants among ``nodes`` (booleans are not)."""
    return [abs(c.value) for c in nodes if isinstance(c, ir.Const) and isinstance(c.value, int)
            and not isinstance(c.value, bool)]


def static_parts(form) -> list:
    """Maximal counter-free sub-forms of ``form`` that read a free scalar."""
    if not is_dynamic(form):
        return [form] if free_scalars(form) else []
    out = []
    for c in form_children(form):
        out += static_parts(c)
    return out


def iterations_ahead(form, counter: "LoopVar", stop, step) -> bool:
    """Whether ``form`` is ``counter + j * step < stop`` (j >= 1) for a loop ``range(start,
    stop, step)`` with a positive constant step: at iteration k it holds iff k + j is less than
    the trip count (start + (k + j) * step < stop), which the loop observes already, so its
    counter-free parts need no observation of their own (a rotated loop's guard: the
    cross-agent-pipeline pass)."""
    if not (isinstance(form, ir.Compare) and form.op == "<" and form.right == stop
            and not has_node(stop, lambda x: x is DYN)
            and isinstance(form.left, ir.BinOp) and form.left.op == "+" and form.left.left == counter):
        return False
    ahead = form.left.right
    return isinstance(step, ir.Const) and isinstance(step.value, int) and step.value > 0 \
        and isinstance(ahead, ir.Const) and isinstance(ahead.value, int) \
        and ahead.value > 0 and ahead.value % step.value == 0


def divides_by_scalar(form) -> bool:
    for n in form_nodes(form):
        if isinstance(n, ir.BinOp) and n.op in ("//", "%", "/") and not isinstance(n.right, ir.Const):
            return True
        if isinstance(n, ir.Call) and n.op is TileOp.CDIV and not isinstance(n.args[1], ir.Const):
            return True
    return False


def divides_by_zero(form) -> bool:
    for n in form_nodes(form):
        right = n.right if isinstance(n, ir.BinOp) and n.op in ("//", "%", "/") else (
            n.args[1] if isinstance(n, ir.Call) and n.op is TileOp.CDIV else None)
        if isinstance(right, ir.Const) and not right.value:
            return True
    return False


def linear_in(x, mine) -> bool:
    """Whether the counter occurs in ``x`` outside every modulus (so ``x`` grows with it)."""
    if mine(x):
        return True
    if isinstance(x, ir.BinOp) and x.op == "%":
        return False
    return any(linear_in(c, mine) for c in form_children(x))


def is_private(form, nm: Named, inside) -> bool:
    """Every occurrence of ``inside`` in ``form`` lies within an occurrence of ``nm``."""
    if form == nm:
        return True
    if isinstance(form, (Atom, CutVar)):
        return form not in inside
    return all(is_private(c, nm, inside) for c in form_children(form))


def is_surjective(value) -> bool:
    """``value`` adds or subtracts a free integer scalar occurring once: it takes every integer."""
    counts: dict = {}
    for n in form_nodes(value):
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


def form_size(x) -> int:
    return sum(1 for _ in form_nodes(x))
