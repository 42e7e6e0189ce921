"""Frontend: a kernel's Python source -> :class:`~xsync.lowering.ir.KernelIR`.

The body is read, never executed. The frontend resolves the xsync names the kernel
uses, folds constexprs into declarations (stages, replicas, tile shapes), records which
role owns every value, and rejects misuse with the kernel's own file:line:

* a sync verb used by the wrong side (a consumer that commits, a producer that waits),
* a sync verb or a store outside any role block,
* a value made in one role and read in another without passing through a pipe,
* constructs whose trip counts or types the verifier and renderers cannot see.
"""
from __future__ import annotations

import ast
import collections
import dataclasses
import inspect
import textwrap
import types

from xsync import api
from xsync.dtypes import DType
from xsync.errors import KernelSourceError, SourceLoc
from xsync.lowering import cluster, frontend_rules, holding, ir, shapes, slot_fill, tile_launch
from xsync.lowering.constexprs import constexpr_values

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
           ast.Mod: "%", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^",
           ast.LShift: "<<", ast.RShift: ">>"}
_CMPOPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_UNOPS = {ast.USub: "-", ast.Not: "not", ast.Invert: "~", ast.UAdd: "+"}
_PIPE_VERBS = {"acquire": "src", "commit": "src", "wait": "dst", "release": "dst"}
_BARRIER_VERBS = ("sync", "arrive")


def parse_kernel(fn, constexprs: dict[str, object] | None = None,
                 tensor_dtypes: dict[str, DType] | None = None) -> ir.KernelIR:
    """Build the IR of ``fn`` specialised for ``constexprs`` and tensor dtypes."""
    return _Frontend(fn, dict(constexprs or {}), dict(tensor_dtypes or {})).run()


