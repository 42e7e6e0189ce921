"""The launch contract of a single-tile loop.

``for tile in xs.tile_range(total, persistent=False)`` is compiled without a loop: program p
runs the tile p if p < total, and nothing else. That is the persistent loop's behaviour only
when at least ``total`` programs are launched; with fewer, some tiles would never run and the
output would be silently incomplete. So the tile count must be computable on the host from the
launch's scalars (the kernel's scalar and constexpr parameters, through the top-level
assignments before the loop: ``row_blocks = xs.cdiv(max_q, 2 * BM)``), and every launch checks
its grid against it before anything runs.
"""
from __future__ import annotations

from dataclasses import dataclass

from xsync.errors import KernelSourceError, LaunchError, SourceLoc
from xsync.lowering import ir
from xsync.lowering.protocol import NotConstant, evaluate, text

HOST_OPS = ("cdiv", "minimum", "maximum")


@dataclass(frozen=True)
class TileCount:
    """How many programs a single-tile loop needs: ``total`` after the ``prelude``."""

    loop: ir.For
    prelude: tuple[ir.Assign, ...]      # the top-level assignments ``total`` reads, in order

    def programs_needed(self, scalars: dict) -> int:
        env = dict(scalars)
        for a in self.prelude:
            env[a.targets[0]] = evaluate(a.value, env)
        return int(evaluate(self.loop.stop, env))


def _host_computable(e: ir.Expr, known: set[str]) -> str | None:
    """None if ``e`` is arithmetic over ``known`` names; else the first part that is not."""
    if isinstance(e, ir.Const):
        return None
    if isinstance(e, ir.Name):
        return None if e.id in known else e.id
    if isinstance(e, (ir.BinOp, ir.Compare)):
        return _host_computable(e.left, known) or _host_computable(e.right, known)
    if isinstance(e, ir.UnaryOp):
        return _host_computable(e.operand, known)
    if isinstance(e, ir.Call) and e.op in HOST_OPS:
        for x in e.args:
            bad = _host_computable(x, known)
            if bad:
                return bad
        return None
    return text(e)


def single_tile_counts(kernel: ir.KernelIR) -> tuple[TileCount, ...]:
    """The tile count of every top-level single-tile loop, or KernelSourceError naming the
    part of the count that the host cannot compute."""
    known = {p.name for p in kernel.params if p.kind in (ir.ParamKind.SCALAR, ir.ParamKind.CONSTEXPR)}
    defs: dict[str, ir.Assign] = {}
    counts = []
    for s in kernel.body:
        if isinstance(s, ir.Assign) and len(s.targets) == 1 and \
                _host_computable(s.value, known | set(defs)) is None:
            defs[s.targets[0]] = s
        elif isinstance(s, ir.Assign):
            for t in s.targets:
                defs.pop(t, None)
        elif isinstance(s, ir.For) and s.single_tile:
            bad = _host_computable(s.stop, known | set(defs))
            if bad is not None:
                raise KernelSourceError(
                    f"kernel '{kernel.name}': the tile count of xs.tile_range(..., persistent=False) "
                    f"reads `{bad}`, which the host cannot compute before the launch",
                    loc=s.loc, objects=(s.var,),
                    fix="compute the tile count from scalar and constexpr parameters (e.g. "
                        "xs.cdiv(max_q, 2 * BM) * heads), or launch it persistent")
            counts.append(TileCount(s, tuple(_prelude(s.stop, defs))))
        if isinstance(s, (ir.For, ir.If, ir.RoleBlock)):
            _no_nested_single_tile(kernel, s)
    return tuple(counts)


def _no_nested_single_tile(kernel: ir.KernelIR, s) -> None:
    for inner in (*s.body, *getattr(s, "orelse", ())):
        if isinstance(inner, ir.For) and inner.single_tile:
            raise KernelSourceError(
                f"kernel '{kernel.name}': xs.tile_range(..., persistent=False) inside a loop or branch",
                loc=inner.loc, objects=(inner.var,),
                fix="make the tile loop a top-level statement of the kernel (it decides which tile "
                    "the whole program works on)")
        if isinstance(inner, (ir.For, ir.If, ir.RoleBlock)):
            _no_nested_single_tile(kernel, inner)


def _prelude(e: ir.Expr, defs: dict[str, ir.Assign]) -> list[ir.Assign]:
    """The assignments ``e`` reads, directly or through each other, in program order."""
    need, stack = set(), list(ir.expr_names(e))
    while stack:
        n = stack.pop()
        if n in defs and n not in need:
            need.add(n)
            stack.extend(ir.expr_names(defs[n].value))
    return [a for a in defs.values() if a.targets[0] in need]


