"""A compiled Gluon kernel: host arguments (TMA descriptors) and launches on the GPU.

:class:`CompiledNvidia` holds the rendered module of one specialization; ``launch(grid,
args)`` builds the host arguments from torch tensors by the kernel's parameter records
(:class:`~xsync.backends.nvidia.abi.KernelArg`) and launches through Triton's JIT, later
ones through the compiled C launcher (:mod:`xsync.backends.nvidia.launcher`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from xsync.backends.nvidia.abi import ArgKind
from xsync.backends.nvidia.launcher import prepare_c_launch
from xsync.backends.nvidia.modules import load_module
from xsync.backends.nvidia.options import RenderOptions
from xsync.backends.nvidia.ptx import bars_offset_from_ptx
from xsync.errors import BackendError, LaunchError, SourceLoc, StallError
from xsync.lowering import ir
from xsync.lowering.ir import Verb
from xsync.lowering.placement import Placement
from xsync.lowering.verifier.check import run_time_verdict

# Floating-point fusion (a*b+c contracted to fma) is passed to every compile and launch
# instead of left to Triton's default: 3.6-3.9 default to on, 3.9 warns that 3.10 turns
# it off (TRITON_DEFAULT_FP_FUSION), and the numerics tests and the measured speed were
# obtained with it on; a silent change of rounding and speed with the Triton version is
# what this pins away (on 3.9, TRITON_FORCE_DISABLE_FP_FUSION=1 still overrides it).
FP_FUSION = True
# Prepared launches call the compiled C launcher directly where Triton's layout allows
# (launcher.py); False keeps Triton's kernel.run (benchmarks/host_path.py compares both).
DIRECT_LAUNCH = True


@dataclass
class CompiledNvidia:
    kernel: ir.KernelIR
    placement: Placement
    allocation: object
    options: RenderOptions
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
            for arg in self.result.params:
                layout = None
                if arg.kind.descriptor:
                    layout = nvmma_shared_layout(arg.source[1], self.result.descriptor_layouts[arg.name][2],
                                                 (self.result.descriptor_cga or {}).get(arg.name))
                plan.append((arg, layout))
            self.__dict__["_plan"] = plan
        return plan

    def host_args(self, args: dict, dbg_ptr: int | None = None) -> list:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        k = self.kernel
        out = []
        for arg, lay in self._param_plan():
            name, kind, extra = arg.name, arg.kind, arg.source
            if kind is ArgKind.DESC:
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
            elif kind is ArgKind.STORE_DESC:
                # a TMA store target: where the tensor does not suit TMA, the kernel takes its
                # masked stores (its `_tma_ok` argument is 0) and this descriptor is a stand-in
                t, shape = extra
                x = self._tensor(t, args)
                if tma_ready(x):
                    out.append(host_descriptor(self.__dict__.setdefault("_desc_templates", {}),
                                               name, x, shape, lay, TensorDescriptor))
                else:
                    out.append(self._stand_in_descriptor(x, shape, lay, TensorDescriptor))
            elif kind is ArgKind.STORE_OK:
                out.append(int(tma_ready(self._tensor(extra, args))))
            elif kind is ArgKind.PTR:
                x = self._tensor(extra, args)
                if x.shape[-1] > 1 and x.stride(-1) != 1:
                    raise LaunchError(f"kernel '{k.name}': tensor `{extra}` has stride {x.stride(-1)} in its "
                                      f"last dimension; the Hopper lowering addresses it with unit stride there",
                                      loc=k.loc, objects=(extra,),
                                      fix=f"pass a view whose last dimension is contiguous (`{extra}.contiguous()`)")
                out.append(x)
            elif kind is ArgKind.TABLE:
                out.append(self._tensor(extra, args))
            elif kind is ArgKind.ROWS:
                out.append(int(self._tensor(extra, args).shape[0]))
            elif kind is ArgKind.COLS:
                out.append(int(self._tensor(extra, args).shape[1]))
            elif kind is ArgKind.STRIDE:
                out.append(int(self._tensor(extra, args).stride(0)))
            elif kind is ArgKind.SIZE:
                out.append(int(self._tensor(extra[0], args).shape[extra[1]]))
            elif kind is ArgKind.STRIDE_I:
                out.append(int(self._tensor(extra[0], args).stride(extra[1])))
            elif kind is ArgKind.SCALAR:
                out.append(args[extra])
            elif kind is ArgKind.DBG:
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
        if self.allocation.maxnreg:
            opts["maxnreg"] = int(self.allocation.maxnreg)
        if self.result.num_ctas > 1:
            opts["num_ctas"] = self.result.num_ctas
        return opts

    def cluster_grid(self, grid) -> tuple:
        """The launch grid in Gluon programs: a kernel spread over a cluster's CTAs takes one
        program per cluster (Triton launches num_ctas CTAs for each); xsync's grid counts the
        cluster's programs (check_grid: a multiple of the cluster)."""
        grid = tuple(grid) + (1,) * (3 - len(grid))
        n = self.result.num_ctas
        return grid if n == 1 else (grid[0] // n,) + grid[1:]

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
    def launch(self, grid, args: dict, settings=None):
        """``settings`` (xsync.config.Settings): unused here (no run-time option on the GPU)."""
        grid = self.cluster_grid(grid)
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
        spec = specialization_key(argv)
        key = (device, spec)
        kernels = self.__dict__.setdefault("_kernels", {})
        kernel = kernels.get(key) if spec is not None else None
        hooks = hook_set(knobs.runtime.launch_enter_hook) or hook_set(knobs.runtime.launch_exit_hook)
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
        grid = self.cluster_grid(grid)
        argv = self.host_args(args)
        device = driver.active.get_current_device()
        kernel = self.__dict__.get("_kernels", {}).get((device, specialization_key(argv)))
        if kernel is None:
            return None
        position = {name: i for i, name in enumerate(varying)}
        static, slots = list(argv), []
        for i, (arg, _) in enumerate(self._param_plan()):
            kind = arg.kind
            if kind is ArgKind.STORE_OK and not argv[i]:
                return None           # the stand-in descriptor would have to follow the tensor
            desc = kind.descriptor
            tensor = arg.source[0] if desc else arg.source
            if (desc or kind in (ArgKind.PTR, ArgKind.TABLE)) and tensor in position:
                if argv[i].base.data_ptr() % 16 if desc else argv[i].data_ptr() % 16:
                    return None
                template = {**argv[i].__dict__, "base": None} if desc else None
                slots.append((i, position[tensor], template))
                static[i] = None
        current_device, current_stream = driver.active.get_current_device, driver.active.get_current_stream
        runtime = runtime_knobs()

        def hooks_set() -> bool:
            return hook_set(runtime.launch_enter_hook) or hook_set(runtime.launch_exit_hook)
        if DIRECT_LAUNCH:
            kinds = [ArgKind.DESC if arg.kind is ArgKind.STORE_DESC else arg.kind
                     for arg, _ in self._param_plan()]
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
        result = render(self.kernel, self.placement, self.allocation, dataclasses.replace(self.options, bars_smem=off))
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
            kind = "pipe" if s.verb in (Verb.ACQUIRE, Verb.WAIT) and \
                isinstance(self.kernel.sync_object(s.obj), ir.Pipe) else "event"
            side = {Verb.ACQUIRE: "a free slot", Verb.WAIT: "a full slot"}.get(s.verb, "a signal") \
                if kind == "pipe" else "a signal"
            lines.append(f"{label} (role '{s.role}'): line {s.line}: `{s.what}` waits for {side} of "
                         f"{kind} '{s.obj}', iteration {count} (its {count + 1}-th {s.verb})")
            objects += [f"role '{s.role}'", f"{kind} '{s.obj}'"]
        timeout = self.options.hang_timeout_ms
        return StallError(
            f"kernel '{self.kernel.name}' stalled on the GPU: program {pid} waited more than {timeout} ms "
            f"on an mbarrier (XSYNC_DEBUG_HANG)",
            loc=SourceLoc(self.kernel.file, first_line or self.kernel.loc.line, self.kernel.name),
            objects=tuple(dict.fromkeys(objects)), details="\n".join(lines),
            fix=_stall_fix(self.lowered))


def _stall_fix(lowered) -> str:
    """What to do about a reported GPU stall, from what the verifier said about the kernel."""
    restart = "the CUDA context is unusable after the trap, restart the process"
    verdict = run_time_verdict(lowered)
    if verdict is None:     # verification was off
        return (f"run `python -m xsync check module:kernel` with XSYNC_VERIFY=1 for the "
                f"counterexample; {restart}")
    return f"{verdict}; {restart}"


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


def runtime_knobs():
    from triton import knobs
    return knobs.runtime


def hook_set(hook) -> bool:
    """Whether a launch hook is installed: None, or (Triton 3.6+) an empty HookChain, is not;
    a launch with hooks (a profiler, proton) goes through Triton's own path, which calls them."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return True if calls is None else bool(calls)


def specialization_key(argv: list):
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

