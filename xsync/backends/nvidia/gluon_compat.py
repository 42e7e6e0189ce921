"""Gluon spellings that differ across the supported Triton versions, for generated modules only
(importing this module imports triton).

``tma_reduce_add(desc, coord, smem)``: the TMA bulk reduce-add of a shared-memory tile into
global memory (PTX ``cp.reduce.async.bulk.tensor ... .add``). Triton >= 3.9's Gluon calls it
``tma.async_atomic_add``; Triton 3.6 builds the same op (``create_async_tma_reduce`` with
``DESCRIPTOR_REDUCE_KIND.ADD``) but has no Gluon function for it, so this module defines one
the same way 3.9 does (its ``_async_atomic_shared_to_global``). Like a TMA store it is waited
with ``tma.store_wait``.

``cluster_multicast()``: whether the installed Gluon spells a cluster's TMA multicast (Triton >=
3.8: ``tma.async_load(..., multicast=True)``, ``mbarrier.expect/arrive(..., from_cta=)``,
``gl.num_ctas()``). Gluon spreads ONE program over the cluster's CTAs there (CGA layouts), so an
xsync cluster of n programs becomes one Gluon program launched with ``num_ctas=n``;
tests/nvidia/multicast_reference.py is the protocol such a lowering spells, compiled offline.
"""
import inspect

from triton.experimental.gluon import language as _gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier as _mbarrier
from triton.experimental.gluon.language.nvidia.hopper import tma

tma_reduce_add = getattr(tma, "async_atomic_add", None)

if tma_reduce_add is None:
    from triton._C.libtriton import ir as _ir
    from triton.experimental.gluon.language._core import builtin as _builtin

    @_builtin
    def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """Add the shared-memory tile ``src`` into the global tile of ``tensor_desc`` at ``coord``."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle,
                                                  coord, src.handle)


def cluster_multicast() -> bool:
    """Whether this Gluon has TMA multicast into CTA-split programs (Triton >= 3.8); 3.6 and 3.7
    have none of it, and xsync's cluster kernels run there as independent programs."""
    load = getattr(tma, "async_load", None)
    return (load is not None and "multicast" in inspect.signature(load).parameters
            and "from_cta" in inspect.signature(_mbarrier.arrive).parameters and hasattr(_gl, "num_ctas"))
