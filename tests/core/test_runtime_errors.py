"""Bounded time and launch arguments on the CPU emulator (issue 35, deliverable 4): the
watchdog fires on wall time whatever an agent does and names the agent and line; grids are
validated; `xsync trace` refuses what it cannot draw in bounded time."""
import inspect
import os
import time

import pytest
import torch

import xsync as xs
from xsync import cli
from xsync.backends.cpu import runtime
from xsync.backends.cpu.recording import MAX_OPS
from xsync.trace.run import MAX_PROGRAMS
from xsync.trace.timeline import TraceSetupError

EX = dict(x=xs.float32, y=xs.float32, BLOCK=16)
HERE = os.path.basename(__file__)


@xs.kernel(example=EX)
def spin(x, y, n, BLOCK: xs.constexpr):
    w = xs.role("w", kind="vector")
    with w:
        acc = xs.zeros([BLOCK, BLOCK], xs.float32)
        for i in range(n):  # SPIN
            acc = acc + 1.0
        xs.store(y, [0, 0], acc)


@xs.kernel(example=EX)
def spin_and_wait(x, y, n, BLOCK: xs.constexpr):
    prod = xs.role("prod", kind="vector")
    cons = xs.role("cons", kind="copy")
    ring = xs.pipe(prod, cons, stages=1, t=xs.tile([BLOCK, BLOCK], xs.float32))
    with prod:
        acc = xs.zeros([BLOCK, BLOCK], xs.float32)
        for i in range(n):  # SPIN
            acc = acc + 1.0
        s = ring.acquire()
        s.t = acc
        ring.commit()
    with cons:
        got = ring.wait()  # WAIT
        xs.store(y, [0, 0], got.t)
        ring.release()


@xs.kernel(example=EX)
def axes(x, y, BLOCK: xs.constexpr):
    w = xs.role("w", kind="vector")
    with w:
        t = xs.zeros([BLOCK, BLOCK], xs.float32) + (xs.program_id(1) * 10 + xs.num_programs(1))
        xs.store(y, [0, 0], t)


