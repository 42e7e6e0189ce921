"""The Hopper protocol of a cluster GEMM with TMA multicast, written by hand in Gluon (Triton >= 3.8),
as the reference a lowering of ``xs.cluster(n)`` + ``xs.tile(..., multicast=True)`` spells
(docs/design.md §8). Imported only where ``gluon_compat.cluster_multicast()`` holds.

Gluon's model: ONE program spread over the cluster's ``n`` CTAs (``num_ctas=n``); a tensor's
``cga_layout`` says how the CTAs share it. The xsync cluster's programs (rank r: rows r*BM..) are
the CTA split of one program tile of ``n*BM`` rows:

* A (per rank): shared ring and descriptor of ``[n*BM, BK]`` split along M: each CTA loads its own
  ``BM`` rows into its own shared memory;
* B (multicast): ``[BK, BN]`` broadcast (all-zero CGA bases): the lead CTA of the broadcast group
  issues the TMA with ``.multicast::cluster`` and a CTA mask, every CTA receives the whole tile;
* full barriers: one per CTA (``mbarrier.allocate_mbarrier``); each CTA's producer arms its own
  with the bytes that CTA receives: its share of A plus the whole B (``nbytes_per_cta`` of the two
  descriptors), so the multicast's complete_tx may land before or after the arming;
* empty barriers: one per CTA (its own A slot) plus a group barrier for the multicast slot (CGA
  bases all zero: it lives on the lead CTA, ``init`` multiplies its count by n, every CTA's arrive
  is routed to the lead as ``mbarrier.arrive.shared::cluster``, only the lead waits). A release
  is both arrives: the lead overwrites B in every CTA only after every consumer released it;
* sm_90a has no ``mbarrier.arrive.multicast`` (ptxas: "not supported on .target sm_90a"), so the
  release is routed to the one CTA that multicasts rather than broadcast to all;
* the barriers are initialised before ``warp_specialize``: the compiler adds
  ``fence.mbarrier_init.release.cluster`` and a cluster barrier there (a cluster barrier cannot
  run inside warp specialization).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)


@gluon.constexpr_function
def split_m(n):
    """CGA bases of a tile whose n CTAs hold consecutive row blocks."""
    return [[1 << i, 0] for i in range(n.bit_length() - 1)]


@gluon.constexpr_function
def broadcast(n, rank):
    """CGA bases of a tile (or barrier) every CTA of the n shares: all zero."""
    return [[0] * rank for _ in range(n.bit_length() - 1)]


@gluon.constexpr_function
def smem_layout(n, split, bitwidth):
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=bitwidth, rank=2,
                                cga_layout=split_m(n) if split else broadcast(n, 2))


@gluon.jit
def _producer(a_desc, b_desc, K, ring_a, ring_b, full, empty, empty_mc, NC: gl.constexpr, BK: gl.constexpr,
              STAGES: gl.constexpr):
    off_m = gl.program_id(0) * a_desc.block_shape[0]     # the cluster's rows; each CTA its share
    off_n = gl.program_id(1) * b_desc.block_shape[1]
    i = 0
    for k in range(0, K, BK):
        s = i % STAGES
        phase = ((i // STAGES) & 1) ^ 1
        mbarrier.wait(empty.index(s), phase)          # this CTA's consumer released its A slot
        mbarrier.wait(empty_mc.index(s), phase)       # lead only: every CTA released the B slot
        mbarrier.expect(full.index(s), a_desc.nbytes_per_cta + b_desc.nbytes_per_cta)
        tma.async_load(a_desc, [off_m, k], full.index(s), ring_a.index(s))
        tma.async_load(b_desc, [k, off_n], full.index(s), ring_b.index(s), multicast=True)
        i += 1


@gluon.jit
def _consumer(a_desc, b_desc, K, ring_a, ring_b, full, empty, empty_mc, c, ldc, ACC: gl.constexpr,
              NC: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    BM: gl.constexpr = a_desc.block_shape[0]
    BN: gl.constexpr = b_desc.block_shape[1]
    acc = gl.zeros([BM, BN], gl.float32, ACC)
    i = 0
    for k in range(0, K, BK):
        s = i % STAGES
        mbarrier.wait(full.index(s), (i // STAGES) & 1)
        acc = warpgroup_mma(ring_a.index(s), ring_b.index(s), acc, is_async=True)
        acc, _, _ = warpgroup_mma_wait(0, deps=[acc, ring_a.index(s), ring_b.index(s)])
        mbarrier.arrive(empty.index(s), count=1)
        mbarrier.arrive(empty_mc.index(s), count=1)   # routed to the lead CTA
        i += 1
    rows = gl.program_id(0) * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, ACC))
    cols = gl.program_id(1) * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, ACC))
    gl.store(c + rows[:, None] * ldc + cols[None, :], acc)


@gluon.jit
def cluster_gemm(a_desc, b_desc, c, ldc, K, NC: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """C[cluster rows, cols] = A @ B over a cluster of NC CTAs (launch num_ctas=NC, grid in clusters)."""
    gl.static_assert(gl.num_ctas() == NC)
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16],
                                                  cga_layout=split_m(NC))
    ring_a = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_shape, a_desc.layout)
    ring_b = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_shape, b_desc.layout)
    full = mbarrier.allocate_mbarrier(batch=STAGES)
    empty = mbarrier.allocate_mbarrier(batch=STAGES)
    empty_mc = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout(broadcast(NC, 1)))
    for s in gl.static_range(STAGES):
        mbarrier.init(full.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
        mbarrier.init(empty_mc.index(s), count=1)     # x NC on the lead
    fence_async_shared()
    gl.warp_specialize([
        (_consumer, (a_desc, b_desc, K, ring_a, ring_b, full, empty, empty_mc, c, ldc, ACC, NC, BK, STAGES)),
        (_producer, (a_desc, b_desc, K, ring_a, ring_b, full, empty, empty_mc, NC, BK, STAGES)),
    ], [1], [40])


def compile_offline(n: int = 2, BM: int = 128, BN: int = 128, BK: int = 64, STAGES: int = 4):
    """Triton's compiled kernel for sm_90a (no GPU): BM rows per CTA, n CTAs a cluster."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    la, lb = smem_layout(n, True, 16), smem_layout(n, False, 16)
    sig = {"a_desc": f"tensordesc<bf16[{n * BM}, {BK}],{la!r}>", "b_desc": f"tensordesc<bf16[{BK}, {BN}],{lb!r}>",
           "c": "*fp32", "ldc": "i32", "K": "i32", "NC": "constexpr", "BK": "constexpr", "STAGES": "constexpr"}
    src = GluonASTSource(cluster_gemm, sig, {(5,): n, (6,): BK, (7,): STAGES},
                         attrs={(2,): [["tt.divisibility", 16]]})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "num_ctas": n, "enable_fp_fusion": True})
