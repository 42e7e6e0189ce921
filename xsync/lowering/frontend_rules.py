"""Rules of the frontend (xsync/lowering/frontend.py) that fold or refuse Python constructs
with a meaning only at compile time: arithmetic in declarations (``stages=2 ** 3``,
``xs.tile([BLOCK // 2, ...])``) and the identity/membership comparisons (``is``, ``in``)."""
from __future__ import annotations

import ast
import inspect
import operator

from xsync.dtypes import DType
from xsync.lowering import ir

MAX_STAGES = 64      # ring slots per pipe: far beyond what hides any latency (2-4 do)
MAX_EXPONENT = 64    # `**` in a declaration: enough for any size, bounded time

CONST_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
                ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor,
                ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.Pow: operator.pow}
_NOT_CONSTANT = object()


def fold_binop(fe, node: ast.BinOp, what: str, lhs, rhs):
    """``lhs <op> rhs`` of a declaration argument, or a KernelSourceError naming ``what``."""
    text = ast.unparse(node)
    if isinstance(lhs, DType) or isinstance(rhs, DType):
        fe.error(node, f"{what} computes with a dtype: `{text}`", fix="compute with numbers")
    big = isinstance(node.op, (ast.Pow, ast.LShift)) and isinstance(rhs, (int, float)) and (
        abs(rhs) > MAX_EXPONENT)
    if big:
        fe.error(node, f"{what} is `{text}`, far too large", fix="use sizes a core can hold")
    try:
        return CONST_BINOPS[type(node.op)](lhs, rhs)
    except ZeroDivisionError:
        fe.error(node, f"{what} divides by zero: `{text}`",
                 fix="check the constexpr values the kernel is specialized with")
    except (TypeError, ValueError, OverflowError) as exc:
        fe.error(node, f"{what} cannot be computed: `{text}` ({exc})", fix="compute with integers")


