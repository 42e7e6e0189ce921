"""NVIDIA Hopper backend (Triton 3.6-3.9 Gluon).

Its modules, one job each:

* :mod:`~xsync.backends.nvidia.backend` -- the registered :class:`NvidiaBackend` (availability
  probe, compile, render_source);
* :mod:`~xsync.backends.nvidia.options` -- ``LowerOptions`` (the schedule passes' switches,
  register budgets) and ``RenderOptions`` (hang debug mode, TMA stores, prefetch, exp2 on FMA);
* :mod:`~xsync.backends.nvidia.placement`, :mod:`~xsync.backends.nvidia.passes`,
  :mod:`~xsync.backends.nvidia.alloc` -- lowering; :mod:`~xsync.backends.nvidia.render` --
  the Gluon source;
* :mod:`~xsync.backends.nvidia.modules` -- the module cache (generated sources as real ``.py``
  files under ``$XSYNC_CACHE_DIR/nvidia``: Gluon's JIT reads the source with ``inspect``);
* :mod:`~xsync.backends.nvidia.compiled` -- :class:`CompiledNvidia`: host arguments (TMA
  descriptors) and launches; :mod:`~xsync.backends.nvidia.launcher` -- the direct C launch;
* :mod:`~xsync.backends.nvidia.ptx` -- ``compile_ptx`` (sm_90a PTX + cubin on any machine, no
  GPU needed) and reading the PTX.

Options (``xsync.options(...)`` names; environment ``XSYNC_<NAME>``):

* ``debug_hang`` -- hang debug mode: every mbarrier wait first polls with
  ``mbarrier.try_wait.parity`` for at most ``hang_timeout_ms`` (default 2000) ms; a stuck
  agent records (agent, wait site, iteration) in a host-mapped buffer and traps, and the
  launch raises :class:`xsync.errors.StallError` naming the role, the pipe/event, the kernel
  line and the iteration. The trap leaves the CUDA context unusable: run debug launches in a
  process you can discard.
* ``nv_producer_regs`` (default 40) / ``nv_consumer_regs`` (default: the registers left, split
  evenly between consumer warpgroups, at most 232) -- ``worker_num_regs`` per partition
  (``setmaxnreg``); ``nv_maxnreg`` -- the launch option ``maxnreg``. The allocator reads them
  when the kernel is lowered (``LowerOptions.producer_regs`` ...).
* ``nv_merge_pipes`` / ``nv_fuse_mma`` / ``nv_defer_mma_wait`` / ``nv_overlap`` /
  ``nv_pingpong=0|1|each|first|wrap`` -- switch the Hopper schedule passes
  (:mod:`xsync.backends.nvidia.passes`); ``LowerOptions.merge_pipes`` / ``fuse_mma`` /
  ``defer_mma_wait`` / ``overlap_softmax`` / ``pingpong`` (``kernel.lower(..., options=)``,
  ``compile_ptx(options=)``). They act when the kernel is lowered: the verifier checks what
  they emit.
"""
from __future__ import annotations

from xsync.backends.nvidia.backend import NVIDIA, NvidiaBackend  # noqa: F401
from xsync import config
from xsync.backends.nvidia.compiled import (  # noqa: F401
    CompiledNvidia, from_template, host_descriptor, specialization_key,
    tma_aligned, tma_ready,
)
from xsync.backends.nvidia.modules import cache_dir, load_module  # noqa: F401
from xsync.backends.nvidia.options import LowerOptions, RenderOptions  # noqa: F401
from xsync.backends.nvidia.ptx import TARGET_ARCH, PtxResult, bars_offset_from_ptx, compile_ptx, signature_of  # noqa: F401


def availability() -> tuple[bool, str]:
    """(can run here, why not); probed once per process."""
    return NVIDIA.availability()


def render_source(kernel, placement, allocation, options: dict | None = None) -> str:
    """The Gluon module text of a lowered kernel; ``options``: RenderOptions fields over the
    configuration (a lowering option here is a ConfigError: lower with it)."""
    return NVIDIA.render_source(kernel, placement, allocation,
                                config.render_options(NVIDIA, options, where="render_source(options=...)"))


def compile_kernel(kernel, placement, allocation, options: dict | None = None) -> CompiledNvidia:
    """The compiled kernel of a lowered one; ``options`` as for :func:`render_source`."""
    return NVIDIA.compile(kernel, placement, allocation,
                          config.render_options(NVIDIA, options, where="compile_kernel(options=...)"))
