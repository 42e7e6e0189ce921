"""Rule 5 of the Hopper CTA split (xsync/backends/nvidia/cta_rows.py): every tile of a cluster's
program is made of its programs' rows. The attention forward with K/V multicast
(xsync.kernels.flash_attn.cluster: the flagship's roles and pipes) passes it -- row reductions,
row vectors, S, P and PV handed between roles, P as a wgmma's A, ``xs.trans`` of a multicast K --
also after the Hopper schedule passes rewrote its consumer, and its cluster program computes, on
the CPU emulator, what the cluster's programs compute; each way of mixing rows across programs
is refused by line."""
import math

import pytest
import torch

import xsync as xs
from tests.core import cluster_kernels as C
from xsync.kernels.flash_attn.cluster import attention_cluster, attention_fwd_cluster
from xsync.lowering import ir
from xsync.lowering.passes import dataflow

ATTN = dict(BM=64, BN=128, D=128, STAGES=2, REPLICAS=2, CLUSTER=2)


@pytest.mark.parametrize("replicas, cluster", [(1, 2), (2, 2), (2, 4)])
def test_attention_cluster_splits_over_the_ctas(replicas, cluster):
    d = C.decide(attention_fwd_cluster, dict(ATTN, REPLICAS=replicas, CLUSTER=cluster))
    assert d.split is not None and d.why.startswith("rules 1-5"), d.why
    k = d.split.kernel
    assert d.split.multicast == {("k_in", "k"), ("v_in", "v")}
    assert k.sync_object("q_in").fields[0].shape == (cluster * 64, 128)
    assert k.sync_object("s_out").fields[0].shape == (cluster * 64, 128)       # register hand-offs
    assert [k.sync_object(p).fields[0].shape for p in ("k_in", "v_in")] == [(128, 128), (128, 128)]
    made = [e for st in ir.walk(k.all_statements()) for e in dataflow.stmt_exprs(st)
            if isinstance(e, ir.Call) and e.op in (ir.TileOp.ZEROS, ir.TileOp.FULL)]
    assert made and all(e.args[0].items[0] == ir.Const(cluster * 64) for e in made)   # 1-D and 2-D
    assert C.decide(attention_fwd_cluster, ATTN, gluon=False).why.startswith("rule 1:")


