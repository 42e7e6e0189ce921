"""A kernel object: compile pipeline, cache and launch.

    source --frontend--> KernelIR --placement--> agents --verify--> (ok)
           --alloc--> resources --backend renderer--> generated code --> run

Compiled kernels are cached by (source hash, the values of the globals and closure variables
the source names, backend, constexprs, tensor dtypes, verify, accept_bounded, the backend's
LowerOptions and RenderOptions): rebinding a module-level constant the kernel reads recompiles. A backend name (``XSYNC_BACKEND``, a
``backend=`` argument) becomes a :class:`~xsync.backends.base.Backend` here, once; the
configuration becomes the backend's option objects here too (``xsync.config``), and both
travel down as objects. ``XSYNC_DUMP=<dir>`` writes each generated source and its allocation
table.
``XSYNC_VERIFY=0`` skips the verifier (the CPU emulator's stall watchdog still reports
hangs).

A verdict is proven (every trip count and scalar value), rejected (a ProtocolError with a
counterexample) or not proven (checked only up to bounds: ``VerifyReport.unproven``). A kernel
that is not proven is not lowered, compiled or launched: where it is verified
(:meth:`Kernel._lower`) it raises ``VerifierLimitError`` carrying the report, unless the
``accept_bounded`` option (``@xs.kernel(accept_bounded=True)``, ``xsync.options``,
``XSYNC_ACCEPT_BOUNDED=1``, ``--accept-bounded``) accepts it; the report then says NOT PROVEN.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import inspect
import operator
import os
import textwrap
import threading
from dataclasses import dataclass

from xsync import config
from xsync import dtypes as xs_types
from xsync.errors import LaunchError, SourceLoc
from xsync.files import write_atomic
from xsync.lowering import ir
from xsync.lowering.alloc import Allocation, allocate
from xsync.lowering import passes
from xsync.lowering import reduce_add
from xsync.lowering.constexprs import constexpr_values
from xsync.lowering.frontend import parse_kernel
from xsync.lowering.passes import PassLog
from xsync.lowering.placement import Placement
from xsync.lowering.protocol import Skeleton, derive
from xsync.lowering.tile_launch import check_grid, check_int_scalars, launch_uses, single_tile_counts
from xsync.lowering.verifier.check import not_proven_error
from xsync.lowering.verify import VerifyReport, verify

def _xs_dtype(torch_dtype):
    """The xsync dtype of a torch dtype (None if unsupported); memoized per dtype object."""
    hit = _DTYPE_MEMO.get(torch_dtype)
    if hit is None and torch_dtype not in _DTYPE_MEMO:
        hit = _DTYPE_MEMO[torch_dtype] = _TORCH_TO_XS.get(str(torch_dtype))
    return hit


_DTYPE_MEMO: dict = {}
_TORCH_TO_XS = {"torch.float16": xs_types.float16, "torch.bfloat16": xs_types.bfloat16,
                "torch.float32": xs_types.float32, "torch.int32": xs_types.int32}


@dataclass
class Lowered:
    """Everything xsync derives for one specialization on one backend."""

    kernel: ir.KernelIR
    placement: Placement
    allocation: Allocation
    report: VerifyReport | None
    backend: object                     # the xsync.backends.base.Backend it was lowered by
    passes: PassLog | None = None       # what the schedule passes did (xsync check prints it)
    skeleton: Skeleton | None = None    # the protocol's one meaning (also allocation.skeleton)
    options: object = None              # the backend's LowerOptions the passes and allocator read


class Kernel:
    """``@xs.kernel(example=..., trace=...)``.

    example: the specialization ``xsync check``/``lower`` use (constexpr values and
    tensor dtypes by parameter name).
    options: configuration defaults for this kernel (``xsync.config`` option names, e.g.
    ``{"nv_pingpong": "0"}``); the environment is below them, ``with xsync.options(...)``
    above them.
    trace: optional ``fn(settings) -> (grid, args, kwargs)`` building a *small* launch
    (tiny tensors, 1-2 programs) that ``xsync trace`` runs on the CPU emulator as
    ``kernel[grid](*args, **kwargs)``; ``settings`` holds the ``--set NAME=VALUE`` values
    (ints, floats, strings, xs dtypes) for the hook to honour. See ``xsync.trace``.
    accept_bounded: this kernel's default of the ``accept_bounded`` option (lower, compile
    and launch it where its verdict is only bounded; the report says NOT PROVEN).
    """

    def __init__(self, fn, example: dict | None = None, trace=None, options: dict | None = None,
                 accept_bounded: bool | None = None):
        if trace is not None and not callable(trace):
            raise TypeError(f"@xs.kernel(trace=...) of '{fn.__name__}' must be a function "
                            f"settings -> (grid, args, kwargs), got {type(trace).__name__}")
        self.fn = fn
        self.trace = trace
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.signature = inspect.signature(fn)
        self.example = dict(example or {})
        # Configuration defaults of this kernel (xsync.config option names).
        if accept_bounded is not None:
            options = {**(options or {}), "accept_bounded": accept_bounded}
        self.options = config.kernel_options(options, fn.__name__)
        self._cache: dict = {}
        self._dumped: set = set()
        self._lock = threading.Lock()
        self._source_hash: str | None = None
        self._free_names: tuple[str, ...] | None = None   # globals/closures the source names
        self._launch_memo: dict = {}     # launch-path key (no sorting) -> (compiled, tile counts, launch uses)
        self.generation = 0              # bumped by clear_cache()
        # Launch-path facts, computed once (every launch needs them).
        self._constexpr_names = tuple(
            name for name, p in self.signature.parameters.items()
            if p.annotation is xs_types.constexpr or (isinstance(p.annotation, str)
                                                 and p.annotation.endswith("constexpr")))
        self._constexpr_defaults = {
            name: self.signature.parameters[name].default for name in self._constexpr_names
            if self.signature.parameters[name].default is not inspect.Parameter.empty}

    def clear_cache(self):
        """Forget every compiled specialization of this kernel (the next launch compiles)."""
        with self._lock:
            self._cache.clear()
            self._launch_memo.clear()
            self._dumped.clear()
            self.generation += 1      # launch plans made before this are stale

    def __repr__(self):
        return f"<xsync kernel {self.fn.__module__}.{self.__name__}>"

    def __call__(self, *args, **kwargs):
        raise LaunchError(f"xsync kernel '{self.__name__}' needs a grid: {self.__name__}[grid](...)",
                          fix="launch with kernel[(programs,)](*args, CONST=value)")

    def __getitem__(self, grid):
        def launcher(*args, backend=None, **kwargs):
            return self.launch(grid, args, kwargs, backend=backend)
        return launcher

    # ---------------------------------------------------------------- lowering
    def constexpr_names(self) -> list[str]:
        return list(self._constexpr_names)

    def source_hash(self) -> str:
        # Computed once: every launch needs it, and reading the source costs milliseconds.
        if self._source_hash is None:
            self._source_hash = hashlib.sha256(inspect.getsource(self.fn).encode()).hexdigest()[:16]
        return self._source_hash

    def captured(self) -> tuple:
        """The values of the globals and closure variables the kernel's source names, as a
        cache key: the frontend folds numeric globals into the program, so a rebinding
        (``SCALE = 3.0`` between launches) must compile again, never reuse the stale kernel."""
        names = self._free_names
        if names is None:
            names = self._free_names = _free_names(self.fn)
        fn = self.fn
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__)) if fn.__closure__ else {}
        out = []
        for name in names:
            cell = cells.get(name)
            if cell is not None:
                try:
                    value = cell.cell_contents
                except ValueError:        # a closure variable not bound yet
                    value = _UNBOUND
            else:
                value = fn.__globals__.get(name, _UNBOUND)
            out.append(_fingerprint(value))
        return tuple(out)

    def lower(self, backend, constexprs: dict | None = None, tensor_dtypes: dict | None = None,
              check: bool | None = None, options=None, accept_bounded: bool | str | None = None) -> Lowered:
        """Frontend, placement, schedule passes, verification and allocation for one
        specialization. ``backend``: a Backend or its name (no availability check: lowering
        needs no hardware). ``options``: the backend's ``LowerOptions``, or a dict of its
        fields over the configuration (environment < @xs.kernel(options=) < xsync.options).
        ``check``: run the verifier (default: the ``verify`` option). ``accept_bounded``:
        lower a kernel whose verdict is not proven (default: the ``accept_bounded`` option;
        a text says who accepts it, as the report repeats it, e.g. ``"--accept-bounded"``);
        without it such a kernel raises ``VerifierLimitError``."""
        from xsync.backends import get

        backend = get(backend)
        with config.kernel_scope(self.options):
            settings = config.current()
            lower_options = config.lower_options(backend, options, settings)
            run_check = settings.verify if check is None else check
            if accept_bounded is None:
                accept = config.set_by("accept_bounded") if settings.accept_bounded else None
            elif accept_bounded:
                accept = accept_bounded if isinstance(accept_bounded, str) else "accept_bounded=True"
            else:
                accept = None
        return self._lower(backend, constexprs, tensor_dtypes, run_check, lower_options, accept)

    def _lower(self, backend, constexprs, tensor_dtypes, check: bool, options,
               accept: str | None = None) -> Lowered:
        """``accept``: who accepts a verdict that is not proven (None: nobody, it raises)."""
        constexprs, tensor_dtypes = self.specialization(constexprs, tensor_dtypes)
        kernel = parse_kernel(self.fn, constexprs, tensor_dtypes)
        placement = backend.place(kernel)
        reduce_add.check(kernel, placement)
        log = PassLog()
        # The verifier checks what the passes emit, not what the user wrote.
        written = kernel
        kernel = passes.run(kernel, placement, log, options)
        skeleton = derive(kernel, placement)
        report = verify(kernel, placement, skeleton) if check else None
        if report is not None and not report.proven and kernel is not written:
            # a rewrite the verifier proves only up to its bounds is not kept where the kernel
            # as written is proven (cross-agent-pipeline rule 7): a proof beats a schedule
            plain = derive(written, placement)
            first = verify(written, placement, plain)
            if first.proven:
                log = PassLog([n if not n.applied else dataclasses.replace(
                    n, applied=False, why=f"{n.why}; not kept: the rewritten protocol is proven only "
                                          f"up to the verifier's bounds, the kernel as written for every value")
                    for n in log.notes])
                kernel, skeleton, report = written, plain, first
        if report is not None and not report.proven:
            if accept is None:
                raise not_proven_error(kernel, report)
            report = report.accepted(accept)
        allocation = allocate(kernel, placement, skeleton, options)
        return Lowered(kernel, placement, allocation, report, backend, log, skeleton, options)

    def specialization(self, constexprs: dict | None = None, tensor_dtypes: dict | None = None):
        """(constexprs, tensor dtypes): the given ones, else the kernel's ``example=``, with
        signature defaults (`GROUP_M: xs.constexpr = 8`) filling the constexprs left out."""
        def is_tensor_dtype(name, value):   # a dtype-valued constexpr (`DT=xs.bfloat16`) is not
            return isinstance(value, xs_types.DType) and name not in self._constexpr_names
        if constexprs is None:
            constexprs = {k: v for k, v in self.example.items() if not is_tensor_dtype(k, v)}
        if tensor_dtypes is None:
            tensor_dtypes = {k: v for k, v in self.example.items() if is_tensor_dtype(k, v)}
        return constexpr_values(self.fn, {**self._constexpr_defaults, **constexprs}), dict(tensor_dtypes)

    def compile(self, backend, constexprs: dict | None = None, tensor_dtypes: dict | None = None):
        """The compiled kernel of one specialization on ``backend`` (a Backend or its name),
        under the configuration in effect."""
        from xsync.backends import get

        backend = get(backend)
        with config.kernel_scope(self.options):
            return self._compile(backend, constexprs, tensor_dtypes, config.current())

    def _compile(self, backend, constexprs, tensor_dtypes, settings):
        constexprs, tensor_dtypes = self.specialization(constexprs, tensor_dtypes)
        lower_options, render_options = settings.backend_options(backend)
        # The option objects are part of the key: changing an option recompiles.
        key = (self.source_hash(), self.captured(), backend.name, tuple(sorted(constexprs.items())),
               tuple(sorted((k, v.name) for k, v in tensor_dtypes.items())), settings.verify,
               settings.accept_bounded, lower_options, render_options)
        with self._lock:
            compiled = self._cache.get(key)
        if compiled is None:
            # (compile and launch run in the kernel's option scope: set_by sees its layer)
            accept = config.set_by("accept_bounded") if settings.accept_bounded else None
            lowered = self._lower(backend, constexprs, tensor_dtypes, settings.verify, lower_options,
                                  accept)
            compiled = backend.compile(lowered.kernel, lowered.placement, lowered.allocation,
                                       render_options)
            compiled.lowered = lowered
            with self._lock:
                self._cache[key] = compiled
        dump_dir = settings.dump
        if dump_dir and (dump_dir, key) not in self._dumped:
            # once per specialization, under its own names: specializations never overwrite
            try:
                dump(dump_dir, compiled.lowered, compiled.source, tag=_digest(repr(key))[:8])
            except OSError as exc:
                raise _dump_error(dump_dir, exc) from exc
            self._dumped.add((dump_dir, key))
        return compiled

    # ---------------------------------------------------------------- launch
    def _binder(self):
        """``signature.bind`` + ``apply_defaults`` as a generated function (the launch path
        runs it on every call; inspect's binder costs tens of microseconds)."""
        fn = self.__dict__.get("_bind_fn")
        if fn is None:
            params = self.signature.parameters
            if any(p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params.values()):
                fn = self._inspect_bind
            else:
                namespace = {f"default_{n}": p.default for n, p in params.items()
                             if p.default is not p.empty}
                arglist = ", ".join(n if p.default is p.empty else f"{n}=default_{n}"
                                    for n, p in params.items())
                body = ", ".join(f"{n!r}: {n}" for n in params)
                exec(f"def bind({arglist}):\n    return {{{body}}}\n", namespace)  # noqa: S102
                fn = namespace["bind"]
            self.__dict__["_bind_fn"] = fn
        return fn

    def _inspect_bind(self, *args, **kwargs):
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def bind(self, args, kwargs):
        """Split launch arguments into run-time args, constexprs and tensor dtypes."""
        try:
            arguments = self._binder()(*args, **kwargs)
        except TypeError as exc:
            raise LaunchError(f"kernel '{self.__name__}': {str(exc).replace('bind()', self.__name__ + '()')}",
                              fix=f"signature is {self.__name__}{self.signature}") from exc
        consts = self._constexpr_names
        run_args, constexprs, dtypes = {}, {}, {}
        for name, value in arguments.items():
            if name in consts:
                constexprs[name] = value
                continue
            if hasattr(value, "dtype") and hasattr(value, "shape"):
                xs_dtype = _xs_dtype(value.dtype)
                if xs_dtype is None:
                    raise LaunchError(f"kernel '{self.__name__}': tensor `{name}` has dtype {value.dtype}",
                                      fix="use float16, bfloat16, float32 or int32 tensors")
                if not 1 <= value.dim() <= 4:   # the kernel's rank of each is checked at launch
                    raise LaunchError(
                        f"kernel '{self.__name__}': tensor `{name}` has {value.dim()} dims; "
                        f"xs.load/xs.store address tensors of 1 to 4 dimensions",
                        fix="pass a view of 1 to 4 dimensions (e.g. x.view(-1, x.shape[-1]))")
                dtypes[name] = xs_dtype
            elif not isinstance(value, (int, float)):
                raise LaunchError(f"kernel '{self.__name__}': argument `{name}` is a {type(value).__name__}",
                                  fix="pass tensors, ints or floats")
            run_args[name] = value
        return run_args, constexprs, dtypes

    def launch(self, grid, args, kwargs, backend=None):
        if self.options:
            with config.kernel_scope(self.options):
                return self._launch(grid, args, kwargs, backend)
        return self._launch(grid, args, kwargs, backend)

    def _launch(self, grid, args, kwargs, backend):
        from xsync.backends import select

        settings = config.current()
        backend = select(backend, settings.backend)
        run_args, constexprs, dtypes = self.bind(args, kwargs)
        grid = launch_grid(self.__name__, grid(constexprs) if callable(grid) else grid)
        # bind() yields the constexprs and dtypes in signature order: a key without sorting
        fast = (backend, self.captured(), tuple(constexprs.values()), tuple(dtypes.items()), settings.verify,
                settings.accept_bounded, settings.backend_options(backend))
        try:
            memo = self._launch_memo.get(fast)
        except TypeError:   # an unhashable constexpr (a list, ...): _compile names it
            memo = None
        if memo is None or settings.dump:
            compiled = self._compile(backend, constexprs, dtypes, settings)
            memo = self._launch_memo[fast] = (compiled, single_tile_counts(compiled.lowered.kernel),
                                              launch_uses(compiled.lowered.kernel))
        compiled, counts, uses = memo
        if compiled.lowered.kernel.int_scalars:
            check_int_scalars(compiled.lowered.kernel, run_args)
        uses.check(compiled.lowered.kernel, run_args)   # tensor ranks, run-time loop steps
        if counts or compiled.lowered.kernel.cluster > 1:   # one program per tile; whole clusters
            check_grid(compiled.lowered.kernel, counts, grid, run_args, constexprs)
        compiled.launch(grid, run_args, settings)
        return compiled


def dump(directory: str, lowered: Lowered, source: str, tag: str | None = None) -> list[str]:
    """Write the generated source and its allocation table (each atomically: whole or not at
    all) as <kernel>.<backend>[.<tag>].py and .alloc.txt; returns the two paths."""
    k = lowered.kernel
    stem = os.path.join(directory, f"{k.name}.{lowered.backend.target_name}" + (f".{tag}" if tag else ""))
    spec = " ".join(f"{n}={v}" for n, v in k.constexprs) + "".join(
        f" {p.name}={p.dtype.name}" for p in k.params if p.dtype is not None)
    table = f"specialization: {spec}\n" + lowered.allocation.table() + "\n"
    if lowered.passes is not None and lowered.passes.notes:
        table += "\n" + lowered.passes.text() + "\n"
    if lowered.report is not None:
        table += "\n" + lowered.report.summary() + "\n"
    paths = [stem + ".py", stem + ".alloc.txt"]
    for path, text in zip(paths, (source, table)):
        write_atomic(path, text)
    return paths


_UNBOUND = object()
MAX_GRID = 2**31 - 1      # programs along one axis (CUDA's x limit; the others are smaller)


def launch_grid(name: str, grid) -> tuple[int, ...]:
    """``kernel[grid]``'s grid as 1-3 non-negative ints, or a LaunchError at the caller's line
    (a string, None, a float or a bool is a slip, not a size)."""
    dims = grid if isinstance(grid, (tuple, list)) else (grid,)
    out = []
    for g in dims:
        try:
            size = operator.index(g) if not isinstance(g, bool) else None
        except TypeError:
            size = None
        if size is None or not 0 <= size <= MAX_GRID:
            what = (f"{g!r} is a {type(g).__name__}, not a number of programs" if size is None
                    else f"{size} programs along one axis is outside 0..{MAX_GRID}")
            raise LaunchError(f"kernel '{name}': grid {grid!r}: {what}", loc=caller_loc(),
                              fix=f"launch with {name}[(n,)] or {name}[(n, m)], n and m ints "
                                  f"(e.g. triton.cdiv(M, BM) or math.ceil(...), not a float)")
        out.append(size)
    if not 1 <= len(out) <= 3:
        raise LaunchError(f"kernel '{name}': grid {grid!r} has {len(out)} axes", loc=caller_loc(),
                          fix=f"launch with 1 to 3 sizes: {name}[(n,)], {name}[(n, m)] or {name}[(n, m, k)]")
    return tuple(out)


def caller_loc() -> SourceLoc | None:
    """The innermost frame outside xsync, its library kernels and torch: the user's call."""
    import sys

    root = os.path.dirname(os.path.abspath(__file__))
    ours = (root + os.sep, os.path.join(os.path.dirname(root), "kernels") + os.sep)  # + a checkout's kernels/
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        # torch.ops dispatch and autograd sit between the user's call and the library's checks
        ours += (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,)
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(ours) and frame.f_code.co_filename[:1] != "<":
            return SourceLoc(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return None


def _dump_error(directory: str, exc: OSError) -> config.ConfigError:
    """XSYNC_DUMP names something that cannot receive files (a file, a read-only folder)."""
    what = ("is a file, not a folder" if os.path.exists(directory) and not os.path.isdir(directory)
            else f"cannot be written ({exc.strerror or exc})")
    return config.ConfigError(f"the dump folder {directory} {what} ({config.set_by('dump')})",
                              fix="set XSYNC_DUMP (or xsync.options(dump=...)) to a writable folder, "
                                  "or unset it")


def _free_names(fn) -> tuple[str, ...]:
    """Names the kernel's source reads that are neither its parameters nor assigned in it
    (globals, closure variables, builtins: a superset of what the frontend looks up)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return ()    # the frontend reports an unreadable source with its own error
    fdef = tree.body[0] if tree.body else None
    if not isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return ()
    params = set(inspect.signature(fn).parameters)
    body = [n for stmt in fdef.body for n in ast.walk(stmt) if isinstance(n, ast.Name)]
    stored = {n.id for n in body if not isinstance(n.ctx, ast.Load)}
    read = {n.id for n in body if isinstance(n.ctx, ast.Load)}
    return tuple(sorted(read - params - stored))


def _fingerprint(value):
    """A hashable stand-in for a captured value: numbers and strings by type and value
    (1 and 1.0 and True fold differently), anything else by identity (a module, a function)."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return (type(value).__name__, value)
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return ("obj", value)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
