"""GPU tests: numerics vs torch, partial tiles, hang debug mode. Skip without a Hopper GPU."""
import json
import math
import os
import subprocess
import sys

import pytest

from tests.nvidia.conftest import ROOT, gpu_reason

REASON = gpu_reason()
pytestmark = pytest.mark.skipif(bool(REASON), reason=f"needs a Hopper GPU: {REASON}")


def cdiv(a, b):
    return -(-a // b)


def padded(rows, cols, dtype, fill=None):
    """A [rows, cols] view of a larger tensor (non-trivial row stride, poisoned padding)."""
    import torch

    pad = 16
    big = torch.full((rows + 8, cols + pad), float("nan") if fill is None else fill,
                     device="cuda", dtype=dtype)
    return big, big[:rows, :cols]


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", [(256, 256, 256), (300, 200, 136), (513, 264, 200)])
def test_gemm_numerics(stages, shape):
    import torch

    from xsync.kernels.gemm import gemm

    M, N, K = shape
    torch.manual_seed(0)
    a_big, a = padded(M, K, torch.bfloat16, fill=1e4)  # padding must never be read (TMA bounds)
    b_big, b = padded(K, N, torch.bfloat16, fill=1e4)
    a.copy_(torch.randn(M, K))
    b.copy_(torch.randn(K, N))
    c_big, c = padded(M, N, torch.float32)
    gemm[(cdiv(M, 128), cdiv(N, 128))](a, b, c, M, N, K, BM=128, BN=128, BK=64, STAGES=stages,
                                        backend="nvidia")
    torch.cuda.synchronize()
    ref = a.float() @ b.float()
    torch.testing.assert_close(c, ref, atol=2e-2, rtol=1e-3)
    # out-of-bounds parts of the last tiles were dropped
    assert torch.isnan(c_big[M:, :]).all() and torch.isnan(c_big[:, N:]).all()


def softmax_blocks(x, n, block):
    import torch

    out = torch.empty_like(x)
    for j in range(0, n, block):
        out[:, j:j + block] = torch.softmax(x[:, j:min(j + block, n)], dim=1)
    return out


@pytest.mark.parametrize("shape", [(128, 256, 128), (130, 200, 136)])
def test_gemm_softmax_numerics(shape):
    import torch

    from xsync.kernels.gemm_softmax import gemm_softmax

    M, N, K = shape
    torch.manual_seed(1)
    a = (torch.randn(M, K, device="cuda") * 0.1).to(torch.bfloat16)
    b = (torch.randn(K, N, device="cuda") * 0.1).to(torch.bfloat16)
    out_big, out = padded(M, N, torch.float32)
    grid = (cdiv(M, 64), cdiv(N, 64 * 2))
    gemm_softmax[grid](a, b, out, M, N, K, BM=64, BN=64, BK=64, STAGES=2, TILES=2, backend="nvidia")
    torch.cuda.synchronize()
    ref = softmax_blocks(a.float() @ b.float(), N, 64)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-3)
    assert torch.isnan(out_big[M:, :]).all() and torch.isnan(out_big[:, N:]).all()


def test_handoff_arrive_sync_numerics():
    import torch

    from tests.nvidia.nv_kernels import handoff

    M, N, K = 128, 192, 128
    a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(K, N, device="cuda").to(torch.bfloat16)
    out = torch.zeros(M, N, device="cuda")
    handoff[(cdiv(M, 64), cdiv(N, 64))](a, b, out, M, N, K, BM=64, BN=64, BK=64, backend="nvidia")
    torch.cuda.synchronize()
    torch.testing.assert_close(out, 2 * (a.float() @ b.float()), atol=2e-2, rtol=1e-3)


