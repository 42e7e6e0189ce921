"""The sliding-window family (tests/core/window_kernels.py, issue 34): proofs that do not depend
on spelling. The correct kernel is proven (not bounded) on every placement for the window a
run-time scalar or a constant and the key range written either way; the kernel with the release
moved into the edge-block branch is rejected on every placement with a counterexample of
concrete values, and the CPU emulator, with the verifier off, stalls on it and says so."""
import re

import pytest
import torch

import xsync as xs
from tests.core.window_kernels import window_attention, window_attention_release_in_edge
from xsync.errors import ProtocolError, XSyncError

BASE = dict(BM=64, BN=128, D=64, STAGES=2)
WINDOWS = (0, 256, 400, 1000, 4096)     # 0: the window is the run-time scalar `window`


@pytest.mark.parametrize("lengths", [0, 1], ids=["rows_left", "q_len-k_len"])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("backend", ["cpu", "nvidia", "ascend"])
def test_correct_window_is_proven_everywhere(backend, window, lengths):
    report = window_attention.lower(backend, dict(BASE, WINDOW=window, LENGTHS=lengths)).report
    assert report.proven, report.summary()
    assert report.summary().startswith(f"verified for {backend}: ")


BROKEN = [(b, w, spell) for b in ("cpu", "nvidia", "ascend") for w in (0, 400) for spell in (0, 1)]


@pytest.mark.parametrize("backend,window,lengths", BROKEN)
def test_release_in_edge_branch_is_rejected_with_values(backend, window, lengths):
    with pytest.raises(ProtocolError) as info:
        window_attention_release_in_edge.lower(backend, dict(BASE, WINDOW=window, LENGTHS=lengths))
    msg = str(info.value)
    assert "s_out" in msg and "with " in msg and info.value.fix, msg
    assert re.search(r"with [^\n]*(m_block|tile_order, tile\)) = \d+", msg), msg     # concrete values


def _launch_args(s, window, d=64):
    q, k, v = (torch.randn(s, d).bfloat16() for _ in range(3))
    o = torch.zeros_like(q)
    cu = torch.tensor([0, s], dtype=torch.int32)
    order = torch.arange(0, s, 2 * BASE["BM"], dtype=torch.int32)
    # the kernel's softmax is in base 2: its scale carries log2(e)
    return (q, k, v, o, cu, cu, order, d ** -0.5 * 1.4426950408889634, window, len(order)), o


def test_emulator_stalls_where_the_verifier_rejects():
    """The issue's case: window 400 at S = 512 hangs; with the verifier off the emulator reports
    the stall, the pipe and that the verifier was off."""
    args, _ = _launch_args(512, 400)
    with xs.options(verify=False, cpu_timeout=20):
        with pytest.raises(XSyncError) as info:
            window_attention_release_in_edge[(1,)](*args, **BASE, WINDOW=0, LENGTHS=0, backend="cpu")
    msg = str(info.value)
    assert "s_out" in msg and "XSYNC_VERIFY=0" in msg, msg


def test_correct_window_runs_and_matches_a_reference():
    s, w = 512, 400
    args, o = _launch_args(s, w)
    window_attention[(2,)](*args, **BASE, WINDOW=0, LENGTHS=0, backend="cpu")
    q, k, v = (a.float() for a in args[:3])
    i = torch.arange(s)[:, None]
    j = torch.arange(s)[None, :]
    keep = (j <= i) & (i - j < w)
    ref = torch.softmax((q @ k.T * q.shape[1] ** -0.5).masked_fill(~keep, float("-inf")), -1) @ v
    torch.testing.assert_close(o.float(), ref, atol=3e-2, rtol=3e-2)
