"""NVIDIA Hopper backend (Triton 3.6-3.9 Gluon).

``compile_kernel(kernel_ir, placement, allocation)`` renders Gluon source
(:mod:`xsync.backends.nvidia.render`), writes it to a real ``.py`` file (Gluon's JIT
reads the source with ``inspect``) and imports it. ``.launch(grid, args)`` builds the
TMA descriptors from torch tensors and launches on the GPU. ``compile_ptx(...)``
compiles to sm_90a PTX + cubin on any machine (no GPU needed).

Environment:

* ``XSYNC_CACHE_DIR`` -- where generated sources go (default ``~/.cache/xsync``);
  files are written atomically (temp file + ``os.replace``).
* ``XSYNC_DEBUG_HANG=1`` -- hang debug mode: every mbarrier wait first polls with
  ``mbarrier.try_wait.parity`` for at most ``XSYNC_HANG_TIMEOUT_MS`` (default 2000) ms;
  a stuck agent records (agent, wait site, iteration) in a host-mapped buffer and
  traps, and the launch raises :class:`xsync.errors.StallError` naming the role, the
  pipe/event, the kernel line and the iteration. The trap leaves the CUDA context
  unusable: run debug launches in a process you can discard.
* ``XSYNC_NV_PRODUCER_REGS`` (default 40) / ``XSYNC_NV_CONSUMER_REGS`` (default:
  the registers left, split evenly between consumer warpgroups, at most 232) --
  ``worker_num_regs`` per partition (``setmaxnreg``); ``XSYNC_NV_MAXNREG`` -- the
  launch option ``maxnreg``. The same keys (lower case, without the prefix) can be
  passed in ``options``.
* ``XSYNC_NV_MERGE_PIPES=0`` / ``XSYNC_NV_FUSE_MMA=0`` / ``XSYNC_NV_DEFER_MMA_WAIT=0`` /
  ``XSYNC_NV_OVERLAP=0`` / ``XSYNC_NV_PINGPONG=0|1|each|first|wrap``
  (``xsync.options(nv_fuse_mma=..., ...)``; ``compile_ptx`` also takes them as ``merge_pipes`` /
  ``fuse_mma`` / ``defer_mma_wait`` / ``overlap_softmax`` / ``pingpong`` in ``options``) --
  switch the Hopper schedule passes (:mod:`xsync.backends.nvidia.passes`: merge-pipes,
  fuse-accumulating-mma, defer-mma-wait, pingpong, overlap-softmax). They act when the kernel is lowered: the verifier checks what they emit.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import threading
from dataclasses import dataclass, field

from xsync import config, files
from xsync.errors import BackendError, LaunchError, SourceLoc, StallError
from xsync.backends.nvidia.alloc import two_ctas_fit
from xsync.lowering import ir
from xsync.lowering.placement import Placement
from xsync.backends.nvidia.launcher import prepare_c_launch

TARGET_ARCH = 90

# Floating-point fusion (a*b+c contracted to fma) is passed to every compile and launch
# instead of left to Triton's default: 3.6-3.9 default to on, 3.9 warns that 3.10 turns
# it off (TRITON_DEFAULT_FP_FUSION), and the numerics tests and the measured speed were
# obtained with it on; a silent change of rounding and speed with the Triton version is
# what this pins away (on 3.9, TRITON_FORCE_DISABLE_FP_FUSION=1 still overrides it).
FP_FUSION = True
# Prepared launches call the compiled C launcher directly where Triton's layout allows
# (launcher.py); False keeps Triton's kernel.run (benchmarks/host_path.py compares both).
DIRECT_LAUNCH = True


_AVAILABILITY: tuple[bool, str] | None = None


def availability() -> tuple[bool, str]:
    """(can run here, why not); probed once per process (every launch asks)."""
    global _AVAILABILITY
    if _AVAILABILITY is None:
        _AVAILABILITY = _probe()
    return _AVAILABILITY


def _probe() -> tuple[bool, str]:
    try:
        import triton.experimental.gluon  # noqa: F401
    except ImportError:
        return False, "upstream Triton with Gluon (triton>=3.6,<3.10) is not installed"
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU is visible to torch"
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        return False, f"the GPU is sm_{major}{minor}; the Gluon lowering targets Hopper (sm_90a)"
    return True, ""


# ---------------------------------------------------------------- options
# renderer option -> xsync.config option (None there means "the renderer's default")
_OPTION_NAMES = {"producer_regs": "nv_producer_regs", "consumer_regs": "nv_consumer_regs",
                 "maxnreg": "nv_maxnreg", "hang_timeout_ms": "hang_timeout_ms",
                 "debug_hang": "debug_hang", "merge_pipes": "nv_merge_pipes", "fuse_mma": "nv_fuse_mma",
                 "defer_mma_wait": "nv_defer_mma_wait", "overlap_softmax": "nv_overlap",
                 "pingpong": "nv_pingpong", "tma_store": "nv_tma_store",
                 "prefetch_tile_scalars": "nv_prefetch_tile_scalars", "exp2_fma": "nv_exp2_fma"}


# compile_ptx option -> the configuration option it sets while the kernel is lowered: the
# schedule passes and the allocator (register budgets) read them then
LOWERING_OPTIONS = {"merge_pipes": "nv_merge_pipes", "fuse_mma": "nv_fuse_mma", "defer_mma_wait": "nv_defer_mma_wait",
                    "overlap_softmax": "nv_overlap", "pingpong": "nv_pingpong",
                    "producer_regs": "nv_producer_regs", "consumer_regs": "nv_consumer_regs",
                    "maxnreg": "nv_maxnreg"}


def _pass_value(key: str, value):
    if key == "pingpong" and isinstance(value, bool):
        return "1" if value else "0"
    return value


def resolve_options(options: dict | None = None) -> dict:
    """Renderer options: ``options`` over the configuration (xsync.config)."""
    settings = config.current()
    out = {key: settings[name] for key, name in _OPTION_NAMES.items() if settings[name] is not None}
    out.update({k: v for k, v in (options or {}).items() if v is not None})
    return out


def cache_dir() -> str:
    return files.cache_dir("nvidia")


_import_lock = threading.Lock()


write_atomic = files.write_atomic


def load_module(name: str, source: str):
    """Write ``source`` to the cache as ``<name>_<hash>.py`` and import it."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    modname = f"xsync_gluon_{name}_{digest}"
    with _import_lock:
        path = os.path.join(cache_dir(), modname + ".py")
        # an edited, truncated or undecodable file is rewritten, never imported as it is
        files.write_checked(path, source)
        if modname in sys.modules:
            return sys.modules[modname]
        spec = importlib.util.spec_from_file_location(modname, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[modname] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[modname]
            raise
        return module


# ---------------------------------------------------------------- shared-memory offset (debug mode)
_INIT_RE = re.compile(r"mbarrier\.init\.shared(?:::cta)?\.b64\s+\[([^\]]+)\]")


def bars_offset_from_ptx(ptx: str) -> int | None:
    """Byte offset of ``xs_bars`` in shared memory: the address of the first mbarrier.init
    (xs_bars[0] is initialised first), resolved through the PTX's mov/add chain."""
    m = _INIT_RE.search(ptx)
    if not m:
        return None
    defs = {}
    for d in re.finditer(r"^\s*(?:mov|add|cvt)\.[\w.]+\s+(%r[d]?\d+),\s*([^;]+);", ptx, re.M):
        defs.setdefault(d.group(1), d.group(2).split(","))

    def value(term: str, depth=0):
        term = term.strip()
        if depth > 16:
            return None
        if term == "global_smem":
            return 0
        if re.fullmatch(r"-?\d+", term):
            return int(term)
        if "+" in term:
            parts = [value(t, depth + 1) for t in term.split("+")]
            return None if None in parts else sum(parts)
        if term in defs:
            args = defs[term]
            vals = [value(a, depth + 1) for a in args]
            return None if None in vals else sum(vals)
        return None

    return value(m.group(1))


# ---------------------------------------------------------------- compiled kernel
@dataclass
class CompiledNvidia:
    kernel: ir.KernelIR
    placement: Placement
    allocation: object
    options: dict
    result: object                    # render.RenderResult
    module: object
    lowered: object = None
    _debug_variants: dict = field(default_factory=dict)

    @property
    def source(self) -> str:
        return self.result.source

    @property
    def jit_fn(self):
        return getattr(self.module, self.result.kernel_name)

    # ------------------------------------------------------------ host arguments
    def _param_plan(self) -> list:
        """The kernel parameters with what each needs, computed once (layouts included)."""
        plan = self.__dict__.get("_plan")
        if plan is None:
            from xsync.backends.nvidia.layouts import nvmma_shared_layout

            plan = []
            for name, kind, extra in self.result.params:
                layout = None
                if kind in ("desc", "store_desc"):
                    layout = nvmma_shared_layout(extra[1], self.result.descriptor_layouts[name][2])
                plan.append((name, kind, extra, layout))
            self.__dict__["_plan"] = plan
        return plan

    def host_args(self, args: dict, dbg_ptr: int | None = None) -> list:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        k = self.kernel
        out = []
        for name, kind, extra, lay in self._param_plan():
            if kind == "desc":
                t, shape = extra
                x = self._tensor(t, args)
                esz = x.element_size()
                if not tma_aligned(x):
                    raise LaunchError(
                        f"kernel '{k.name}': tensor `{t}` cannot be read by TMA (row stride "
                        f"{x.stride(0) * esz} B, base alignment {x.data_ptr() % 16}); TMA needs contiguous "
                        f"rows, 16-byte aligned row strides and a 16-byte aligned base",
                        loc=k.loc, objects=(t,),
                        fix=f"pad the last dimension of `{t}` to a multiple of {16 // esz} elements")
                out.append(host_descriptor(self.__dict__.setdefault("_desc_templates", {}),
                                           name, x, shape, lay, TensorDescriptor))
            elif kind == "store_desc":
                # a TMA store target: where the tensor does not suit TMA, the kernel takes its
                # masked stores (its `_tma_ok` argument is 0) and this descriptor is a stand-in
                t, shape = extra
                x = self._tensor(t, args)
                if tma_ready(x):
                    out.append(host_descriptor(self.__dict__.setdefault("_desc_templates", {}),
                                               name, x, shape, lay, TensorDescriptor))
                else:
                    out.append(self._stand_in_descriptor(x, shape, lay, TensorDescriptor))
            elif kind == "store_ok":
                out.append(int(tma_ready(self._tensor(extra, args))))
            elif kind == "ptr":
                x = self._tensor(extra, args)
                if x.stride(1) != 1:
                    raise LaunchError(f"kernel '{k.name}': tensor `{extra}` has column stride {x.stride(1)}",
                                      loc=k.loc, objects=(extra,), fix="pass a tensor with contiguous rows")
                out.append(x)
            elif kind == "table":
                out.append(self._tensor(extra, args))
            elif kind == "rows":
                out.append(int(self._tensor(extra, args).shape[0]))
            elif kind == "cols":
                out.append(int(self._tensor(extra, args).shape[1]))
            elif kind == "stride":
                out.append(int(self._tensor(extra, args).stride(0)))
            elif kind == "scalar":
                out.append(args[extra])
            elif kind == "dbg":
                out.append(int(dbg_ptr))
        return out

    def _stand_in_descriptor(self, x, block, layout, cls):
        import torch

        key = (x.dtype, x.device, tuple(block))
        cache = self.__dict__.setdefault("_stand_ins", {})
        if key not in cache:
            base = torch.empty(tuple(block), dtype=x.dtype, device=x.device)
            cache[key] = cls(base, list(base.shape), list(base.stride()), list(block), layout)
        return cache[key]

    def _tensor(self, name, args):
        x = args[name]
        if not getattr(x, "is_cuda", False):
            raise LaunchError(f"kernel '{self.kernel.name}': tensor `{name}` is not on a CUDA device",
                              loc=self.kernel.loc, objects=(name,), fix="move it with .cuda()")
        return x

    def launch_options(self) -> dict:
        opts = {"num_warps": self.result.num_warps, "enable_fp_fusion": FP_FUSION}
        if self.options.get("maxnreg"):
            opts["maxnreg"] = int(self.options["maxnreg"])
        return opts

    def local_memory_bytes(self) -> int | None:
        """Local memory a thread of this kernel uses (ptxas spills), as the CUDA driver reports
        it for the specializations launched so far (the most of them); None before the first
        launch. A schedule measured with one Triton can spill under another: the caller
        decides whether that is worth a fallback (kernels/flash_attn/ops.py)."""
        kernels = self.__dict__.get("_kernels")
        if not kernels:
            return None
        return max(4 * int(getattr(k, "n_spills", 0) or 0) for k in kernels.values())

    # ------------------------------------------------------------ launch
    def launch(self, grid, args: dict):
        grid = tuple(grid) + (1,) * (3 - len(grid))
        if self.result.debug_hang:
            return self._launch_debug(grid, args)
        self.run_argv(grid, self.host_args(args))

    def run_argv(self, grid: tuple, argv: list):
        """Launch with prepared arguments. The first launch of each specialization goes
        through Triton's JIT (compile, cache); later ones call the compiled kernel's launcher
        directly, which skips re-deriving the specialization Triton already keyed it by."""
        from triton import knobs
        from triton.runtime.driver import driver

        device = driver.active.get_current_device()
        spec = _specialization_key(argv)
        key = (device, spec)
        kernels = self.__dict__.setdefault("_kernels", {})
        kernel = kernels.get(key) if spec is not None else None
        hooks = _hook_set(knobs.runtime.launch_enter_hook) or _hook_set(knobs.runtime.launch_exit_hook)
        if kernel is None or hooks:
            kernel = self.jit_fn.run(*argv, grid=grid, warmup=False, **self.launch_options())
            if spec is not None and not hooks:
                kernels[key] = kernel
            return
        stream = driver.active.get_current_stream(device)
        kernel.run(grid[0], grid[1], grid[2], stream, kernel.function, kernel.packed_metadata, None,
                   None, None, *argv)

    def prepare(self, grid, args: dict, varying: tuple[str, ...]):
        """A launcher for repeated launches that differ from this one only in the data of the
        `varying` tensors (passed positionally, in that order): same shapes, strides, dtypes
        and device; everything else (scalars, other tensors, descriptor fields, the grid, the
        compiled kernel) is bound now. It returns False, launching nothing, where it cannot
        apply (a base not 16-byte aligned, another current device, a launch hook installed);
        the caller then launches the usual way. None if this specialization has not been
        launched yet (the first launch compiles through Triton) or in hang-debug mode.
        It holds no varying tensor (descriptor templates keep base=None)."""
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
        from triton.runtime.driver import driver

        if self.result.debug_hang:
            return None
        grid = tuple(grid) + (1,) * (3 - len(grid))
        argv = self.host_args(args)
        device = driver.active.get_current_device()
        kernel = self.__dict__.get("_kernels", {}).get((device, _specialization_key(argv)))
        if kernel is None:
            return None
        position = {name: i for i, name in enumerate(varying)}
        static, slots = list(argv), []
        for i, (name, kind, extra, _) in enumerate(self._param_plan()):
            if kind == "store_ok" and not argv[i]:
                return None           # the stand-in descriptor would have to follow the tensor
            desc = kind in ("desc", "store_desc")
            tensor = extra[0] if desc else extra
            if kind in ("desc", "store_desc", "ptr", "table") and tensor in position:
                if argv[i].base.data_ptr() % 16 if desc else argv[i].data_ptr() % 16:
                    return None
                template = {**argv[i].__dict__, "base": None} if desc else None
                slots.append((i, position[tensor], template))
                static[i] = None
        current_device, current_stream = driver.active.get_current_device, driver.active.get_current_stream
        runtime = _runtime_knobs()

        def hooks_set() -> bool:
            return _hook_set(runtime.launch_enter_hook) or _hook_set(runtime.launch_exit_hook)
        if DIRECT_LAUNCH:
            kinds = ["desc" if kind == "store_desc" else kind for _, kind, _, _ in self._param_plan()]
            direct = prepare_c_launch(kernel, grid, argv, kinds, slots, device, current_device,
                                      current_stream, hooks_set)
            if direct is not None:
                return direct
        run, function, meta = kernel.run, kernel.function, kernel.packed_metadata
        gx, gy, gz = grid

        def launch(*tensors) -> bool:
            if current_device() != device or hooks_set():
                return False
            argv = static.copy()
            for i, j, template in slots:
                x = tensors[j]
                if x.data_ptr() % 16:
                    return False
                argv[i] = x if template is None else from_template(TensorDescriptor, template, base=x)
            run(gx, gy, gz, current_stream(device), function, meta, None, None, None, *argv)
            return True
        return launch

    def _launch_debug(self, grid, args):
        import torch

        n = 4 + 4 * len(self.result.partitions)
        buf = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        argv = self.host_args(args, buf.data_ptr())
        fn = self._debug_fn(argv, grid)
        try:
            fn[grid](*argv, **self.launch_options())
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - the trap surfaces as a CUDA error
            if int(buf[0]) != 0:
                raise self.stall_error(buf.tolist(), grid) from exc
            raise
        if int(buf[0]) != 0:
            raise self.stall_error(buf.tolist(), grid)

    def _debug_fn(self, argv, grid):
        """Debug kernels need the shared-memory offset of xs_bars: compile once to read it
        from the PTX, render again with it, and check that the offset did not move."""
        from xsync.backends.nvidia.render import render

        if "fn" in self._debug_variants:
            return self._debug_variants["fn"]
        opts = self.launch_options()
        first = self.jit_fn.warmup(*argv, grid=grid, **opts)
        off = bars_offset_from_ptx(first.asm["ptx"])
        if off is None:
            raise BackendError("hang debug mode: cannot find the mbarrier array in the PTX",
                               loc=self.kernel.loc, fix="unset XSYNC_DEBUG_HANG")
        result = render(self.kernel, self.placement, self.allocation, {**self.options, "bars_smem": off})
        module = load_module(self.kernel.name + "_dbg", result.source)
        fn = getattr(module, result.kernel_name)
        second = fn.warmup(*argv, grid=grid, **opts)
        if bars_offset_from_ptx(second.asm["ptx"]) != off:
            raise BackendError("hang debug mode: the mbarrier array moved between compiles",
                               loc=self.kernel.loc, fix="unset XSYNC_DEBUG_HANG")
        self._debug_variants.update(fn=fn, result=result)
        return fn

    def stall_error(self, words, grid) -> StallError:
        res = self._debug_variants.get("result", self.result)
        sites = {s.id: s for s in res.wait_sites}
        labels = {i: label for label, i in res.agent_ids.items()}
        cta = words[0] - 1
        gx, gy = grid[0], grid[1]
        pid = (cta % gx, (cta // gx) % gy, cta // (gx * gy))
        lines, objects, first_line = [], [], None
        for aid, label in sorted(labels.items()):
            flag, site_id, count = words[4 + 4 * aid: 7 + 4 * aid]
            if not flag:
                lines.append(f"{label}: not stuck (finished or still running when the kernel trapped)")
                continue
            s = sites.get(site_id)
            if s is None:
                lines.append(f"{label}: stuck at unknown wait site {site_id}")
                continue
            first_line = first_line or s.line
            kind = "pipe" if s.verb in ("acquire", "wait") and \
                self.kernel.sync_object(s.obj).__class__.__name__ == "Pipe" else "event"
            side = {"acquire": "a free slot", "wait": "a full slot"}.get(s.verb, "a signal") \
                if kind == "pipe" else "a signal"
            lines.append(f"{label} (role '{s.role}'): line {s.line}: `{s.what}` waits for {side} of "
                         f"{kind} '{s.obj}', iteration {count} (its {count + 1}-th {s.verb})")
            objects += [f"role '{s.role}'", f"{kind} '{s.obj}'"]
        timeout = self.options.get("hang_timeout_ms", 2000)
        return StallError(
            f"kernel '{self.kernel.name}' stalled on the GPU: program {pid} waited more than {timeout} ms "
            f"on an mbarrier (XSYNC_DEBUG_HANG)",
            loc=SourceLoc(self.kernel.file, first_line or self.kernel.loc.line, self.kernel.name),
            objects=tuple(dict.fromkeys(objects)), details="\n".join(lines),
            fix=("run `python -m xsync check module:kernel` with XSYNC_VERIFY=1 for the counterexample; "
                 "the CUDA context is unusable after the trap, restart the process"))


def tma_aligned(x) -> bool:
    """Contiguous rows, a 16-byte aligned row stride and base: what a TMA descriptor of ``x``
    needs beyond its extents."""
    return x.stride(1) == 1 and (x.stride(0) * x.element_size()) % 16 == 0 and x.data_ptr() % 16 == 0


def tma_ready(x) -> bool:
    """Whether the copy engine can address 2-D tensor ``x``: aligned (tma_aligned), no empty
    extent."""
    return x.dim() == 2 and min(x.shape) > 0 and tma_aligned(x)


def host_descriptor(templates: dict, name: str, x, block, layout, cls):
    """A host TMA descriptor of `x`, made per call (a cached one would keep the tensor alive).
    The first per (parameter, dtype) is built by Triton's constructor, which validates it;
    later ones copy its fields and set base, shape and strides (the constructor costs ~5 us;
    what it checks beyond those three -- block shape, layout, dtype width -- is fixed by the
    launch plan, and the caller checked row and base alignment). A non-positive extent takes
    the constructor, and its error."""
    shape, strides = list(x.shape), list(x.stride())
    template = templates.get((name, x.dtype))
    if template is None or min(shape) <= 0:
        desc = cls(x, shape, strides, list(block), layout)
        templates[(name, x.dtype)] = {**desc.__dict__, "base": None}   # holds no tensor
        return desc
    return from_template(cls, template, base=x, shape=shape, strides=strides)


def from_template(cls, template: dict, **fields):
    """A descriptor with a validated one's fields, `fields` replaced; no constructor (and
    none of its checks: the caller guarantees what they would check)."""
    desc = object.__new__(cls)
    desc.__dict__.update(template)
    desc.__dict__.update(fields)
    return desc


def _runtime_knobs():
    from triton import knobs
    return knobs.runtime


def _hook_set(hook) -> bool:
    """Whether a launch hook is installed: None, or (Triton 3.6+) an empty HookChain, is not;
    a launch with hooks (a profiler, proton) goes through Triton's own path, which calls them."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return True if calls is None else bool(calls)


def _specialization_key(argv: list):
    """What Triton 3.6-3.9 specializes a launch on, per argument (an int: == 1, divisible by
    16, 32 or 64 bits; a tensor: dtype and 16-byte alignment; a host TMA descriptor, a float,
    a bool: its type alone), so equal keys always meet the same compiled kernel; None for an
    argument kind it does not know (that launch takes Triton's own path)."""
    import torch

    key = []
    for x in argv:
        t = type(x)
        if t is int:
            key.append((x == 1, x % 16 == 0, -(1 << 31) <= x < (1 << 31), x < (1 << 63)))
        elif t is float:
            key.append(0.0)
        elif t is bool:
            key.append(("u1",))
        elif isinstance(x, torch.Tensor):
            key.append((x.dtype, x.data_ptr() % 16 == 0))
        elif t.__name__ == "TensorDescriptor":
            key.append(("desc", x.base.dtype, tuple(x.block_shape)))
        else:
            return None
    return tuple(key)


def render_source(kernel: ir.KernelIR, placement: Placement, allocation, options=None) -> str:
    """The Gluon module text (``xsync lower --backend nvidia``); needs no GPU and no triton."""
    from xsync.backends.nvidia.render import render

    return render(kernel, placement, allocation, resolve_options(options)).source


def occupancy_defaults(kernel: ir.KernelIR, placement: Placement, allocation, opts: dict) -> dict:
    """Two CTAs per SM when they fit: one consumer warpgroup plus the producer warp, and
    pipes needing at most half the shared memory. Then maxnreg=128 (24 producer / 232
    consumer registers) lets two CTAs share the register file, and one's epilogue
    overlaps the other's main loop (H200, GEMM 8192^3, STAGES=3: 0.67x -> 0.85x of
    torch.matmul in one run). Explicit register options or XSYNC_NV_* variables win."""
    if any(key in opts for key in ("maxnreg", "producer_regs", "consumer_regs")):
        return opts
    if two_ctas_fit(allocation.partitions, allocation.smem_bytes):
        return {**opts, "maxnreg": 128, "producer_regs": 24, "consumer_regs": 232}
    return opts


def compile_kernel(kernel: ir.KernelIR, placement: Placement, allocation, options=None) -> CompiledNvidia:
    from xsync.backends.nvidia.render import render

    opts = occupancy_defaults(kernel, placement, allocation, resolve_options(options))
    result = render(kernel, placement, allocation, opts)
    module = load_module(kernel.name, result.source)
    return CompiledNvidia(kernel, placement, allocation, opts, result, module)


# ---------------------------------------------------------------- offline compile (no GPU needed)
@dataclass
class PtxResult:
    source: str
    ptx: str
    cubin: bytes
    ttgir: str
    metadata: object
    render: object
    bars_smem: int | None = None


def signature_of(result, scalar_types: dict | None = None) -> tuple[dict, dict]:
    scalar_types = scalar_types or {}
    from xsync.backends.nvidia.layouts import nvmma_shared_layout
    from xsync.backends.nvidia.values import SIG_DTYPES

    sig, attrs = {}, {}
    for i, (name, kind, extra) in enumerate(result.params):
        if kind in ("desc", "store_desc"):
            t, shape, dtype = result.descriptor_layouts[name]
            lay = nvmma_shared_layout(shape, dtype)
            dt = SIG_DTYPES[dtype.name]
            sig[name] = f"tensordesc<{dt}[{shape[0]}, {shape[1]}],{lay!r}>"
        elif kind in ("ptr", "table"):
            sig[name] = "*" + SIG_DTYPES[result.tensors[extra].dtype.name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif kind in ("rows", "cols", "stride", "store_ok"):
            sig[name] = "i32"
        elif kind == "scalar":
            sig[name] = scalar_types.get(name, "i32")
        elif kind == "dbg":
            sig[name] = "i64"
    return sig, attrs


def _ptx_compile(kernel, placement, allocation, opts, scalar_types):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from xsync.backends.nvidia.render import render

    result = render(kernel, placement, allocation, opts)
    module = load_module(kernel.name, result.source)
    fn = getattr(module, result.kernel_name)
    sig, attrs = signature_of(result, scalar_types)
    options = {"num_warps": result.num_warps, "enable_fp_fusion": FP_FUSION}
    if opts.get("maxnreg"):
        options["maxnreg"] = int(opts["maxnreg"])
    compiled = triton.compile(GluonASTSource(fn, sig, {}, attrs=attrs),
                              target=GPUTarget("cuda", TARGET_ARCH, 32), options=options)
    return result, compiled


def compile_ptx(obj, constexprs: dict | None = None, tensor_dtypes: dict | None = None,
                scalar_types: dict | None = None, options: dict | None = None,
                debug_hang: bool | None = None) -> PtxResult:
    """Compile an xsync kernel (or a ``Lowered``) for sm_90a without a GPU.

    ``scalar_types`` maps scalar parameters to Triton types (default ``i32``).
    Returns the generated source, PTX, cubin and TTGIR.
    """
    at_lowering = {LOWERING_OPTIONS[k]: _pass_value(k, v) for k, v in (options or {}).items()
                   if k in LOWERING_OPTIONS and v is not None}
    if hasattr(obj, "lower"):
        with config.options(**at_lowering):
            lowered = obj.lower("nvidia", constexprs, tensor_dtypes)
    elif at_lowering:
        raise BackendError(f"compile_ptx got options {sorted(at_lowering)} for a kernel already lowered: "
                           f"the schedule passes and the allocator read them when it was lowered",
                           fix="pass the kernel itself, or lower it inside xsync.options(...) with them")
    else:
        lowered = obj
    if lowered.placement.backend != "nvidia":
        raise BackendError(f"compile_ptx needs a kernel lowered for nvidia, got {lowered.placement.backend}",
                           fix="call kernel.lower('nvidia', ...)")
    args = (lowered.kernel, lowered.placement, lowered.allocation)
    opts = occupancy_defaults(*args, resolve_options(options))
    if debug_hang is not None:
        opts["debug_hang"] = debug_hang
    off = None
    if opts.get("debug_hang"):
        _, first = _ptx_compile(*args, {**opts, "bars_smem": 0}, scalar_types)
        off = bars_offset_from_ptx(first.asm["ptx"])
        if off is None:
            raise BackendError("hang debug mode: cannot find the mbarrier array in the PTX", loc=lowered.kernel.loc)
        opts["bars_smem"] = off
    result, compiled = _ptx_compile(*args, opts, scalar_types)
    if off is not None and bars_offset_from_ptx(compiled.asm["ptx"]) != off:
        raise BackendError("hang debug mode: the mbarrier array moved between compiles", loc=lowered.kernel.loc)
    return PtxResult(result.source, compiled.asm["ptx"], compiled.asm["cubin"], compiled.asm["ttgir"],
                     compiled.metadata, result, off)
