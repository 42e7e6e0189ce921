"""Kernels of copy and vector roles without matrix work (issue 34, deliverable 4): one source
lowers on every backend. On Ascend they run vector-only (``mix_mode "aiv"``: no cube core
runs), every role on one vector core in source order, each pipe a GM ring of ``stages`` slots
used in program order (no flag); a kernel with matrix work keeps the cube/vector placement.

Stages: the verifier proves them on that placement (or rejects them with a counterexample);
the generated source reaches hivmc through the real triton-ascend frontend and HIVM compiler
(ascend venv); the simulator runs it against float64 torch (ascend venv); the CPU emulator
runs the same source (any venv) and the Hopper lowering compiles to PTX (nvidia venv)."""
import re

import pytest
import torch

import vector_only_kernels as V
import xsync as xs
from tests.core import corpus as C
from xsync.backends.ascend.placement import vector_only
from xsync.compiler import Kernel
from xsync.errors import DeadlockError, ProtocolError, XSyncError
from xsync.lowering.placement import Unit

KERNELS = [V.rmsnorm, V.rmsnorm_two_replicas, V.rowscale_deferred_release]
IDS = [k.__name__ for k in KERNELS]


def vector_only_corpus():
    """The corpus kernels without matrix work that the verifier accepts on Ascend."""
    out = []
    for name, k in sorted(vars(C).items()):
        if not isinstance(k, Kernel):
            continue
        try:
            lowered = k.lower("ascend")
        except XSyncError:
            continue
        if vector_only(lowered.kernel):
            out.append(pytest.param(k, id=name))
    return out


def reference(kernel, x, w):
    x = x.double()
    if kernel is V.rowscale_deferred_release:
        return 2 * x
    return x * torch.rsqrt((x * x).mean(1, keepdim=True) + 1e-6) * w.double()


