"""Huawei Ascend backend (triton-ascend).

``compile_kernel`` renders the triton-ascend source (see ``render.py`` for the two
forms and the replica fallback), writes it to a real ``.py`` file (``triton.jit`` reads
its source) under ``$XSYNC_CACHE_DIR/ascend`` (default ``~/.cache/xsync``; written
atomically: temp file + ``os.replace``) and returns an object with ``.source`` and
``.launch(grid, args)``. Launching needs an NPU (torch_npu); rendering does not.

On a machine without CANN/NPU, :func:`compile_hivm` runs triton-ascend's own ``ttir``
and ``ttadapter`` stages (``triton-adapter-opt``) and returns the TTIR and the
HIVM-flavoured MLIR text, where the sync ops appear as
``hivm.hir.sync_block_set[<CUBE>, <PIPE_FIX>, <PIPE_MTE2>] flag = N``.

Environment:
  XSYNC_ASCEND_FORM    release | scope | auto (default: scope when
                       ``triton.language.extra.cann.extension`` is importable, i.e.
                       triton-ascend 3.2.1+, else release)
  XSYNC_ASCEND_CORES   AI cores (cube cores) a launch may keep resident; used for the
                       grid check of kernels with ``sync_block_all`` barriers when the
                       device cannot be asked (default 20: Ascend 910B3)
  XSYNC_ASCEND_EVENT_IDS  event-ID budget cap (see xsync.lowering.alloc)
  XSYNC_CACHE_DIR      where generated sources are written
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import threading

from xsync import config, files
from xsync.backends.ascend import options as ascend_options
from xsync.backends.ascend import render as _render
from xsync.backends.ascend.addressing import host_values
from xsync.backends.ascend.placement import TARGET, place
from xsync.backends.base import Backend
from xsync.errors import BackendError, LaunchError
from xsync.lowering import ir
from xsync.lowering.placement import Placement
from xsync.lowering.tile_launch import tensor_ranks

DEFAULT_CORES = 20          # Ascend 910B3: 20 AI cores (1 cube + 2 vector cores each)
DEFAULT_ARCH = "Ascend910B3"
# triton-ascend kernel options xsync compiles and launches with: the protocol's flags are
# exactly xsync's allocation, so the compiler's automatic cross-core sync stays off.
COMPILE_OPTIONS = {"disable_auto_inject_block_sync": True}


def availability() -> tuple[bool, str]:
    try:
        import torch_npu  # noqa: F401
    except Exception:  # noqa: BLE001 - torch_npu raises several kinds without CANN
        return False, "torch_npu is not importable (needs CANN and an Ascend NPU)"
    import torch
    if not torch.npu.is_available():
        return False, "no Ascend NPU is visible to torch_npu"
    try:
        import triton.backends  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError:
        return False, "triton-ascend is not installed"
    return True, ""


def scope_form_available() -> bool:
    """True when the installed triton-ascend has al.scope (3.2.1+, which still report 3.2.0)."""
    try:
        return importlib.util.find_spec("triton.language.extra.cann.extension") is not None
    except (ImportError, ValueError, AttributeError):
        return False


def select_form(form: str | None = None) -> str:
    raw = (form if form is not None else config.current().ascend_form).strip().lower()
    if raw in ("", "auto"):
        return "scope" if scope_form_available() else "release"
    if raw not in _render.FORMS:
        raise BackendError(f"unknown Ascend source form {raw!r}" + ("" if form else " (from XSYNC_ASCEND_FORM)"),
                           fix="use release (triton-ascend 3.2.0), scope (3.2.1+, al.scope) or auto")
    return raw


def core_count() -> tuple[int, str]:
    """(AI cores a launch may keep resident, where the number came from)."""
    n = config.current().ascend_cores
    if n is not None:
        return n, "XSYNC_ASCEND_CORES"
    try:
        import torch
        import torch_npu  # noqa: F401
        from triton.runtime import driver
        props = driver.active.utils.get_device_properties(torch.npu.current_device())
        n = int(props.get("num_aicore") or 0)
        if n > 0:
            return n, "the device"
    except Exception:  # noqa: BLE001 - no NPU / CANN: fall back to the documented default
        pass
    return DEFAULT_CORES, f"the default for {DEFAULT_ARCH} (set XSYNC_ASCEND_CORES to override)"


def cache_dir() -> str:
    return files.cache_dir("ascend")


class CompiledAscend:
    """The generated triton-ascend module of one specialization.

    ``launch`` runs it on an NPU or, ``simulated``, in xsync's cube/vector simulator on the
    CPU (``XSYNC_BACKEND=ascend-sim``)."""

    def __init__(self, kernel: ir.KernelIR, placement: Placement, allocation,
                 module: _render.AscendModule, path: str, simulated: bool = False):
        self.kernel, self.placement, self.allocation = kernel, placement, allocation
        self.module, self.path, self.simulated = module, path, simulated
        self.source, self.form = module.source, module.form
        self._fn = None
        self._lock = threading.Lock()
        self._ranks = tensor_ranks(kernel)      # the rank each tensor is addressed with
        self._workspaces: dict = {}

    # ------------------------------------------------------------ the jit function
    def jit_function(self):
        """Import the generated module (needs triton-ascend) and return its @triton.jit kernel."""
        with self._lock:
            if self._fn is None:
                name = f"xsync_ascend_{self.kernel.name}_{os.path.basename(self.path)[:-3].split('_')[-1]}"
                spec = importlib.util.spec_from_file_location(name, self.path)
                module = importlib.util.module_from_spec(spec)
                files.exec_generated(spec, module)     # heals a damaged .pyc
                self._fn = getattr(module, self.module.entry)
            return self._fn

    def signature(self, scalars: dict | None = None) -> dict:
        return _render.signature(self.kernel, self.allocation, scalars, self.module.names)

    # ------------------------------------------------------------ launch
    def check_grid(self, grid):
        """sync_block_all needs every launched program resident: grid <= AI cores."""
        if not self.kernel.barriers:
            return
        n = math.prod(int(g) for g in grid)
        cores, source = core_count()
        if n <= cores:
            return
        b = self.kernel.barriers[0]
        modes = ", ".join(f"{x.name} (flag {dict(self.allocation.event_ids)[x.name]})"
                          for x in self.kernel.barriers)
        raise LaunchError(
            f"kernel '{self.kernel.name}' launches {n} programs, but its group barrier(s) lower to "
            f"sync_block_all, which needs every launched core resident: at most {cores} AI cores "
            f"(from {source}); the extra programs would wait for cores held by programs that wait "
            f"for them (hang)",
            loc=b.loc, objects=tuple(x.name for x in self.kernel.barriers),
            details=f"barriers: {modes}; grid {tuple(grid)}",
            fix=(f"launch at most {cores} programs and loop over tiles inside the kernel (persistent "
                 f"tiles), or set XSYNC_ASCEND_CORES if this device has more AI cores"))

    def host_args(self, grid, args: dict) -> list:
        """The generated kernel's arguments: each tensor with (rows, cols, row stride), the
        scalars, then one typed view per workspace element type of ONE buffer holding
        ``programs x workspace_bytes`` (the kernel offsets by its program index)."""
        import torch

        call, device = [], None
        ranks = self._ranks
        for p in self.kernel.params:
            if p.kind is ir.ParamKind.CONSTEXPR:
                continue
            v = args[p.name]
            call.append(v)
            if p.kind is ir.ParamKind.TENSOR:
                device = device or v.device
                rank = ranks.get(p.name)
                if rank is not None and v.shape[-1] > 1 and v.stride(-1) != 1:
                    raise LaunchError(
                        f"kernel '{self.kernel.name}': tensor `{p.name}` has stride {v.stride(-1)} in its "
                        f"last dimension; the Ascend lowering addresses tensors with unit stride there "
                        f"(a run-time column stride makes the HIVM compiler spread every element of a "
                        f"tile over 32 bytes of UB)",
                        fix=f"pass `{p.name}.contiguous()` (or a view whose last dimension is "
                            f"contiguous)")
                call += host_values(v, rank or 2)
        dtypes = _render.workspace_dtypes(self.kernel, self.allocation)
        if dtypes:
            nbytes = math.prod(grid) * self.allocation.workspace_bytes
            key = (str(device), nbytes)
            buf = self._workspaces.get(key)
            if buf is None:
                buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
                self._workspaces = {key: buf}
            for d in dtypes:
                call.append(buf.view(_torch_dtype(d)))
        return call

    def launch(self, grid, args: dict, settings=None):
        """``settings``: the configuration the caller resolved (xsync.config.Settings; default:
        the one in effect now), for the run-time options (cpu_timeout of a simulation)."""
        grid = tuple(int(g) for g in grid)
        if self.simulated:
            from xsync.backends.ascend.simulator import simulate
            settings = settings if settings is not None else config.current()
            return simulate(self, grid, args, timeout=settings.cpu_timeout)
        self.check_grid(grid)
        ok, why = availability()
        if not ok:
            raise BackendError(f"cannot launch '{self.kernel.name}' on Ascend: {why}",
                               fix="run on an Ascend NPU host; XSYNC_BACKEND=ascend-sim runs this "
                                   "generated code in xsync's cube/vector simulator on the CPU")
        fn = self.jit_function()
        # xsync places every cross-core flag itself: the compiler must not add its own.
        fn[grid](*self.host_args(grid, args), **COMPILE_OPTIONS)


def _torch_dtype(d):
    import torch
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
            "int32": torch.int32, "int1": torch.int8}[d.name]


class AscendBackend(Backend):
    """Lowers for the ascend target; runs the generated module on an NPU, or (``simulated``,
    the ascend-sim backend) in xsync's cube/vector simulator on the CPU."""

    LowerOptions = ascend_options.LowerOptions
    RenderOptions = ascend_options.RenderOptions

    def __init__(self, name: str, *, simulated: bool):
        super().__init__(name, TARGET, place, device="cpu" if simulated else "npu")
        self.simulated = simulated

    def probe(self) -> tuple[bool, str]:
        if self.simulated:
            from xsync.backends.ascend.simulator import availability as sim_availability
            return sim_availability()
        return availability()

    def unavailable_hint(self) -> str:
        if self.simulated:
            return ""
        return ("; XSYNC_BACKEND=ascend-sim runs the generated Ascend code in xsync's cube/vector "
                "simulator on the CPU (needs triton-ascend: bash scripts/env.sh ascend)")

    def render_source(self, kernel: ir.KernelIR, placement: Placement, allocation,
                      options: ascend_options.RenderOptions) -> str:
        return _render.render(kernel, placement, allocation, select_form(options.form))

    def compile(self, kernel: ir.KernelIR, placement: Placement, allocation,
                options: ascend_options.RenderOptions) -> CompiledAscend:
        """Render the triton-ascend module and write it to the cache (``triton.jit`` reads it)."""
        form = select_form(options.form)
        module = _render.render_module(kernel, placement, allocation, form)
        path = os.path.join(cache_dir(), f"{kernel.name}_{form}_{files.digest(module.source)}.py")
        files.write_checked(path, module.source)
        return CompiledAscend(kernel, placement, allocation, module, path, simulated=self.simulated)

    def resident_programs(self, device=None) -> int:
        """AI cores a launch may keep resident (a persistent launch runs one program per core)."""
        return core_count()[0]


