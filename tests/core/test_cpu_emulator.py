"""The CPU emulator runs the portable kernels with exact sync semantics and matches torch."""
import os
import time

import pytest
import torch

import xsync as xs
from xsync.kernels.gemm import gemm
from xsync.kernels.gemm_softmax import gemm_softmax
from tests.core import broken_kernels as bk


def cdiv(a, b):
    return -(-a // b)


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemm_matches_torch(stages, dtype):
    torch.manual_seed(stages)
    M, N, K = 75, 49, 130          # partial tiles on every edge
    a, b = torch.randn(M, K).to(dtype), torch.randn(K, N).to(dtype)
    c = torch.zeros(M, N)
    BM, BN, BK = 32, 32, 16
    gemm[(cdiv(M, BM), cdiv(N, BN))](a, b, c, M, N, K, BM=BM, BN=BN, BK=BK, STAGES=stages,
                                     backend="cpu")
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stages", [1, 2, 3])
def test_gemm_softmax_two_replicas_matches_torch(stages):
    torch.manual_seed(0)
    M, N, K, BM, BN, TILES = 40, 150, 64, 16, 32, 3
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    out = torch.zeros(M, N)
    gemm_softmax[(cdiv(M, BM), cdiv(N, BN * TILES))](
        a, b, out, M, N, K, BM=BM, BN=BN, BK=32, STAGES=stages, TILES=TILES, backend="cpu")
    ref = torch.cat([torch.softmax(blk, 1) for blk in (a.float() @ b.float()).split(BN, 1)], 1)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_stall_watchdog_names_roles_instead_of_hanging(monkeypatch):
    monkeypatch.setenv("XSYNC_VERIFY", "0")
    x, y = torch.randn(64, 16), torch.zeros(64, 16)
    start = time.monotonic()
    with pytest.raises(xs.StallError) as info:
        bk.missing_release[(1,)](x, y, 4, BLOCK=16, STAGES=1, backend="cpu")
    assert time.monotonic() - start < 5
    msg = str(info.value)
    assert "stalled" in msg
    assert "load" in msg and "acquire on pipe 'ring'" in msg
    assert "work" in msg and "wait on pipe 'ring'" in msg
    assert "(i=" in msg                      # the loop iteration of each stuck agent
    assert "broken_kernels.py:" in msg


def test_stall_watchdog_three_way_cycle(monkeypatch):
    monkeypatch.setenv("XSYNC_VERIFY", "0")
    x = torch.zeros(16, 16)
    with pytest.raises(xs.StallError) as info:
        bk.three_way_cycle[(2,)](x, x, 1, BLOCK=16, STAGES=1, backend="cpu")
    for role in ("a", "b", "c"):
        assert f"\n  {role} " in str(info.value)


def test_verifier_runs_on_every_compile_unless_disabled(monkeypatch):
    x, y = torch.randn(64, 16), torch.zeros(64, 16)
    with pytest.raises(xs.DeadlockError):
        bk.missing_release[(1,)](x, y, 4, BLOCK=16, STAGES=1, backend="cpu")


def test_agent_failure_is_reported_and_others_stop(monkeypatch):
    # A load that fails inside the 'load' agent (every bad argument is refused before launch, so
    # the failure is injected): the launcher re-raises that error promptly instead of leaving the
    # other agents waiting forever.
    from xsync.backends.cpu import runtime

    def broken_load(*args, **kwargs):
        raise RuntimeError("injected load failure")
    monkeypatch.setattr(runtime, "load", broken_load)
    a = torch.randn(8, 8).bfloat16()
    start = time.monotonic()
    with pytest.raises(xs.LaunchError, match="injected load failure") as info:
        gemm[(1, 1)](a, a, torch.zeros(8, 8), 8, 8, 8, BM=16, BN=16, BK=16, STAGES=1, backend="cpu")
    assert time.monotonic() - start < 5
    assert "raised RuntimeError in role 'load'" in str(info.value) and info.value.loc.line
    assert isinstance(info.value.__cause__, RuntimeError)


def test_float_loop_bound_is_refused_at_launch():
    # (it used to break range() inside the agents)
    a = torch.randn(8, 8).bfloat16()
    with pytest.raises(xs.LaunchError, match="scalar `K` is 8.5"):
        gemm[(1, 1)](a, a, torch.zeros(8, 8), 8, 8, 8.5, BM=16, BN=16, BK=16, STAGES=1,
                     backend="cpu")


def test_launch_rejects_a_tensor_of_another_rank():
    a = torch.randn(8, 8).bfloat16()
    with pytest.raises(xs.LaunchError, match=r"has 1 dimension\(s\).*as a 2-D tensor"):
        gemm[(1, 1)](a.view(-1), a, torch.zeros(8, 8), 8, 8, 8, BM=16, BN=16, BK=16, STAGES=1,
                     backend="cpu")


def test_dump_writes_source_and_allocation(tmp_path, monkeypatch):
    monkeypatch.setenv("XSYNC_DUMP", str(tmp_path))
    M = N = K = 32
    a, b, c = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16(), torch.zeros(M, N)
    gemm[(1, 1)](a, b, c, M, N, K, BM=32, BN=32, BK=16, STAGES=2, backend="cpu")
    (src_path,) = tmp_path.glob("gemm.cpu*.py")       # named by specialization
    src = src_path.read_text()
    assert "def agent_load(ag" in src and "ag.acquire('tiles'" in src
    table = src_path.with_name(src_path.name[:-3] + ".alloc.txt").read_text()
    assert "tiles" in table and "verified for cpu" in table
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_cooperative_scheduler_matches_torch():
    """XSYNC_CPU_MODE=cooperative runs the same agent code as generators in one thread."""
    torch.manual_seed(3)
    M, N, K = 75, 49, 130
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = torch.zeros(M, N)
    with xs.options(cpu_mode="cooperative"):
        compiled = gemm[(cdiv(M, 32), cdiv(N, 32))](a, b, c, M, N, K, BM=32, BN=32, BK=16, STAGES=2,
                                                  backend="cpu")
    assert compiled.mode == "cooperative" and "yield from ag.acquire('tiles'" in compiled.source
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-4, atol=1e-4)
    from xsync.kernels.flash_attn import attention
    q, k, v = (torch.randn(1, 2, 40, 64).bfloat16() for _ in range(3))
    with xs.options(cpu_mode="cooperative"):
        o, _ = attention(q, k, v, True, 0.125)
    s = (q.double() @ k.double().transpose(-1, -2)) * 0.125
    s = s.masked_fill(torch.arange(40)[None, :] > torch.arange(40)[:, None], float("-inf"))
    torch.testing.assert_close(o.double(), torch.softmax(s, -1) @ v.double(), rtol=2e-2, atol=2e-2)


