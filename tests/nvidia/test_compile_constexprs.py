"""Role kinds and dtypes chosen by constexprs compile to sm_90a PTX (the string constexprs
are folded into the roles, the dtype into the casts)."""
import os
import sys

import pytest

import xsync as xs
from xsync.backends.nvidia import compile_ptx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "core"))
import constexpr_kernels as ck  # noqa: E402


@pytest.mark.parametrize("kernel,constexprs", [
    (ck.kind_by_constexpr, None),
    (ck.kinds_of_a_pipeline, None),
    (ck.dtype_by_constexpr, dict(BLOCK=16, DT=xs.bfloat16)),
], ids=lambda v: getattr(v, "__name__", ""))
def test_constexpr_kinds_and_dtypes_compile(kernel, constexprs):
    ptx = compile_ptx(kernel.lower("nvidia", constexprs=constexprs)).ptx
    assert ".entry" in ptx