ASCEND = AscendBackend("ascend", simulated=False)
ASCEND_SIM = AscendBackend("ascend-sim", simulated=True)


def compile_kernel(kernel: ir.KernelIR, placement: Placement, allocation, options: dict | None = None,
                   form: str | None = None) -> CompiledAscend:
    """Render the triton-ascend module for an NPU; ``options``: RenderOptions fields (``form``)
    over the configuration, ``form`` over both."""
    opts = config.render_options(ASCEND, options, where="compile_kernel(options=...)")
    if form is not None:
        select_form(form)      # an unknown form is an error naming the argument
        opts = dataclasses.replace(opts, form=form)
    return ASCEND.compile(kernel, placement, allocation, opts)


def compile_hivm(lowered, arch: str = DEFAULT_ARCH, scalars: dict | None = None,
                 form: str | None = None) -> tuple[str, str]:
    """(TTIR text, .ttadapter MLIR text) for a lowered kernel, with no NPU and no CANN.

    ``lowered`` is ``kernel.lower("ascend", ...)`` (an ``xsync.compiler.Lowered``) or a
    :class:`CompiledAscend`. ``scalars`` maps scalar parameters to triton types (default
    ``i32``). Runs triton-ascend's ``ttir`` and ``ttadapter`` stages directly: no cache
    files, no environment variables; a triton-adapter-opt failure raises
    ``subprocess.CalledProcessError`` (its ``.stderr`` says why).
    """
    if isinstance(lowered, CompiledAscend):
        compiled = lowered
    else:
        compiled = compile_kernel(lowered.kernel, lowered.placement, lowered.allocation, form=form)
    from triton._C.libtriton import ir as tir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend

    fn = compiled.jit_function()
    target = GPUTarget("npu", arch, 0)
    backend = make_backend(target)
    src = ASTSource(fn=fn, signature=compiled.signature(scalars), constants={})
    opts = backend.parse_options({})
    stages: dict = {}
    backend.add_stages(stages, opts)
    ctx = tir.context()
    tir.load_dialects(ctx)
    backend.load_dialects(ctx)
    mod = src.make_ir(opts, backend.get_codegen_implementation(), backend.get_module_map(), ctx)
    md = {"hash": src.hash(), "target": target, **opts.__dict__}
    mod = stages["ttir"](mod, md)
    ttir = str(mod)
    return ttir, stages["ttadapter"](mod, md)


def render_source(kernel: ir.KernelIR, placement: Placement, allocation, form: str | None = None) -> str:
    """The generated triton-ascend module text (what `xsync lower --backend ascend` prints)."""
    return _render.render(kernel, placement, allocation, select_form(form))
