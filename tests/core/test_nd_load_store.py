"""xs.load / xs.store on tensors of 1 to 4 dimensions (issue 38), on the CPU emulator against
torch: one offset per tensor dimension, a 1-D or 2-D tile over the tensor's last dimensions
(each leading offset picks one index), any strides; parts outside the tensor (every dimension)
read 0 and are not written. Refused at check with the line and a fix: tiles of 3 or more
dimensions, more tile dimensions than offsets, a tensor addressed with two ranks, more than 4
offsets, bounds of another length; at launch: a tensor of another rank than the kernel's use."""
import pytest
import torch

import xsync as xs
from xsync import cli
from xsync.errors import KernelSourceError, LaunchError
from tests.core.nd_kernels import (add_3d, batched_gemm, bias_add, bounded_4d, heads_4d, row_sums, rows_as_vectors,
                                   scale_3d)


def _line(tag: str) -> int:
    return next(i for i, text in enumerate(open(__file__).read().splitlines(), 1)
                if text.rstrip().endswith(f"# {tag}"))


def test_bias_1d_broadcasts_over_rows_with_ragged_edges():
    M, N = 37, 40                           # neither a multiple of the tile
    x, b = torch.randn(M, N), torch.randn(N)
    out = torch.full((M, N), 7.0)
    bias_add[(3, 3)](x, b, out, BM=16, BN=16, backend="cpu")
    torch.testing.assert_close(out, x + b)


def test_bias_from_a_strided_1d_view():
    x, b = torch.randn(32, 16), torch.randn(16, 3)[:, 1]        # stride 3
    out = torch.zeros(32, 16)
    bias_add[(2, 1)](x, b, out, BM=16, BN=16, backend="cpu")
    torch.testing.assert_close(out, x + b)


def test_1d_store_masks_the_tail():
    x = torch.randn(20, 16)
    out = torch.full((20,), -1.0)
    row_sums[(2,)](x, out, BM=16, BN=16, backend="cpu")
    torch.testing.assert_close(out, x.sum(1))


def test_a_row_of_a_2d_tensor_as_a_1d_tile():
    x = torch.randn(5, 24)
    out = torch.full((5, 24), 3.0)
    rows_as_vectors[(6,)](x, out, BN=32, backend="cpu")             # a 6th program: past the rows
    torch.testing.assert_close(out, 2 * x)


def test_3d_strided_view():
    B, S, D = 3, 40, 32
    x = torch.randn(S, B, D).transpose(0, 1)                    # [B, S, D], not contiguous
    out = torch.zeros(B, S, D)
    scale_3d[(B * 3,)](x, out, S, BM=16, D=D, backend="cpu")
    torch.testing.assert_close(out, 2 * x)


def test_4d_transposed_heads_view_rows_masked():
    B, S, H, D = 2, 20, 3, 32
    q = torch.randn(B, S, H, D).transpose(1, 2)                 # [B, H, S, D] view of [B, S, H, D]
    out = torch.full((B, S, H, D), 5.0)
    heads_4d[(B * H * 2,)](q, out.transpose(1, 2), H, S, BM=16, D=D, backend="cpu")
    torch.testing.assert_close(out, (2 * q + 1).transpose(1, 2))


def test_4d_bounds_on_every_dimension():
    B, H, S, D = 2, 2, 32, 16
    q = torch.randn(B, H, S, D)
    out = torch.zeros(B, H, S, D)
    bounded_4d[(B * H * 2,)](q, out, H, S, 21, BM=16, D=D, backend="cpu")
    torch.testing.assert_close(out[:, :, :21], q[:, :, :21])
    assert not out[:, :, 21:].any()


def test_reduce_add_into_3d():
    B, S, D = 4, 24, 16
    x = torch.randn(B, S, D)
    out = torch.zeros(1, S, D)
    add_3d[(2, 3)](x, out, S, B, BM=16, D=D, STAGES=2, backend="cpu")
    torch.testing.assert_close(out[0], x.sum(0))


def test_pipe_filled_from_3d_views():
    Z, M, N, K = 2, 40, 48, 64
    a = torch.randn(M, Z, K).bfloat16().transpose(0, 1)            # [Z, M, K], strided
    b = torch.randn(Z, K, N).bfloat16()
    bias, c = torch.randn(N), torch.zeros(Z, M, N)
    batched_gemm[(2, 2, Z)](a, b, bias, c, M, K, BM=32, BN=32, BK=16, STAGES=2, backend="cpu")
    torch.testing.assert_close(c, a.float() @ b.float() + bias, atol=1e-4, rtol=1e-4)


