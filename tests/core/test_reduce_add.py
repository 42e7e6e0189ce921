"""Reduce-add to global memory, ``xs.store(t, offsets, value, reduce="add")``: the CPU emulator
adds exactly (split-K GEMM and a column sum against torch, bounds masking, the deterministic
order bit for bit) and check refuses what a backend cannot do (dtypes, deterministic=True) or
what races (a read or a plain store of the tensor in the same kernel), naming the line."""
import os

import pytest
import torch

import xsync as xs
from tests.core.reduce_kernels import column_sum, gemm_split_k, gemm_split_k_reducer
from tests.core.test_verifier import bug_line
from xsync.dtypes import int1
from xsync.errors import KernelSourceError, UnsupportedError

BM, BN, BK = 32, 32, 16


def _split_k(M, N, K, splits, det=0, mode="threads"):
    torch.manual_seed(0)
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = torch.zeros(M, N)
    per = -(-K // splits)
    per = -(-per // BK) * BK
    grid = (-(-M // BM) * -(-N // BN), splits)
    with xs.options(cpu_mode=mode):
        gemm_split_k[grid](a, b, c, M, N, K, per, BM=BM, BN=BN, BK=BK, STAGES=2, DET=det, backend="cpu")
    return a, b, c, per


@pytest.mark.parametrize("mode", ["threads", "cooperative"])
def test_split_k_gemm_matches_torch(mode):
    a, b, c, _ = _split_k(100, 70, 200, 3, mode=mode)      # tiles cut at M, N; a short last split
    torch.testing.assert_close(c, a.double().mm(b.double()).float(), atol=2e-4, rtol=2e-4)


def test_deterministic_order_is_program_order_bit_for_bit():
    """deterministic=True: the adds land programs in launch order (row-major over the grid:
    split 0, 1, 2 of each tile), each program's in program order -- the same bits as that sum
    written in torch."""
    M, N, K, splits = 64, 32, 96, 3
    a, b, c, per = _split_k(M, N, K, splits, det=1)
    want = torch.zeros(M, N)
    for s in range(splits):
        acc = torch.zeros(M, BN)
        for k in range(s * per, min(s * per + per, K), BK):
            acc = torch.matmul(a[:, k:k + BK].float(), b[k:k + BK, :].float()) + acc
        want += acc
    assert torch.equal(c, want)
    assert torch.equal(_split_k(M, N, K, splits, det=1, mode="cooperative")[2], want)


def test_column_sum_masks_the_bounds():
    torch.manual_seed(1)
    M, N = 77, 50
    x = torch.randn(M, N)
    out = torch.full((2, 64), 7.0)
    column_sum[(3, 2)](x, out, M, N, 32, BM=16, BN=32, STAGES=2, backend="cpu")
    torch.testing.assert_close(out[0, :N], 7.0 + x.double().sum(0).float(), atol=1e-4, rtol=1e-5)
    assert torch.equal(out[0, N:], torch.full((64 - N,), 7.0))     # beyond bounds=[1, N]: untouched
    assert torch.equal(out[1], torch.full((64,), 7.0))


def _store_line(kernel) -> int:
    import inspect
    lines, start = inspect.getsourcelines(kernel.fn)
    return start + next(i for i, t in enumerate(lines) if 'reduce="add"' in t)


@pytest.mark.parametrize("backend,dtype", [("ascend", xs.bfloat16), ("nvidia", int1), ("cpu", int1)])
def test_unsupported_dtype_is_refused_at_check(backend, dtype):
    k = gemm_split_k_reducer
    with pytest.raises(UnsupportedError) as info:
        k.lower(backend, tensor_dtypes=dict(a=xs.bfloat16, b=xs.bfloat16, c=dtype))
    err, msg = info.value, str(info.value)
    assert f"reduce_kernels.py:{_store_line(k)}" in msg and dtype.name in msg, msg
    assert "`c`" in msg and "fix:" in msg and "float32" in err.fix, msg


@pytest.mark.parametrize("backend", ["nvidia", "ascend"])
def test_deterministic_is_refused_where_not_ordered(backend):
    with pytest.raises(UnsupportedError) as info:
        gemm_split_k_reducer.lower(backend, {**gemm_split_k_reducer.specialization()[0], "DET": 1})
    msg = str(info.value)
    assert f"reduce_kernels.py:{_store_line(gemm_split_k_reducer)}" in msg and "deterministic" in msg, msg
    assert "CPU emulator" in info.value.fix


def test_every_backend_lowers_the_reduce_add_kernels():
    for backend in ("cpu", "nvidia", "ascend"):
        for k in (gemm_split_k_reducer, column_sum) + ((gemm_split_k,) if backend != "ascend" else ()):
            assert k.lower(backend).report.proven


def test_ascend_refuses_a_reduce_add_from_the_cube():
    """The HIVM compiler moves a GM atomic to a vector core and leaves the cube's tile behind:
    a matrix role's reduce-add is refused; the reducer-role form lowers (test above)."""
    with pytest.raises(UnsupportedError) as info:
        gemm_split_k.lower("ascend")
    err, msg = info.value, str(info.value)
    assert f"reduce_kernels.py:{_store_line(gemm_split_k)}" in msg and "role 'mma'" in msg, msg
    assert "cube core" in msg and "kind 'vector'" in err.fix and "xs.pipe(" in err.fix, msg


def test_reducer_role_split_k_on_cpu():
    torch.manual_seed(2)
    M, N, K = 70, 40, 120
    a, b, c = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16(), torch.zeros(M, N)
    grid = (-(-M // BM) * -(-N // BN), 2)
    gemm_split_k_reducer[grid](a, b, c, M, N, K, 64, BM=BM, BN=BN, BK=BK, STAGES=2, DET=0, backend="cpu")
    torch.testing.assert_close(c, a.double().mm(b.double()).float(), atol=2e-4, rtol=2e-4)


# ---------------------------------------------------------------- kernels that race
EX = dict(x=xs.float32, y=xs.float32, BLOCK=16)


@xs.kernel(example=EX)
def reads_what_it_adds(x, y, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        xs.store(y, [0, 0], xs.load(x, [0, 0], [BLOCK, BLOCK]), reduce="add")
        back = xs.load(y, [0, 0], [BLOCK, BLOCK])  # BUG
        xs.store(x, [0, 0], back)


@xs.kernel(example=EX)
def stores_and_adds(x, y, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        t = xs.load(x, [0, 0], [BLOCK, BLOCK])
        xs.store(y, [0, 0], t)  # BUG
        xs.store(y, [0, 0], t, reduce="add")


@xs.kernel(example=EX)
def unknown_reduction(x, y, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        xs.store(y, [0, 0], xs.load(x, [0, 0], [BLOCK, BLOCK]), reduce="max")  # BUG


@xs.kernel(example=EX)
def deterministic_plain_store(x, y, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        xs.store(y, [0, 0], xs.load(x, [0, 0], [BLOCK, BLOCK]), deterministic=True)  # BUG


@pytest.mark.parametrize("kernel,words,fix", [
    (reads_what_it_adds, ["`y` is reduce-added into", "read by xs.load"], "later kernel launch"),
    (stores_and_adds, ["`y` is both stored to", "reduce-added into"], "torch.zeros"),
    (unknown_reduction, ["reduce='max'"], 'reduce="add"'),
    (deterministic_plain_store, ["deterministic=True) without reduce="], "deterministic orders"),
], ids=lambda v: getattr(getattr(v, "fn", None), "__name__", "x"))
def test_racy_or_unknown_reduce_adds_are_rejected(kernel, words, fix):
    for backend in ("cpu", "nvidia", "ascend"):
        with pytest.raises(KernelSourceError) as info:
            kernel.lower(backend)
        err, msg = info.value, str(info.value)
        assert f"{os.path.basename(__file__)}:{bug_line(kernel)}" in msg, msg
        for w in words:
            assert w in msg, msg
        assert fix in err.fix, msg
