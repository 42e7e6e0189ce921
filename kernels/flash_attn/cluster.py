"""Attention forward with K and V multicast over a cluster: the A/B of issue 39 (does sending one
K/V tile to the CTAs of a cluster pay in attention, as B's multicast does in the GEMM?).

The flagship's roles and pipes (kernel.py), so Hopper gives it the flagship's schedule (the PV
product fused into the accumulator, the softmax overlapped with the next S and the previous PV,
K and V one ring from 3 stages on), with K and V multicast fields; what it leaves out keeps it
inside the CTA-split rules (xsync/backends/nvidia/cluster_ctas.py): non-causal, dense
[B*H*S, D] with S a multiple of the cluster's rows and of BN (no masks, no index ranges), tiles
dealt in order (no tile table), no Q ring ahead. Its CLUSTER=1 specialization is the same kernel
without multicast, so the two compare the multicast alone; benchmarks/attention_cluster.py times
both beside the flagship and cuDNN.

    q_load (copy, REPLICAS) --q_in (paired)--> mma (matrix, REPLICAS) <--k_in, v_in (multicast)-- load
                                                 |  s_out  ^ p_in  | pv_out
                                                 v         |       v
                                               softmax (vector, REPLICAS)

A cluster of CLUSTER programs takes REPLICAS * CLUSTER * BM query rows of one (batch, head):
replica r takes the band of CLUSTER * BM rows at r * CLUSTER * BM, program (rank) c its BM rows
c * BM of it, so on Hopper (Triton >= 3.8) each replica's rows over the cluster are one block,
the CTA split, and the lead CTA multicasts each K/V tile to every CTA. Elsewhere (Ascend, the
CPU, Triton 3.6) every program loads its own K and V.
"""
from __future__ import annotations

import math

import torch

import xsync as xs
from xsync.compiler import caller_loc
from xsync.errors import LaunchError

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
INF = float("inf")


@xs.kernel(example=dict(q=xs.bfloat16, k=xs.bfloat16, v=xs.bfloat16, o=xs.bfloat16, lse=xs.float32,
                        BM=64, BN=128, D=128, STAGES=3, REPLICAS=2, CLUSTER=2))
def attention_fwd_cluster(q, k, v, o, lse, S, BH, sm_scale, BM: xs.constexpr, BN: xs.constexpr,
                          D: xs.constexpr, STAGES: xs.constexpr, REPLICAS: xs.constexpr = 2,
                          CLUSTER: xs.constexpr = 2):
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy")
    q_load = xs.role("q_load", kind="copy", replicas=REPLICAS)
    mma = xs.role("mma", kind="matrix", replicas=REPLICAS)
    softmax = xs.role("softmax", kind="vector", replicas=REPLICAS)
    k_in = xs.pipe(load, mma, stages=STAGES, k=xs.tile([BN, D], k.dtype, multicast=True))
    v_in = xs.pipe(load, mma, stages=STAGES, v=xs.tile([BN, D], v.dtype, multicast=True))
    s_out = xs.pipe(mma, softmax, stages=3, s=xs.tile([BM, BN], xs.float32))
    p_in = xs.pipe(softmax, mma, stages=2, p=xs.tile([BM, BN], q.dtype))
    pv_out = xs.pipe(mma, softmax, stages=2, pv=xs.tile([BM, D], xs.float32))
    q_in = xs.pipe(q_load, mma, stages=1, q=xs.tile([BM, D], q.dtype))
    qk_scale = sm_scale * LOG2E
    blocks_m = xs.cdiv(S, REPLICAS * CLUSTER * BM)
    for tile in xs.tile_range(BH * blocks_m):
        bh = tile // blocks_m
        row = bh * S + (tile % blocks_m) * (REPLICAS * CLUSTER * BM) + xs.cluster_rank() * BM
        with q_load:
            qs = q_in.acquire()
            qs.q = xs.load(q, [row + xs.replica_id() * (CLUSTER * BM), 0], [BM, D])
            q_in.commit()
        with mma:
            qt = q_in.wait()
        with softmax:
            m_i = xs.full([BM], -INF, xs.float32)
            l_i = xs.zeros([BM], xs.float32)
            o_acc = xs.zeros([BM, D], xs.float32)
        for n in range(0, S, BN):
            with load:
                ks = k_in.acquire()
                ks.k = xs.load(k, [bh * S + n, 0], [BN, D])
                k_in.commit()
                vs = v_in.acquire()
                vs.v = xs.load(v, [bh * S + n, 0], [BN, D])
                v_in.commit()
            with mma:
                kt = k_in.wait()
                s = xs.mma(qt.q, xs.trans(kt.k))
                s = xs.mma_wait(s, pending=0)
                k_in.release()
                so = s_out.acquire()
                so.s = s
                s_out.commit()
            with softmax:
                sc = s_out.wait()
                x = sc.s
                s_out.release()
                m_new = xs.maximum(m_i, xs.max(x, 1) * qk_scale)
                alpha = xs.exp2(m_i - m_new)
                p = xs.exp2(x * qk_scale - m_new[:, None])
                l_i = l_i * alpha + xs.sum(p, 1)
                m_i = m_new
                po = p_in.acquire()
                po.p = p.to(q.dtype)
                p_in.commit()
            with mma:
                pt = p_in.wait()
                vt = v_in.wait()
                pv = xs.mma(pt.p, vt.v)
                pv = xs.mma_wait(pv, pending=0)
                v_in.release()
                p_in.release()
                po2 = pv_out.acquire()
                po2.pv = pv
                pv_out.commit()
            with softmax:
                pvs = pv_out.wait()
                o_acc = o_acc * alpha[:, None] + pvs.pv
                pv_out.release()
        with mma:
            q_in.release()
        with softmax:
            xs.store(o, [row + xs.replica_id() * (CLUSTER * BM), 0], (o_acc / l_i[:, None]).to(o.dtype))
            xs.store(lse, [row + xs.replica_id() * (CLUSTER * BM)], (m_i + xs.log2(l_i)) * LN2)


