"""The Hopper decision to spell a cluster as one Gluon program over its CTAs
(xsync/backends/nvidia/cluster_ctas.py), on the IR alone (no Triton: rule 1's fact is given):
which rule keeps the per-program fallback, and what the split kernel looks like."""
import pytest

import xsync as xs
from tests.core import cluster_kernels as C
from xsync.kernels.gemm import gemm_cluster, gemm_cluster_2wg
from xsync.lowering import ir
from xsync.lowering.passes import dataflow

GEMM = dict(BM=128, BN=128, BK=64, STAGES=4, CLUSTER=2)


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=64, BN=64, BK=64, STAGES=2, CLUSTER=2))
def cluster_b_in_registers(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                           STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    """The multicast tile is also read into registers: not a wgmma B operand only (rule 5)."""
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES,
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype, multicast=True))
    for tile in xs.tile_range(xs.cdiv(M, CLUSTER * BM)):
        off_m = tile * (CLUSTER * BM) + xs.cluster_rank() * BM
        with mma:
            acc = xs.zeros([BM, BN], xs.float32)
        for k in range(0, K, BK):
            with load:
                s = tiles.acquire()
                s.a = xs.load(a, [off_m, k], [BM, BK])
                s.b = xs.load(b, [k, 0], [BK, BN])
                tiles.commit()
            with mma:
                t = tiles.wait()
                acc = xs.mma(t.a, t.b, acc) + t.b
                acc = xs.mma_wait(acc, pending=0)
                tiles.release()
        with mma:
            xs.store(c, [off_m, 0], acc)


def test_gemm_cluster_splits_over_the_ctas():
    d = C.decide(gemm_cluster, GEMM)
    assert d.split is not None and d.why.startswith("rules 1-5")
    k = d.split.kernel
    assert d.split.ctas == 2 and d.split.multicast == {("tiles", "b")}
    assert {f.name: f.shape for f in k.sync_object("tiles").fields} == {"a": (256, 64), "b": (64, 128)}
    assert d.split.broadcast_descs == {("b", (64, 128))}
    # no program id of a program is left: the cluster's program is the Gluon program
    pid = ir.Call(ir.TileOp.PROGRAM_ID, (ir.Const(0),))
    ops = [e for st in ir.walk(k.all_statements()) for e in dataflow.stmt_exprs(st)]
    assert pid in ops and ir.BinOp("%", pid, ir.Const(2)) not in ops and ir.BinOp("//", pid, ir.Const(2)) not in ops
    zeros = [e for e in ops if isinstance(e, ir.Call) and e.op is ir.TileOp.ZEROS]
    assert zeros and all(e.args[0].items[0] == ir.Const(256) for e in zeros)
    assert d.split.bases(2, True) == [[1, 0]] and d.split.bases(2, False) == [[0, 0]]
    assert d.split.bases(1, True) == [[1]] and d.split.bases(1, False) == [[0]]