def check_grid(kernel: ir.KernelIR, counts: tuple[TileCount, ...], grid: tuple, scalars: dict,
               constexprs: dict) -> None:
    """LaunchError unless ``grid`` launches a program for every tile of every single-tile loop."""
    env = {**scalars, **constexprs}
    n = kernel.cluster
    if grid[0] % n:
        raise LaunchError(
            f"kernel '{kernel.name}' groups {n} programs into a cluster (xs.cluster({n})), but the "
            f"launch has {grid[0]} program(s) on axis 0", loc=kernel.cluster_loc,
            fix=f"launch a multiple of {n} programs on axis 0 ({-(-grid[0] // n) * n}, say)")
    for count in counts:
        try:
            needed = count.programs_needed(env) * n   # tiles are dealt to clusters
        except (NotConstant, ZeroDivisionError, TypeError) as exc:
            raise LaunchError(f"kernel '{kernel.name}': cannot compute the tile count of "
                              f"xs.tile_range(..., persistent=False) from the launch's scalars ({exc})",
                              loc=count.loop.loc, objects=(count.loop.var,)) from exc
        if grid[0] < needed:
            raise LaunchError(
                f"kernel '{kernel.name}': xs.tile_range(..., persistent=False) runs one tile per "
                f"program{f' of each cluster of {n}' if n > 1 else ''}, but the launch has {grid[0]} "
                f"program(s) on axis 0 for {needed // n} tiles: {(needed - grid[0]) // n} tile(s) "
                f"would never run",
                loc=count.loop.loc, objects=(count.loop.var,),
                fix=f"launch {needed} programs on axis 0, or compile it persistent "
                    f"(persistent=True walks every tile with any number of programs)")


def check_int_scalars(kernel: ir.KernelIR, scalars: dict) -> None:
    """LaunchError for a float passed to a run-time scalar the kernel uses as an integer (a loop
    bound, an offset): the generated code could not take it (``range(4.0)``)."""
    for name, line in kernel.int_scalars:
        value = scalars.get(name)
        if isinstance(value, float) or not isinstance(value, int):
            exact = f" ({name}={int(value)})" if isinstance(value, float) and value.is_integer() else ""
            raise LaunchError(
                f"kernel '{kernel.name}': scalar `{name}` is {value!r} ({type(value).__name__}), but the "
                f"kernel uses it as an integer (line {line})",
                loc=SourceLoc(kernel.file, line, kernel.name), objects=(name,),
                fix=f"pass an int for `{name}`{exact}")


@dataclass(frozen=True)
class LaunchUses:
    """What a launch must check of its arguments against the kernel's use of them: the rank
    each tensor parameter is read or written with (and the first line doing so), and the loop
    steps that are run-time scalars (a zero step never ends)."""

    ranks: tuple[tuple[str, int, int], ...]        # (tensor, rank, line)
    steps: tuple[tuple[str, int], ...]             # (scalar, line)

    def check(self, kernel: ir.KernelIR, args: dict) -> None:
        for name, rank, line in self.ranks:
            x = args.get(name)
            dim = getattr(x, "dim", None)
            if dim is not None and dim() != rank:
                raise LaunchError(
                    f"kernel '{kernel.name}': tensor `{name}` has {dim()} dimension(s) (shape "
                    f"{tuple(x.shape)}), but the kernel reads or writes it as a {rank}-D tensor (line {line})",
                    loc=SourceLoc(kernel.file, line, kernel.name), objects=(name,),
                    fix=f"pass a {rank}-D tensor for `{name}` (e.g. `{name}.reshape({_dims(rank)})`), or "
                        f"address it with {dim()} offset(s) in the kernel")
        for name, line in self.steps:
            if args.get(name) == 0 and not isinstance(args.get(name), bool):
                raise LaunchError(
                    f"kernel '{kernel.name}': scalar `{name}` is 0, but the kernel uses it as a loop step "
                    f"(line {line}): the loop would never end",
                    loc=SourceLoc(kernel.file, line, kernel.name), objects=(name,),
                    fix=f"pass a non-zero step for `{name}`")


def _dims(rank: int) -> str:
    return {1: "n", 2: "rows, cols", 3: "b, rows, cols"}.get(rank, "b, h, rows, cols")


def tensor_ranks(kernel: ir.KernelIR) -> dict[str, int]:
    """The rank each tensor parameter is addressed with by xs.load / xs.store (its offsets'
    count; the shape check makes it one per tensor); tensors only xs.load_scalar reads are absent."""
    return {name: rank for name, rank, _ in launch_uses(kernel).ranks}


def launch_uses(kernel: ir.KernelIR) -> LaunchUses:
    """The tensor ranks and run-time loop steps of ``kernel`` (computed once per compile)."""
    tensors = {p.name for p in kernel.params if p.kind is ir.ParamKind.TENSOR}
    scalars = {p.name for p in kernel.params if p.kind is ir.ParamKind.SCALAR}
    ranks: dict[str, tuple[int, int]] = {}
    steps: dict[str, int] = {}
    for s in ir.walk(kernel.all_statements()):
        line = s.loc.line
        if isinstance(s, ir.Store) and s.tensor in tensors:
            ranks.setdefault(s.tensor, (len(s.offsets), line))
        if isinstance(s, ir.For) and isinstance(s.step, ir.Name) and s.step.id in scalars:
            steps.setdefault(s.step.id, line)
        for attr in ("value", "cond", "start", "stop", "step", "guard"):
            e = getattr(s, attr, None)
            if e is None or isinstance(e, (str, int)):
                continue
            for c in ir.expr_calls(e):
                if c.op is ir.TileOp.LOAD and isinstance(c.args[0], ir.Name) and c.args[0].id in tensors \
                        and isinstance(c.args[1], ir.TupleExpr):
                    ranks.setdefault(c.args[0].id, (len(c.args[1].items), line))
    return LaunchUses(tuple((n, r, ln) for n, (r, ln) in ranks.items()), tuple(steps.items()))
