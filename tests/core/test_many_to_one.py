"""N -> 1 pipes (a gather: each replica of the producer role commits into its own ring; one wait
of the one consumer takes slot k of every ring, ``slot[r].field`` reading replica r's; one
release frees them all). The CPU emulator against torch (split-K inside a program, row sums),
the skeleton the backends read, and what check refuses, naming the line (the verifier's broken
cases are in tests/core/corpus.py, ``pairing_gather_pipe*``)."""
import pytest
import torch

import xsync as xs
from tests.core.many_to_one_kernels import (copy_gather_into_mma, gemm_split_k_gather, pair_sum_gather,
                                             row_sum_gather, scaled_mma_gather)
from tests.core.test_verifier import bug_line
from xsync.errors import KernelSourceError

EX = dict(x=xs.float32, y=xs.float32, BLOCK=16)


@pytest.mark.parametrize("mode", ["threads", "cooperative"])
@pytest.mark.parametrize("M,N,K", [(130, 70, 200), (64, 64, 64), (33, 17, 40)])
def test_split_k_gather_matches_torch(mode, M, N, K):
    torch.manual_seed(0)
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = torch.full((M, N), 5.0)
    with xs.options(cpu_mode=mode):
        gemm_split_k_gather[(-(-M // 32), -(-N // 32))](a, b, c, M, N, K, BM=32, BN=32, BK=16, STAGES=2,
                                                        backend="cpu")
    torch.testing.assert_close(c, a.double().mm(b.double()).float(), atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("mode", ["threads", "cooperative"])
def test_row_sum_gather_matches_torch(mode):
    torch.manual_seed(1)
    x = torch.randn(45, 150)
    out = torch.zeros(45)
    with xs.options(cpu_mode=mode):
        row_sum_gather[(3,)](x, out, 45, 150, BM=16, BN=32, backend="cpu")
    torch.testing.assert_close(out, x.double().sum(1).float(), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("mode", ["threads", "cooperative"])
def test_vector_replicas_into_a_matrix_role_match_torch(mode):
    torch.manual_seed(2)
    M, N, K = 70, 50, 150
    x, w = torch.randn(M, K), torch.randn(K, N).bfloat16()
    y = torch.zeros(M, N)
    with xs.options(cpu_mode=mode):
        scaled_mma_gather[(3, 2)](x, w, y, M, N, K, BM=32, BN=32, BK=32, backend="cpu")
    torch.testing.assert_close(y, (x * 0.5).bfloat16().double().mm(w.double()).float(), atol=1e-3, rtol=1e-3)


def pair_sum_reference(x):
    M, N = x.shape
    return x.float().view(M, N // 128, 2, 64).sum(2).reshape(M, N // 2)


@pytest.mark.parametrize("mode", ["threads", "cooperative"])
def test_copy_replicas_into_a_vector_role_match_torch(mode):
    torch.manual_seed(3)
    x = torch.randn(100, 384).half()
    y = torch.zeros(100, 192)
    with xs.options(cpu_mode=mode):
        pair_sum_gather[(2,)](x, y, 100, 384, BM=64, BN=64, backend="cpu")
    torch.testing.assert_close(y, pair_sum_reference(x))


def test_copy_replicas_into_a_matrix_role_match_torch():
    torch.manual_seed(0)
    M, N, K = 70, 50, 150
    a, b, c = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16(), torch.zeros(M, N)
    copy_gather_into_mma[(3, 2)](a, b, c, M, N, K, BM=32, BN=32, BK=32, backend="cpu")
    torch.testing.assert_close(c, a.double().mm(b.double()).float(), atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("backend", ["cpu", "nvidia", "ascend"])
def test_skeleton_has_a_ring_per_producer_replica(backend):
    skel = gemm_split_k_gather.lower(backend).skeleton
    link = skel.link("part")
    assert link.pairing == "N -> 1 gather" and link.gather_pipe and not link.paired
    assert link.rings == 2 and len(link.channels) == 1
    (ch,) = link.channels
    assert [e.replica for e in ch.producers] == [0, 1] and [e.role for e in ch.consumers] == ["epilogue"]
    assert [link.ring_of(e) for e in ch.producers] == [0, 1]
    assert skel.link("tiles").paired


# ---------------------------------------------------------------- refused at check
@xs.kernel(example=EX)
def gather_read_without_replica(x, y, n, BLOCK: xs.constexpr):
    mma = xs.role("mma", kind="matrix", replicas=2)
    red = xs.role("sum", kind="vector")
    ring = xs.pipe(mma, red, stages=1, s=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with mma:
            o = ring.acquire()
            o.s = xs.mma(xs.load(x, [0, 0], [BLOCK, BLOCK]), xs.load(x, [0, 0], [BLOCK, BLOCK]))
            ring.commit()
        with red:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.s)  # BUG
            ring.release()


@xs.kernel(example=EX)
def gather_replica_out_of_range(x, y, n, BLOCK: xs.constexpr):
    mma = xs.role("mma", kind="matrix", replicas=2)
    red = xs.role("sum", kind="vector")
    ring = xs.pipe(mma, red, stages=1, s=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with mma:
            o = ring.acquire()
            o.s = xs.mma(xs.load(x, [0, 0], [BLOCK, BLOCK]), xs.load(x, [0, 0], [BLOCK, BLOCK]))
            ring.commit()
        with red:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got[0].s + got[2].s)  # BUG
            ring.release()


@xs.kernel(example=EX)
def replica_index_on_a_one_to_one_pipe(x, y, n, BLOCK: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=1, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got[0].t)  # BUG
            ring.release()


@xs.kernel(example=EX)
def two_replicas_to_three(x, y, n, BLOCK: xs.constexpr):
    load = xs.role("load", kind="copy", replicas=2)
    work = xs.role("work", kind="vector", replicas=3)
    ring = xs.pipe(load, work, stages=1, t=xs.tile([BLOCK, BLOCK], xs.float32))  # BUG
    for i in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [i * BLOCK, 0], got.t)
            ring.release()


@pytest.mark.parametrize("kernel,words,fix", [
    (gather_read_without_replica, "gathers 2 replicas of 'mma' into one", "got[0].s ... got[1].s"),
    (gather_replica_out_of_range, "names replica 2 of 'mma', which has 2", "from 0 to 1"),
    (replica_index_on_a_one_to_one_pipe, "indexes a slot of pipe 'ring' by replica", "read got.t"),
    (two_replicas_to_three, "runs from 2 replicas of 'load' to 3 of 'work'", "N -> 1 (gather"),
])
def test_misuse_is_refused_at_check(kernel, words, fix):
    with pytest.raises(KernelSourceError) as info:
        kernel.lower("cpu")
    err = info.value
    assert words in str(err) and fix in err.fix
    assert err.loc.line == bug_line(kernel)


def test_differential_with_gather_pipes():
    """Random protocols with N -> 1 pipes (tests/core/protogen.py, ``gather=True``): the
    verifier's verdict agrees with the CPU emulator at every trip count, and the nvidia and
    ascend verdicts with the CPU one unless the placement changes the protocol."""
    from tests.core import protogen

    seeds = [s for s in range(0, 200) if _has_gather(protogen.generate(s, gather=True).source)][:30]
    assert len(seeds) >= 20
    bad = [o for o in protogen.run(seeds, gather=True) if o.disagreement]
    assert not bad, bad[0]


def _has_gather(src: str) -> bool:
    import re
    reps = dict(re.findall(r'(\w+) = xs\.role\("\w+", kind="\w+", replicas=(\d)\)', src))
    return any(reps[s] == "2" and reps[d] == "1" for s, d in re.findall(r"xs\.pipe\((\w+), (\w+)", src))
