"""Misuse the Ascend backend must reject before the hardware hangs, naming the kernel's
file:line, the pipes/events involved and the fix."""
import ascend_cases as cases
import pytest

from xsync.kernels.gemm_softmax import gemm_softmax
from xsync.backends.ascend import DEFAULT_CORES, compile_kernel
from xsync.errors import AllocationError, BackendError, LaunchError, ProtocolError


def bug_line(fn):
    """Line of the `# BUG` marker inside a case kernel."""
    import inspect
    lines, first = inspect.getsourcelines(fn.fn)
    return first + next(i for i, text in enumerate(lines) if "# BUG" in text)


def compile_ascend(kernel, form="release"):
    lw = kernel.lower("ascend")
    return compile_kernel(lw.kernel, lw.placement, lw.allocation, form=form)


def test_event_budget_17_directions(monkeypatch):
    with pytest.raises(AllocationError) as err:
        cases.seventeen_directions.lower("ascend")
    assert "17 cross-core event IDs; the Ascend budget is 11 (IDs 0-10)" in str(err.value)
    monkeypatch.setenv("XSYNC_ASCEND_EVENT_IDS", "16")
    with pytest.raises(AllocationError) as err:
        cases.seventeen_directions.lower("ascend")
    msg = str(err.value)
    assert "17 cross-core event IDs" in msg and "budget is 16" in msg
    assert f"ascend_cases.py:{bug_line(cases.seventeen_directions)}" in msg
    for name in [f"p{i}" for i in range(8)] + ["done"]:
        assert name in err.value.objects
    assert "p7 (vector->cube)" in msg and "done (vector->cube)" in msg
    assert "XSYNC_ASCEND_EVENT_IDS" in err.value.fix


def test_event_budget_cap_from_env(monkeypatch):
    monkeypatch.setenv("XSYNC_ASCEND_EVENT_IDS", "2")       # gemm_softmax needs 3
    with pytest.raises(AllocationError) as err:
        gemm_softmax.lower("ascend", check=False)
    assert "needs 3 cross-core event IDs; the Ascend budget is 2 (IDs 0-1)" in str(err.value)
    assert "scores" in err.value.objects and "team" in err.value.objects


def test_sixteen_stages_exceed_flag_counter():
    with pytest.raises(AllocationError) as err:
        cases.sixteen_stages.lower("ascend", check=False)
    msg = str(err.value)
    assert "pipe 'ring' has stages=16" in msg and "at most 15" in msg
    assert f"ascend_cases.py:{bug_line(cases.sixteen_stages)}" in msg
    assert err.value.fix == "use stages <= 15"


def test_sixteen_pending_sets_on_an_event_flag():
    with pytest.raises(ProtocolError) as err:
        cases.sixteen_pending_sets.lower("ascend")
    msg = str(err.value)
    assert "flag overflow" in msg and "16 sets pending" in msg and "at most 15" in msg
    assert f"ascend_cases.py:{bug_line(cases.sixteen_pending_sets)}" in msg
    assert err.value.objects == ("ready",)


def test_cross_core_sync_without_cube_work():
    with pytest.raises(BackendError) as err:
        cases.no_cube_work.compile("ascend")
    msg = str(err.value)
    assert "does no matrix work" in msg and 'mix_mode "aiv"' in msg and "wait forever" in msg
    assert f"ascend_cases.py:{bug_line(cases.no_cube_work)}" in msg
    assert "ring (cube -> vector)" in msg and "kind 'copy' or 'vector'" in err.value.fix


@pytest.mark.parametrize("form", ["release", "scope"])
def test_cube_producer_without_mma(form):
    if form == "scope":      # al.scope pins the copy role to the cube: accepted
        assert "al.scope" in compile_ascend(cases.cube_loads_for_vector, form).source
        return
    with pytest.raises(BackendError) as err:
        compile_ascend(cases.cube_loads_for_vector, form)
    assert "not computed by xs.mma" in str(err.value)
    assert f"ascend_cases.py:{bug_line(cases.cube_loads_for_vector)}" in str(err.value)


def test_replica_dependent_sync_in_lockstep():
    with pytest.raises(BackendError) as err:
        compile_ascend(cases.replica_branch_sync, "release")
    assert "depends on xs.replica_id()" in str(err.value)
    assert f"ascend_cases.py:{bug_line(cases.replica_branch_sync)}" in str(err.value)


def test_grid_larger_than_core_count(monkeypatch):
    monkeypatch.delenv("XSYNC_ASCEND_CORES", raising=False)
    compiled = gemm_softmax.compile("ascend")
    with pytest.raises(LaunchError) as err:
        compiled.launch((DEFAULT_CORES + 1, 1), {})
    msg = str(err.value)
    assert f"launches {DEFAULT_CORES + 1} programs" in msg and f"at most {DEFAULT_CORES} AI cores" in msg
    assert "gemm_softmax.py:" in msg and err.value.objects == ("team",)
    assert "XSYNC_ASCEND_CORES" in err.value.fix
    monkeypatch.setenv("XSYNC_ASCEND_CORES", "4")
    with pytest.raises(LaunchError, match="launches 6 programs.*at most 4 AI cores"):
        compiled.launch((3, 2), {})
    monkeypatch.setenv("XSYNC_ASCEND_CORES", "64")
    compiled.check_grid((64, 1))                              # fits: no error


def test_kernel_without_barrier_has_no_grid_limit():
    from xsync.kernels.gemm import gemm
    gemm.compile("ascend").check_grid((10_000, 10))


def test_unknown_form(monkeypatch):
    from xsync.backends.ascend import select_form
    from xsync.config import ConfigError
    monkeypatch.setenv("XSYNC_ASCEND_FORM", "fancy")
    with pytest.raises(ConfigError, match="XSYNC_ASCEND_FORM=fancy is not valid"):
        select_form()
    monkeypatch.delenv("XSYNC_ASCEND_FORM")
    with pytest.raises(BackendError, match="unknown Ascend source form 'fancy'"):
        select_form("fancy")