@xs.kernel(example=EX)
def ping(x, y, n, BLOCK: xs.constexpr):
    a = xs.role("a", kind="copy")
    b = xs.role("b", kind="vector")
    ring = xs.pipe(a, b, stages=2, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for i in range(n):
        with a:
            s = ring.acquire()
            s.t = xs.zeros([BLOCK, BLOCK], xs.float32)
            ring.commit()
        with b:
            got = ring.wait()
            ring.release()


@xs.kernel(example=EX)
def divides(x, y, d, BLOCK: xs.constexpr):
    w = xs.role("w", kind="vector")
    with w:
        t = xs.load(x, [0, 0], [BLOCK, BLOCK])
        t = xs.exp(xs.exp(xs.exp(xs.exp(t * 0.0))))
        t = xs.exp(xs.exp(xs.exp(xs.exp(t * 0.0))))
        xs.store(y, [BLOCK // d, 0], t)  # DIVIDES


def marker_line(kernel, marker):
    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, text in enumerate(lines) if f"# {marker}" in text)


def _tensors():
    return torch.ones(16, 16), torch.zeros(16, 16)


@pytest.mark.parametrize("mode", ["threads", "cooperative"])
def test_watchdog_fires_while_an_agent_computes(mode):
    """Was: the cooperative scheduler never got control back from a computing agent (hang);
    the threaded one reported no agent or line."""
    x, y = _tensors()
    start = time.monotonic()
    with xs.options(cpu_timeout=1.0, cpu_mode=mode), pytest.raises(xs.LaunchError) as info:
        spin[(1,)](x, y, 10**9, BLOCK=16, backend="cpu")
    assert time.monotonic() - start < 4
    err, msg = info.value, str(info.value)
    assert "did not finish within 1 s" in msg
    assert err.loc.file.endswith(HERE) and err.loc.line in (marker_line(spin, "SPIN"), marker_line(spin, "SPIN") + 1)
    assert "w: computing at" in msg and "(i=" in msg
    assert "XSYNC_CPU_TIMEOUT" in err.fix


@pytest.mark.parametrize("mode", ["threads", "cooperative"])
def test_watchdog_names_the_blocked_agent_too(mode):
    x, y = _tensors()
    with xs.options(cpu_timeout=1.0, cpu_mode=mode), pytest.raises(xs.LaunchError) as info:
        spin_and_wait[(1,)](x, y, 10**9, BLOCK=16, backend="cpu")
    msg = str(info.value)
    assert "prod: computing at" in msg
    if mode == "threads":
        assert "cons: blocked: wait on pipe 'ring'" in msg
        assert f"{HERE}:{marker_line(spin_and_wait, 'WAIT')}" in msg
    else:   # one thread: the consumer has not had its first turn while the producer computes
        assert "cons: ready to run" in msg


@pytest.mark.parametrize("mode", ["threads", "cooperative"])
def test_one_deadline_covers_the_whole_grid(mode):
    """Was: the limit applied to each program, so 100,000 quick programs ran unbounded."""
    x, y = _tensors()
    start = time.monotonic()
    with xs.options(cpu_timeout=1.0, cpu_mode=mode), pytest.raises(xs.LaunchError) as info:
        spin[(100_000,)](x, y, 50, BLOCK=16, backend="cpu")
    assert time.monotonic() - start < 4
    assert "of 100000 programs finished" in str(info.value)


def test_varlen_with_a_huge_max_seqlen_runs_for_the_real_lengths():
    from xsync.kernels.flash_attn import attention_varlen

    q = torch.randn(32, 2, 64).bfloat16()
    cu = torch.tensor([0, 16, 32], dtype=torch.int32)
    with xs.options(cpu_timeout=5.0):
        o, _ = attention_varlen(q, q, q, cu, cu, 10**9, 10**9)
        ref, _ = attention_varlen(q, q, q, cu, cu, 16, 16)
    torch.testing.assert_close(o, ref)


@pytest.mark.parametrize("grid,words", [
    ("one", "'one' is a str"), (None, "None is a NoneType"), ((2.0,), "2.0 is a float"),
    ((True,), "True is a bool"), ((1, None), "None is a NoneType"), ((-1,), "outside 0.."),
    ((2**40,), "outside 0.."), ((), "has 0 axes"), ((1, 1, 1, 1), "has 4 axes"),
    (lambda meta: "x", "'x' is a str"),
])
def test_bad_grids_are_launch_errors_at_the_call(grid, words):
    x, y = _tensors()
    with pytest.raises(xs.LaunchError) as info:
        axes[grid](x, y, BLOCK=16, backend="cpu")      # the line the error names
    err = info.value
    assert words in str(err)
    assert err.loc is not None and err.loc.file == __file__
    assert "fix:" in str(err) and "axes[(n,)]" in err.fix or "1 to 3 sizes" in err.fix


def test_grids_of_index_types_are_accepted():
    x, y = _tensors()
    axes[(torch.tensor(1), 2)](x, y, BLOCK=16, backend="cpu")
    assert y[0, 0].item() == 12            # the last program: program_id(1) = 1 of 2


def test_an_axis_the_grid_leaves_out_has_one_program():
    """Was: IndexError from the emulator for program_id(1) on a 1-D grid (the GPU says 0)."""
    x, y = _tensors()
    axes[(1,)](x, y, BLOCK=16, backend="cpu")
    assert y[0, 0].item() == 1             # program_id(1) = 0, num_programs(1) = 1


def test_trace_refuses_a_grid_it_cannot_draw(capsys, tmp_path):
    rc = cli.main(["trace", "kernels/gemm.py:gemm", "--grid", "100000", "--out", str(tmp_path / "g.svg")])
    err = capsys.readouterr().err
    assert rc == 1 and "TraceSetupError" in err
    assert f"at most {MAX_PROGRAMS} programs" in err and "gemm.py:" in err and "fix: " in err
    assert not (tmp_path / "g.svg").exists()


def test_trace_api_refuses_the_grid_too():
    from xsync.kernels.gemm import gemm
    from xsync.trace import trace_kernel

    with pytest.raises(TraceSetupError, match=f"at most {MAX_PROGRAMS}"):
        trace_kernel(gemm, grid=(MAX_PROGRAMS + 1,))


def test_the_recorder_stops_at_its_op_budget():
    x, y = _tensors()
    start = time.monotonic()
    with runtime.record(), pytest.raises(xs.LaunchError) as info:
        ping[(1,)](x, y, MAX_OPS, BLOCK=16, backend="cpu")
    assert time.monotonic() - start < 10
    err = info.value
    assert f"passed {MAX_OPS} sync ops" in str(err) and err.loc.file.endswith(HERE)
    assert "--set" in err.fix


@pytest.mark.parametrize("mode", ["threads", "cooperative"])
def test_the_kernels_own_error_names_its_line_role_and_scalars(mode):
    """Was: a raw ZeroDivisionError whose traceback ended in the generated source."""
    x, y = _tensors()
    with xs.options(cpu_mode=mode), pytest.raises(xs.LaunchError) as info:
        divides[(1,)](x, y, 0, BLOCK=16, backend="cpu")
    err, msg = info.value, str(info.value)
    assert err.loc.file.endswith(HERE) and err.loc.line == marker_line(divides, "DIVIDES")
    assert "raised ZeroDivisionError in role 'w'" in msg and "d = 0" in msg
    assert isinstance(err.__cause__, ZeroDivisionError)
    assert not y.any()


def test_an_agent_that_fails_past_the_deadline_is_reported_failed_not_done():
    """Was: an agent whose own error stopped it after the deadline read as "done". Eight
    exponentials of a 2048 x 2048 tile take longer than the timeout, and straight-line code
    has no loop iteration or sync call to stop at, so the error comes past the deadline."""
    x, y = torch.ones(2048, 2048), torch.zeros(2048, 2048)
    with xs.options(cpu_timeout=0.005, cpu_mode="threads"), pytest.raises(xs.LaunchError) as info:
        divides[(1,)](x, y, 0, BLOCK=2048, backend="cpu")
    msg = str(info.value)
    assert "did not finish within" in msg, msg
    assert "w: failed: ZeroDivisionError: integer division or modulo by zero at " in msg
    assert f"{HERE}:{marker_line(divides, 'DIVIDES')}" in msg
