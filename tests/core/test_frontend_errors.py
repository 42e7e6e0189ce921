"""Frontend completeness (issue 35): every construct a kernel body may hold is given its meaning
or refused at `check` with the kernel's file:line and a fix; tile shapes (mma, broadcast, slot
fields), loop bounds and declarations are checked before any backend or the emulator meets
them; run-time scalars used as integers refuse floats at launch, naming the parameter."""
import inspect
import os
import sys

import pytest
import torch

import xsync as xs
from xsync import backends, cli
from xsync.errors import BackendError, KernelSourceError, LaunchError

EX = dict(x=xs.float32, y=xs.float32, BLOCK=16)
BACKENDS = ("cpu", "nvidia", "ascend")


@xs.kernel(example=EX)
def membership(x, y, n, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        for i in range(n):
            if i in n:  # BUG
                xs.store(y, [i * BLOCK, 0], xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK]))


@xs.kernel(example=EX)
def identity_of_run_time_value(x, y, n, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        if n is not None:  # BUG
            xs.store(y, [0, 0], xs.load(x, [0, 0], [BLOCK, BLOCK]))


@xs.kernel(example=EX)
def folded_comparisons(x, y, n, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        if BLOCK is not None and BLOCK in (8, 16) and BLOCK not in [32]:
            xs.store(y, [0, 0], xs.load(x, [0, 0], [BLOCK, BLOCK]))


@xs.kernel(example=EX)
def step_zero(x, y, n, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        for i in range(0, n, 0):  # BUG
            xs.store(y, [i * BLOCK, 0], xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK]))


@xs.kernel(example=EX)
def float_loop_bound(x, y, n, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        for i in range(0, 2.5):  # BUG
            xs.store(y, [i * BLOCK, 0], xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK]))


@xs.kernel(example=EX)
def division_by_zero_in_shape(x, y, n, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        t = xs.zeros([BLOCK // 0, BLOCK], xs.float32)  # BUG
        xs.store(y, [0, 0], t)


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16, STAGES=2 ** 31))
def huge_stages(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))  # BUG
    with load:
        s = ring.acquire()
        s.t = xs.load(x, [0, 0], [BLOCK, BLOCK])
        ring.commit()
    with work:
        got = ring.wait()
        xs.store(y, [0, 0], got.t)
        ring.release()


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=4.0))
def float_tile_dimension(x, y, n, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        xs.store(y, [0, 0], xs.load(x, [0, 0], [BLOCK, 16]))  # BUG


@xs.kernel(example=EX)
def slot_field_of_another_shape(x, y, n, BLOCK: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=2, t=xs.tile([BLOCK, BLOCK], xs.float32))
    with load:
        s = ring.acquire()
        s.t = xs.load(x, [0, 0], [8, BLOCK])  # BUG
        ring.commit()
    with work:
        got = ring.wait()
        xs.store(y, [0, 0], got.t)
        ring.release()


@xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, y=xs.float32))
def mma_inner_dimensions(a, b, y):
    load = xs.role("load", kind="copy")
    mm = xs.role("mm", kind="matrix")
    ops = xs.pipe(load, mm, stages=1, a=xs.tile([64, 32], xs.bfloat16), b=xs.tile([16, 64], xs.bfloat16))
    with load:
        s = ops.acquire()
        s.a = xs.load(a, [0, 0], [64, 32])
        s.b = xs.load(b, [0, 0], [16, 64])
        ops.commit()
    with mm:
        got = ops.wait()
        acc = xs.mma(got.a, got.b, xs.zeros([64, 64], xs.float32))  # BUG
        acc = xs.mma_wait(acc)
        ops.release()
        xs.store(y, [0, 0], acc)


