"""Offline compile to sm_90a PTX + cubin (no GPU needed), and reading the PTX.

``compile_ptx(kernel or lowered, ...)`` lowers (when given a kernel), renders and compiles
with Triton's Gluon front end for ``cuda:90``; ``bars_offset_from_ptx`` finds the shared-
memory offset of ``xs_bars`` that the hang debug mode's second render needs.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from xsync import config
from xsync.backends.nvidia.abi import ArgKind
from xsync.backends.nvidia.modules import load_module
from xsync.errors import BackendError

TARGET_ARCH = 90

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


# ---------------------------------------------------------------- offline compile
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
    """Triton's (signature, attributes) of the rendered kernel's parameters."""
    scalar_types = scalar_types or {}
    from xsync.backends.nvidia.layouts import nvmma_shared_layout
    from xsync.backends.nvidia.values import SIG_DTYPES

    sig, attrs = {}, {}
    for i, arg in enumerate(result.params):
        name, kind = arg.name, arg.kind
        if kind.descriptor:
            t, shape, dtype = result.descriptor_layouts[name]
            lay = nvmma_shared_layout(shape, dtype, (result.descriptor_cga or {}).get(name))
            dt = SIG_DTYPES[dtype.name]
            sig[name] = f"tensordesc<{dt}[{shape[0]}, {shape[1]}],{lay!r}>"
        elif kind in (ArgKind.PTR, ArgKind.TABLE):
            sig[name] = "*" + SIG_DTYPES[result.tensors[arg.source].dtype.name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif kind in (ArgKind.ROWS, ArgKind.COLS, ArgKind.STRIDE, ArgKind.STORE_OK, ArgKind.SIZE,
                      ArgKind.STRIDE_I):
            sig[name] = "i32"
        elif kind is ArgKind.SCALAR:
            sig[name] = scalar_types.get(arg.source, "i32")   # the kernel's name for it
        elif kind is ArgKind.DBG:
            sig[name] = "i64"
    return sig, attrs


def ptx_compile(lowered, options, scalar_types):
    """(render result, Triton's compiled kernel) of ``lowered`` under RenderOptions ``options``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from xsync.backends.nvidia.compiled import FP_FUSION
    from xsync.backends.nvidia.render import render

    result = render(lowered.kernel, lowered.placement, lowered.allocation, options)
    module = load_module(lowered.kernel.name, result.source)
    fn = getattr(module, result.kernel_name)
    sig, attrs = signature_of(result, scalar_types)
    launch = {"num_warps": result.num_warps, "enable_fp_fusion": FP_FUSION}
    if lowered.allocation.maxnreg:
        launch["maxnreg"] = int(lowered.allocation.maxnreg)
    if result.num_ctas > 1:
        launch["num_ctas"] = result.num_ctas
    compiled = triton.compile(GluonASTSource(fn, sig, {}, attrs=attrs),
                              target=GPUTarget("cuda", TARGET_ARCH, 32), options=launch)
    return result, compiled


def compile_ptx(obj, constexprs: dict | None = None, tensor_dtypes: dict | None = None,
                scalar_types: dict | None = None, options: dict | None = None,
                debug_hang: bool | None = None) -> PtxResult:
    """Compile an xsync kernel (or a ``Lowered``) for sm_90a without a GPU.

    ``options``: the nvidia backend's option fields (``LowerOptions``: the schedule passes'
    switches and register budgets, applied when ``obj`` is a kernel this call lowers;
    ``RenderOptions``: the renderer's), over the configuration. A lowering option for a
    kernel lowered already, or an unknown one, is a ConfigError.
    ``scalar_types`` maps scalar parameters to Triton types (default ``i32``).
    Returns the generated source, PTX, cubin and TTGIR.
    """
    from xsync.backends.nvidia.backend import NVIDIA

    where = "compile_ptx(options=...)"
    given = {k: v for k, v in (options or {}).items() if v is not None}
    at_lowering = {k: v for k, v in given.items() if k in NVIDIA.LowerOptions.field_names()}
    if hasattr(obj, "lower"):
        lowered = obj.lower(NVIDIA, constexprs, tensor_dtypes,
                            options=config.lower_options(NVIDIA, at_lowering, where=where))
    else:
        lowered = obj
    if lowered.backend.target is not NVIDIA.target:
        raise BackendError(f"compile_ptx needs a kernel lowered for nvidia, got {lowered.placement.backend}",
                           fix="call kernel.lower('nvidia', ...)")
    if lowered is obj:     # lowered already: lowering options are an error
        opts = config.render_options(NVIDIA, given, where=where)
    else:
        opts = config.render_options(NVIDIA, {k: v for k, v in given.items() if k not in at_lowering},
                                     where=where)
    if debug_hang is not None:
        opts = dataclasses.replace(opts, debug_hang=debug_hang)
    off = None
    if opts.debug_hang:
        _, first = ptx_compile(lowered, dataclasses.replace(opts, bars_smem=0), scalar_types)
        off = bars_offset_from_ptx(first.asm["ptx"])
        if off is None:
            raise BackendError("hang debug mode: cannot find the mbarrier array in the PTX", loc=lowered.kernel.loc)
        opts = dataclasses.replace(opts, bars_smem=off)
    result, compiled = ptx_compile(lowered, opts, scalar_types)
    if off is not None and bars_offset_from_ptx(compiled.asm["ptx"]) != off:
        raise BackendError("hang debug mode: the mbarrier array moved between compiles", loc=lowered.kernel.loc)
    return PtxResult(result.source, compiled.asm["ptx"], compiled.asm["cubin"], compiled.asm["ttgir"],
                     compiled.metadata, result, off)
