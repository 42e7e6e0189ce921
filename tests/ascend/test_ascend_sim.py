"""The generated Ascend code executed on the CPU (XSYNC_BACKEND=ascend-sim): the triton-ascend
module xsync emits, split per core as the HIVM compiler splits it, one cube and two vector
threads per AI core under triton-ascend's interpreter, flags as receiver counters. Numerics
against float64 torch for every kernel; planted protocol faults in the generated code end in
a named report within seconds."""
import dataclasses
import math
import re
import time

import pytest
import torch

import xsync
from xsync.backends.ascend.simulator import simulate
from xsync.errors import BackendError, SimulationError, StallError
from xsync.kernels.flash_attn import attention, attention_varlen, ops
from xsync.kernels.gemm import gemm, gemm_persistent, gemm_persistent_2wg
from xsync.kernels.gemm_softmax import gemm_softmax

pytestmark = pytest.mark.usefixtures("triton_ascend")


@pytest.fixture(autouse=True)
def on_simulator(monkeypatch):
    monkeypatch.setenv("XSYNC_BACKEND", "ascend-sim")


def cdiv(a, b):
    return -(-a // b)


def reference(q, k, v, causal, scale=None):
    """float64 attention with a bottom-right causal mask (flash-attn's convention), and LSE."""
    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    k = k.double().repeat_interleave(hq // hk, 1)
    v = v.double().repeat_interleave(hq // hk, 1)
    s = q.double() @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(d))
    if causal:
        keep = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1).nan_to_num(0.0) @ v, lse


@pytest.mark.parametrize("M,N,K", [(256, 256, 256), (200, 136, 72), (130, 257, 96)])
def test_gemm(M, N, K):
    torch.manual_seed(0)
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = torch.full((M, N), float("nan"))
    gemm[(cdiv(M, 128), cdiv(N, 128))](a, b, c, M, N, K, BM=128, BN=128, BK=64, STAGES=3)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-4, atol=1e-4)


def test_persistent_gemm():
    """The persistent GEMM on the simulated cube: 3 programs for 6 output tiles."""
    torch.manual_seed(0)
    M, N, K = 200, 300, 96
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = torch.full((M, N), float("nan"))
    gemm_persistent[(3,)](a, b, c, M, N, K, BM=128, BN=128, BK=64, STAGES=2)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-4, atol=1e-4)
    c = torch.full((M, N), float("nan"))
    gemm_persistent_2wg[(2,)](a, b, c, M, N, K, BM=64, BN=128, BK=64, STAGES=2)   # 2 x 64 rows
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-4, atol=1e-4)


