"""Where a vector role runs (issue 38): Hopper's rule for a vector role beside a matrix role of
its replica count (xsync/backends/nvidia/placement.py ``own_roles``), ``xs.role(placement=)``
and its errors, and the report ``xsync check`` / ``xsync lower`` print."""
import os
import subprocess
import sys

import pytest
import torch

import xsync as xs
from xsync.backends import registry
from xsync.errors import AllocationError, KernelSourceError
from xsync.lowering.placement import Unit
from tests.core.placement_kernels import EXAMPLE, gemm_epilogue_role, paired_epilogue, round_trip

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NV = registry.get("nvidia")
SPEC = {k: v for k, v in EXAMPLE.items() if isinstance(v, int)}


def lower(kernel, backend=NV, check=False, **cx):
    return kernel.lower(backend, {**SPEC, **cx} if kernel is gemm_epilogue_role else cx or None,
                        check=check)


def agents(lowered):
    return {a.name: a.roles for a in lowered.placement.agents}


def note(lowered, role):
    return next(n for n in lowered.placement.notes if n.role == role)


def test_buffered_epilogue_gets_its_own_warpgroup_and_is_proven():
    lo = lower(gemm_epilogue_role, check=True)
    assert agents(lo) == {"producer": ("load",), "consumer": ("mma",), "epi": ("epi",)}
    assert lo.placement.agent("epi").unit is Unit.CONSUMER
    assert lo.report.proven
    parts = lo.allocation.partitions
    assert [(p.agent, p.warps) for p in parts] == [("consumer", 4), ("epi", 4), ("producer", 1)]
    assert lo.allocation.mbarrier("accs", "full").barriers == 2       # the pipe keeps its stages
    n = note(lo, "epi")
    assert n.placement == "own consumer warpgroup"
    assert "stages=2" in n.reason and "overlaps the next tile's main loop" in n.reason
    assert 'placement="merged"' in n.ask
    table = lo.allocation.table()
    assert "epi" in table and "own consumer warpgroup" in table and "rules 1-4" in table


def test_single_stage_keeps_todays_merge():
    lo = lower(gemm_epilogue_role, check=True, EPI_STAGES=1)
    assert agents(lo) == {"producer": ("load",), "consumer": ("mma", "epi")}
    n = note(lo, "epi")
    assert n.placement == "merged with 'mma'" and n.reason.startswith("rule 1:")
    assert "stages=1" in n.reason and 'placement="own"' in n.ask
    assert "register hand-off" in lo.allocation.table()


def test_explicit_requests_win():
    own = lower(gemm_epilogue_role, check=True, EPI_STAGES=1, PLACEMENT="own")
    assert agents(own)["epi"] == ("epi",) and own.report.proven
    assert note(own, "epi").reason == 'asked: placement="own"'
    merged = lower(gemm_epilogue_role, check=True, PLACEMENT="merged")
    assert agents(merged)["consumer"] == ("mma", "epi")
    assert note(merged, "epi").reason == 'asked: placement="merged"'
    auto = lower(gemm_epilogue_role, PLACEMENT="auto")
    assert agents(auto)["epi"] == ("epi",)


def test_hand_back_stays_merged():
    lo = lower(round_trip)
    assert agents(lo)["consumer"] == ("mma", "vec")
    n = note(lo, "vec")
    assert n.reason.startswith("rule 2:") and "'p_in'" in n.reason


def test_flagship_softmax_stays_merged():
    from xsync.kernels.flash_attn import attention_fwd

    lo = attention_fwd.lower(NV, check=False)
    assert lo.placement.agent_of("softmax") is lo.placement.agent_of("mma")
    assert note(lo, "softmax").reason.startswith("rule 2:")


def test_shared_memory_and_warpgroup_limits_fall_back_with_the_reason():
    lo = lower(gemm_epilogue_role, STAGES=4)          # 4 x 32 KB + 2 x 64 KB > 227 KB
    assert agents(lo)["consumer"] == ("mma", "epi")
    n = note(lo, "epi")
    assert n.reason.startswith("rule 3:") and "262144 B" in n.reason and "lower stages" in n.ask
    with pytest.raises(AllocationError) as err:        # asked anyway: the allocator refuses
        lower(gemm_epilogue_role, STAGES=4, PLACEMENT="own")
    assert 'drop placement="own"' in err.value.fix and "'epi'" in err.value.fix
    lo = lower(paired_epilogue)
    assert agents(lo)["consumer"] == ("mma", "epi")
    assert note(lo, "epi").reason.startswith("rule 4:")


