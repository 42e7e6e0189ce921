"""Prepared launches: the compiled kernel's C launch function called with arguments bound once.

Triton's launch path re-derives per call what a repeated launch of one plan (same shapes,
strides, dtypes, grid, compiled kernel) never changes: Python wrappers around the C launcher
expand every host TMA descriptor into a freshly encoded ``CUtensorMap`` (a driver call and a
Python object each), allocate scratch that is empty for our kernels, and let the C code call
``data_ptr()`` and ``cuPointerGetAttribute`` on every tensor. A prepared launch binds all of
that once and per call only fills in the varying tensors:

    prepare:  argv --expand (Triton's own make_tensordesc_arg)--> static C arguments
              varying tensor j -> (slot in the C arguments, descriptor template or None)
    launch:   C arguments = static copy; per varying tensor: its data pointer, or the
              CUtensorMap for that pointer (cached: the map is a pure function of the pointer
              once shape, strides, dtype and block are fixed, so a hit is always right)

Where the installed Triton lays its launcher out differently than the layout this module
knows (checked structurally, not by version string), ``c_launch`` returns None and the caller
keeps Triton's ``kernel.run``.
"""
from __future__ import annotations

import sys

from xsync.backends.nvidia.abi import ArgKind

# How many CUtensorMaps each varying descriptor keeps (keyed by data pointer). A training
# loop cycles through a handful of buffers; more distinct pointers just clear the cache.
MAPS_PER_SLOT = 64
C_ARGS_FORMAT = "iiiKKppOOOOOO"


def layout_known(driver_module) -> bool:
    """Whether a Triton driver module spells the C function's argument tuple as this module
    does (Triton 3.6): grid, stream, function, cooperative, pdl, two scratch pointers,
    metadata, launch metadata, two hooks; descriptors expanded by make_tensordesc_arg(arg, meta)."""
    expand = getattr(driver_module, "make_tensordesc_arg", None)
    return (getattr(driver_module, "_BASE_ARGS_FORMAT", None) == C_ARGS_FORMAT and expand is not None
            and getattr(expand, "__code__", None) is not None and expand.__code__.co_argcount == 2)


def c_launch(kernel):
    """(C launch function, tensordesc metadata, make_tensordesc_arg) of a compiled Triton 3.6
    kernel, or None where its launcher is not the layout known here or needs scratch memory."""
    run = getattr(kernel, "run", None)
    wrapper = getattr(run, "launch", None)
    if wrapper is None or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    if getattr(run, "launch_cooperative_grid", None) is None or getattr(run, "launch_pdl", None) is None:
        return None
    module = sys.modules.get(type(run).__module__)
    if not layout_known(module):
        return None
    meta = getattr(kernel.metadata, "tensordesc_meta", None)
    code = getattr(wrapper, "__code__", None)
    if code is None:                       # no descriptor argument: the C function itself
        return (wrapper, meta, None) if _is_builtin(wrapper) else None
    free = code.co_freevars
    if "launcher" not in free or wrapper.__closure__ is None:
        return None
    inner = wrapper.__closure__[free.index("launcher")].cell_contents
    if not _is_builtin(inner):
        return None
    return inner, meta, module.make_tensordesc_arg


def _is_builtin(fn) -> bool:
    return type(fn).__name__ == "builtin_function_or_method"


def prepare_c_launch(kernel, grid: tuple, argv: list, kinds: list, slots: list, device: int,
                     current_device, current_stream, hooks_set):
    """A launch(*tensors) -> bool calling the C launcher directly, or None (see c_launch).

    `kinds[i]` is the ArgKind of `argv[i]` (a TMA store descriptor counts as DESC);
    `slots` lists (argument index, varying tensor index, descriptor template or None) as
    CompiledNvidia.prepare builds them. Tensor pointer arguments are passed as integers (the
    plan fixed their device), and the static ones stay referenced by the launch."""
    from xsync.backends.nvidia.compiled import from_template
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    found = c_launch(kernel)
    if found is None:
        return None
    c_fn, metas, expand = found
    varying = {i: (j, template) for i, j, template in slots}
    descriptors = iter(metas or ())
    static, places, keep = [], [], []
    for i, (arg, kind) in enumerate(zip(argv, kinds)):
        meta = next(descriptors, None) if kind is ArgKind.DESC else None
        if i in varying:
            j, template = varying[i]
            if kind is ArgKind.DESC:
                if meta is None:           # the descriptor would be passed as its tensor
                    return None
                width = len(expand(arg, meta))
                places.append((len(static), width, j, template, meta, {}))
                static.extend([None] * width)
            else:
                places.append((len(static), 0, j, None, None, None))
                static.append(None)
        elif kind is ArgKind.DESC:
            if expand is None:
                return None
            keep.append(arg)
            static.extend(expand(arg, meta))
        elif kind in (ArgKind.PTR, ArgKind.TABLE):
            keep.append(arg)
            static.append(arg.data_ptr())
        else:
            static.append(arg)
    gx, gy, gz = grid
    head = [gx, gy, gz, None, kernel.function, kernel.run.launch_cooperative_grid, kernel.run.launch_pdl,
            None, None, kernel.packed_metadata, None, None, None]
    args0 = head + static
    stream_at, base = 3, len(head)

    def launch(*tensors) -> bool:
        if current_device() != device or hooks_set():
            return False
        args = args0.copy()
        for at, width, j, template, meta, maps in places:
            x = tensors[j]
            ptr = x.data_ptr()
            if ptr % 16:
                return False
            if maps is None:
                args[base + at] = ptr
                continue
            expanded = maps.get(ptr)
            if expanded is None:
                if len(maps) >= MAPS_PER_SLOT:
                    maps.clear()
                expanded = maps[ptr] = expand(from_template(TensorDescriptor, template, base=x), meta)
            args[base + at:base + at + width] = expanded
        args[stream_at] = current_stream(device)
        c_fn(*args)
        return True
    launch.keep_alive = tuple(keep)     # the static tensors behind the integer pointers
    return launch
