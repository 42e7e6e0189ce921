"""The Hopper schedule passes, in the order the target runs them (``TARGET.passes``):

1. ``merge-pipes`` (:mod:`.merge_pipes`): two rings the same producer fills back to back and
   the same consumer takes in one iteration become one ring of two-tile slots.
2. ``fuse-accumulating-mma`` (:mod:`.fuse_mma`): a fresh product added to an accumulator
   becomes the accumulating wgmma.
3. ``defer-mma-wait`` (:mod:`.defer_wait`): one wgmma in flight across the iterations of an
   accumulating loop; the slot releases move one iteration later.
4. ``pingpong`` (:mod:`.pingpong`): the two consumer warpgroups of an agent take turns issuing
   wgmmas, through two barriers the pass declares.
5. ``overlap-softmax`` (:mod:`.overlap`): the attention loop rotated by one GEMM, so the next S
   and the previous PV are in flight during the softmax.

Each but the first rewrites consumer agents' programs (``KernelIR.programs``), states its applicability
rules in dataflow terms in its docstring, logs a line per candidate (``xsync check`` /
``xsync lower`` print the log) and emits IR sync operations; ``Kernel.lower`` verifies the
result before allocating and rendering.
"""
from xsync.backends.nvidia.passes import defer_wait, fuse_mma, merge_pipes, overlap, pingpong

PASSES = (merge_pipes, fuse_mma, defer_wait, pingpong, overlap)