def test_cooperative_scheduler_reports_stalls(monkeypatch):
    monkeypatch.setenv("XSYNC_VERIFY", "0")
    x, y = torch.randn(64, 16), torch.zeros(64, 16)
    with xs.options(cpu_mode="cooperative"):
        with pytest.raises(xs.StallError) as info:
            bk.missing_release[(1,)](x, y, 4, BLOCK=16, STAGES=1, backend="cpu")
    msg = str(info.value)
    assert "load" in msg and "acquire on pipe 'ring'" in msg and "(i=" in msg and "with n = 4" in msg


def test_emulator_reports_leftovers_with_role_object_line_and_iteration(monkeypatch):
    monkeypatch.setenv("XSYNC_VERIFY", "0")
    x, y = torch.randn(64, 16), torch.zeros(64, 16)
    with pytest.raises(xs.LeftoverError) as info:
        bk.loop_count_mismatch[(1,)](x, y, 3, BLOCK=16, STAGES=1, backend="cpu")
    err = info.value
    msg = str(err)
    assert err.loc.file.endswith("broken_kernels.py")
    assert "pipe 'ring': slot 2 committed by load was never waited by work" in msg
    assert "(i=2)" in msg and "ring" in err.objects
    with pytest.raises(xs.LeftoverError, match="event 'done': signal 2 of load was never waited"):
        bk.signal_never_waited[(1,)](x, y, 1, BLOCK=16, STAGES=1, backend="cpu")


# ---------------------------------------------------------------- clusters (issue 39)
@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16, STAGES=2))
def _cluster_gather(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # a multicast N -> 1 pipe: each program's two load replicas fill a ring each; the sum of a
    # program waits for every replica of every program; program 1 skips a release at i == 2
    xs.cluster(2)
    load = xs.role("load", kind="copy", replicas=2)
    red = xs.role("sum", kind="vector")
    ring = xs.pipe(load, red, stages=STAGES, s=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))
    for i in range(n):
        with load:
            o = ring.acquire()
            o.s = xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with red:
            got = ring.wait()
            xs.store(y, [(xs.program_id(0) * n + i) * BLOCK, 0], got[0].s + got[1].s)
            if xs.cluster_rank() == 0 or i != 2:
                ring.release()


@pytest.mark.parametrize("mode", ["threads", "cooperative"])
def test_cluster_gather_pipe_runs_per_program_rings(mode):
    """A multicast gather pipe on the emulator: every program reads its own rings (the same
    tile from each replica), and a release one program skips is reported for that program
    where the verifier reports it."""
    with pytest.raises(xs.LeftoverError, match=r"waited by sum \(program 1 of the cluster\) never released"):
        _cluster_gather.lower("cpu")
    x = torch.randn(16 * 16, 16)
    for n in (0, 1, 2):
        y = torch.zeros(4 * 2 * 16 + 16, 16)
        with xs.options(verify=False, cpu_mode=mode):
            _cluster_gather[(4,)](x, y, n, BLOCK=16, STAGES=2, backend="cpu")
        for p in range(4):
            for i in range(n):
                assert torch.equal(y[(p * n + i) * 16:(p * n + i + 1) * 16], 2 * x[i * 16:(i + 1) * 16])
    with xs.options(verify=False, cpu_mode=mode):
        with pytest.raises(xs.LeftoverError, match=r"waited by sum \(program 1 of the cluster\) was never released"):
            _cluster_gather[(2,)](x, torch.zeros(16 * 16, 16), 3, BLOCK=16, STAGES=2, backend="cpu")
