"""Context parallelism: attention over a sequence split across the ranks of a torch.distributed
process group (gloo on CPUs, nccl on GPUs: the same code), with xsync's attention as the block
kernel. docs/distributed.md explains the layouts, the ring and how it relates to torch's
``context_parallel``.

    ring_attention(q, k, v, causal=False, sm_scale=None, group=None, layout="zigzag", timeout=None)
        -> (o, lse) of this rank's rows; differentiable
    shard(x, rank, world, dim=2, layout="zigzag") / unshard(parts, dim=2, layout="zigzag")
    gather(local, group=None, dim=2, layout="zigzag")       the collective unshard
    positions(seq_len, rank, world, layout="zigzag")        global positions of rank's tokens
"""
from xsync.distributed.layout import LAYOUTS, Block, Segment, positions, segments, shard, step_blocks, unshard  # noqa: F401
from xsync.distributed.ring import gather, merge, ring_attention  # noqa: F401
