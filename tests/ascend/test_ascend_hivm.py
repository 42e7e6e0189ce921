"""The real triton-ascend 3.2.0 frontend + triton-adapter-opt compile the lowered kernels;
the HIVM text shows the allocated flags, barriers, mix_mode and the workspace argument."""
import importlib
import pkgutil
import re

import pytest

import xsync.kernels as kernels
from xsync.kernels.gemm import gemm
from xsync.kernels.gemm_softmax import gemm_softmax
from xsync.backends.ascend import compile_hivm, compile_kernel
from xsync.backends.ascend.render import core_of_kind
from xsync.kernel import Kernel

SCALARS = {"sm_scale": "fp32"}


def all_kernels():
    """Every xsync kernel under kernels/ (flash_attn included once it exists)."""
    found = {}
    for mod in pkgutil.walk_packages(kernels.__path__, "xsync.kernels."):
        module = importlib.import_module(mod.name)
        for value in vars(module).values():
            if isinstance(value, Kernel):
                found[f"{value.fn.__module__}.{value.__name__}"] = value
    return [found[k] for k in sorted(found)]


def hivm(kernel, **kw):
    return compile_hivm(kernel.lower("ascend"), scalars=SCALARS, form="release", **kw)


def test_gemm_single_core(triton_ascend):
    ttir, mlir = hivm(gemm)
    assert 'mix_mode = "mix"' in mlir
    assert "linalg.matmul" in mlir
    # load and mma share the cube core: the ring is program order, no flag, no workspace
    assert "hivm.hir.sync_block" not in mlir
    assert "sync_block" not in ttir
    assert "tensor_kind = 2" not in mlir


def test_gemm_softmax_flags_barrier_workspace(triton_ascend):
    lowered = gemm_softmax.lower("ascend")
    ids = dict(lowered.allocation.event_ids)
    ttir, mlir = compile_hivm(lowered, form="release")
    full, empty, team = ids["scores:full"], ids["scores:empty"], ids["team"]
    assert f'tt.custom "sync_block_set" {{str_args = ["cube", {full} : i32]}}' in ttir
    assert f"hivm.hir.sync_block_set[<CUBE>, <PIPE_FIX>, <PIPE_MTE2>] flag = {full}" in mlir
    assert f"hivm.hir.sync_block_wait[<VECTOR>, <PIPE_FIX>, <PIPE_MTE2>] flag = {full}" in mlir
    assert f"hivm.hir.sync_block_set[<VECTOR>, <PIPE_MTE3>, <PIPE_MTE2>] flag = {empty}" in mlir
    assert f"hivm.hir.sync_block_wait[<CUBE>, <PIPE_MTE3>, <PIPE_MTE2>] flag = {empty}" in mlir
    assert f"hivm.hir.sync_block[<ALL_VECTOR>, {team} : i16]" in mlir
    assert 'mix_mode = "mix"' in mlir
    # the GM workspace ring: an fp32 pointer argument that is read and written
    sig = re.search(r"func\.func @gemm_softmax\((.*?)\) attributes", mlir).group(1)
    memrefs = re.findall(r"memref<\?x(\w+)>(?: \{tt.tensor_kind = (\d))?", sig)
    assert memrefs[-1] == ("f32", "2")            # xs_ws_fp32: the last pointer argument
    # FULL: one set per commit and one wait per core; EMPTY: producer waits in the loop + drain
    assert mlir.count(f"<CUBE>, <PIPE_FIX>, <PIPE_MTE2>] flag = {full}") == 1
    assert mlir.count(f"sync_block_wait[<VECTOR>, <PIPE_FIX>, <PIPE_MTE2>] flag = {full}") == 1
    assert mlir.count(f"sync_block_wait[<CUBE>, <PIPE_MTE3>, <PIPE_MTE2>] flag = {empty}") == 3


@pytest.mark.parametrize("kernel", all_kernels(), ids=lambda k: k.__name__)
def test_every_kernel_compiles_with_its_allocation(kernel, triton_ascend):
    lowered = kernel.lower("ascend")
    k, placement, alloc = lowered.kernel, lowered.placement, lowered.allocation
    ids = dict(alloc.event_ids)
    ttir, mlir = compile_hivm(lowered, scalars=SCALARS, form="release")
    has_mma = "linalg.matmul" in mlir
    assert f'mix_mode = "{"mix" if has_mma else "aiv"}"' in mlir
    pipe_of = {"cube": "PIPE_FIX", "vector": "PIPE_MTE3"}
    directions = []
    for p in k.pipes:
        if placement.crosses(p):
            s, d = core_of_kind(k.role(p.src).kind), core_of_kind(k.role(p.dst).kind)
            directions += [(s, d, ids[f"{p.name}:full"]), (d, s, ids[f"{p.name}:empty"])]
    for e in k.events:
        if placement.crosses(e):
            directions.append((core_of_kind(k.role(e.src).kind), core_of_kind(k.role(e.dst).kind),
                               ids[e.name]))
    for s, d, flag in directions:
        pipes = f"<{pipe_of[s]}>, <PIPE_MTE2>] flag = {flag}"
        assert f"hivm.hir.sync_block_set[<{s.upper()}>, {pipes}" in mlir
        assert f"hivm.hir.sync_block_wait[<{d.upper()}>, {pipes}" in mlir
    for b in k.barriers:
        assert re.search(rf"hivm\.hir\.sync_block\[<ALL(_CUBE|_VECTOR)?>, {ids[b.name]} : i16\]", mlir)
    n_sync = len(re.findall(r"hivm\.hir\.sync_block", mlir))
    assert (n_sync > 0) == bool(directions or k.barriers)
    ws = compile_kernel(k, placement, alloc, form="release").signature(SCALARS)
    assert sum(1 for a in ws if a.startswith("xs_ws_")) == len({f.dtype for r in alloc.workspace
                                                              for f in k.sync_object(r.pipe).fields})


def test_flash_attn_flags_when_present(triton_ascend):
    try:
        from xsync.kernels.flash_attn import attention_fwd
    except ImportError:
        pytest.skip("kernels/flash_attn is not there yet")
    lowered = attention_fwd.lower("ascend")
    ids = dict(lowered.allocation.event_ids)
    _, mlir = compile_hivm(lowered, scalars=SCALARS, form="release")
    assert 'mix_mode = "mix"' in mlir
    for key, flag in ids.items():
        assert f"flag = {flag}" in mlir, key


def test_barrier_met_once_per_meeting_compiles(triton_ascend):
    """Roles sharing the cube meet the barrier once per step: in HIVM one sync_block[<ALL>]
    in the cube's part and one in the vector's, not one per member role."""
    import ascend_cases as cases
    lowered = cases.cube_roles_meet_once.lower("ascend")
    team = dict(lowered.allocation.event_ids)["team"]
    ttir, mlir = compile_hivm(lowered, scalars=SCALARS, form="release")
    assert mlir.count(f"hivm.hir.sync_block[<ALL>, {team} : i16]") == 2, mlir.count("sync_block[")
