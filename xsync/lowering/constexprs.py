"""Constexpr values a kernel may be specialised for: an int, a float, a bool, an xs dtype, or
a string where the vocabulary takes one (``xs.role(kind=KIND)``). Numpy-style scalars are
taken as the Python numbers they hold; anything else (a list, a tensor, None) is a
:class:`KernelSourceError` at the parameter's line, before a cache key is made of it."""
from __future__ import annotations

import ast
import inspect
import numbers
import textwrap

from xsync.dtypes import DType
from xsync.errors import KernelSourceError, SourceLoc


def constexpr_value_problem(value) -> str | None:
    """Why ``value`` cannot be a constexpr, or None. A constexpr is an int, a float, a bool, an
    xs dtype, or a string (meaningful where the vocabulary takes one: ``xs.role(kind=...)``)."""
    if isinstance(value, (bool, int, float, str, DType)):
        return None
    if value is None:
        return "is None"
    kind = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
    return f"is a {kind} ({value!r:.60})"


def constexpr_values(fn, constexprs: dict) -> dict:
    """``constexprs`` with numpy-style scalars made Python ones (``np.int64(16)`` -> 16); raise
    :class:`KernelSourceError` at the parameter's line for the first value of an unsupported
    type (see :func:`constexpr_value_problem`)."""
    out = {}
    for name, value in constexprs.items():
        if not isinstance(value, (bool, int, float, str, DType)):
            if isinstance(value, numbers.Integral):
                value = int(value)
            elif isinstance(value, numbers.Real):
                value = float(value)
            elif type(value).__name__ == "bool_":   # numpy's bool is not a numbers.Integral
                value = bool(value)
        problem = constexpr_value_problem(value)
        if problem is not None:
            raise KernelSourceError(
                f"constexpr `{name}` {problem}; a constexpr is an int, a float, a bool, an xs "
                f"dtype, or a string for xs.role(kind=...)",
                loc=parameter_loc(fn, name), objects=(name,),
                fix=f"pass {name}=<int, float, bool, xs dtype or string> when launching or compiling")
        out[name] = value
    return out


def parameter_loc(fn, name: str) -> SourceLoc | None:
    """file:line of parameter ``name`` of ``fn`` (None when the source cannot be read)."""
    try:
        lines, first = inspect.getsourcelines(fn)
        file = inspect.getsourcefile(fn) or "<unknown>"
    except (OSError, TypeError):
        return None
    fdef = ast.parse(textwrap.dedent("".join(lines))).body[0]
    line = next((a.lineno for a in fdef.args.args if a.arg == name), 1)
    return SourceLoc(file, first + line - 1, fn.__name__)
