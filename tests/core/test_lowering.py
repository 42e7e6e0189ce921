"""Frontend, placement and allocation of the example kernels on every backend."""
import re

import pytest

import xsync as xs
from xsync.kernels.gemm import gemm, gemm_persistent, gemm_persistent_2wg
from xsync.kernels.gemm_softmax import gemm_softmax
from xsync.lowering import ir
from xsync.lowering.slicing import slice_agent


def test_frontend_builds_ir():
    k = gemm.lower("cpu").kernel
    assert [r.name for r in k.roles] == ["load", "mma"]
    (p,) = k.pipes
    assert (p.src, p.dst, p.stages) == ("load", "mma", 3)
    assert [(f.name, f.shape, f.dtype.name) for f in p.fields] == [
        ("a", (128, 64), "bfloat16"), ("b", (64, 128), "bfloat16")]
    verbs = [s.verb for s in ir.walk(k.body) if isinstance(s, ir.SyncOp)]
    assert verbs == ["acquire", "commit", "wait", "release"]


def test_placements():
    assert [(a.name, a.roles) for a in gemm.lower("nvidia").placement.agents] == [
        ("producer", ("load",)), ("consumer", ("mma",))]
    assert [(a.name, a.roles) for a in gemm.lower("ascend").placement.agents] == [
        ("cube", ("load", "mma"))]
    agents = gemm_softmax.lower("ascend").placement.agents
    assert [(a.name, a.roles, a.replicas) for a in agents] == [
        ("cube", ("load", "mma"), 1), ("vector", ("epilogue",), 2)]


def test_nvidia_allocation_table():
    alloc = gemm_softmax.lower("nvidia").allocation
    table = alloc.table()
    assert "mbarrier[2] count=1, expect 16384 B (TMA)" in table        # tiles: TMA completion
    assert "mbarrier[2] count=2" in table                              # scores: 2 consumers release
    assert "parity (i // stages) & 1" in table
    assert dict(alloc.barrier_ids)["team"] == 15                       # above the compiler's IDs
    assert "256 threads" in table
    assert [p.label for p in alloc.partitions] == ["mma", "epilogue[0]", "epilogue[1]", "producer"]


def test_ascend_allocation_table():
    alloc = gemm_softmax.lower("ascend").allocation
    ids = dict(alloc.event_ids)
    # from the top of the range CANN documents (0-10), where the compiler's own IDs never start
    assert ids == {"scores:full": 10, "scores:empty": 9, "team": 8}
    table = alloc.table()
    assert "flag 10 (cube -> vector)" in table and "flag 9 (vector -> cube)" in table
    assert "mode all_vector" in table
    assert alloc.workspace_bytes == 2 * 16 * 1024
    assert re.search(r"tiles\s+same core", table)


def test_slicing_drops_other_roles_and_dead_code():
    k = gemm_softmax.lower("cpu").kernel
    load_body = slice_agent(k.body, ("load",))
    roles = {s.role for s in ir.walk(load_body) if isinstance(s, ir.RoleBlock)}
    assert roles == {"load"}
    assigned = {t for s in ir.walk(load_body) if isinstance(s, ir.Assign) for t in s.targets}
    assert {"off_m", "off_n"} <= assigned
    mma_body = slice_agent(k.body, ("mma",))
    assigned = {t for s in ir.walk(mma_body) if isinstance(s, ir.Assign) for t in s.targets}
    assert "off_m" not in assigned and "off_n" not in assigned   # replicated but unused: dropped


@pytest.mark.parametrize("backend", ["cpu", "nvidia", "ascend"])
def test_examples_verify_on_every_backend(backend):
    for kernel in (gemm, gemm_persistent, gemm_softmax):
        report = kernel.lower(backend).report
        assert report.complete and report.states > 0


@pytest.mark.parametrize("backend", ["cpu", "nvidia", "ascend"])
def test_two_replica_persistent_gemm_is_proven_on_every_placement(backend):
    """gemm_persistent_2wg is accepted everywhere for every value of its scalars: its
    persistent tile loop is checked tile by tile (the general check, which combined the
    program ids with M, N and K, could only thin its candidates on cpu and nvidia)."""
    report = gemm_persistent_2wg.lower(backend).report
    assert report.states > 0 and report.complete
    summary = report.summary()
    assert summary.startswith(f"verified for {backend}: ") and "for every value of" in summary
    assert "its iterations are independent" in summary