class _Frontend:
    def __init__(self, fn, constexprs, tensor_dtypes):
        self.fn = fn
        self.constexprs = constexprs
        self.tensor_dtypes = tensor_dtypes
        try:
            lines, self.first_line = inspect.getsourcelines(fn)
            self.file = inspect.getsourcefile(fn) or "<unknown>"
        except (OSError, TypeError) as exc:
            raise KernelSourceError(
                f"cannot read the source of kernel {fn.__name__!r}",
                fix="define kernels in a .py file (xsync reads their source)") from exc
        self.source = textwrap.dedent("".join(lines))
        # closure variables shadow globals, as in Python (the compile cache keys both)
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        bound = {}
        for name, cell in cells.items():
            try:
                bound[name] = cell.cell_contents
            except ValueError:      # not bound yet: the name stays unknown
                pass
        self.globals = collections.ChainMap(bound, fn.__globals__)
        self.roles: dict[str, ir.Role] = {}      # variable name -> role
        self.objects: dict[str, object] = {}     # variable name -> Pipe | Event | Barrier
        self.home: dict[str, tuple[str | None, int]] = {}  # value -> (owning role, line)
        self.slots: dict[str, tuple[str, str]] = {}        # slot variable -> (pipe, side)
        self.params: list[ir.Param] = []
        self.role_ctx: str | None = None
        self.loop_vars: set[str] = set()
        self.used_verbs: set[tuple[str, str]] = set()
        self.cluster, self.cluster_loc = 1, None      # xs.cluster(n): xsync/lowering/cluster.py

    # ------------------------------------------------------------ helpers
    def loc(self, node) -> SourceLoc:
        return SourceLoc(self.file, self.first_line + getattr(node, "lineno", 1) - 1,
                         self.fn.__name__)

    def error(self, node, what, fix="", objects=()):
        fix += frontend_rules.stray_specialization(self)     # a misspelt example= key hides there
        raise KernelSourceError(what, loc=self.loc(node), objects=tuple(objects), fix=fix)

    def is_xs(self, node) -> str | None:
        """The xsync name a node refers to (`xs.pipe` -> "pipe"), or None."""
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            mod = self.globals.get(node.value.id)
            if isinstance(mod, types.ModuleType) and mod.__name__ in ("xsync", "xsync.api"):
                return node.attr
        if isinstance(node, ast.Name) and node.id not in self.home:
            obj = self.globals.get(node.id)
            if getattr(obj, "__module__", None) == "xsync.api" and hasattr(obj, "__name__"):
                return obj.__name__
        return None

    def const_eval(self, node, what: str, text_ok: bool = False):
        """Evaluate a declaration argument from constexprs, globals and literals. A string
        constexpr is folded only where ``text_ok`` (the argument takes a string)."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in self.constexprs:
                value = self.constexprs[node.id]
                if isinstance(value, str) and not text_ok:
                    self.error(node, f"{what} is constexpr `{node.id}`, the string {value!r}",
                               fix=f"pass {node.id}=<a number>; string constexprs are for "
                                   f"xs.role(kind=...)", objects=(node.id,))
                return value
            val = self.globals.get(node.id)
            if isinstance(val, (int, float)):
                return val
            self.error(node, f"{what} must be known at compile time, but `{node.id}` is not",
                       fix=f"annotate `{node.id}: xs.constexpr` or use a literal")
        if isinstance(node, ast.BinOp) and type(node.op) in frontend_rules.CONST_BINOPS:
            lhs, rhs = self.const_eval(node.left, what), self.const_eval(node.right, what)
            if isinstance(lhs, str) or isinstance(rhs, str):
                self.error(node, f"{what} computes with a string: `{ast.unparse(node)}`",
                           fix="compute with numbers; strings are for xs.role(kind=...)")
            return frontend_rules.fold_binop(self, node, what, lhs, rhs)
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.const_eval(e, what) for e in node.elts]
        dtype = self.dtype_of(node)
        if dtype is not None:
            return dtype
        self.error(node, f"{what} must be a compile-time constant, got `{ast.unparse(node)}`",
                   fix="use literals and constexpr parameters")

    def dtype_of(self, node) -> DType | None:
        name = self.is_xs(node)
        if name in api.DTYPES:
            return api.DTYPES[name]
        if isinstance(node, ast.Name) and isinstance(self.constexprs.get(node.id), DType):
            return self.constexprs[node.id]
        if (isinstance(node, ast.Attribute) and node.attr == "dtype"
                and isinstance(node.value, ast.Name) and node.value.id in self.tensor_dtypes):
            return self.tensor_dtypes[node.value.id]
        return None

    # ------------------------------------------------------------ entry
    def run(self) -> ir.KernelIR:
        tree = ast.parse(self.source)
        fdef = tree.body[0]
        if not isinstance(fdef, ast.FunctionDef):
            self.error(fdef, "an xsync kernel must be a plain `def` function")
        self.parse_params(fdef)
        body = self.block(fdef.body, top=True)
        self.check_all_sides_used(fdef)
        pipes = tuple(o for o in self.objects.values() if isinstance(o, ir.Pipe))
        events = tuple(o for o in self.objects.values() if isinstance(o, ir.Event))
        every_role = tuple(r.name for r in self.roles.values())
        barriers = tuple(ir.Barrier(o.name, every_role, o.loc, True) if o.all_roles else o
                         for o in self.objects.values() if isinstance(o, ir.Barrier))
        if not self.roles:
            self.error(fdef, f"kernel {fdef.name!r} declares no role",
                       fix='declare at least one: `work = xs.role("work", kind="vector")`')
        frontend_rules.check_merged_partners(tuple(self.roles.values()))
        kernel = ir.KernelIR(
            name=fdef.name, file=self.file, params=tuple(self.params), constexprs=frontend_rules.named_constexprs(self, fdef),
            roles=tuple(self.roles.values()), pipes=pipes, events=events, barriers=barriers,
            body=tuple(body), loc=self.loc(fdef), source=self.source, cluster=self.cluster,
            cluster_loc=self.cluster_loc)
        slot_fill.check(kernel)   # each field of a slot written once before its commit
        kernel = cluster.lower(kernel)   # multicast fields' rules; cluster ops in program_id
        holding.check_release_order(kernel)   # release order; no slot read after its release
        int_scalars = shapes.check(kernel)   # every tile shape, before any backend meets one
        tile_launch.single_tile_counts(kernel)   # the host can check a one-tile-per-program grid
        return dataclasses.replace(kernel, int_scalars=tuple(sorted(int_scalars.items())))

    def parse_params(self, fdef: ast.FunctionDef):
        args = fdef.args
        if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
            self.error(fdef, "kernel parameters must be plain positional names",
                       fix="remove *args, **kwargs and keyword-only parameters")
        for a in args.args:
            frontend_rules.check_user_name(self, a.arg, a)
            is_const = a.annotation is not None and (
                self.is_xs(a.annotation) == "constexpr"
                or (isinstance(a.annotation, ast.Name) and a.annotation.id == "constexpr"))
            if is_const:
                if a.arg not in self.constexprs:
                    self.error(a, f"constexpr parameter `{a.arg}` has no value",
                               fix=f"pass {a.arg}=... when launching or compiling")
                self.constexprs.update(constexpr_values(self.fn, {a.arg: self.constexprs[a.arg]}))
                kind = ir.ParamKind.CONSTEXPR
            elif a.arg in self.tensor_dtypes:
                kind = ir.ParamKind.TENSOR
            else:
                kind = ir.ParamKind.SCALAR
            self.params.append(ir.Param(a.arg, kind, self.tensor_dtypes.get(a.arg)))
            self.home[a.arg] = (None, self.loc(a).line)

    # ------------------------------------------------------------ statements
    def block(self, stmts, top=False) -> list:
        out = []
        for i, s in enumerate(stmts):
            if (i == 0 and top and isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                    and isinstance(s.value.value, str)):
                continue  # docstring
            r = self.stmt(s, top)
            if r is not None:
                out.append(r)
        return out

    def stmt(self, s, top):
        if isinstance(s, ast.Pass):
            return None
        if isinstance(s, ast.Assign):
            return self.assign(s, top)
        if isinstance(s, ast.AugAssign):
            if not isinstance(s.target, ast.Name):
                self.error(s, "augmented assignment needs a plain name on the left")
            value = ast.BinOp(left=ast.Name(s.target.id, ast.Load()), op=s.op, right=s.value)
            ast.copy_location(value, s)
            return self.bind([s.target.id], self.expr(value), s)
        if isinstance(s, ast.With):
            return self.role_block(s)
        if isinstance(s, ast.For):
            return self.for_loop(s)
        if isinstance(s, ast.If):
            return ir.If(self.expr(s.test), tuple(self.block(s.body)), tuple(self.block(s.orelse)),
                         self.loc(s), written=True)
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            if self.is_xs(s.value.func) == "cluster":
                return cluster.declare(self, s.value, s, top)
            return self.call_stmt(s.value, s)
        if isinstance(s, ast.While):
            self.error(s, "`while` loops are not supported in an xsync kernel",
                       fix="use `for i in range(...)`: the verifier must see every trip count")
        if isinstance(s, ast.Return):
            self.error(s, "an xsync kernel returns nothing",
                       fix="write results with xs.store(tensor, offsets, tile)")
        self.error(s, f"unsupported statement `{ast.unparse(s).splitlines()[0]}` in an xsync kernel",
                   fix="kernels use assignments, for/if, `with role:` blocks, sync verbs and xs.store")

    def assign(self, s: ast.Assign, top):
        if len(s.targets) != 1:
            self.error(s, "chained assignment is not supported", fix="assign one target per line")
        target, value = s.targets[0], s.value
        if isinstance(value, ast.Call):
            decl = self.is_xs(value.func)
            if decl in api.SYNC_DECLS:
                if not top or not isinstance(target, ast.Name):
                    self.error(s, f"xs.{decl}(...) must be declared at the top level of the kernel "
                                  f"and bound to a plain name",
                               fix="move the declaration before the first loop or role block")
                self.declare(decl, target.id, value, s)
                return None
            verb = self.method_verb(value)
            if verb is not None:
                if not isinstance(target, ast.Name):
                    self.error(s, "bind a slot to a plain name: `slot = pipe.acquire()`")
                return self.sync_verb(verb[0], verb[1], value, s, target=target.id)
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            return self.slot_write(target, value, s)
        if isinstance(target, ast.Name):
            return self.bind([target.id], self.expr(value), s)
        if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
            val = self.expr(value)
            if not isinstance(val, ir.TupleExpr) or len(val.items) != len(target.elts):
                self.error(s, "tuple assignment needs a tuple of the same length on the right")
            return self.bind([e.id for e in target.elts], val, s)
        self.error(s, f"unsupported assignment target `{ast.unparse(target)}`")

    def bind(self, names, value, s):
        line = self.loc(s).line
        for n in names:
            frontend_rules.check_user_name(self, n, s)
            if n in self.roles or n in self.objects:
                self.error(s, f"`{n}` names a role or sync object and cannot be reassigned")
            if n in self.home and self.home[n][0] != self.role_ctx:
                owner, at = self.home[n]
                where = f"role '{self.role_name(owner)}'" if owner else "unannotated code"
                here = f"role '{self.role_name(self.role_ctx)}'" if self.role_ctx else "unannotated code"
                self.error(s, f"`{n}` is defined in {where} (line {at}) and assigned again in {here}",
                           fix=(f"give the value in {here} its own name; a value belongs to one role "
                                "(or to unannotated code, which every agent replicates)"),
                           objects=(n,))
            self.home.setdefault(n, (self.role_ctx, line))
            self.slots.pop(n, None)
        return ir.Assign(tuple(names), value, self.loc(s))

    def role_name(self, var):
        return self.roles[var].name if var in self.roles else var

    def role_block(self, s: ast.With):
        if len(s.items) != 1 or s.items[0].optional_vars is not None:
            self.error(s, "a role block is `with <role>:` with exactly one role")
        ctx = s.items[0].context_expr
        if not (isinstance(ctx, ast.Name) and ctx.id in self.roles):
            self.error(s, f"`with {ast.unparse(ctx)}:` does not name a declared role",
                       fix='declare it first: `mma = xs.role("mma", kind="matrix")`')
        if self.role_ctx is not None:
            self.error(s, f"role block '{self.roles[ctx.id].name}' is nested inside role "
                          f"'{self.roles[self.role_ctx].name}'",
                       fix="role blocks cannot nest; close the outer block first")
        self.role_ctx = ctx.id
        try:
            body = self.block(s.body)
        finally:
            self.role_ctx = None
        return ir.RoleBlock(self.roles[ctx.id].name, tuple(body), self.loc(s))

    def for_loop(self, s: ast.For):
        it = s.iter
        if isinstance(it, ast.Call) and self.is_xs(it.func) == "tile_range":
            return self.tile_range(s)
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
                and 1 <= len(it.args) <= 3 and not it.keywords):
            self.error(s, f"loops must iterate over range(...), got `{ast.unparse(it)}`",
                       fix="write `for i in range(start, stop, step)`")
        if not isinstance(s.target, ast.Name):
            self.error(s, "the loop variable must be a plain name")
        if s.orelse:
            self.error(s, "for ... else is not supported")
        args = [self.expr(a) for a in it.args]
        if len(args) == 1:
            start, stop, step = ir.Const(0), args[0], ir.Const(1)
        else:
            start, stop = args[0], args[1]
            step = args[2] if len(args) == 3 else ir.Const(1)
        return self.loop(s, start, stop, step)

    def loop(self, s: ast.For, start, stop, step, single_tile=False, tile_loop=False) -> ir.For:
        """The ir.For of ``s`` (target and form already checked): its counter and body."""
        var = s.target.id
        if var in self.loop_vars:
            self.home.pop(var, None)  # each loop scopes its own counter
        self.loop_vars.add(var)
        self.bind([var], ir.Const(0), s)
        body = self.block(s.body)
        return ir.For(var, start, stop, step, tuple(body), self.loc(s), single_tile=single_tile, tile_loop=tile_loop)

    def tile_range(self, s: ast.For):
        """``for tile in xs.tile_range(total, persistent=P)``: the persistent loop
        ``range(program_id(0), total, num_programs(0))``; with P false marked ``single_tile``
        (one program per tile: the renderers spell the guarded body ``tile = program_id(0);
        if tile < total:``, the verifier checks the loop, of which that is one run)."""
        it = s.iter
        usage = "write `for tile in xs.tile_range(total, persistent=PERSISTENT)`"
        keywords = {k.arg: k.value for k in it.keywords}
        if not 1 <= len(it.args) <= 2 or set(keywords) - {"persistent"} or (
                len(it.args) == 2 and keywords):
            self.error(s, f"xs.tile_range takes the tile count and `persistent`, got "
                          f"`{ast.unparse(it)}`", fix=usage)
        if not isinstance(s.target, ast.Name):
            self.error(s, "the tile variable must be a plain name", fix=usage)
        if s.orelse:
            self.error(s, "for ... else is not supported")
        if self.role_ctx is not None:
            self.error(s, "xs.tile_range inside a role block",
                       fix="the tile loop is unannotated code around the role blocks: every agent "
                           "walks the same tiles")
        flag = it.args[1] if len(it.args) == 2 else keywords.get("persistent")
        persistent = True if flag is None else self.const_eval(flag, "xs.tile_range's `persistent`")
        if not isinstance(persistent, (bool, int)):
            self.error(s, f"xs.tile_range's `persistent` is {persistent!r}, not a flag",
                       fix="pass True/False, 1/0 or a constexpr holding one")
        plain = self.cluster_loc is None      # else tiles are dealt to clusters
        first, every = ((ir.TileOp.PROGRAM_ID, ir.TileOp.NUM_PROGRAMS) if plain else
                        (ir.TileOp.CLUSTER_ID, ir.TileOp.NUM_CLUSTERS))
        return self.loop(s, ir.Call(first, (ir.Const(0),) * plain), self.expr(it.args[0]),
                         ir.Call(every, (ir.Const(0),) * plain), single_tile=not persistent, tile_loop=True)

    def method_verb(self, call: ast.Call):
        """(object variable, verb) for `pipe.acquire()` / `bar.sync()`-style calls."""
        f = call.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in self.objects:
            return f.value.id, f.attr
        return None

    def call_stmt(self, call: ast.Call, s):
        verb = self.method_verb(call)
        if verb is not None:
            return self.sync_verb(verb[0], verb[1], call, s)
        name = self.is_xs(call.func)
        if name in ("signal", "wait"):
            if len(call.args) != 1 or not isinstance(call.args[0], ast.Name) or \
                    not isinstance(self.objects.get(call.args[0].id), ir.Event):
                self.error(s, f"xs.{name}() takes one declared event",
                           fix="declare it with `ev = xs.event(src_role, dst_role)`")
            return self.sync_verb(call.args[0].id, "signal" if name == "signal" else "evwait", call, s)
        if name == "store":
            return self.store(call, s)
        self.error(s, f"`{ast.unparse(call)}` is not a statement xsync understands",
                   fix="statements are sync verbs (acquire/commit/wait/release, xs.signal/xs.wait, "
                       "barrier.sync/arrive) and xs.store(...)")

    def sync_verb(self, obj_var, verb, call, s, target=None):
        obj = self.objects[obj_var]
        shown = f"{obj_var}.{verb}()" if verb not in ("signal", "evwait") else \
            f"xs.{'signal' if verb == 'signal' else 'wait'}({obj_var})"
        named = holding.release_slot(self, obj, call, s) if verb == "release" and isinstance(obj, ir.Pipe) else None
        if (call.args or call.keywords) and verb not in ("signal", "evwait", "release"):
            self.error(s, f"{shown} takes no arguments")
        if self.role_ctx is None:
            self.error(s, f"{shown} is outside any role block",
                       fix="sync verbs belong to a role: put it inside `with <role>:`",
                       objects=(obj.name,))
        here = self.roles[self.role_ctx]
        if isinstance(obj, ir.Pipe):
            if verb not in _PIPE_VERBS:
                self.error(s, f"pipe '{obj.name}' has no verb {verb!r}",
                           fix="pipes have acquire/commit (producer) and wait/release (consumer)",
                           objects=(obj.name,))
            side = _PIPE_VERBS[verb]
            owner = obj.src if side == "src" else obj.dst
            if here.name != owner:
                other = "producer" if side == "src" else "consumer"
                self.error(s, f"{shown} in role '{here.name}', but only the {other} role "
                              f"'{owner}' of pipe '{obj.name}' may {verb}",
                           fix=(f"move it into `with {self.var_of_role(owner)}:`; pipe '{obj.name}' "
                                f"runs from '{obj.src}' (acquire/commit) to '{obj.dst}' (wait/release)"),
                           objects=(obj.name, here.name))
            if verb in ("acquire", "wait") and target is None:
                if obj.fields:
                    self.error(s, f"{shown} returns the slot; bind it: `slot = {obj_var}.{verb}()`",
                               objects=(obj.name,))
            if verb in ("commit", "release") and target is not None:
                self.error(s, f"{shown} returns nothing", objects=(obj.name,))
            if target is not None:
                self.bind([target], ir.Const(None), s)
                self.slots[target] = (obj_var, "producer" if side == "src" else "consumer")
            self.used_verbs.add((obj_var, verb))
            return ir.SyncOp(ir.Verb(verb), obj.name, target, self.loc(s), slot=named)
        if isinstance(obj, ir.Event):
            if verb not in ("signal", "evwait"):
                self.error(s, f"event '{obj.name}' is used with xs.signal(ev) / xs.wait(ev), "
                              f"not .{verb}()", objects=(obj.name,))
            owner = obj.src if verb == "signal" else obj.dst
            if here.name != owner:
                side = "source" if verb == "signal" else "destination"
                self.error(s, f"{shown} in role '{here.name}', but event '{obj.name}' has "
                              f"{side} role '{owner}'",
                           fix=(f"event '{obj.name}' is signalled by '{obj.src}' and waited by "
                                f"'{obj.dst}'; move the call or declare another event"),
                           objects=(obj.name, here.name))
            self.used_verbs.add((obj_var, verb))
            return ir.SyncOp(ir.Verb.SIGNAL if verb == "signal" else ir.Verb.WAIT, obj.name, None, self.loc(s))
        # barrier
        if verb not in _BARRIER_VERBS:
            self.error(s, f"barrier '{obj.name}' has verbs sync() and arrive(), not {verb}()",
                       objects=(obj.name,))
        if not obj.all_roles and here.name not in obj.members:
            self.error(s, f"{shown} in role '{here.name}', which is not a member of barrier "
                          f"'{obj.name}' (members: {', '.join(obj.members)})",
                       fix=f"add the role to xs.barrier(...) or move the call", objects=(obj.name,))
        self.used_verbs.add((obj_var, verb))
        return ir.SyncOp(ir.Verb(verb), obj.name, None, self.loc(s))

    def var_of_role(self, role_name):
        return next((v for v, r in self.roles.items() if r.name == role_name), role_name)

    def slot_write(self, target: ast.Attribute, value, s):
        slot = target.value.id
        if slot not in self.slots:
            self.error(s, f"`{slot}.{target.attr} = ...`: `{slot}` is not a pipe slot",
                       fix="acquire a slot first: `slot = pipe.acquire()`")
        pipe_var, side = self.slots[slot]
        pipe = self.objects[pipe_var]
        if side != "producer":
            self.error(s, f"the consumer of pipe '{pipe.name}' writes slot field '{target.attr}'",
                       fix="only the producer (after acquire) writes a slot; the consumer reads it",
                       objects=(pipe.name,))
        if pipe.field(target.attr) is None:
            self.error(s, f"pipe '{pipe.name}' has no field '{target.attr}' "
                          f"(fields: {', '.join(f.name for f in pipe.fields) or 'none'})",
                       fix=f"declare it: xs.pipe(..., {target.attr}=xs.tile(shape, dtype))",
                       objects=(pipe.name,))
        self.check_owner(slot, s)
        return ir.SlotWrite(pipe.name, slot, target.attr, self.expr(value), self.loc(s))

    def store(self, call, s):
        if self.role_ctx is None:
            self.error(s, "xs.store(...) is outside any role block",
                       fix="stores belong to the role that owns the value: wrap in `with <role>:`")
        kw = {k.arg: k.value for k in call.keywords}
        if len(call.args) != 3 or set(kw) - {"bounds", "reduce", "deterministic"}:
            self.error(s, "xs.store(tensor, offsets, value, bounds=None, reduce=None, "
                          "deterministic=False) takes three arguments and optional keywords",
                       fix="bounds=[row_end, col_end] masks the tile; reduce=\"add\" adds it into "
                           "the tensor")
        tensor = call.args[0]
        if not (isinstance(tensor, ast.Name) and tensor.id in self.tensor_dtypes):
            self.error(s, f"xs.store target `{ast.unparse(tensor)}` is not a tensor parameter")
        offsets = self.expr(call.args[1])
        if not isinstance(offsets, ir.TupleExpr):
            self.error(s, "xs.store offsets must be a list, one offset per tensor dimension",
                       fix="pass [row, col] for a 2-D tensor ([b, h, row, col] for a 4-D one)")
        bounds = None
        if "bounds" in kw:
            b = self.expr(kw["bounds"])
            if not isinstance(b, ir.TupleExpr) or len(b.items) != len(offsets.items):
                self.error(s, f"xs.store bounds must be a list with one end per offset "
                              f"({len(offsets.items)})", fix="pass [row_end, col_end] for a 2-D tensor "
                                                            "(one end per dimension, like the offsets)")
            bounds = b.items
        reduce, deterministic = self.store_reduce(kw, s)
        return ir.Store(tensor.id, offsets.items, self.expr(call.args[2]), self.loc(s), bounds,
                        reduce, deterministic)

    def store_reduce(self, kw, s):
        """(reduce, deterministic) of an xs.store: compile-time values, checked here."""
        reduce = self.const_eval(kw["reduce"], "xs.store's `reduce`", text_ok=True) if "reduce" in kw else None
        if reduce is not None and reduce not in tuple(ir.StoreReduce):
            self.error(s, f"xs.store(..., reduce={reduce!r}) is not a reduction xsync knows",
                       fix='use reduce="add" (element-wise add into the tensor) or leave it out')
        det = self.const_eval(kw["deterministic"], "xs.store's `deterministic`") if "deterministic" in kw else False
        if not isinstance(det, (bool, int)):
            self.error(s, f"xs.store's `deterministic` is {det!r}, not a flag",
                       fix="pass True/False or a constexpr holding one")
        if det and reduce is None:
            self.error(s, "xs.store(..., deterministic=True) without reduce=",
                       fix='deterministic orders the adds of reduce="add"; a plain store has none to order')
        return (None if reduce is None else ir.StoreReduce(reduce)), bool(det)

    # ------------------------------------------------------------ declarations
    def declare(self, decl, var, call: ast.Call, s):
        if var in self.objects or var in self.roles:
            self.error(s, f"`{var}` is declared twice")
        frontend_rules.check_user_name(self, var, s)
        kw = {k.arg: k.value for k in call.keywords}
        loc = self.loc(s)
        if decl == "role":
            if len(call.args) != 1 or not isinstance(call.args[0], ast.Constant) \
                    or not isinstance(call.args[0].value, str):
                self.error(s, 'xs.role needs a name string: xs.role("load", kind="copy")')
            name = call.args[0].value
            if any(r.name == name for r in self.roles.values()):
                self.error(s, f"role '{name}' is declared twice")
            kind = self.const_eval(kw.pop("kind"), "kind", text_ok=True) if "kind" in kw else "vector"
            replicas = self.const_eval(kw.pop("replicas"), "replicas") if "replicas" in kw else 1
            placement = (self.const_eval(kw.pop("placement"), "placement", text_ok=True)
                         if "placement" in kw else None)
            if kw:
                self.error(s, f"xs.role got unknown arguments {sorted(kw)}",
                           fix="use kind=, replicas= and placement=")
            if kind not in api.ROLE_KINDS:
                self.error(s, f"role '{name}' has kind {kind!r}",
                           fix=f"kind is one of {', '.join(api.ROLE_KINDS)}", objects=(name,))
            if not isinstance(replicas, int) or isinstance(replicas, bool) or not 1 <= replicas <= 4:
                self.error(s, f"role '{name}' has replicas={replicas!r}",
                           fix="replicas is an integer from 1 to 4", objects=(name,))
            frontend_rules.check_role_placement(self, s, name, kind, placement)
            self.roles[var] = ir.Role(name, ir.RoleKind(kind), replicas, loc,
                                      None if placement in (None, "auto") else ir.RolePlacement(placement))
            return
        if decl == "pipe":
            src, dst = self.role_args(call, s, "pipe", 2)
            if "stages" not in kw:
                self.error(s, "xs.pipe needs stages=N (ring slots)", fix="e.g. stages=2")
            stages = self.const_eval(kw.pop("stages"), "stages")
            name = var
            if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1:
                self.error(s, f"pipe '{name}' has stages={stages!r}; a pipe needs at least one slot",
                           fix="use stages=1 (no overlap) or more (2-4 for double/triple buffering)",
                           objects=(name,))
            if stages > frontend_rules.MAX_STAGES:
                self.error(s, f"pipe '{name}' has stages={stages}, more than "
                              f"{frontend_rules.MAX_STAGES} slots", objects=(name,),
                           fix="2-4 stages (double/triple buffering) hide the latency; more only "
                               "take memory")
            if src == dst:
                self.error(s, f"pipe '{name}' runs from role '{src.name}' to itself",
                           fix="a value stays inside its role without a pipe", objects=(name,))
            if src.replicas not in (1, dst.replicas) and dst.replicas != 1:
                self.error(s, f"pipe '{name}' runs from {src.replicas} replicas of '{src.name}' to "
                              f"{dst.replicas} of '{dst.name}'",
                           fix=("a pipe is 1 -> N (broadcast), N -> N (replica i feeds replica i) "
                                "or N -> 1 (gather: each slot holds one value per producer replica)"),
                           objects=(name,))
            interleave = holding.interleave(self, kw, s, name, stages, src, dst)
            fields = []
            for fname, fnode in kw.items():
                if not (isinstance(fnode, ast.Call) and self.is_xs(fnode.func) == "tile" and len(fnode.args) == 2):
                    self.error(s, f"pipe field {fname}= must be xs.tile(shape, dtype)", objects=(name,))
                shape = self.const_eval(fnode.args[0], f"shape of field {fname}")
                dtype = self.const_eval(fnode.args[1], f"dtype of field {fname}")
                if not isinstance(dtype, DType):
                    self.error(s, f"field {fname} of pipe '{name}' needs a dtype such as xs.bfloat16",
                               objects=(name,))
                shape = shapes.tile_dims(shape, f"the shape of field {fname} of pipe '{name}'", loc)
                fields.append(ir.TileSpec(fname, shape, dtype,
                                          cluster.multicast_flag(self, fnode, s, name, fname)))
            self.objects[var] = ir.Pipe(name, src.name, dst.name, stages, tuple(fields), loc,
                                        interleave=interleave)
            return
        if decl == "event":
            src, dst = self.role_args(call, s, "event", 2)
            if kw:
                self.error(s, f"xs.event got unknown arguments {sorted(kw)}")
            if src == dst:
                self.error(s, f"event '{var}' runs from role '{src.name}' to itself",
                           fix="order work inside one role by program order; events link two roles",
                           objects=(var,))
            if src.replicas > 1 and dst.replicas > 1 and src.replicas != dst.replicas:
                self.error(s, f"event '{var}' runs from {src.replicas} replicas of '{src.name}' to "
                              f"{dst.replicas} of '{dst.name}'",
                           fix=("an event is 1 -> N (broadcast), N -> N (replica i signals replica "
                                "i) or N -> 1 (the waiter needs every replica's signal)"),
                           objects=(var,))
            self.objects[var] = ir.Event(var, src.name, dst.name, loc)
            return
        if decl == "barrier":
            if kw:
                self.error(s, f"xs.barrier got unknown arguments {sorted(kw)}",
                           fix="xs.barrier(role, ...) takes roles; xs.barrier() means every role")
            members = self.role_args(call, s, "barrier", None)
            if len({r.name for r in members}) != len(members):
                self.error(s, f"barrier '{var}' names a role twice", objects=(var,),
                           fix="list each member role once (all its replicas are members)")
            # xs.barrier() with no roles: every role of the kernel meets (resolved in run(),
            # so roles declared after the barrier are members too)
            self.objects[var] = ir.Barrier(var, tuple(r.name for r in members), loc,
                                           all_roles=not members)
            return

    def role_args(self, call, s, decl, count):
        args = call.args
        if count is not None and len(args) != count:
            self.error(s, f"xs.{decl}(src, dst, ...) takes {count} roles, got {len(args)}")
        out = []
        for a in args:
            if not (isinstance(a, ast.Name) and a.id in self.roles):
                self.error(s, f"`{ast.unparse(a)}` in xs.{decl}(...) is not a declared role",
                           fix='declare roles first: `load = xs.role("load", kind="copy")`')
            out.append(self.roles[a.id])
        return out

    def check_all_sides_used(self, fdef):
        for var, obj in self.objects.items():
            if isinstance(obj, ir.Pipe):
                need = ("acquire", "commit", "wait", "release")
            elif isinstance(obj, ir.Event):
                need = ("signal", "evwait")
            else:
                continue
            missing = [v for v in need if (var, v) not in self.used_verbs]
            if missing:
                shown = ", ".join("wait" if m == "evwait" else m for m in missing)
                raise KernelSourceError(
                    f"{type(obj).__name__.lower()} '{obj.name}' is never used with: {shown}",
                    loc=obj.loc, objects=(obj.name,),
                    fix="every declared pipe/event needs both sides, or remove the declaration")

    # ------------------------------------------------------------ expressions
    def check_owner(self, name, node):
        if name not in self.home:
            return
        owner, line = self.home[name]
        if owner is None or owner == self.role_ctx:
            return
        src = self.roles[owner].name
        if self.role_ctx is None:
            self.error(node, f"unannotated code reads `{name}`, which role '{src}' produces (line {line})",
                       fix=("unannotated code is replicated into every agent and may only use "
                            "parameters and other unannotated values; move this into the role"),
                       objects=(name, src))
        dst = self.roles[self.role_ctx].name
        self.error(node, f"role '{dst}' reads `{name}`, which role '{src}' produces (line {line}); "
                         f"a value crosses roles only through a pipe",
                   fix=(f"declare `xs.pipe({owner}, {self.role_ctx}, stages=1, "
                        f"{name}=xs.tile(shape, dtype))`, write it in '{src}' and read it in '{dst}'"),
                   objects=(name, src, dst))

    def expr(self, node) -> ir.Expr:
        if isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float, bool)) and node.value is not None:
                self.error(node, f"constant {node.value!r} is not a number")
            return ir.Const(node.value)
        if isinstance(node, ast.Name):
            return self.name(node)
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):      # `x ** c` is xs.pow(x, c)
                return frontend_rules.power(self, node, node.left, node.right)
            if type(node.op) not in _BINOPS:
                self.error(node, f"operator in `{ast.unparse(node)}` is not supported")
            return ir.BinOp(_BINOPS[type(node.op)], self.expr(node.left), self.expr(node.right))
        if isinstance(node, ast.UnaryOp):
            if type(node.op) not in _UNOPS:
                self.error(node, f"operator in `{ast.unparse(node)}` is not supported")
            return ir.UnaryOp(_UNOPS[type(node.op)], self.expr(node.operand))
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1:
                self.error(node, "chained comparisons are not supported", fix="split into `a < b and b < c`")
            if type(node.ops[0]) not in _CMPOPS:   # in / not in / is / is not
                return frontend_rules.identity_compare(self, node)
            return ir.Compare(_CMPOPS[type(node.ops[0])], self.expr(node.left), self.expr(node.comparators[0]))
        if isinstance(node, ast.BoolOp):
            return ir.BoolOp("and" if isinstance(node.op, ast.And) else "or",
                             tuple(self.expr(v) for v in node.values))
        if isinstance(node, (ast.List, ast.Tuple)):
            return ir.TupleExpr(tuple(self.expr(e) for e in node.elts))
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.Attribute):
            return self.attribute(node)
        if isinstance(node, ast.Subscript):
            return self.subscript(node)
        if isinstance(node, ast.IfExp):
            self.error(node, "conditional expressions are not supported", fix="use xs.where(cond, a, b)")
        self.error(node, f"unsupported expression `{ast.unparse(node)}`")

    def name(self, node: ast.Name):
        n = node.id
        if n in self.roles or n in self.objects:
            self.error(node, f"`{n}` is a role or sync object and cannot be used as a value")
        if isinstance(self.constexprs.get(n), str):
            self.error(node, f"constexpr `{n}` is the string {self.constexprs[n]!r} and is used as a value",
                       fix=f"pass {n}=<a number or bool>; string constexprs are for xs.role(kind=...)",
                       objects=(n,))
        if isinstance(self.constexprs.get(n), DType):   # folded, as `xs.bfloat16` is
            return ir.Const(self.constexprs[n])
        if n in self.home:
            self.check_owner(n, node)
            if n in self.slots:
                self.error(node, f"slot `{n}` is used as a value; read one of its fields: `{n}.<field>`",
                           fix="a slot is a name bound by wait() or acquire(); to carry a held slot into "
                               "the next iteration, alternate two names (tutorial §14, sliding sums)")
            return ir.Name(n)
        if n in self.constexprs:
            return ir.Name(n)
        g = self.globals.get(n)
        if isinstance(g, (int, float)) and not isinstance(g, bool):
            return ir.Const(g)
        self.error(node, f"`{n}` is not defined in the kernel (or is a global that is not a number)",
                   fix="kernels see their parameters, their own values and numeric globals")

    def call(self, node: ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "to":
            if len(node.args) != 1:
                self.error(node, "x.to(dtype) takes one dtype")
            dtype = self.dtype_of(node.args[0])
            if dtype is None:
                self.error(node, f"`{ast.unparse(node.args[0])}` is not a dtype",
                           fix="use xs.float32 / xs.bfloat16 / xs.float16 or tensor.dtype")
            return ir.Cast(self.expr(f.value), dtype)
        name = self.is_xs(f)
        if name == "num_replicas":
            return frontend_rules.num_replicas(self, node)
        if name is None or name not in api.TILE_OPS:
            if isinstance(f, ast.Name) and f.id in ("min", "max", "abs", "pow"):
                self.error(node, f"Python's {f.id}() is not a tile op",
                           fix=f"use xs.{ {'min': 'minimum', 'max': 'maximum'}.get(f.id, f.id)}")
            if name in ("acquire", "wait", "signal"):
                self.error(node, f"xs.{name} used inside an expression", fix="use it as a statement")
            if name == "tile_range":
                self.error(node, "xs.tile_range(...) is only the iterator of a tile loop",
                           fix="write `for tile in xs.tile_range(total, persistent=PERSISTENT):`")
            self.error(node, f"`{ast.unparse(f)}` is not an xsync tile op",
                       fix="available: " + ", ".join(sorted(api.TILE_OPS)))
        args, keywords = frontend_rules.bind_arguments(self, node, name, api.TILE_OPS[name])
        if name in ("zeros", "full"):
            dtype = self.dtype_of(args[-1])
            if dtype is None:
                self.error(node, f"xs.{name} needs a dtype as its last argument (e.g. xs.float32)")
        if name == "replica_id" and self.role_ctx is None:
            self.error(node, "xs.replica_id() outside a role block",
                       fix="replica ids exist per role: call it inside `with <role>:`")
        if name in ("mma", "mma_wait") and self.role_ctx is None:
            self.error(node, f"xs.{name} outside any role block",
                       fix="matrix work belongs to a role of kind 'matrix'")
        if name == "mma" and self.roles[self.role_ctx].kind is not ir.RoleKind.MATRIX:
            r = self.roles[self.role_ctx]
            self.error(node, f"xs.mma in role '{r.name}' of kind '{r.kind}'",
                       fix="matrix multiplies run in a role of kind 'matrix' (the wgmma warpgroup / "
                           "the Ascend cube core)", objects=(r.name,))
        if name in ("load", "load_scalar") and not (
                isinstance(args[0], ast.Name) and args[0].id in self.tensor_dtypes):
            self.error(node, f"xs.{name} source `{ast.unparse(args[0])}` is not a tensor parameter")
        if name == "pow":
            return frontend_rules.power(self, node, *args)
        args = tuple(self.expr(a) for a in args)
        kwargs = tuple((k.arg, self.expr(k.value)) for k in keywords)
        return ir.Call(ir.TileOp(name), args, kwargs)

    def attribute(self, node: ast.Attribute):
        dtype = self.dtype_of(node)
        if dtype is not None:
            return ir.Const(dtype)
        field = frontend_rules.slot_field(self, node)
        if field is not None:
            return field
        self.error(node, f"unsupported attribute `{ast.unparse(node)}`",
                   fix="attributes are slot fields (slot.a), tensor.dtype and xs.<name>")

    def subscript(self, node: ast.Subscript):
        idx = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        out = []
        for i in idx:
            if isinstance(i, ast.Slice) and i.lower is None and i.upper is None and i.step is None:
                out.append(":")
            elif isinstance(i, ast.Constant) and i.value is None:
                out.append(None)
            else:
                self.error(node, f"indexing `{ast.unparse(node)}` is not supported",
                           fix="only broadcasting is: x[:, None] / x[None, :]")
        return ir.Subscript(self.expr(node.value), tuple(out))