def constant(fe, node):
    """The compile-time value of ``node`` (literals, constexprs, numeric globals, tuples of
    them), or ``_NOT_CONSTANT``."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in fe.constexprs:
            return fe.constexprs[node.id]
        if node.id not in fe.home:
            g = fe.globals.get(node.id, _NOT_CONSTANT)
            if g is None or isinstance(g, (int, float, str)):
                return g
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [constant(fe, e) for e in node.elts]
        return _NOT_CONSTANT if any(i is _NOT_CONSTANT for i in items) else tuple(items)
    return _NOT_CONSTANT


def identity_compare(fe, node: ast.Compare):
    """``a is None`` / ``a is not b`` / ``a in (..)`` / ``a not in (..)``: folded to a constant
    when both sides are known at compile time (constexprs, literals); refused otherwise, since
    run-time values (tensors, scalars, tiles) are never None and have no membership."""
    from xsync.lowering import ir

    op = node.ops[0]
    lhs, rhs = constant(fe, node.left), constant(fe, node.comparators[0])
    spelled = {ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}[type(op)]
    if lhs is not _NOT_CONSTANT and rhs is not _NOT_CONSTANT:
        if isinstance(op, (ast.Is, ast.IsNot)):
            if not any(v is None or isinstance(v, bool) for v in (lhs, rhs)):
                fe.error(node, f"`{ast.unparse(node)}` compares numbers by identity",
                         fix="compare values with == / != (`is` is for None, True and False)")
            same = lhs is rhs or (lhs == rhs and type(lhs) is type(rhs))
            return ir.Const(same if isinstance(op, ast.Is) else not same)
        if not isinstance(rhs, tuple):
            fe.error(node, f"`{ast.unparse(node)}`: the right side of `{spelled}` is not a "
                           f"tuple or list", fix="write `X in (1, 2)`")
        return ir.Const((lhs in rhs) if isinstance(op, ast.In) else (lhs not in rhs))
    if isinstance(op, (ast.Is, ast.IsNot)):
        fe.error(node, f"`{ast.unparse(node)}`: `{spelled}` is known only on compile-time values "
                       f"(constexprs, None, literals); run-time values are never None",
                 fix="for an optional feature pass a bool constexpr (`HAS_BIAS: xs.constexpr`) "
                     "and test `if HAS_BIAS:`; compare run-time values with == / !=")
    fe.error(node, f"`{ast.unparse(node)}`: membership (`{spelled}`) is not supported on run-time "
                   f"values", fix="compare with == and combine with `or`: `a == 1 or a == 2`")


def power(fe, node, base, exponent):
    """``base ** exponent`` / ``xs.pow(base, exponent)`` as ``Call(POW, base, Const)``: the
    exponent is a compile-time number, since each backend spells the power from it (products for
    an integer, exp2/log2 otherwise: see xsync.api.pow)."""
    from xsync.lowering import ir

    text = ast.unparse(node)
    n = constant(fe, exponent)
    if n is _NOT_CONSTANT and isinstance(exponent, ast.UnaryOp) and isinstance(exponent.op, ast.USub):
        n = constant(fe, exponent.operand)
        n = n if n is _NOT_CONSTANT or isinstance(n, (str, tuple)) or n is None else -n
    if n is _NOT_CONSTANT or isinstance(n, (bool, str, tuple)) or n is None:
        fe.error(node, f"`{text}`: the exponent `{ast.unparse(exponent)}` is not a compile-time "
                       f"number (a tile exponent has no portable spelling yet)",
                 fix="use a literal or a constexpr exponent; for a tile exponent and positive x "
                     "write xs.exp2(y * xs.log2(x))")
    if isinstance(n, int) and abs(n) > ir.MAX_INT_POWER:
        fe.error(node, f"`{text}`: integer exponent {n} is more than {ir.MAX_INT_POWER} products",
                 fix=f"use a float exponent ({float(n)}, computed as exp2/log2 for positive x) or "
                     f"square intermediate values")
    return ir.Call(ir.TileOp.POW, (fe.expr(base), ir.Const(n)))


RESERVED_PREFIX = "xs_"                                    # the generators' own names
RESERVED_BUILTINS = frozenset({"range", "float", "int", "getattr"})   # generated code calls them


def check_user_name(fe, name: str, node):
    """Refuse a kernel name the generated code cannot hold apart from its own: the ``xs_``
    prefix (every backend's generated names) and the builtins generated code calls. Every
    other name is the user's: the generators spell theirs around it."""
    if name.startswith(RESERVED_PREFIX):
        fe.error(node, f"`{name}`: names beginning with `{RESERVED_PREFIX}` are reserved for "
                       f"xsync's generated code", objects=(name,),
                 fix=f"rename it (e.g. `{name[len(RESERVED_PREFIX):] or 'x'}_`)")
    if name in RESERVED_BUILTINS:
        fe.error(node, f"`{name}` shadows Python's builtin {name}(), which the generated code "
                       f"calls", objects=(name,), fix=f"rename it (e.g. `{name}_`)")


def check_role_placement(fe, node, name: str, kind: str, placement) -> None:
    """``xs.role(..., placement=)``: "own" or "merged", on a vector role (a copy role always
    has producer warps of its own, a matrix role is the warpgroup others merge into)."""
    from xsync import api

    if placement is None or placement == "auto":
        return
    if placement not in api.ROLE_PLACEMENTS:
        fe.error(node, f"role '{name}' has placement={placement!r}", objects=(name,),
                 fix='placement is "own" (a warpgroup of its own on Hopper), "merged" (share the '
                     "matrix role's warpgroup) or \"auto\" (the default: the backend decides)")
    if kind != "vector":
        fe.error(node, f"role '{name}' of kind {kind!r} asks placement={placement!r}: only a "
                       f"vector role chooses where it runs", objects=(name,),
                 fix="drop placement= (a copy role always runs on producer warps of its own, a "
                     "matrix role is the warpgroup vector roles merge into), or set it on the "
                     "vector role")


def check_merged_partners(roles) -> None:
    """A vector role asking placement="merged" needs a matrix role with its replica count:
    roles of different replica counts cannot share a warpgroup."""
    from xsync.errors import KernelSourceError
    from xsync.lowering import ir

    for r in roles:
        if r.placement is not ir.RolePlacement.MERGED:
            continue
        if not any(m.kind is ir.RoleKind.MATRIX and m.replicas == r.replicas for m in roles):
            counts = sorted({m.replicas for m in roles if m.kind is ir.RoleKind.MATRIX})
            have = (f"the matrix roles have replicas={', '.join(map(str, counts))}" if counts
                    else "the kernel has no matrix role")
            raise KernelSourceError(
                f"role '{r.name}' asks placement=\"merged\" with replicas={r.replicas}, but {have}: "
                f"there is no warpgroup to merge into", loc=r.loc, objects=(r.name,),
                fix=("give it the matrix role's replica count, or drop placement=" if counts
                     else "drop placement= (a kernel without matrix work gives vector roles the "
                          "consumer warpgroups)"))


def slot_field(fe, node: ast.Attribute):
    """``slot.field`` (a pipe payload field) or, of an N -> 1 pipe, ``slot[r].field``: producer
    replica r's value. None: not a slot field."""
    if isinstance(node.value, ast.Subscript) and isinstance(node.value.value, ast.Name) \
            and node.value.value.id in fe.slots:
        return _gathered_field(fe, node)
    if not (isinstance(node.value, ast.Name) and node.value.id in fe.slots):
        return None
    slot = node.value.id
    pipe_var, side = fe.slots[slot]
    pipe = fe.objects[pipe_var]
    fe.check_owner(slot, node)
    if pipe.field(node.attr) is None:
        fe.error(node, f"pipe '{pipe.name}' has no field '{node.attr}' "
                       f"(fields: {', '.join(f.name for f in pipe.fields) or 'none'})",
                 objects=(pipe.name,))
    if side != "consumer":
        fe.error(node, f"the producer of pipe '{pipe.name}' reads slot field '{node.attr}'",
                 fix="the producer writes a slot, the consumer (after wait) reads it",
                 objects=(pipe.name,))
    gather = gather_parts(fe, pipe)
    if gather:
        fe.error(node, f"`{ast.unparse(node)}` reads a slot of pipe '{pipe.name}', which gathers "
                       f"{gather} replicas of '{pipe.src}' into one: the slot holds one "
                       f"'{node.attr}' per producer replica", objects=(pipe.name,),
                 fix=f"name the replica: {slot}[0].{node.attr} ... {slot}[{gather - 1}].{node.attr}")
    return ir.Attr(ir.Name(slot), node.attr)


def gather_parts(fe, pipe) -> int:
    """Producer replicas an N -> 1 pipe gathers (0: not such a pipe)."""
    src = next(r for r in fe.roles.values() if r.name == pipe.src)
    dst = next(r for r in fe.roles.values() if r.name == pipe.dst)
    return src.replicas if src.replicas > 1 and dst.replicas == 1 else 0


def _gathered_field(fe, node: ast.Attribute):
    """``slot[r].field``: producer replica r's value in a slot of an N -> 1 pipe."""
    slot = node.value.value.id
    pipe_var, side = fe.slots[slot]
    pipe = fe.objects[pipe_var]
    fe.check_owner(slot, node)
    n = gather_parts(fe, pipe)
    if not n or side != "consumer":
        fe.error(node, f"`{ast.unparse(node)}` indexes a slot of pipe '{pipe.name}' by replica",
                 objects=(pipe.name,),
                 fix=("only the consumer of an N -> 1 pipe (replicas of the producer role, one "
                      f"consumer) names a producer replica; read {slot}.{node.attr}"))
    part = fe.const_eval(node.value.slice, f"the replica in `{ast.unparse(node)}`")
    if not isinstance(part, int) or isinstance(part, bool) or not 0 <= part < n:
        fe.error(node, f"`{ast.unparse(node)}` names replica {part!r} of '{pipe.src}', which has {n}",
                 objects=(pipe.name,), fix=f"a compile-time replica from 0 to {n - 1}")
    if pipe.field(node.attr) is None:
        fe.error(node, f"pipe '{pipe.name}' has no field '{node.attr}' "
                       f"(fields: {', '.join(f.name for f in pipe.fields) or 'none'})",
                 objects=(pipe.name,))
    return ir.Attr(ir.Name(slot), node.attr, part)


def named_constexprs(fe, fdef: ast.FunctionDef) -> tuple:
    """The constexprs the generated code names, sorted: string constexprs are folded into
    declarations, and so are those that only set roles' ``replicas=`` (the body reads the count
    with ``xs.num_replicas(role)``, folded to a number)."""
    parents = {id(c): p for p in ast.walk(fdef) for c in ast.iter_child_nodes(p)}

    def replicas_arg(name: ast.Name) -> bool:
        kw = parents.get(id(name))
        call = parents.get(id(kw))
        return (isinstance(kw, ast.keyword) and kw.arg == "replicas" and isinstance(call, ast.Call)
                and fe.is_xs(call.func) == "role")

    uses: dict[str, list[bool]] = {}
    for stmt in fdef.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and node.id in fe.constexprs:
                uses.setdefault(node.id, []).append(replicas_arg(node))
    return tuple(sorted((n, v) for n, v in fe.constexprs.items()
                        if not isinstance(v, str) and not (uses.get(n) and all(uses[n]))))


def num_replicas(fe, node: ast.Call) -> ir.Const:
    """``xs.num_replicas(role)``: the role's declared replica count."""
    arg = node.args[0] if len(node.args) == 1 and not node.keywords else None
    if not (isinstance(arg, ast.Name) and arg.id in fe.roles):
        fe.error(node, f"`{ast.unparse(node)}` does not name a role",
                 fix="pass the role variable: `xs.num_replicas(mma)`")
    return ir.Const(fe.roles[arg.id].replicas)


def bind_arguments(fe, node: ast.Call, name: str, sig) -> tuple:
    """The positional arguments of ``xs.<name>(...)`` (``sig``: its ``api.TileOpSignature``) --
    those passed by their parameter's name (``xs.max(x, axis=1)``) put in place -- and its
    keyword-only ones, or a KernelSourceError naming the call's parameters."""
    params = ", ".join(sig.params)
    args, options, by_name = list(node.args), [], {}
    for k in node.keywords:
        if k.arg in sig.keywords:
            options.append(k)
        elif k.arg in sig.params[len(node.args):]:
            by_name[k.arg] = k.value
        else:
            fe.error(node, f"xs.{name} got {k.arg!r} twice" if k.arg in sig.params
                     else f"xs.{name} has no keyword {k.arg!r}",
                     fix=f"its parameters: xs.{name}({', '.join(sig.params + tuple(f'{kw}=' for kw in sig.keywords))})")
    for param in sig.params[len(args):]:
        if param not in by_name:
            break
        args.append(by_name.pop(param))
    if by_name or not sig.min_args <= len(args) <= sig.max_args:
        span = sig.min_args if sig.min_args == sig.max_args else f"{sig.min_args}-{sig.max_args}"
        fe.error(node, f"xs.{name} takes {span} arguments ({params}), "
                       f"got {len(node.args) + len(node.keywords) - len(options)}",
                 fix=f"call it as xs.{name}({', '.join(sig.params[:sig.min_args])})")
    return args, options


def stray_specialization(fe) -> str:
    """A note for an error's fix naming the specialization's names (``example=`` keys, launch
    keywords) that are no parameter of the kernel, with the nearest parameter: such a name is
    ignored, and the error it leads to (a dtype or constexpr without a value) hides the slip."""
    import difflib

    params = list(inspect.signature(fe.fn).parameters)
    stray = [k for k in (*fe.tensor_dtypes, *fe.constexprs) if k not in params]
    notes = []
    for k in dict.fromkeys(stray):
        near = difflib.get_close_matches(k, params, n=1)
        notes.append(f"'{k}'" + (f" (did you mean '{near[0]}'?)" if near else ""))
    return (f"; note: the specialization names {', '.join(notes)}, which no parameter of "
            f"'{fe.fn.__name__}' has") if notes else ""