def test_paired_pipe_allocates_a_ring_per_replica_pair():
    """The allocation table prints what the renderer allocates: N -> N pipes have one ring per
    replica pair, so rings x stages mbarriers per side (the skeleton's channels)."""
    from tests.core.corpus import pairing_paired_across_agents as k
    lw = k.lower("nvidia")
    link = lw.skeleton.link("ring")
    assert link.pairing == "N -> N paired" and link.rings == 2
    full, empty = lw.allocation.mbarrier("ring", "full"), lw.allocation.mbarrier("ring", "empty")
    assert (full.barriers, full.arrive_count) == (4, 1)
    assert (empty.barriers, empty.arrive_count) == (4, 1)      # one consumer per channel
    assert "mbarrier[4] count=1" in lw.allocation.table() and "2 rings" in lw.allocation.table()
    # a Hopper allocation (per-target type) has no Ascend block barriers or workspace at all
    from xsync.backends.nvidia.alloc import HopperAllocation
    assert isinstance(lw.allocation, HopperAllocation) and not hasattr(lw.allocation, "workspace")


def test_broadcast_and_gather_arrive_counts_come_from_the_channels():
    from tests.core.corpus import pairing_gather_with_ack as k
    lw = k.lower("nvidia")
    done, ack = lw.skeleton.link("done"), lw.skeleton.link("ack")
    assert done.pairing == "N -> 1 gather" and done.producer_arrivals == 2
    assert ack.pairing == "1 -> N broadcast" and len(ack.channels[0].consumers) == 2
    assert lw.allocation.mbarrier("done", "event").arrive_count == 2
    assert lw.allocation.mbarrier("ack", "event").arrive_count == 1


def test_barrier_members_that_share_an_agent_meet_once():
    from tests.core.corpus import correct_barrier_of_roles_sharing_an_agent as k
    nv = k.lower("nvidia")
    team = nv.skeleton.barrier("team")
    assert [nv.skeleton.instances[m].label for m in team.members] == ["producer", "consumer"]
    assert nv.allocation.named_barrier("team").threads == 32 * (1 + 4)
    points = [p for p in nv.skeleton.points if p.agent == "consumer"]
    assert len(points) == 1 and points[0].roles == ("mma", "softmax") and points[0].merged
    assert nv.skeleton.renders("consumer", points[0].ops[0]) is None      # mma's call: skipped
    assert nv.skeleton.renders("consumer", points[0].ops[1]) is points[0]  # softmax's: rendered
    asc = k.lower("ascend")
    assert [p.roles for p in asc.skeleton.points if p.agent == "cube"] == [("load", "mma")]
    assert asc.allocation.block_barrier("team").mode == "all"


def test_all_roles_barrier():
    from tests.core.corpus import correct_all_roles_barrier as k
    kir = k.lower("cpu").kernel
    (b,) = kir.barriers
    assert b.all_roles and b.members == ("load", "mma", "softmax")
    assert k.lower("cpu").skeleton.barrier("everyone").arrivals == 4     # softmax has 2 replicas
    assert k.lower("ascend").allocation.block_barrier("everyone").mode == "all"


def test_event_between_different_replica_counts_is_rejected():
    from xsync.errors import KernelSourceError

    @xs.kernel
    def bad(n):
        a = xs.role("a", kind="copy", replicas=2)
        b = xs.role("b", kind="vector", replicas=3)
        e = xs.event(a, b)
        with a:
            xs.signal(e)
        with b:
            xs.wait(e)

    with pytest.raises(KernelSourceError, match="1 -> N .* N -> N .* N -> 1"):
        bad.lower("cpu")


@pytest.mark.parametrize("M,N,K,programs", [(48, 80, 64, 2), (33, 50, 70, 3), (16, 16, 16, 1),
                                            (64, 64, 32, 7), (80, 16, 48, 4)])
def test_persistent_gemm_walks_every_tile_once(M, N, K, programs):
    """Fewer (or more) programs than output tiles: each walks tiles p, p + P, ...; the ring's
    counters run on across tiles; ragged edges; every C element written exactly once (NaN
    fill)."""
    import torch

    torch.manual_seed(0)
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = torch.full((M, N), float("nan"))
    gemm_persistent[(programs,)](a, b, c, M, N, K, BM=16, BN=16, BK=16, STAGES=2, GROUP_M=2,
                                 backend="cpu")
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-4, atol=1e-4)
    c = torch.full((M, N), float("nan"))
    gemm_persistent_2wg[(programs,)](a, b, c, M, N, K, BM=16, BN=16, BK=16, STAGES=2, GROUP_M=2,
                                     backend="cpu")      # tiles of 32 rows, two replicas
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-4, atol=1e-4)