@pytest.mark.parametrize("replicas, cluster", [(1, 2), (2, 2), (1, 4)])
def test_the_attention_cluster_program_computes_what_its_programs_computed(replicas, cluster):
    """The rewrite's meaning without a GPU: the cluster's program (Q tiles and the softmax's row
    vectors n times taller, K and V one tile for all) run as an ordinary kernel on the CPU
    emulator, one program per cluster, gives the output and LSE of the cluster's programs (to the
    last bits a taller matmul may round differently in: 1e-6), which match SDPA; the verifier
    proves its protocol as one program."""
    cx = dict(BM=16, BN=32, D=32, STAGES=2, REPLICAS=replicas, CLUSTER=cluster)
    compiled = C.cluster_program(attention_fwd_cluster, cx, {n: xs.float32 for n in ("q", "k", "v", "o", "lse")})

    torch.manual_seed(0)
    B, H, S, D = 1, 2, 2 * replicas * cluster * 16, 32
    q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
    o, lse = attention_cluster(q, k, v, cluster=cluster, replicas=replicas, block_m=16, block_n=32,
                               backend="cpu")
    torch.testing.assert_close(o, torch.nn.functional.scaled_dot_product_attention(q, k, v),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, torch.logsumexp(q @ k.transpose(-1, -2) / math.sqrt(D), -1),
                               rtol=1e-5, atol=1e-5)
    o_one, lse_one = torch.zeros(B * H * S, D), torch.zeros(B * H * S)
    flat = [t.reshape(B * H * S, D) for t in (q, k, v)]
    compiled.launch((B * H * S // (replicas * cluster * 16),),
                    dict(q=flat[0], k=flat[1], v=flat[2], o=o_one, lse=lse_one, S=S, BH=B * H,
                         sm_scale=1 / math.sqrt(D)))
    torch.testing.assert_close(o_one, o.reshape(-1, D), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse_one, lse.reshape(-1), rtol=1e-6, atol=1e-6)


def test_attention_cluster_refuses_what_it_does_not_cover():
    q = torch.randn(1, 1, 96, 32)
    with pytest.raises(xs.LaunchError, match="not a multiple of 128 query rows") as info:
        attention_cluster(q, q, q, block_m=32, backend="cpu")
    assert "flash_attn.attention" in info.value.fix
    ints = torch.ones(1, 1, 128, 32, dtype=torch.int32)
    with pytest.raises(xs.LaunchError, match="torch.int32") as info:
        attention_cluster(ints, ints, ints, block_m=32, backend="cpu")
    assert "bfloat16 or float16" in info.value.fix
    with pytest.raises(xs.LaunchError, match="one shape"):
        attention_cluster(q, q[:, :, :64], q, backend="cpu")


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=64, BN=64, MIX=0))
def mixes_rows(a, b, c, BM: xs.constexpr, BN: xs.constexpr, MIX: xs.constexpr):
    """Two programs, A split by rows and B multicast; MIX picks one way of mixing rows."""
    xs.cluster(2)
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=2,
                    a=xs.tile([BM, BN], a.dtype), b=xs.tile([BN, BN], b.dtype, multicast=True))
    off_m = xs.cluster_id() * (2 * BM) + xs.cluster_rank() * BM
    with load:
        s = tiles.acquire()
        s.a = xs.load(a, [off_m, 0], [BM, BN])
        s.b = xs.load(b, [0, 0], [BN, BN])
        tiles.commit()
    with mma:
        t = tiles.wait()
        acc = xs.mma(t.a, t.b, xs.zeros([BM, BN], xs.float32))
        acc = xs.mma_wait(acc, pending=0)
        tiles.release()
        if MIX == 1:
            acc = acc - xs.max(acc, 0)[None, :]                 # a reduction along the rows
        if MIX == 2:
            acc = acc + xs.sum(acc, 1)                          # a row vector along the columns
        if MIX == 3:
            acc = acc + xs.sum(acc, 1)[None, :]                 # rows turned into columns
        if MIX == 4:
            acc = xs.trans(acc)                                 # a transpose
        if MIX == 5:
            acc = acc + xs.arange(0, BN)[None, :]               # an index range
        if MIX == 6:
            acc = acc + xs.zeros([1, BN], xs.float32)           # a tile of other rows
        if MIX == 7:
            acc = acc * 2.0 + xs.max(acc, 1)[:, None]           # row by row: accepted
        xs.store(c, [off_m, 0], acc)


@pytest.mark.parametrize("mix, why", [
    (1, "xs.max along axis 0 mixes the program's rows"),
    (2, "a row vector meets a 2-D tile without `[:, None]`"),
    (3, "`x[None, ...]` turns the program's rows into columns"),
    (4, "xs.trans of a tile turns the program's rows into columns"),
    (5, "xs.arange makes an index range"),
    (6, "xs.zeros of 1 row(s)"),
    (7, None),
])
def test_rule_5_refuses_each_way_of_mixing_rows(mix, why):
    d = C.decide(mixes_rows, dict(BM=64, BN=64, MIX=mix))
    if why is None:
        assert d.split is not None, d.why
        return
    assert d.split is None and d.why.startswith("rule 5: line") and why in d.why, d.why
    line = int(d.why.split("line ")[1].split(":")[0])
    assert f"MIX == {mix}" in open(__file__).read().splitlines()[line - 2], (line, d.why)


@pytest.mark.parametrize("d", [64, 128])
def test_attention_cluster_keeps_the_flagship_schedule(d):
    """With 3 stages the Hopper passes merge K and V into one ring, fuse PV into the accumulator
    and overlap the softmax with the next S and the previous PV -- and the cluster's program is
    still one over the CTAs, both fields of the merged ring multicast."""
    cx = dict(ATTN, D=d, STAGES=3)
    lw = attention_fwd_cluster.lower("nvidia", cx)
    applied = {n.pass_name for n in lw.passes.notes if n.applied}
    assert {"merge-pipes", "fuse-accumulating-mma", "overlap-softmax"} <= applied, applied
    split = C.decide(attention_fwd_cluster, cx).split
    assert split is not None and len(split.multicast) == 2
    assert {f for _, f in split.multicast} == {"k", "v"}