@xs.kernel(example=EX)
def broadcast_mismatch(x, y, n, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        t = xs.load(x, [0, 0], [BLOCK, BLOCK]) + xs.load(x, [0, 0], [8, BLOCK])  # BUG
        xs.store(y, [0, 0], t)


@xs.kernel(example=EX)
def reduce_wrong_axis(x, y, n, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        m = xs.max(xs.load(x, [0, 0], [BLOCK, BLOCK]), 2)  # BUG
        xs.store(y, [0, 0], m[:, None])


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=12))
def not_a_power_of_two(x, y, n, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        xs.store(y, [0, 0], xs.load(x, [0, 0], [BLOCK, BLOCK]))  # BUG


@xs.kernel(example=EX)
def rows_copy(x, y, n, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        for i in range(n):
            xs.store(y, [i * BLOCK, 0], xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK]))


@xs.kernel(example=EX)
def keyword_arguments(x, y, n, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        t = xs.load(x, offsets=[0, 0], shape=[BLOCK, BLOCK])
        xs.store(y, [0, 0], t - xs.max(t, axis=1)[:, None] + xs.sum(x=t, axis=0)[None, :])


@xs.kernel(example=EX)
def unknown_keyword(x, y, n, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        t = xs.load(x, [0, 0], [BLOCK, BLOCK])
        xs.store(y, [0, 0], xs.max(t, dim=1)[:, None])  # BUG


@xs.kernel(example=EX)
def argument_twice(x, y, n, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        t = xs.load(x, [0, 0], [BLOCK, BLOCK])
        xs.store(y, [0, 0], xs.sum(t, 1, axis=1)[:, None])  # BUG


@xs.kernel(example=EX)
def argument_missing(x, y, n, BLOCK: xs.constexpr):
    work = xs.role("work", kind="vector")
    with work:
        t = xs.load(x, [0, 0], shape=[BLOCK, BLOCK])
        xs.store(y, [0, 0], xs.sum(t)[:, None])  # BUG


def bug_line(kernel) -> int:
    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, text in enumerate(lines) if "# BUG" in text)


def assert_names_bug(exc, kernel, *words):
    text = str(exc)
    assert f"{os.path.basename(__file__)}:{bug_line(kernel)}" in text, text
    assert exc.fix, text
    for w in words:
        assert w in text, text


REFUSED = [
    (membership, "membership (`in`)", "=="),
    (identity_of_run_time_value, "`is not` is known only on compile-time values", "constexpr"),
    (step_zero, "step 0", "step of 1"),
    (float_loop_bound, "is 2.5, not an integer", "integer"),
    (division_by_zero_in_shape, "xs.zeros divides by zero", "constexpr"),
    (huge_stages, "stages=2147483648, more than 64", "2-4 stages"),
    (float_tile_dimension, "4.0, not an integer", "positive integers"),
    (slot_field_of_another_shape, "declared [16, 16] but written with [8, 16]", "ring"),
    (mma_inner_dimensions, "inner dimensions differ (32 vs 16)", "[K, N]"),
    (broadcast_mismatch, "[16, 16], [8, 16] do not broadcast", "None"),
    (reduce_wrong_axis, "axis 2 of a [16, 16] value", "axis is 0..1"),
    (unknown_keyword, "xs.max has no keyword 'dim'", "xs.max(x, axis)"),
    (argument_twice, "xs.sum got 'axis' twice", "xs.sum(x, axis)"),
    (argument_missing, "xs.sum takes 2 arguments (x, axis), got 1", "xs.sum(x, axis)"),
]


@pytest.mark.parametrize("kernel,what,fix", REFUSED, ids=[k.__name__ for k, _, _ in REFUSED])
def test_refused_at_check_on_every_backend(kernel, what, fix):
    for backend in BACKENDS:
        with pytest.raises(KernelSourceError) as err:
            kernel.lower(backend)
        assert_names_bug(err.value, kernel, what, fix)


def test_refused_before_the_emulator_runs():
    # the launch lowers first: the emulator never meets the shape error check would report
    x, y = torch.randn(64, 64), torch.zeros(64, 64)
    with pytest.raises(KernelSourceError) as err:
        slot_field_of_another_shape[(1,)](x, y, 1, BLOCK=16, backend="cpu")
    assert_names_bug(err.value, slot_field_of_another_shape, "ring")


def test_arguments_by_parameter_name():
    # xs.max(t, axis=1), xs.load(x, offsets=..., shape=...): Python's spelling of the same call
    x, y = torch.randn(16, 16), torch.zeros(16, 16)
    keyword_arguments[(1,)](x, y, 1, BLOCK=16, backend="cpu")
    ref = x - x.max(dim=1, keepdim=True).values + x.sum(dim=0, keepdim=True)
    assert torch.allclose(y, ref, atol=1e-5)
    for backend in BACKENDS:
        keyword_arguments.lower(backend)


def test_compile_time_comparisons_fold():
    x, y = torch.randn(16, 16), torch.zeros(16, 16)
    folded_comparisons[(1,)](x, y, 1, BLOCK=16, backend="cpu")
    assert torch.equal(y, x)
    y.zero_()
    folded_comparisons[(1,)](x, y, 1, BLOCK=8, backend="cpu")   # `8 in (8, 16)` holds too
    assert torch.equal(y[:8, :8], x[:8, :8]) and not y[8:].any()


@pytest.mark.parametrize("value", [4.0, 2.5])
def test_float_for_an_integer_scalar_is_a_launch_error(value):
    x, y = torch.randn(64, 16), torch.zeros(64, 16)
    with pytest.raises(LaunchError) as err:
        rows_copy[(1,)](x, y, value, BLOCK=16, backend="cpu")
    text = str(err.value)
    assert "scalar `n`" in text and f"{value!r} (float)" in text and "line" in text, text
    assert "pass an int" in err.value.fix
    rows_copy[(1,)](x, y, 4, BLOCK=16, backend="cpu")
    assert torch.equal(y, x)


def test_power_of_two_tiles_on_nvidia():
    with pytest.raises(BackendError) as err:
        cli.lower_and_render(not_a_power_of_two, backends.get("nvidia"))
    assert_names_bug(err.value, not_a_power_of_two, "[12, 12]", "powers of two")
    not_a_power_of_two.lower("cpu")     # the emulator takes any shape


def test_cli_set_on_a_run_time_scalar(capsys):
    assert cli.main(["check", f"{__file__}:rows_copy", "--backend", "cpu", "--set", "n=3"]) == 2
    err = capsys.readouterr().err
    assert "n is a run-time scalar parameter, not settable by --set" in err and "fix:" in err, err


def test_cli_imports_a_kernel_file_with_its_folder_on_the_path(tmp_path, monkeypatch, capsys):
    (tmp_path / "helper_fe35.py").write_text("BLOCK = 16\n")
    src = inspect.getsource(rows_copy.fn)
    (tmp_path / "kern.py").write_text(
        "import xsync as xs\nfrom helper_fe35 import BLOCK as HB\n\n"
        "EX = dict(x=xs.float32, y=xs.float32, BLOCK=HB)\n\n\n" + src)
    monkeypatch.chdir(os.path.dirname(__file__))      # not the kernel's folder
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert cli.main(["check", f"{tmp_path / 'kern.py'}:rows_copy", "--backend", "cpu"]) == 0, \
        capsys.readouterr().err


@xs.kernel(example=dict(a=xs.float32, y=xs.float32, B=16))
def misspelt_example(at, y, B: xs.constexpr):
    ld = xs.role("ld", kind="copy")
    wk = xs.role("wk", kind="vector")
    r = xs.pipe(ld, wk, stages=1, t=xs.tile([B, B], at.dtype))
    with ld:
        s = r.acquire()
        s.t = xs.load(at, [0, 0], [B, B])
        r.commit()
    with wk:
        g = r.wait()
        xs.store(y, [0, 0], g.t)
        r.release()


def test_a_misspelt_example_key_is_named_in_the_error_it_leads_to():
    """Was: example key 'a' (for parameter 'at') was dropped without a word, and the error
    blamed `at.dtype` only."""
    with pytest.raises(xs.KernelSourceError) as err:
        misspelt_example.lower("cpu")
    assert "the specialization names 'a' (did you mean 'at'?), which no parameter of 'misspelt_example' has" \
        in err.value.fix
    assert misspelt_example.lower("cpu", dict(B=16), dict(at=xs.float32, y=xs.float32)).report.proven