def test_gemm_softmax():
    torch.manual_seed(0)
    M, N, K, BM, BN, TILES = 128, 256, 192, 64, 64, 2
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    out = torch.full((M, N), float("nan"))
    gemm_softmax[(M // BM, N // (BN * TILES))](a, b, out, M, N, K, BM=BM, BN=BN, BK=64, STAGES=2,
                                                TILES=TILES)
    ref = (a.double() @ b.double()).view(M, -1, BN).softmax(-1).view(M, N)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_dense(d, causal):
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 2, 200, d).bfloat16() for _ in range(3))
    o, lse = attention(q, k, v, causal=causal)
    ref, ref_lse = reference(q, k, v, causal)
    torch.testing.assert_close(o.double(), ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_d128_several_512_key_steps(causal):
    """d128 runs 128 rows x 512 keys a step in four sub-tile replicas (schedule.py,
    passes/subtile_replicas.py): three steps, the last one partial, a partial row tile, and
    causal rows whose diagonal falls inside a 512-key block, against float64."""
    torch.manual_seed(6)
    q = torch.randn(1, 1, 130, 128).bfloat16()
    k, v = (torch.randn(1, 1, 1100, 128).bfloat16() for _ in range(2))
    assert ops.block_sizes("ascend", 128, causal)["BN"] == 512
    o, lse = attention(q, k, v, causal=causal)
    ref, ref_lse = reference(q, k, v, causal)
    torch.testing.assert_close(o.double(), ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("hk", [2, 1], ids=["gqa-4:2", "mqa-4:1"])
def test_attention_grouped_heads(hk):
    torch.manual_seed(2)
    q = torch.randn(1, 4, 150, 64, dtype=torch.float16)
    k, v = (torch.randn(1, hk, 150, 64, dtype=torch.float16) for _ in range(2))
    o, _ = attention(q, k, v, causal=True)
    ref, _ = reference(q, k, v, True)
    torch.testing.assert_close(o.double(), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("sq,sk", [(1, 1), (17, 17), (129, 257), (257, 100)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_odd_lengths(sq, sk, causal):
    torch.manual_seed(3)
    q = torch.randn(1, 2, sq, 64).bfloat16()
    k, v = (torch.randn(1, 2, sk, 64).bfloat16() for _ in range(2))
    o, lse = attention(q, k, v, causal=causal)
    ref, ref_lse = reference(q, k, v, causal)
    torch.testing.assert_close(o.double(), ref, rtol=1e-2, atol=1e-2)
    seen = torch.isfinite(ref_lse)          # causal rows that see no key are defined separately
    torch.testing.assert_close(lse.double()[seen], ref_lse[seen], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("d", [96, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_padded_and_wide_head_dims(d, causal):
    """d96 (128-wide tiles, zero columns past the head) and d256 (BN = 64: schedule.py), GQA 2:1."""
    torch.manual_seed(5)
    q = torch.randn(1, 2, 70, d).bfloat16()
    k, v = (torch.randn(1, 1, 90, d).bfloat16() for _ in range(2))
    o, lse = attention(q, k, v, causal=causal)
    ref, ref_lse = reference(q, k, v, causal)
    torch.testing.assert_close(o.double(), ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_varlen(causal):
    torch.manual_seed(4)
    lens = [1, 17, 133, 64, 200]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    total, h, d = int(cu[-1]), 2, 128
    q, k, v = (torch.randn(total, h, d).bfloat16() for _ in range(3))
    o, lse = attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
    for i, n in enumerate(lens):
        s, e = int(cu[i]), int(cu[i + 1])
        ref, ref_lse = reference(q[s:e].transpose(0, 1)[None], k[s:e].transpose(0, 1)[None],
                                 v[s:e].transpose(0, 1)[None], causal)
        torch.testing.assert_close(o[s:e].transpose(0, 1)[None].double(), ref, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(lse[:, s:e][None].double(), ref_lse, rtol=1e-3, atol=1e-3)


def test_scope_form_runs_one_replica_per_vector_core(monkeypatch):
    """The triton-ascend 3.2.1+ form (al.scope, sub_vec_id, named pipes): generated here,
    not compilable with 3.2.0, but its protocol and numerics run in the simulator."""
    monkeypatch.setenv("XSYNC_ASCEND_FORM", "scope")
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 2, 300, 64).bfloat16() for _ in range(3))
    o, _ = attention(q, k, v, causal=True)
    ref, _ = reference(q, k, v, True)
    torch.testing.assert_close(o.double(), ref, rtol=1e-2, atol=1e-2)
    M, N, K, BM, BN = 128, 256, 128, 64, 64
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    out = torch.zeros(M, N)
    gemm_softmax[(M // BM, N // (BN * 2))](a, b, out, M, N, K, BM=BM, BN=BN, BK=64, STAGES=2, TILES=2)
    torch.testing.assert_close(out.double(), (a.double() @ b.double()).view(M, -1, BN).softmax(-1).view(M, N),
                               rtol=1e-4, atol=1e-5)
    assert "al.sub_vec_id()" in gemm_softmax.compile("ascend-sim").source


@pytest.mark.parametrize("form", ["release", "scope"])
def test_ping_pong_n_to_n_rings(form, monkeypatch):
    """Two cube replicas (lockstep on the one cube) feed two vector replicas through one GM
    ring per replica pair, and the vector -> cube event needs both vector cores' sets."""
    import ascend_cases as cases
    monkeypatch.setenv("XSYNC_ASCEND_FORM", form)
    torch.manual_seed(6)
    BM, BN, BK, TILES, K = 16, 16, 16, 4, 48
    a, b = torch.randn(TILES * BM, K).bfloat16(), torch.randn(K, BN).bfloat16()
    out = torch.zeros(TILES * BM, BN)
    cases.ping_pong[(1,)](a, b, out, K, BM=BM, BN=BN, BK=BK, TILES=TILES)
    ref = ((a.double() @ b.double()) * math.log(2)).softmax(-1)       # the kernel uses exp2
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- planted faults
TILES = 2


def kernel_line(kernel, text):
    import inspect
    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, ln in enumerate(lines) if text in ln)


def planted(edit, tiles=TILES):
    """gemm_softmax's generated Ascend module with ``edit`` applied, simulated; returns the
    error and the seconds it took to appear."""
    cx = dict(BM=64, BN=64, BK=64, STAGES=2, TILES=tiles)
    compiled = gemm_softmax.compile("ascend-sim", cx)
    ids = dict(compiled.allocation.event_ids)
    text = edit(compiled.source, ids)
    assert text != compiled.source, "the edit did not apply"
    M, K = 128, 128
    N = 2 * tiles * 64
    args = dict(a=torch.randn(M, K).bfloat16(), b=torch.randn(K, N).bfloat16(),
                out=torch.zeros(M, N), M=M, N=N, K=K)
    start = time.monotonic()
    with pytest.raises(xsync.XSyncError) as err:
        simulate(compiled, (M // 64, 2), args, dataclasses.replace(compiled.module, source=text))
    return err.value, time.monotonic() - start, ids


def test_planted_wrong_flag_id_is_a_named_stall():
    def edit(src, ids):
        full = ids["scores:full"]
        return src.replace(f'tl.sync_block_wait("cube", "vector", {full})', 'tl.sync_block_wait("cube", "vector", 3)')
    err, seconds, ids = planted(edit)
    assert isinstance(err, StallError) and seconds < 10
    msg = str(err)
    assert "flag 3 (not in xsync's allocation)" in msg and "vector 0 of AI core" in msg
    assert f"gemm_softmax.py:{kernel_line(gemm_softmax, 'scores.wait()')}" in msg
    assert "(iteration t=0)" in msg
    assert f"flag {ids['scores:empty']} (pipe 'scores' EMPTY)" in msg     # the cube, waiting back


def test_planted_missing_set_is_a_named_stall():
    def edit(src, ids):
        return re.sub(rf'\n *tl\.sync_block_set\("cube", "vector", {ids["scores:full"]}\)[^\n]*', "", src)
    err, seconds, ids = planted(edit)
    assert isinstance(err, StallError) and seconds < 10
    assert f"sync_block_wait on flag {ids['scores:full']} (pipe 'scores' FULL): vector 0 has 0" in str(err)


def test_planted_sixteenth_pending_set_is_a_flag_overflow():
    """Without its EMPTY wait the cube never consumes the vector cores' releases (only its
    final drain takes two): the 16th pending set on the EMPTY flag is reported."""
    def edit(src, ids):
        return re.sub(rf'tl\.sync_block_wait\("vector", "cube", {ids["scores:empty"]}\)  # scores EMPTY: a free slot[^\n]*',
                      "pass", src)
    err, seconds, ids = planted(edit, tiles=20)
    assert isinstance(err, SimulationError) and seconds < 10
    msg = str(err)
    assert msg.startswith("flag overflow") and f"flag {ids['scores:empty']} (pipe 'scores' EMPTY)" in msg
    assert "15 sets are already pending" in msg and re.search(r"\(iteration t=1[5-7]\)", msg)


def test_planted_missing_drain_leaves_flags_pending():
    def edit(src, ids):
        return re.sub(r'( *)tl\.sync_block_wait\("vector", "cube", \d+\)  # scores EMPTY: drain[^\n]*', r"\1pass", src)
    err, seconds, ids = planted(edit)
    assert isinstance(err, SimulationError) and seconds < 10
    assert "flags pending" in str(err) and f"flag {ids['scores:empty']}" in str(err)


def test_ascend_without_npu_points_at_the_simulator(monkeypatch):
    from xsync.backends import select
    monkeypatch.setenv("XSYNC_BACKEND", "ascend")
    with pytest.raises(BackendError) as err:
        select()
    assert "XSYNC_BACKEND=ascend-sim" in err.value.fix


def test_compiling_still_works_after_a_simulation():
    """The interpreter patches triton.language while it runs; the simulator restores it."""
    from xsync.backends.ascend import compile_hivm
    q, k, v = (torch.randn(1, 1, 64, 64).bfloat16() for _ in range(3))
    attention(q, k, v)
    ttir, _ = compile_hivm(gemm_softmax.lower("ascend"), form="release")
    assert "tt.dot" in ttir


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_rotated_round_trip_numerics(n):
    """The cross-agent pipeline's output (prologue, the next product issued ahead) computes
    what the source says, for every trip count including 0 and 1."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "core"))
    import pass_kernels as pk
    assert "applied" in pk.round_trip.lower("ascend").passes.text()
    torch.manual_seed(7)
    BM = BN = 16
    a = (torch.randn(max(n, 1) * BM, BN) * 0.25).bfloat16()
    b = (torch.randn(BN, BN) * 0.25).bfloat16()
    out = torch.zeros(max(n, 1) * BM, BN)
    pk.round_trip[(1,)](a, b, out, n, BM=BM, BN=BN)
    bt = b.double()
    y = torch.exp2(a.double() @ bt).bfloat16().double()
    ref = y @ bt
    # the reference rounds y to bf16 as the cores do (to nearest even): only fp32 sums differ
    torch.testing.assert_close(out[:n * BM].double(), ref[:n * BM], rtol=1e-5, atol=1e-5)