def test_launch_refuses_a_tensor_of_another_rank():
    with pytest.raises(LaunchError) as info:
        heads_4d[(1,)](torch.zeros(2, 16, 32), torch.zeros(2, 1, 16, 32), 1, 16, BM=16, D=32, backend="cpu")
    e = info.value
    assert "`Q` has 3 dimension(s)" in str(e) and "4-D" in str(e) and "Q" in e.objects and e.fix


@xs.kernel(example=dict(X=xs.float32, OUT=xs.float32, BM=16))
def tile_of_three_dims(X, OUT, BM: xs.constexpr):
    w = xs.role("w", kind="vector")
    with w:
        x = xs.load(X, [0, 0, 0], [1, BM, BM])      # BUG_3D_TILE
        xs.store(OUT, [0, 0, 0], x)


@xs.kernel(example=dict(X=xs.float32, OUT=xs.float32, BM=16))
def tile_wider_than_offsets(X, OUT, BM: xs.constexpr):
    w = xs.role("w", kind="vector")
    with w:
        x = xs.load(X, [0], [BM, BM])               # BUG_WIDER
        xs.store(OUT, [0, 0], x)


@xs.kernel(example=dict(X=xs.float32, OUT=xs.float32, BM=16))
def two_ranks(X, OUT, BM: xs.constexpr):
    w = xs.role("w", kind="vector")
    with w:
        x = xs.load(X, [0, 0], [BM, BM])
        y = xs.load(X, [0, 0, 0], [BM, BM])         # BUG_TWO_RANKS
        xs.store(OUT, [0, 0], x + y)


@xs.kernel(example=dict(X=xs.float32, OUT=xs.float32, BM=16))
def five_offsets(X, OUT, BM: xs.constexpr):
    w = xs.role("w", kind="vector")
    with w:
        x = xs.load(X, [0, 0], [BM, BM])
        xs.store(OUT, [0, 0, 0, 0, 0], x)           # BUG_FIVE


@xs.kernel(example=dict(X=xs.float32, OUT=xs.float32, BM=16))
def short_bounds(X, OUT, BM: xs.constexpr):
    w = xs.role("w", kind="vector")
    with w:
        x = xs.load(X, [0, 0, 0], [BM, BM])
        xs.store(OUT, [0, 0, 0], x, bounds=[BM, BM])    # BUG_BOUNDS


@xs.kernel(example=dict(X=xs.float32, OUT=xs.float32, BM=16))
def store_into_1d_of_2d_tile(X, OUT, BM: xs.constexpr):
    w = xs.role("w", kind="vector")
    with w:
        x = xs.load(X, [0, 0], [BM, BM])
        xs.store(OUT, [0], x)                       # BUG_STORE_RANK


REFUSED = [
    (tile_of_three_dims, "BUG_3D_TILE", "reads a [1, 16, 16] tile; tiles are 1-D or 2-D", "[BM, D]"),
    (tile_wider_than_offsets, "BUG_WIDER", "reads a [16, 16] tile with 1 offset(s)", "one offset per dimension"),
    (two_ranks, "BUG_TWO_RANKS", "addresses `X` with 3 offset(s), but line", "one rank"),
    (five_offsets, "BUG_FIVE", "has 5 offset(s)", "[b, h, row, col]"),
    (short_bounds, "BUG_BOUNDS", "one end per offset (3)", "one end per dimension"),
    (store_into_1d_of_2d_tile, "BUG_STORE_RANK", "writes [16, 16]", "1-D"),
]


@pytest.mark.parametrize("kernel,tag,what,fix", REFUSED, ids=[k.__name__ for k, *_ in REFUSED])
@pytest.mark.parametrize("backend", ["cpu", "nvidia", "ascend"])
def test_refused_at_check_with_line_and_fix(kernel, tag, what, fix, backend):
    with pytest.raises(KernelSourceError) as info:
        kernel.lower(backend, constexprs=dict(BM=16), tensor_dtypes=dict(X=xs.float32, OUT=xs.float32))
    e = info.value
    assert e.loc.line == _line(tag), str(e)
    assert what in str(e) and e.fix and fix in e.fix, (str(e), e.fix)


def test_cli_check_names_the_line(capsys):
    assert cli.main(["check", f"{__file__}:two_ranks", "--backend", "cpu"]) == 1
    out = capsys.readouterr().out
    assert f"test_nd_load_store.py:{_line('BUG_TWO_RANKS')}" in out and "REJECTED" in out and "fix:" in out, out