@pytest.mark.parametrize("backend", ["cpu", "ascend"])
def test_other_backends_accept_and_report_not_applicable(backend):
    lo = lower(gemm_epilogue_role, registry.get(backend), check=True, PLACEMENT="merged")
    n = note(lo, "epi")
    assert n.placement == "not applicable" and "Hopper choice" in n.reason
    assert "not applicable" in lo.allocation.table()
    assert lo.report.proven


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16))
def bad_value(x, y, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector", placement="separate")
    with work:
        xs.store(y, [0, 0], xs.load(x, [0, 0], [BLOCK, BLOCK]))


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16))
def on_a_copy_role(x, y, BLOCK: xs.constexpr):
    load = xs.role("load", kind="copy", placement="own")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=2, t=xs.tile([BLOCK, BLOCK], x.dtype))
    with load:
        s = ring.acquire()
        s.t = xs.load(x, [0, 0], [BLOCK, BLOCK])
        ring.commit()
    with work:
        got = ring.wait()
        xs.store(y, [0, 0], got.t)
        ring.release()


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16))
def merged_with_nothing(x, y, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector", placement="merged")
    with work:
        xs.store(y, [0, 0], xs.load(x, [0, 0], [BLOCK, BLOCK]))


@pytest.mark.parametrize("kernel,what,fix", [
    (bad_value, "placement='separate'", '"own"'),
    (on_a_copy_role, "of kind 'copy' asks placement='own'", "drop placement="),
    (merged_with_nothing, 'asks placement="merged" with replicas=1, but the kernel has no matrix role',
     "drop placement="),
])
@pytest.mark.parametrize("backend", ["cpu", "nvidia", "ascend"])
def test_errors_name_the_line_and_the_fix(kernel, what, fix, backend):
    with pytest.raises(KernelSourceError) as err:
        kernel.lower(registry.get(backend), check=False)
    e = err.value
    assert what in e.what and fix in e.fix
    assert e.loc.file.endswith("test_placement.py") and e.loc.line > kernel.fn.__code__.co_firstlineno


def test_merged_needs_the_matrix_role_replica_count():
    with pytest.raises(KernelSourceError) as err:
        lower(paired_epilogue_merged_mismatch)
    assert "matrix roles have replicas=1" in err.value.what
    assert "matrix role's replica count" in err.value.fix


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=64, BN=64, BK=64))
def paired_epilogue_merged_mismatch(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    epi = xs.role("epi", kind="vector", replicas=2, placement="merged")
    tiles = xs.pipe(load, mma, stages=2, a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    accs = xs.pipe(mma, epi, stages=2, c=xs.tile([BM, BN], xs.float32))
    with mma:
        acc = xs.zeros([BM, BN], xs.float32)
    for k in range(0, K, BK):
        with load:
            slot = tiles.acquire()
            slot.a = xs.load(a, [0, k], [BM, BK])
            slot.b = xs.load(b, [k, 0], [BK, BN])
            tiles.commit()
        with mma:
            ab = tiles.wait()
            acc = xs.mma(ab.a, ab.b, acc)
            acc = xs.mma_wait(acc, pending=0)
            tiles.release()
    with mma:
        out = accs.acquire()
        out.c = acc
        accs.commit()
    with epi:
        got = accs.wait()
        if xs.replica_id() == 0:
            xs.store(c, [0, 0], got.c)
        accs.release()


def test_check_and_lower_print_the_decision():
    r = subprocess.run([sys.executable, "-m", "xsync", "check", "tests/core/placement_kernels.py:gemm_epilogue_role",
                        "--backend", "nvidia"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "epi          1 x consumer warpgroup (4 warps, own): roles epi" in r.stdout
    line = next(x for x in r.stdout.splitlines() if x.split()[:2] == ["epi", "placement"])
    assert "own consumer warpgroup" in line and 'placement="merged"' in line
    r = subprocess.run([sys.executable, "-m", "xsync", "lower", "tests/core/placement_kernels.py:gemm_epilogue_role",
                        "--backend", "nvidia", "--set", "EPI_STAGES=1"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "merged with 'mma'" in r.stdout and "rule 1:" in r.stdout


def test_emulator_numerics_of_the_epilogue_kernel():
    torch.manual_seed(0)
    m, n, k = 48, 40, 64
    a, b = torch.randn(m, k).bfloat16(), torch.randn(k, n).bfloat16()
    bias = torch.randn(1, n)
    c = torch.zeros(m, n, dtype=torch.bfloat16)
    gemm_epilogue_role[(3,)](a, b, bias, c, m, n, k, BM=16, BN=16, BK=16, STAGES=2, EPI_STAGES=2,
                             backend="cpu")
    ref = torch.nn.functional.gelu(a.float() @ b.float() + bias)
    torch.testing.assert_close(c.float(), ref, atol=3e-2, rtol=3e-2)


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16))
def too_many_warpgroups(x, y, BLOCK: xs.constexpr):
    """Three vector roles of four replicas, each on its own: 12 warpgroups, 48 warps."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix", replicas=4)
    v1 = xs.role("v1", kind="vector", replicas=4, placement="own")
    v2 = xs.role("v2", kind="vector", replicas=4, placement="own")
    ring = xs.pipe(load, mma, stages=2, t=xs.tile([BLOCK, BLOCK], x.dtype))
    with load:
        s = ring.acquire()
        s.t = xs.load(x, [0, 0], [BLOCK, BLOCK])
        ring.commit()
    with mma:
        got = ring.wait()
        xs.store(y, [xs.replica_id() * BLOCK, 0], got.t)
        ring.release()
    with v1:
        xs.store(y, [xs.replica_id() * BLOCK, BLOCK], xs.zeros([BLOCK, BLOCK], xs.float32))
    with v2:
        xs.store(y, [xs.replica_id() * BLOCK, 2 * BLOCK], xs.zeros([BLOCK, BLOCK], xs.float32))


def test_more_warps_than_a_cta_holds_is_refused():
    with pytest.raises(AllocationError) as err:
        too_many_warpgroups.lower(NV, check=False)
    assert "a Hopper CTA runs at most 32" in err.value.what
    assert "drop placement=\"own\" from 'v1', 'v2'" in err.value.fix
    too_many_warpgroups.lower(registry.get("cpu"), check=False)   # the emulator takes it