def test_gemm_cluster_2wg_splits_each_replica_band_over_the_ctas():
    """Two matrix replicas, each with its own A ring and a per-replica row offset
    (``off_m + xs.replica_id() * CLUSTER * BM``), B a 1 -> 2 broadcast pipe: each replica's A tile
    becomes n times taller (its band's rows over the cluster, split by rows), B stays one tile
    multicast to every CTA, and the lead's group barrier counts both replicas of every CTA."""
    for n in (2, 4):
        d = C.decide(gemm_cluster_2wg, dict(GEMM, CLUSTER=n))
        assert d.split is not None and d.why.startswith("rules 1-5"), d.why
        k = d.split.kernel
        assert d.split.multicast == {("b_in", "b")} and d.split.broadcast_descs == {("b", (64, 128))}
        assert k.sync_object("a_in").fields[0].shape == (n * 128, 64)
        assert k.sync_object("b_in").fields[0].shape == (64, 128)
        ops = [e for st in ir.walk(k.all_statements()) for e in dataflow.stmt_exprs(st)]
        rid = [e for e in ops if isinstance(e, ir.Call) and e.op is ir.TileOp.REPLICA_ID]
        assert rid and ir.BinOp("%", ir.Call(ir.TileOp.PROGRAM_ID, (ir.Const(0),)), ir.Const(n)) not in ops
    lw = gemm_cluster_2wg.lower("nvidia", GEMM)
    d = C.decide(gemm_cluster_2wg, GEMM)
    rows = {(r.obj, r.what): r for r in d.rows(lw.kernel, lw.placement.target)}
    assert rows[("b_in", "multicast b")].resource == "TMA multicast to the 2 CTAs (lead CTA issues)"
    assert lw.allocation.mbarrier("b_in", "empty").arrive_count == 2      # x 2 CTAs on the lead
    assert rows[("b_in", "multicast empty barriers")].resource == \
        "mbarrier[4] on the lead CTA, count 4 (2 per CTA, 1 per consumer replica)"


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=64, BN=64, BK=64, STAGES=2, CLUSTER=2))
def cluster_b_per_replica(a, b, c, M, N, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                          STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    """Two copy replicas each fill their own multicast ring: more than one ring (rule 2)."""
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy", replicas=2)
    mma = xs.role("mma", kind="matrix", replicas=2)
    tiles = xs.pipe(load, mma, stages=STAGES,
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype, multicast=True))
    off_m = xs.cluster_id() * (2 * CLUSTER * BM) + xs.cluster_rank() * BM
    with load:
        s = tiles.acquire()
        s.a = xs.load(a, [off_m + xs.replica_id() * (CLUSTER * BM), 0], [BM, BK])
        s.b = xs.load(b, [0, 0], [BK, BN])
        tiles.commit()
    with mma:
        t = tiles.wait()
        acc = xs.mma(t.a, t.b, xs.zeros([BM, BN], xs.float32))
        acc = xs.mma_wait(acc, pending=0)
        tiles.release()
        xs.store(c, [off_m + xs.replica_id() * (CLUSTER * BM), 0], acc)


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=64, BN=64, BK=64, STAGES=2, CLUSTER=2))
def cluster_offset_reads_rank_twice(a, b, c, M, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                                    STAGES: xs.constexpr, CLUSTER: xs.constexpr):
    """A row offset ``v + t`` whose ``t`` reads ``v`` again: not the same in every program, so
    not one block over the CTAs (rule 5: no per-rank row offset)."""
    xs.cluster(CLUSTER)
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES,
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype, multicast=True))
    off_m = xs.cluster_id() * (2 * CLUSTER * BM) + xs.cluster_rank() * BM
    with load:
        s = tiles.acquire()
        s.a = xs.load(a, [off_m + off_m // 2, 0], [BM, BK])
        s.b = xs.load(b, [0, 0], [BK, BN])
        tiles.commit()
    with mma:
        t = tiles.wait()
        acc = xs.mma(t.a, t.b, xs.zeros([BM, BN], xs.float32))
        acc = xs.mma_wait(acc, pending=0)
        tiles.release()
        xs.store(c, [off_m, 0], acc)


def test_four_ctas():
    d = C.decide(gemm_cluster, dict(GEMM, CLUSTER=4))
    assert d.split.ctas == 4 and d.split.bases(2, True) == [[1, 0], [2, 0]]


@pytest.mark.parametrize("kernel, cx, rule", [
    (gemm_cluster, GEMM, None),
    (C.rank_rows, dict(BLOCK=64, STAGES=2, CLUSTER=2), "rule 3: line"),
    (cluster_b_in_registers, dict(BM=64, BN=64, BK=64, STAGES=2, CLUSTER=2), "rule 5: line"),
    (gemm_cluster_2wg, GEMM, None),
    (cluster_b_per_replica, dict(BM=64, BN=64, BK=64, STAGES=2, CLUSTER=2), "rule 2: multicast pipe 'tiles'"),
    (cluster_offset_reads_rank_twice, dict(BM=64, BN=64, BK=64, STAGES=2, CLUSTER=2),
     "rule 5: line"),
])
def test_rules(kernel, cx, rule):
    if rule is None:
        assert C.decide(kernel, cx).split is not None
        d = C.decide(kernel, cx, gluon=False)
        assert d.split is None and d.why.startswith("rule 1:")
        return
    d = C.decide(kernel, cx)
    assert d.split is None and d.why.startswith(rule), d.why


def test_no_cluster_no_decision():
    from xsync.kernels.gemm import gemm
    assert C.decide(gemm, None) is None


def test_table_rows():
    d = C.decide(gemm_cluster, GEMM)
    lw = gemm_cluster.lower("nvidia", GEMM)
    rows = {(r.obj, r.what): r for r in d.rows(lw.kernel, lw.placement.target)}
    assert rows[("tiles", "multicast b")].resource == "TMA multicast to the 2 CTAs (lead CTA issues)"
    assert "count 2 (1 per CTA)" in rows[("tiles", "multicast empty barriers")].resource
    off = C.decide(gemm_cluster, GEMM, gluon=False).rows(lw.kernel, lw.placement.target)
    assert [r.resource for r in off] == ["each program loads its own copy"]
    assert rows[("cluster", "Gluon program")].resource == "one program over the 2 CTAs (num_ctas=2)"


@pytest.mark.parametrize("cluster", [2, 4])
@pytest.mark.parametrize("kernel, rows", [(gemm_cluster, 1), (gemm_cluster_2wg, 2)], ids=["1wg", "2wg"])
def test_the_cluster_program_computes_what_the_cluster_computed(cluster, kernel, rows):
    """The rewrite's meaning, without a GPU: the cluster's program (tiles n times taller, the rank
    offset gone; with two replicas, each replica's band of the n programs' rows one block), run as
    an ordinary kernel on the CPU emulator with one program per cluster, gives the GEMM that the
    cluster's programs give; the verifier proves its protocol as one program."""
    import torch

    cx = dict(BM=16, BN=16, BK=16, STAGES=2, CLUSTER=cluster)
    compiled = C.cluster_program(kernel, cx, dict(a=xs.float32, b=xs.float32, c=xs.float32))

    torch.manual_seed(0)
    M, N, K = 2 * rows * cluster * 16, 3 * 16, 4 * 16
    a, b = torch.randn(M, K), torch.randn(K, N)
    want = a @ b
    c_cluster, c_one = torch.zeros(M, N), torch.zeros(M, N)
    kernel[(2 * cluster,)](a, b, c_cluster, M, N, K, **cx, backend="cpu")         # 2 clusters' programs
    compiled.launch((2,), dict(a=a, b=b, c=c_one, M=M, N=N, K=K))                  # 2 cluster programs
    torch.testing.assert_close(c_cluster, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(c_one, c_cluster, rtol=0, atol=0)
