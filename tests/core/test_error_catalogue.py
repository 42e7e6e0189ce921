"""Error catalogue (docs/errors.md): every misuse gives a message that names where it is
(file:line of the user's kernel), what it involves (role / pipe / event / barrier) and
how to fix it."""
import os
import re

import pytest
import torch

import xsync as xs
from xsync.kernels.gemm import gemm
from xsync.kernels.flash_attn import attention
from tests.core import broken_kernels as bk
from tests.core.test_verifier import bug_line
from xsync.errors import XSyncError

# (kernel, backend, error class, objects that must be named, words of the fix)
CATALOGUE = [
    ("missing_release", "cpu", xs.DeadlockError, ["ring", "load", "work"], "release"),
    ("three_way_cycle", "cpu", xs.DeadlockError, ["ab", "bc", "ca"], "reorder the waits"),
    ("wait_in_producer", "cpu", xs.KernelSourceError, ["ring", "load"], "move it into `with work:`"),
    ("signal_from_wrong_role", "cpu", xs.KernelSourceError, ["ready", "work"], "signalled by 'load'"),
    ("zero_stages", "cpu", xs.KernelSourceError, ["ring"], "stages=1"),
    ("too_many_event_ids", "ascend", xs.AllocationError, ["e0", "e16"], "merge pipes"),
    ("sixteen_stage_flag", "ascend", xs.AllocationError, ["ring"], "stages <= 15"),
    ("flag_overflow", "ascend", xs.FlagOverflowError, ["tick"], "back-pressure"),
    ("event_runs_ahead", "nvidia", xs.PhaseAliasingError, ["tick"], "back-pressure"),
    ("loop_count_mismatch", "cpu", xs.LeftoverError, ["ring", "work"], "as many times"),
    ("cross_role_value", "cpu", xs.KernelSourceError, ["tile", "load", "work"], "xs.pipe(load, work"),
    ("commit_without_acquire", "cpu", xs.SlotOrderError, ["ring", "load"], "ring.acquire()"),
    ("sync_outside_role", "cpu", xs.KernelSourceError, ["ready"], "inside `with <role>:`"),
    ("mma_in_vector_role", "cpu", xs.KernelSourceError, ["work"], "kind 'matrix'"),
    ("barrier_non_member", "cpu", xs.KernelSourceError, ["team"], "add the role to xs.barrier"),
    ("signal_never_waited", "cpu", xs.LeftoverError, ["done"], "as many times"),
    ("register_handoff_out_of_order", "nvidia", xs.DeadlockError, ["s_pipe", "consumer"], ""),
    ("too_much_shared_memory", "nvidia", xs.AllocationError, ["ring"], "lower stages"),
    ("nested_roles", "cpu", xs.KernelSourceError, [], "cannot nest"),
    ("while_loop", "cpu", xs.KernelSourceError, [], "for i in range"),
]


@pytest.mark.parametrize("name,backend,cls,objects,fix", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_catalogue_entry(name, backend, cls, objects, fix):
    kernel = getattr(bk, name)
    with pytest.raises(cls) as info:
        kernel.lower(backend)
    err, msg = info.value, str(info.value)
    assert type(err) is cls, msg
    assert f"{os.path.basename(err.loc.file)}:{bug_line(kernel)}" in msg     # where
    for obj in objects:                                                      # what
        assert re.search(rf"\b{re.escape(obj)}\b", msg), f"{obj!r} not named in:\n{msg}"
    assert "fix:" in msg and fix in err.fix, msg                             # how to mend it


def test_catalogue_is_documented():
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "errors.md")).read()
    for name, *_ in CATALOGUE:
        assert name in doc, f"docs/errors.md lacks {name}"
    # the corpus entries shown there are still rejected the way the doc shows
    from tests.core import corpus
    shown = re.findall(r"### `(\w+)` — [^\n]*\n\n`(\w+)` on the `(\w+)` backend", doc)
    assert len(shown) >= 5
    for name, cls, backend in shown:
        with pytest.raises(XSyncError) as info:
            getattr(corpus, name).lower(backend)
        assert type(info.value).__name__ == cls, (name, backend)


def test_launch_errors_name_the_argument_and_fix():
    a = torch.randn(8, 8).bfloat16()
    with pytest.raises(xs.LaunchError) as info:
        gemm[(1, 1)](a, a, torch.zeros(8, 8), 8, 8, BM=16, BN=16, BK=16, STAGES=1, backend="cpu")
    assert "gemm" in str(info.value) and info.value.fix
    with pytest.raises(xs.LaunchError) as info:
        gemm(a, a)
    assert "needs a grid" in str(info.value)
    with pytest.raises(xs.LaunchError) as info:
        attention(torch.randn(1, 2, 8, 64), torch.randn(1, 2, 8, 64), torch.randn(1, 2, 8, 64))
    assert "float32" in str(info.value) and "bfloat16" in info.value.fix


def test_backend_errors(monkeypatch):
    from xsync.backends import select
    monkeypatch.setenv("XSYNC_BACKEND", "gpu")
    with pytest.raises(xs.ConfigError, match="XSYNC_BACKEND=gpu is not valid") as info:
        select()
    assert "auto, cpu, nvidia, ascend" in info.value.fix
    with pytest.raises(xs.BackendError, match="unknown backend 'gpu'") as info:
        select("gpu")
    assert "cpu, nvidia, ascend" in info.value.fix
    monkeypatch.setenv("XSYNC_BACKEND", "")
    monkeypatch.setenv("XSYNC_ASCEND_EVENT_IDS", "99")
    from xsync.kernels.gemm_softmax import gemm_softmax
    with pytest.raises(xs.ConfigError, match="XSYNC_ASCEND_EVENT_IDS=99 is not valid") as info:
        gemm_softmax.lower("ascend")
    assert "<= 16" in info.value.fix


def test_all_catalogue_errors_are_xsync_errors():
    assert all(issubclass(c[2], XSyncError) for c in CATALOGUE)
