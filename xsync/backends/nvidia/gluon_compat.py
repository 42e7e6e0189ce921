"""Gluon spellings that differ across the supported Triton versions, for generated modules only
(importing this module imports triton).

``tma_reduce_add(desc, coord, smem)``: the TMA bulk reduce-add of a shared-memory tile into
global memory (PTX ``cp.reduce.async.bulk.tensor ... .add``). Triton >= 3.9's Gluon calls it
``tma.async_atomic_add``; Triton 3.6 builds the same op (``create_async_tma_reduce`` with
``DESCRIPTOR_REDUCE_KIND.ADD``) but has no Gluon function for it, so this module defines one
the same way 3.9 does (its ``_async_atomic_shared_to_global``). Like a TMA store it is waited
with ``tma.store_wait``.
"""
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