def attention_cluster(q, k, v, *, cluster: int = 2, block_m: int = 64, block_n: int = 128,
                      stages: int = 3, replicas: int = 2, backend: str | None = None):
    """Non-causal attention of [B, H, S, D] tensors (equal heads, S_q = S_k) by
    :func:`attention_fwd_cluster`; returns (out [B, H, S, D], lse [B, H, S]). S must be a multiple
    of ``replicas * cluster * block_m`` and of ``block_n``."""
    where = caller_loc()
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)) or \
            q.shape != k.shape or q.shape != v.shape:
        raise LaunchError("attention_cluster: q, k and v must be [B, H, S, D] tensors of one shape",
                          loc=where, objects=("q", "k", "v"), fix="pass equal [B, H, S, D] tensors")
    if len({t.dtype for t in (q, k, v)}) > 1 or q.dtype not in (torch.bfloat16, torch.float16, torch.float32) \
            or len({t.device for t in (q, k, v)}) > 1:
        raise LaunchError(f"attention_cluster: q, k and v are {q.dtype} / {k.dtype} / {v.dtype} on "
                          f"{q.device} / {k.device} / {v.device}", loc=where, objects=("q", "k", "v"),
                          fix="pass bfloat16 or float16 tensors (float32 on the CPU emulator) of one dtype on one device")
    b, h, s, d = q.shape
    rows = replicas * cluster * block_m
    if s % rows or s % block_n:
        raise LaunchError(f"attention_cluster: S = {s} is not a multiple of {rows} query rows "
                          f"(replicas x cluster x block_m) and of block_n = {block_n}", loc=where,
                          objects=("q",), fix="use xsync.kernels.flash_attn.attention for any length")
    q2, k2, v2 = (t.reshape(b * h * s, d).contiguous() for t in (q, k, v))
    o = torch.empty_like(q2)
    lse = torch.empty(b * h * s, dtype=torch.float32, device=q.device)
    grid = (b * h * (s // rows) * cluster,)
    attention_fwd_cluster[grid](q2, k2, v2, o, lse, s, b * h, 1.0 / math.sqrt(d), BM=block_m, BN=block_n,
                                D=d, STAGES=stages, REPLICAS=replicas, CLUSTER=cluster, backend=backend)
    return o.view(b, h, s, d), lse.view(b, h, s)
