"""Constexpr values: an int, a float, a bool, an xs dtype, or a string where the vocabulary
takes one (a role kind chosen by a parameter, which works on every backend). Any other value,
and a string used where a number is needed, is a KernelSourceError at the kernel's line that
names the parameter and says what to pass, never an internal traceback."""
import numpy as np
import pytest
import torch

import constexpr_kernels as ck
import xsync as xs
from test_verifier import bug_line
from xsync.backends import get
from xsync.errors import KernelSourceError
from xsync.lowering.ir import RoleKind

BACKENDS = ("cpu", "nvidia", "ascend")


KINDS = {ck.kind_by_constexpr: {"work": RoleKind.VECTOR},
         ck.kinds_of_a_pipeline: {"load": RoleKind.COPY, "mma": RoleKind.MATRIX, "epi": RoleKind.VECTOR}}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kernel", list(KINDS), ids=lambda k: k.__name__)
def test_role_kind_by_constexpr_checks_and_lowers(kernel, backend):
    lowered = kernel.lower(backend)      # verified (check) and lowered
    assert {r.name: r.kind for r in lowered.kernel.roles} == KINDS[kernel]
    # the string constexprs are folded into the roles; the generated code never names them
    assert all(not isinstance(v, str) for _, v in lowered.kernel.constexprs)


@pytest.mark.parametrize("kernel", [ck.kind_by_constexpr, ck.kinds_of_a_pipeline], ids=lambda k: k.__name__)
def test_role_kind_by_constexpr_renders_for_ascend(kernel):
    ascend = get("ascend")
    lowered = kernel.lower(ascend)
    _, render_options = xs.config.current().backend_options(ascend)
    source = ascend.render_source(lowered.kernel, lowered.placement, lowered.allocation, render_options)
    assert "@triton.jit" in source and "KIND" not in source
    compile(source, "<ascend>", "exec")


@pytest.mark.parametrize("kind", ["vector", "copy", "matrix"])
def test_role_kind_by_constexpr_launches_on_cpu(monkeypatch, kind):
    monkeypatch.setenv("XSYNC_BACKEND", "cpu")
    x, y = torch.randn(48, 16), torch.zeros(48, 16)
    ck.kind_by_constexpr[(1,)](x, y, 3, BLOCK=16, KIND=kind)
    assert torch.equal(y, x * 2)


def test_kinds_and_dtype_of_a_pipeline_launch_on_cpu(monkeypatch):
    monkeypatch.setenv("XSYNC_BACKEND", "cpu")
    torch.manual_seed(0)
    a, b, out = torch.randn(16, 32).bfloat16(), torch.randn(32, 16).bfloat16(), torch.zeros(16, 16)
    ck.kinds_of_a_pipeline[(1,)](a, b, out, 32, BM=16, BN=16, BK=16, LOAD_KIND="copy",
                                 MMA_KIND="matrix", EPI_KIND="vector", DT=xs.float16)
    ref = (a.double() @ b.double()).float().half().float()
    torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3)


STRING_MISUSE = [
    # (kernel, the parameter named, words of the message)
    (ck.string_in_arithmetic, "OFFSET", "is the string '16' and is used as a value"),
    (ck.string_stages, "STAGES", "stages is constexpr `STAGES`, the string '2'"),
    (ck.string_in_shape, "ROWS", "shape of field t is constexpr `ROWS`"),
    (ck.kind_by_runtime_parameter, "kind", "kind must be known at compile time"),
    (ck.unknown_kind, "work", "role 'work' has kind 'tensor'"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kernel,name,words", STRING_MISUSE, ids=[c[0].__name__ for c in STRING_MISUSE])
def test_string_where_a_number_is_needed_is_an_error_at_the_line(kernel, name, words, backend):
    with pytest.raises(KernelSourceError) as info:
        kernel.lower(backend)
    err = info.value
    assert err.loc is not None and err.loc.line == bug_line(kernel), str(err)
    assert err.loc.file.endswith("constexpr_kernels.py")
    assert words in err.what and f"{name}" in str(err) and err.fix, str(err)


def test_string_used_as_a_value_is_an_error_at_cpu_launch(monkeypatch):
    monkeypatch.setenv("XSYNC_BACKEND", "cpu")
    x, y = torch.randn(32, 16), torch.zeros(32, 16)
    with pytest.raises(KernelSourceError, match=r"constexpr_kernels.py:\d+ .*`BLOCK` is the string '16'"):
        ck.kind_by_constexpr[(1,)](x, y, 2, BLOCK="16", KIND="vector")


BAD_VALUES = [([16], "is a list ([16])"), ((16,), "is a tuple"), (torch.tensor(16), "is a torch.Tensor"),
              (None, "is None"), ({"a": 1}, "is a dict")]


def param_line(kernel, name):
    import inspect
    lines, start = inspect.getsourcelines(kernel.fn)
    return next(start + i for i, text in enumerate(lines) if f"{name}: xs.constexpr" in text)


@pytest.mark.parametrize("value,words", BAD_VALUES, ids=[w for _, w in BAD_VALUES])
def test_unsupported_constexpr_value_at_launch(monkeypatch, value, words):
    monkeypatch.setenv("XSYNC_BACKEND", "cpu")
    x, y = torch.randn(32, 16), torch.zeros(32, 16)
    with pytest.raises(KernelSourceError) as info:
        ck.kind_by_constexpr[(1,)](x, y, 2, BLOCK=value, KIND="vector")
    err = info.value
    assert f"constexpr `BLOCK` {words}" in err.what, str(err)
    assert err.objects == ("BLOCK",) and "pass BLOCK=" in err.fix
    assert err.loc.line == param_line(ck.kind_by_constexpr, "BLOCK")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value,words", BAD_VALUES[:4], ids=[w for _, w in BAD_VALUES[:4]])
def test_unsupported_constexpr_value_at_check(backend, value, words):
    with pytest.raises(KernelSourceError, match=rf"constexpr_kernels.py:\d+ .*constexpr `KIND` {words[:8]}"):
        ck.kind_by_constexpr.lower(backend, constexprs=dict(BLOCK=16, KIND=value))


def test_numpy_scalars_are_numbers(monkeypatch):
    monkeypatch.setenv("XSYNC_BACKEND", "cpu")
    x, y = torch.randn(32, 16), torch.zeros(32, 16)
    ck.kind_by_constexpr[(1,)](x, y, 2, BLOCK=np.int64(16), KIND="vector")
    assert torch.equal(y, x * 2)
    lowered = ck.kind_by_constexpr.lower("cpu", constexprs=dict(BLOCK=np.int32(16), KIND="vector"))
    assert dict(lowered.kernel.constexprs) == {"BLOCK": 16} and type(dict(lowered.kernel.constexprs)["BLOCK"]) is int


@pytest.mark.parametrize("backend", BACKENDS)
def test_dtype_constexpr_is_folded_and_renders(backend):
    b = get(backend)
    lowered = ck.dtype_by_constexpr.lower(b, constexprs=dict(BLOCK=16, DT=xs.bfloat16))
    _, render_options = xs.config.current().backend_options(b)
    source = b.render_source(lowered.kernel, lowered.placement, lowered.allocation, render_options)
    compile(source, f"<{backend}>", "exec")


def test_dtype_constexpr_launches_on_cpu(monkeypatch):
    monkeypatch.setenv("XSYNC_BACKEND", "cpu")
    x, y = torch.randn(16, 16), torch.zeros(16, 16)
    ck.dtype_by_constexpr[(1,)](x, y, BLOCK=16, DT=xs.bfloat16)
    assert torch.equal(y, x.bfloat16().float())
