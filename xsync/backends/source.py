"""Shared Python-source emitter for the renderers.

All three targets (torch threads, Gluon, triton-ascend) are Python: every renderer writes
through an :class:`Emitter` and parenthesizes by :data:`PRECEDENCE`; the CPU and Ascend
renderers subclass :class:`PythonRenderer`, which walks the IR while they spell the tile ops,
sync verbs and dtypes (the Hopper renderer's value speller spells typed expressions itself,
xsync/backends/nvidia/values.py). Generated code keeps the kernel's own names and cites the
kernel's lines.
"""
from __future__ import annotations

from xsync.lowering import ir

PRECEDENCE = {"or": 1, "and": 2, "not": 3, "cmp": 4, "|": 5, "^": 6, "&": 7, "<<": 8, ">>": 8,
               "+": 9, "-": 9, "*": 10, "/": 10, "//": 10, "%": 10, "unary": 11}


def float_literal(v: float) -> str:
    """A float as Python source; inf and nan have no literal (``float("inf")`` parses in
    Python, Gluon and triton-ascend alike)."""
    if v != v:
        return 'float("nan")'
    if v in (float("inf"), float("-inf")):
        return 'float("inf")' if v > 0 else 'float("-inf")'
    return repr(v)


def label(text: str) -> str:
    """A user's label (a role name is any string) as comment or docstring text: as written when
    it is printable and has no quote or backslash, else escaped (no newline or quotes survive)."""
    if text.isprintable() and not set(text) & set("\"'\\"):
        return text
    return ascii(text).replace('"', "\\x22")


def doc_text(text: str) -> str:
    """A line of a generated docstring: as written unless it could end the docstring early."""
    if text.isprintable() and "\\" not in text and '"' not in text:
        return text
    return label(text)


class Emitter:
    """Collects indented lines."""

    def __init__(self):
        self.lines: list[str] = []
        self.depth = 0

    def line(self, text: str = ""):
        if "\n" in text or "\r" in text:   # a user's label in a comment: one line stays one line
            text = text.replace("\r", "\\r").replace("\n", "\\n")
        self.lines.append(("    " * self.depth + text) if text else "")

    def indent(self):
        self.depth += 1

    def dedent(self):
        self.depth -= 1

    def source(self) -> str:
        return "\n".join(self.lines) + "\n"