def test_hang_debug_reports_stuck_role():
    env = dict(os.environ, PYTHONPATH=ROOT, XSYNC_HANG_TIMEOUT_MS="1000")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "nvidia", "hang_probe.py")],
                          capture_output=True, text=True, timeout=180, env=env)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("HANG_REPORT ")), None)
    assert line, f"no report; rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    report = json.loads(line[len("HANG_REPORT "):])
    print(report["message"])
    assert report["raised"] == "StallError", report
    msg = report["message"]
    assert "role 'mma'" in msg and "pipe 'tiles'" in msg and "extra = tiles.wait()" in msg, msg
    assert "iteration 3" in msg, msg          # K / BK = 3 slots were waited before the stuck one
    assert "role 'load'" not in msg, msg      # the producer finished
    assert report["seconds"] < 60, report


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(256, 256), (200, 333)])
def test_flash_attention_single_source(d, causal, sq, sk, monkeypatch):
    """kernels/flash_attn (the one source every backend compiles) on the Hopper lowering."""
    import math

    import torch

    from xsync.kernels.flash_attn.ops import attention_impl

    monkeypatch.setenv("XSYNC_BACKEND", "nvidia")
    torch.manual_seed(2)
    q = torch.randn(2, 4, sq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 4, sk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 4, sk, d, device="cuda", dtype=torch.bfloat16)
    o, lse = attention_impl(q, k, v, causal)
    torch.cuda.synchronize()
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(d)
    if causal:
        i = torch.arange(sq, device="cuda")[:, None]
        j = torch.arange(sk, device="cuda")[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    torch.testing.assert_close(o.float(), torch.softmax(s, -1) @ v.float(), atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("share", ["1/4", "1/2"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_with_exp2_on_the_fma_pipe(share, d, causal, monkeypatch):
    """A share of P's exponentials by a polynomial on the FMA pipe (XSYNC_NV_EXP2_FMA,
    xsync/backends/nvidia/exp2.py): O and the LSE as accurate as with MUFU alone, and a causal
    row that sees no key (more queries than keys) still gets O = 0 and LSE = +inf (its masked
    scores give exactly 0)."""
    import torch

    from xsync.kernels.flash_attn.ops import attention_impl

    monkeypatch.setenv("XSYNC_BACKEND", "nvidia")
    monkeypatch.setenv("XSYNC_NV_EXP2_FMA", share)
    torch.manual_seed(3)
    sq, sk = 1100, 900
    q = torch.randn(2, 4, sq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 4, sk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 4, sk, d, device="cuda", dtype=torch.bfloat16)
    o, lse = attention_impl(q, k, v, causal)
    torch.cuda.synchronize()
    ref_o, ref_lse = _reference(q, k, v, causal)
    torch.testing.assert_close(o.float(), ref_o, atol=3e-2, rtol=2e-2)
    finite = torch.isfinite(ref_lse)
    assert (lse.view_as(ref_lse)[~finite] == float("inf")).all()
    torch.testing.assert_close(lse.view_as(ref_lse)[finite], ref_lse[finite], atol=1e-3, rtol=1e-3)


def _check_varlen(q, k, v, cu_q, cu_k, o, lse, causal):
    """Each packed sequence against the float64 reference (a sequence without queries: nothing)."""
    import torch

    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    for b in range(len(bounds_q) - 1):
        qs, ks = slice(bounds_q[b], bounds_q[b + 1]), slice(bounds_k[b], bounds_k[b + 1])
        if qs.start == qs.stop:
            continue
        ref_o, ref_lse = _reference(q[qs].transpose(0, 1)[None], k[ks].transpose(0, 1)[None],
                                    v[ks].transpose(0, 1)[None], causal)
        torch_o = o[qs].transpose(0, 1)[None].float()
        assert (torch_o - ref_o).abs().max().item() < 3e-2 + 2e-2 * ref_o.abs().max().item(), (b, causal)
        got_lse = lse[:, qs][None]
        finite = torch.isfinite(ref_lse)
        assert (got_lse[~finite] == float("inf")).all(), (b, causal)
        if finite.any():
            err = (got_lse[finite] - ref_lse[finite]).abs().max().item()
            assert err < 1e-3 * (1 + ref_lse[finite].abs().max().item()), (b, causal, err)


def _packed(lens_q, lens_k, hq, hk, d):
    import torch

    cu = [torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
          for lens in (lens_q, lens_k)]
    q = torch.randn(sum(lens_q), hq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lens_k), hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return q, k, v, *cu


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("longest", [700, 2500, 9000])
def test_varlen_on_hopper(d, causal, longest, monkeypatch):
    """Packed sequences (empty ones, lengths around the tile sizes, q and k of other lengths,
    GQA) under the schedule the table picks for the longest: only the tiles that can hold rows
    are launched, longest first (tiles.packed_order)."""
    import torch

    from xsync.kernels.flash_attn import attention_varlen

    monkeypatch.setenv("XSYNC_BACKEND", "nvidia")
    torch.manual_seed(7)
    lens_q = [longest, 0, 1, 127, 128, 129, 300, 64, 191]
    lens_k = [longest, 5, 0, 127, 200, 129, 250, 64, 400]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 4, 2, d)
    o, lse = attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)
    torch.cuda.synchronize()
    _check_varlen(q, k, v, cu_q, cu_k, o, lse, causal)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_with_reads_ahead_on_hopper(d, causal, monkeypatch):
    """Packed sequences with the consumers' table reads issued tiles early: the device-made
    tile table and the sequence offsets it names, two reads deep (prefetch.py)."""
    import torch

    from xsync.kernels.flash_attn import attention_varlen

    monkeypatch.setenv("XSYNC_BACKEND", "nvidia")
    monkeypatch.setenv("XSYNC_NV_PREFETCH_TILE_SCALARS", "1")
    torch.manual_seed(9)
    lens_q = [2500, 0, 1, 127, 128, 129, 300, 64, 191, 1000]
    lens_k = [2500, 5, 0, 127, 200, 129, 250, 64, 400, 999]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 4, 2, d)
    o, lse = attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)
    torch.cuda.synchronize()
    _check_varlen(q, k, v, cu_q, cu_k, o, lse, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_cuda_graph_replays_with_new_lengths(causal, monkeypatch):
    """A captured varlen call, replayed after the lengths (same token count) and q/k/v changed
    in place, computes the new ones: the packed tile table (non-causal, persistent) is made on
    the device from cu_seqlens inside the graph; the causal launch walks every row block."""
    import torch

    from xsync.kernels.flash_attn import attention_varlen

    monkeypatch.setenv("XSYNC_BACKEND", "nvidia")
    torch.manual_seed(8)
    lens = [[300, 5, 700, 19], [1, 1000, 0, 23], [512, 256, 128, 128]]
    q, k, v, cu_q, cu_k = _packed(lens[0], lens[0], 4, 4, 128)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            attention_varlen(q, k, v, cu_q, cu_k, 1024, 1024, causal=causal)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, lse = attention_varlen(q, k, v, cu_q, cu_k, 1024, 1024, causal=causal)
    for step in lens:
        cu = torch.tensor([0] + torch.tensor(step).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        cu_q.copy_(cu)
        cu_k.copy_(cu)
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        _check_varlen(q, k, v, cu_q, cu_k, o, lse, causal)


@pytest.mark.parametrize("scale", [0.2, 0.0, -0.3])
@pytest.mark.parametrize("d", [64, 128])
def test_flash_attention_scale_signs(scale, d, monkeypatch):
    """A positive scale runs the kernel's scaled-max form (the row max scaled once, the score
    scaled inside exp2's fused multiply-add), zero and negative ones the form that scales every
    score first; both match a float32 reference, the first causal rows (q longer than k) see
    no key: output 0, LSE +inf, and a NaN in one key reaches its rows' outputs."""
    import torch

    from xsync.kernels.flash_attn.ops import attention_impl

    monkeypatch.setenv("XSYNC_BACKEND", "nvidia")
    torch.manual_seed(5)
    sq, sk = 300, 200
    q = torch.randn(1, 2, sq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, sk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 2, sk, d, device="cuda", dtype=torch.bfloat16)
    for causal in (False, True):
        o, lse = attention_impl(q, k, v, causal, scale)
        s = (q.float() @ k.float().transpose(-1, -2)) * scale
        if causal:
            i = torch.arange(sq, device="cuda")[:, None]
            j = torch.arange(sk, device="cuda")[None, :]
            s = s.masked_fill(j > i + (sk - sq), float("-inf"))
        ref_lse = torch.logsumexp(s, -1)
        seen = torch.isfinite(ref_lse)
        assert (o[~seen] == 0).all() and (lse[~seen] == float("inf")).all()
        ref = torch.softmax(s, -1) @ v.float()
        torch.testing.assert_close(o.float()[seen], ref[seen], atol=3e-2, rtol=2e-2)
        torch.testing.assert_close(lse[seen], ref_lse[seen], atol=1e-3, rtol=1e-3)
    k[0, 1, 7] = float("nan")
    o, _ = attention_impl(q, k, v, False, scale)
    assert o[0, 1].isnan().all() and not o[0, 0].isnan().any()


# query lengths that reach every Hopper row of the schedule table (checked below), each off the
# tile grid so the last tile is partial (a 192-row tile of three replicas: 2000 = 10 x 192 + 80)
TABLE_LENGTHS = (1000, 2000, 4100, 8300)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_every_schedule_row_matches_torch(d, causal, monkeypatch):
    """Each row of the committed schedule table (kernels/flash_attn/schedule.py: tiles, stages,
    Q slots, two or three consumer replicas, persistent or one program per tile) as the ops
    launch it, against a float32 softmax(QK^T)V and its log-sum-exp."""
    import torch

    from xsync.kernels.flash_attn import schedule
    from xsync.kernels.flash_attn.ops import attention_impl

    rows = {id(r.schedule) for r in schedule.TABLE if r.backend == "nvidia"}
    hit = {id(schedule.lookup("nvidia", dd, c, n)) for dd in (64, 128, 256) for c in (False, True)
           for n in TABLE_LENGTHS}
    assert rows <= hit, "a schedule row no length of TABLE_LENGTHS reaches: add one"
    monkeypatch.setenv("XSYNC_BACKEND", "nvidia")
    torch.manual_seed(5)
    for n in TABLE_LENGTHS:
        q, k, v = (torch.randn(1, 2, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o, lse = attention_impl(q, k, v, causal)
        s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(d)
        if causal:
            s = s.masked_fill(torch.ones(n, n, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
        plan = schedule.lookup("nvidia", d, causal, n)
        torch.testing.assert_close(o.float(), torch.softmax(s, -1) @ v.float(), atol=3e-2, rtol=2e-2,
                                   msg=lambda m: f"s={n} {plan}: {m}")
        torch.testing.assert_close(lse, torch.logsumexp(s, -1), atol=1e-3, rtol=1e-3,
                                   msg=lambda m: f"s={n} {plan}: {m}")
        del s


def test_a_schedule_that_spills_falls_back(monkeypatch):
    """A table row whose kernel spills under the installed Triton (here d128 with three
    consumer warpgroups: 216 B a thread under Triton 3.6) runs once, right, and the driver's
    local-memory figure sends every later call to the row's fallback; the launch plan the
    fast path caches is the fallback's."""
    import torch

    from xsync.kernels.flash_attn import ops, schedule

    spilling = schedule.Schedule(BM=64, BN=128, STAGES=2, persistent=False, replicas=3,
                                 fallback=schedule.HOPPER)
    monkeypatch.setattr(schedule, "TABLE", (schedule.Row("nvidia", 128, False, None, spilling),
                                            *schedule.TABLE))
    monkeypatch.setattr(ops, "_SPILLED", {})
    monkeypatch.setattr(ops, "_PLANS", {})
    monkeypatch.setenv("XSYNC_BACKEND", "nvidia")
    torch.manual_seed(6)
    q, k, v = (torch.randn(1, 2, 700, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    want = torch.softmax((q.float() @ k.float().transpose(-1, -2)) / math.sqrt(128), -1) @ v.float()
    assert ops.launched_schedule("nvidia", 128, False, 700, q.dtype) is spilling
    first, _ = ops.attention_impl(q, k, v)
    spilled = ops.spilled_schedules()
    assert spilled[("nvidia", 128, False, torch.bfloat16, spilling)] > 0, spilled
    assert not ops._PLANS, "a spilling launch must not become the cached plan"
    assert ops.launched_schedule("nvidia", 128, False, 700, q.dtype) is schedule.HOPPER
    second, _ = ops.attention_impl(q, k, v)
    third, _ = ops.attention_impl(q, k, v)          # through the cached plan
    assert len(ops._PLANS) == 1
    for o in (first, second, third):
        torch.testing.assert_close(o.float(), want, atol=3e-2, rtol=2e-2)
    # the table's own rows with a fallback are checked the same way on first launch
    q64 = torch.randn(1, 2, 2000, 64, device="cuda", dtype=torch.bfloat16)
    row = schedule.lookup("nvidia", 64, False, 2000)
    assert row.fallback is not None
    ops.attention_impl(q64, q64, q64)
    local = ops.spilled_schedules()[("nvidia", 64, False, torch.bfloat16, row)]
    assert ops.launched_schedule("nvidia", 64, False, 2000, q64.dtype) is (row.fallback if local else row)


def _reference(q, k, v, causal):
    """tests/core's float64 reference, as float32; a row that sees no key (causal, more
    queries than keys) has O = 0 and LSE = +inf, the kernel's (flash-attn's) convention."""
    import torch

    from tests.core.test_flash_attn_backward import reference

    o, lse = reference(q.double(), k.double(), v.double(), causal, 1 / math.sqrt(q.shape[-1]))
    return o.float(), torch.where(torch.isfinite(lse), lse, float("inf")).float()


@pytest.mark.parametrize("ahead", [False, True], ids=["reads_in_place", "reads_ahead"])
@pytest.mark.parametrize("programs", [1, 3, 7])
@pytest.mark.parametrize("causal", [False, True])
def test_persistent_tile_loop_on_hopper(programs, causal, ahead):
    """Fewer programs than tiles: each walks its share (tiles p, p + P, ...), with the
    pipes' counters carried from tile to tile; odd lengths and GQA. ``reads_ahead``: the
    consumers' tile-table and sequence-offset reads issued tiles early
    (XSYNC_NV_PREFETCH_TILE_SCALARS, xsync/backends/nvidia/prefetch.py)."""
    import math

    import torch

    import xsync as xs

    from xsync.kernels.flash_attn import ops, schedule
    from xsync.kernels.flash_attn.kernel import attention_fwd

    torch.manual_seed(5)
    b, hq, hk, sq, sk, d = 2, 4, 2, 333, 270, 128
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hk, sk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, hk, sk, d, device="cuda", dtype=torch.bfloat16)
    o = torch.empty_like(q)
    lse = torch.empty(b * hq, sq, device="cuda", dtype=torch.float32)
    ar = torch.arange(0, b + 1, dtype=torch.int32, device="cuda")
    plan = schedule.Schedule(BM=64, BN=128, STAGES=2, persistent=True)
    with xs.options(nv_prefetch_tile_scalars=ahead):
        ops.launch(attention_fwd, q.view(-1, d), k.view(-1, d), v.view(-1, d), o.view(-1, d), lse,
                   ar * sq, ar * sk, sq, b, hq, hk, d, causal, 1 / math.sqrt(d), (hq, sq, 0, hk, sk, 0, hq, 0),
                   "nvidia", plan, programs)
    ref_o, ref_lse = _reference(q, k, v, causal)
    torch.testing.assert_close(o.float(), ref_o, atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(lse.view(b, hq, sq), ref_lse, atol=1e-3, rtol=1e-3)


def test_cuda_graph_replays_with_new_inputs(monkeypatch):
    """The launch path makes no host sync and keeps nothing per call that a graph would
    freeze wrongly: capture once, change q/k/v in place, replay, compare."""
    import torch

    from xsync.kernels.flash_attn import attention

    monkeypatch.setenv("XSYNC_BACKEND", "nvidia")
    torch.manual_seed(6)
    q, k, v = (torch.randn(1, 8, 300, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            attention(q, k, v, causal=True)          # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, lse = attention(q, k, v, causal=True)
    for step in range(3):
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        ref_o, ref_lse = _reference(q, k, v, True)
        torch.testing.assert_close(o.float(), ref_o, atol=3e-2, rtol=2e-2)
        torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-3)


def test_direct_launch_keys_match_tritons_specialization(monkeypatch):
    """The launch path reuses a compiled kernel when its own key matches
    (xsync.backends.nvidia.specialization_key): that key must never join two launches
    that Triton would specialize differently. Recorded over shapes whose ints hit 1,
    multiples of 16 and odd values, and tensors at odd offsets."""
    import torch
    from triton.runtime.driver import driver

    from xsync.backends import nvidia
    from xsync.kernels.flash_attn import attention, attention_varlen

    monkeypatch.setenv("XSYNC_BACKEND", "nvidia")
    seen = []
    original = nvidia.CompiledNvidia.run_argv

    def recording(self, grid, argv):
        seen.append((self, list(argv)))
        return original(self, grid, argv)

    monkeypatch.setattr(nvidia.CompiledNvidia, "run_argv", recording)
    for b, h, s in ((1, 1, 1), (1, 1, 16), (2, 3, 17), (1, 16, 128), (3, 2, 129)):
        q, k, v = (torch.randn(b, h, s, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        attention(q, k, v)
    flat = torch.randn(4 * 200 * 128 + 8, device="cuda", dtype=torch.bfloat16)
    q = flat[8:].view(200, 4, 128)                      # 16-byte aligned, not 128
    cu = torch.tensor([0, 50, 200], dtype=torch.int32, device="cuda")
    attention_varlen(q, q, q, cu, cu, 150, 150)
    device = driver.active.get_current_device()
    classes = {}
    for compiled, argv in seen:
        binder = compiled.jit_fn.device_caches[device][4]
        _, spec, _ = binder(*argv, **compiled.launch_options())
        key = (id(compiled), nvidia.specialization_key(argv))
        classes.setdefault(key, set()).add(str(spec))
    assert len(seen) >= 6
    assert all(len(specs) == 1 for specs in classes.values()), classes


def test_repeated_launch_skips_tritons_dispatch(monkeypatch):
    """After the first launch of a specialization, a launch calls the compiled kernel
    directly: Triton's JIT dispatch (binder, cache key, launch metadata) is not run again,
    so the host cost per call stays small. An installed launch hook takes Triton's path."""
    import torch
    from triton import knobs

    from xsync.backends import nvidia
    from xsync.kernels.flash_attn import attention

    monkeypatch.setenv("XSYNC_BACKEND", "nvidia")
    seen = []
    original = nvidia.CompiledNvidia.run_argv

    def recording(self, grid, argv):
        seen.append(self)
        return original(self, grid, argv)

    monkeypatch.setattr(nvidia.CompiledNvidia, "run_argv", recording)
    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    first = attention(q, k, v)
    compiled = seen[-1]

    def no_dispatch(*args, **kwargs):
        raise AssertionError("Triton's JIT dispatch ran for an already launched specialization")

    monkeypatch.setattr(compiled.jit_fn, "run", no_dispatch)
    again = attention(q, k, v)
    torch.testing.assert_close(again, first)
    monkeypatch.undo()
    monkeypatch.setenv("XSYNC_BACKEND", "nvidia")
    chain = knobs.runtime.launch_enter_hook      # a HookChain on Triton 3.6-3.9
    calls = []
    chain.add(calls.append)
    try:
        attention(q, k, v)
        torch.cuda.synchronize()
    finally:
        chain.remove(calls.append)
    assert calls, "a launch hook was installed but not called"


@pytest.mark.parametrize("programs", [1, 5, 132])
def test_persistent_gemm_numerics(programs):
    import torch

    from xsync.kernels.gemm import gemm_persistent

    torch.manual_seed(0)
    M, N, K = 513, 264, 200
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    c = torch.full((M, N), float("nan"), device="cuda")
    gemm_persistent[(programs,)](a, b, c, M, N, K, BM=128, BN=128, BK=64, STAGES=4, backend="nvidia")
    torch.cuda.synchronize()
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("misfit", ["row_stride", "base"])
def test_tma_store_falls_back_where_the_output_does_not_suit_tma(misfit):
    """gemm_persistent stores its C tiles by TMA; a C the copy engine cannot address (a row
    stride or a base not 16-byte aligned) takes the masked stores instead (c_tma_ok = 0):
    the same result, and nothing written outside C."""
    import torch

    from xsync.kernels.gemm import gemm_persistent

    torch.manual_seed(0)
    M, N, K = 300, 136, 200                             # A and B still suit TMA (16-byte rows)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    if misfit == "row_stride":
        big = torch.full((M, N + 1), float("nan"), device="cuda")
        c = big[:, :N]                                  # 137 floats a row: 548 B
    else:
        big = torch.full((M * N + 1,), float("nan"), device="cuda")
        c = big[1:].view(M, N)                          # base 4 B past an aligned one
    gemm_persistent[(5,)](a, b, c, M, N, K, BM=128, BN=128, BK=64, STAGES=4, backend="nvidia")
    torch.cuda.synchronize()
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-3, atol=1e-2)
    if misfit == "row_stride":
        assert torch.isnan(big[:, N]).all()
    else:
        assert torch.isnan(big[0])


def test_launch_plan_follows_new_data(monkeypatch):
    """The dense op's launch plan (bound after the first call of a shape) reads each call's
    own q, k, v and writes its own o and lse: new data gives the new answer, interleaved
    shapes and causal flags keep their plans apart, and clear_cache() retires the plans."""
    import torch

    from xsync.kernels.flash_attn import attention, ops
    from xsync.kernels.flash_attn.kernel import attention_fwd

    monkeypatch.setenv("XSYNC_BACKEND", "nvidia")
    torch.manual_seed(3)
    shapes = [(1, 2, 130, 64), (2, 4, 64, 128)]
    for round_ in range(3):
        for causal in (False, True):
            for shape in shapes:
                q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                o, lse = attention(q, k, v, causal=causal)
                ref_o, ref_lse = _reference(q, k, v, causal)
                torch.testing.assert_close(o.float(), ref_o, atol=3e-2, rtol=2e-2)
                torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-3)
    assert len(ops._PLANS) >= 4
    attention_fwd.clear_cache()
    assert all(p.generation != attention_fwd.generation for p in ops._PLANS.values())
    q, k, v = (torch.randn(*shapes[0], device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, _ = attention(q, k, v)
    torch.testing.assert_close(o.float(), _reference(q, k, v, False)[0], atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("shape,causal", [((1, 1, 128, 64), False), ((2, 4, 300, 128), True)])
def test_direct_c_launch_matches_tritons_launcher(monkeypatch, shape, causal):
    """A prepared launch through the C launcher (xsync/backends/nvidia/launcher.py: cached
    TMA maps keyed by pointer, integer pointers) gives bit-identical outputs to Triton's
    kernel.run, for new tensors (map-cache misses) and repeated ones (hits)."""
    import torch
    import triton

    from xsync.backends.nvidia import compiled as nvidia
    from xsync.kernels.flash_attn import attention, ops

    monkeypatch.setenv("XSYNC_BACKEND", "nvidia")
    torch.manual_seed(7)
    inputs = [tuple(torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
              for _ in range(3)]
    outputs = {}
    for direct in (False, True):
        monkeypatch.setattr(nvidia, "DIRECT_LAUNCH", direct)
        ops._PLANS.clear()
        attention(*inputs[0], causal=causal)                  # compile, then prepare the plan
        plan = next(iter(ops._PLANS.values()))
        if direct and triton.__version__.startswith("3.6"):
            assert hasattr(plan.launch, "keep_alive"), "Triton 3.6 launches should go direct"
        outputs[direct] = [attention(*x, causal=causal) for x in inputs + inputs]
    torch.cuda.synchronize()
    for (o0, l0), (o1, l1) in zip(outputs[False], outputs[True]):
        assert torch.equal(o0, o1) and torch.equal(l0, l1)
    ref_o, ref_lse = _reference(*inputs[1], causal)
    torch.testing.assert_close(outputs[True][1][0].float(), ref_o, atol=3e-2, rtol=2e-2)