def launch(kernel, backend=None, M=96, N=48, BM=16, blocks=3):
    torch.manual_seed(0)
    x, w = torch.randn(M, N), torch.randn(1, N)
    y = torch.full((M, N), float("nan"))
    extra = {} if backend is None else {"backend": backend}
    kernel[(M // (BM * blocks),)](x, w, y, M, N, blocks, BM=BM, BN=64, STAGES=2, **extra)
    return y, reference(kernel, x, w)


# ---------------------------------------------------------------- placement and verdicts
@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_one_vector_core_runs_every_role(kernel):
    lowered = kernel.lower("ascend")
    agent, = lowered.placement.agents
    assert agent.unit is Unit.VECTOR and agent.memory_pipes and agent.replicas == 1
    assert set(agent.roles) == {r.name for r in lowered.kernel.roles}
    assert agent.serial == tuple(r.name for r in lowered.kernel.roles if r.replicas > 1)
    report = lowered.report
    assert report.complete and "every value of" in report.summary()
    assert not lowered.allocation.event_ids            # no cross-core flag at all
    assert lowered.allocation.workspace               # the pipe's GM ring


def test_kernels_with_matrix_work_keep_the_cube():
    from xsync.kernels.gemm_softmax import gemm_softmax
    units = [a.unit for a in gemm_softmax.lower("ascend").placement.agents]
    assert units == [Unit.CUBE, Unit.VECTOR]


@pytest.mark.parametrize("form", ["release", "scope"])
@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_source_has_no_cross_core_sync(kernel, form):
    from xsync.backends.ascend import render
    lowered = kernel.lower("ascend")
    src = render.render_module(lowered.kernel, lowered.placement, lowered.allocation, form).source
    assert "sync_block_set" not in src and "sync_block_wait" not in src
    assert "sub_vec_id" not in src and 'core_mode="cube"' not in src
    assert "tl.debug_barrier()" in src                # the GM ring's write -> read fence
    compile(src, kernel.__name__, "exec")


def test_deferred_release_needs_the_ring_stages():
    """The consumer holds a slot while the next one is written: 2 stages in GM, proven."""
    report = C.correct_deferred_release.lower("ascend").report
    assert report.complete
    with pytest.raises(DeadlockError) as err:
        C.hint_too_few_stages.lower("ascend")
    assert "raise stages to at least 3 (now 2)" in err.value.fix
    assert C.hint_too_few_stages_fixed.lower("ascend").report.complete


def test_replicas_on_one_vector_core_run_in_lockstep():
    """A vector-only program is one vector core: a 1 -> 2 pipe's replicas run there in lockstep,
    so a sync verb under a replica-dependent branch is rejected at its line, with the fix."""
    with pytest.raises(ProtocolError) as err:
        C.pairing_broadcast_one_replica_skips.lower("ascend")
    msg = str(err.value)
    assert "agent 'vector' runs the replicas of 'work' one after another" in msg
    assert err.value.loc.file.endswith("corpus.py")
    assert "branch only the work on xs.replica_id()" in err.value.fix


@xs.kernel(example=C.EX)
def arrive_waits_with_cube(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    cube = xs.role("cube", kind="matrix")
    vec = xs.role("vec", kind="vector")
    team = xs.barrier(cube, vec)
    go = xs.event(cube, vec)
    for i in range(n):
        with vec:
            xs.wait(go)
            team.sync()
        with cube:
            team.arrive()
            xs.signal(go)


@xs.kernel(example=C.EX)
def arrive_waits_with_cube_fixed(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    cube = xs.role("cube", kind="matrix")
    vec = xs.role("vec", kind="vector")
    team = xs.barrier(cube, vec)
    go = xs.event(cube, vec)
    for i in range(n):
        with vec:
            xs.wait(go)
            team.sync()
        with cube:
            xs.signal(go)
            team.arrive()


def test_arrive_hint_between_cube_and_vector():
    """The corpus's arrive hint, with a cube core (its copy-role spelling is vector-only now)."""
    with pytest.raises(DeadlockError) as err:
        arrive_waits_with_cube.lower("ascend")
    assert "no arrive-only form" in str(err.value)
    assert "call team.arrive() after the signals and commits" in err.value.fix
    assert arrive_waits_with_cube_fixed.lower("ascend").report.complete


# ---------------------------------------------------------------- the CPU emulator
@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_cpu_emulator(kernel):
    y, ref = launch(kernel, "cpu")
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- Hopper
@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_hopper_compiles(kernel):
    try:
        import triton.experimental.gluon  # noqa: F401
    except ImportError:
        pytest.skip("upstream triton with Gluon is not installed: run with the nvidia venv")
    from xsync.backends.nvidia import compile_ptx
    r = compile_ptx(kernel.lower("nvidia"))
    assert ".target sm_90a" in r.ptx and "mbarrier" in r.ptx


# ---------------------------------------------------------------- triton-ascend
@pytest.fixture(scope="module")
def hivm_compiler(triton_ascend):
    from xsync.backends.ascend import hivm
    if hivm.compiler_path() is None:
        pytest.fail("bishengir-compile is missing: the ascend environment installs ascendnpu-ir")
    return hivm


@pytest.mark.parametrize("kernel", [pytest.param(k, id=k.__name__) for k in KERNELS]
                         + vector_only_corpus())
def test_hivm_compiles_vector_only(kernel, hivm_compiler):
    lowered = kernel.lower("ascend")
    result = hivm_compiler.compile_lowered(lowered, timeout=180)
    assert result.reached_hivmc, result.describe()
    assert set(re.findall(r'mix_mode = "(\w+)"', result.after_split)) == {"aiv"}
    assert sorted(result.functions) == [kernel.__name__]           # no cube function
    assert "#hivm.sub_block" not in result.after_binding           # one program = one vector core
    # no pipe flag: only sync_block_all of a barrier may remain
    assert result.flags() == {f for _, f in lowered.allocation.event_ids}
    if lowered.allocation.workspace:
        assert "hivm.hir.pipe_barrier[<PIPE_ALL>]" in result.after_split


@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_simulator_numerics(kernel, triton_ascend, monkeypatch):
    monkeypatch.setenv("XSYNC_BACKEND", "ascend-sim")
    y, ref = launch(kernel)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