class PythonRenderer:
    """Renders IR expressions as Python; subclasses spell the target's ops.

    Subclasses keep their lines in ``self.out`` (an :class:`Emitter`)."""

    out: Emitter

    # ------------------------------------------------------------ control flow
    def emit_for(self, s: ir.For, body):
        """``for var in range(start, stop, step):`` with ``body(stmts)`` rendering the body;
        a single-tile loop (one program per tile) as ``var = start`` and ``if var < stop:``."""
        o = self.out
        if s.single_tile:
            o.line(f"{self.name(s.var)} = {self.expr(s.start)}  # one tile per program")
            o.line(f"if {self.name(s.var)} < {self.expr(s.stop)}:")
        else:
            o.line(f"for {self.name(s.var)} in range({self.expr(s.start)}, {self.expr(s.stop)}, "
                   f"{self.expr(s.step)}):")
        o.indent()
        body(s.body)
        o.dedent()

    def emit_if(self, s: ir.If, body):
        """``if cond: ... else: ...`` with ``body(stmts)`` rendering each branch."""
        o = self.out
        o.line(f"if {self.expr(s.cond)}:")
        o.indent()
        body(s.body)
        o.dedent()
        if s.orelse:
            o.line("else:")
            o.indent()
            body(s.orelse)
            o.dedent()

    def expr(self, e, parent: int = 0) -> str:
        if isinstance(e, ir.Const):
            return self.const(e.value)
        if isinstance(e, ir.Name):
            return self.name(e.id)
        if isinstance(e, ir.BinOp):
            p = PRECEDENCE[e.op]
            out = f"{self.expr(e.left, p)} {e.op} {self.expr(e.right, p + 1)}"
            return f"({out})" if p < parent else out
        if isinstance(e, ir.Compare):
            p = PRECEDENCE["cmp"]
            out = f"{self.expr(e.left, p + 1)} {e.op} {self.expr(e.right, p + 1)}"
            return f"({out})" if p < parent else out
        if isinstance(e, ir.BoolOp):
            # Triton refuses a chain (A or B or C): pairs, left to right
            p = PRECEDENCE[e.op]
            out = self.expr(e.values[0], p + 1)
            for v in e.values[1:]:
                out = f"{out} {self.bool_op(e.op)} {self.expr(v, p + 1)}"
                if v is not e.values[-1]:
                    out = f"({out})"
            return f"({out})" if p < parent else out
        if isinstance(e, ir.UnaryOp):
            p = PRECEDENCE["unary"] if e.op != "not" else PRECEDENCE["not"]
            op = "not " if e.op == "not" else e.op
            out = f"{op}{self.expr(e.operand, p)}"
            return f"({out})" if p < parent else out
        if isinstance(e, ir.TupleExpr):
            return "[" + ", ".join(self.expr(i) for i in e.items) + "]"
        if isinstance(e, ir.Subscript):
            idx = ", ".join("None" if i is None else ":" for i in e.index)
            return f"{self.expr(e.value, 99)}[{idx}]"
        if isinstance(e, ir.Cast):
            return self.cast(e)
        if isinstance(e, ir.Attr):
            return self.attr(e)
        if isinstance(e, ir.Call):
            return self.call(e)
        raise TypeError(f"cannot render {e!r}")

    # hooks
    def const(self, v) -> str:
        if isinstance(v, float):
            return float_literal(v)
        if v is None or isinstance(v, (bool, int)):
            return repr(v)
        return self.dtype(v)

    def name(self, n: str) -> str:
        return n

    def bool_op(self, op: str) -> str:
        return op

    def dtype(self, d) -> str:
        raise NotImplementedError

    def cast(self, e: ir.Cast) -> str:
        return f"{self.expr(e.value, 99)}.to({self.dtype(e.dtype)})"

    def attr(self, e: ir.Attr) -> str:
        return f"{self.expr(e.value, 99)}.{e.attr}"

    def call(self, e: ir.Call) -> str:
        raise NotImplementedError

    def args(self, e: ir.Call) -> str:
        return ", ".join([self.expr(a) for a in e.args] + [f"{k}={self.expr(v)}" for k, v in e.kwargs])


def spell_math(op, x: str, lib: str, native, exponent=None) -> str:
    """Elementwise math ``op`` (xsync.lowering.ir.UNARY_MATH, POW) on ``x``, the code of a
    float32 operand, in a Triton dialect whose module is ``lib`` (``gl`` / ``tl``); ``native``:
    the ops ``lib`` has a function for. The others are spelled through exp / exp2 / log2, where
    ``x`` appears once, except an integer power (its products repeat ``x``: pass a name)."""
    from xsync.lowering import ir

    if op in native:
        return f"{lib}.{op.value}({x})"
    if op is ir.TileOp.TANH:     # 2 sigmoid(2x) - 1: -1 / 1 at the far ends, |error| ~1e-7
        return f"(2.0 / (1.0 + {lib}.exp(-2.0 * {x})) - 1.0)"
    if op is ir.TileOp.SIGMOID:
        return f"(1.0 / (1.0 + {lib}.exp(-{x})))"
    if op is ir.TileOp.POW:
        n = int_power(exponent)
        if n is None:
            return f"{lib}.exp2({float_literal(float(exponent))} * {lib}.log2({x}))"
        product = " * ".join([x] * abs(n)) or f"({x} * 0.0 + 1.0)"
        return f"(1.0 / ({product}))" if n < 0 else f"({product})"
    raise TypeError(f"no spelling of {op}")


def int_power(exponent):
    """The integer an exponent is (``2``, ``2.0``), or None: such a power multiplies."""
    from xsync.lowering.ir import MAX_INT_POWER

    if isinstance(exponent, float) and exponent.is_integer() and abs(exponent) <= MAX_INT_POWER:
        return int(exponent)
    return exponent if isinstance(exponent, int) else None

