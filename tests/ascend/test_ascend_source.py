"""Generated triton-ascend source: both forms parse, the al.scope form matches its golden
text, the release form keeps each core's part valid alone, files land in the cache
atomically and XSYNC_DUMP shows flags per direction and the workspace layout."""
import ast
import os

import ascend_cases as cases
import pytest

from xsync.kernels.flash_attn import grad
from xsync.kernels.flash_attn.backward import attention_bwd_dkdv, attention_bwd_dq
from xsync.kernels.gemm import gemm
from xsync.kernels.gemm_softmax import gemm_softmax
from test_ascend_hivm import RELEASE_FORM_REFUSED, all_kernels
from xsync.backends import ascend
from xsync.backends.ascend import compile_kernel, select_form
from xsync.errors import UnsupportedError

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")


def source(kernel, form):
    lw = kernel.lower("ascend", *specialization(kernel))
    return compile_kernel(lw.kernel, lw.placement, lw.allocation, form=form).source


def specialization(kernel):
    """The example's; the attention backward's at the Ascend schedule's tiles (the example's,
    Hopper's, overflow the cube's L0C: xsync/backends/ascend/memory.py rule 7)."""
    cx, dtypes = kernel.specialization()
    if kernel in (attention_bwd_dkdv, attention_bwd_dq):
        cx.update(grad.block_sizes("ascend", 128))
    return cx, dtypes


def normalized(kernel, form):
    return source(kernel, form).replace(kernel.lower("ascend").kernel.file, "<kernel file>")


@pytest.mark.parametrize("form", ["release", "scope"])
@pytest.mark.parametrize("kernel", all_kernels() + [cases.ping_pong], ids=lambda k: k.__name__)
def test_every_kernel_renders_parseable_python(kernel, form):
    if form == "release" and kernel.__name__ in RELEASE_FORM_REFUSED:
        with pytest.raises(UnsupportedError, match="both vector cores"):
            source(kernel, form)
        return
    tree = ast.parse(source(kernel, form))
    jit = [f for f in tree.body if isinstance(f, ast.FunctionDef)]
    assert [f.name for f in jit] == [kernel.__name__]
    assert ast.unparse(jit[0].decorator_list[0]) == "triton.jit"


@pytest.mark.parametrize("name", ["ping_pong"])
def test_scope_form_golden(name):
    kernel = getattr(cases, name)
    text = normalized(kernel, "scope")
    path = os.path.join(GOLDEN, f"{name}.scope.py")
    if os.environ.get("XSYNC_UPDATE_GOLDEN"):
        with open(path, "w") as f:
            f.write(text)
    with open(path) as f:
        assert text == f.read(), f"regenerate with XSYNC_UPDATE_GOLDEN=1 if the change is intended: {path}"


def test_scope_form_spelling():
    """FULL: set on the writer's pipe, the reader's MTE2 waits; EMPTY: set on the reader's
    MTE2 (after the GM read), the writer's pipe waits; a vector-replica barrier is the two
    vector cores of one AI core (all_sub_vector), not the grid."""
    lw = gemm_softmax.lower("ascend")
    ids = dict(lw.allocation.event_ids)
    full, empty, team = ids["scores:full"], ids["scores:empty"], ids["team"]
    text = source(gemm_softmax, "scope")
    assert "import triton.language.extra.cann.extension as al" in text
    assert 'with al.scope(core_mode="cube"):' in text and 'with al.scope(core_mode="vector"):' in text
    assert f'al.sync_block_set("cube", "vector", {full}, al.PIPE.PIPE_FIX, al.PIPE.PIPE_MTE2)' in text
    assert f'al.sync_block_wait("cube", "vector", {full}, al.PIPE.PIPE_FIX, al.PIPE.PIPE_MTE2)' in text
    assert f'al.sync_block_set("vector", "cube", {empty}, al.PIPE.PIPE_MTE2, al.PIPE.PIPE_FIX)' in text
    assert f'al.sync_block_wait("vector", "cube", {empty}, al.PIPE.PIPE_MTE2, al.PIPE.PIPE_FIX)' in text
    assert f'al.sync_block_all("all_sub_vector", {team})' in text
    assert "xs_rid = al.sub_vec_id()" in text and "if t % 2 == xs_rid:" in text
    assert "tl.sync_block" not in text


def test_release_form_replica_fallback():
    """No sub_vec_id in 3.2.0: both replicas run in lockstep on each vector core; the FULL
    wait and the EMPTY set happen once per core, not once per replica."""
    ids = dict(gemm_softmax.lower("ascend").allocation.event_ids)
    full, empty, team = ids["scores:full"], ids["scores:empty"], ids["team"]
    text = source(gemm_softmax, "release")
    vector = text[text.index("vector cores (AIV)"):]
    assert "sub_vec_id" not in text and "al." not in text
    assert vector.count(f'tl.sync_block_wait("cube", "vector", {full})') == 1
    assert vector.count(f'tl.sync_block_set("vector", "cube", {empty})') == 1
    assert vector.count(f'tl.sync_block_all("all_vector", {team})') == 1
    assert "if t % 2 == 0:" in vector and "if t % 2 == 1:" in vector
    assert "got_r0_c" in vector and "got_r1_c" in vector
    cube = text[:text.index("vector cores (AIV)")]
    assert "tl.sync_block_wait(\"cube\"" not in cube and "tl.sync_block_set(\"vector\"" not in cube
    assert "if xs_scores_acq >= 2:" in cube                   # starts with `stages` free slots
    assert "for xs_d in tl.static_range(2):" in cube          # drain: flags end at zero


def test_release_form_same_core_pipe_is_a_plain_value():
    text = source(gemm, "release")
    assert "tl.sync_block" not in text and "xs_ws" not in text
    assert "acc = tl.dot(tiles_a, tiles_b, acc)" in text


def test_form_detection(monkeypatch):
    monkeypatch.delenv("XSYNC_ASCEND_FORM", raising=False)
    monkeypatch.setattr(ascend, "scope_form_available", lambda: True)
    assert select_form() == "scope"
    monkeypatch.setattr(ascend, "scope_form_available", lambda: False)
    assert select_form() == "release"
    monkeypatch.setenv("XSYNC_ASCEND_FORM", "scope")
    assert select_form() == "scope"
    assert select_form("release") == "release"


def test_installed_320_has_no_scope_api(triton_ascend):
    import triton
    if triton.__version__ == "3.2.0":
        assert not ascend.scope_form_available()
        assert select_form(None if not os.environ.get("XSYNC_ASCEND_FORM") else "auto") == "release"


def test_source_written_atomically_to_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XSYNC_CACHE_DIR", str(tmp_path))
    lw = gemm_softmax.lower("ascend")
    compiled = compile_kernel(lw.kernel, lw.placement, lw.allocation, form="release")
    assert os.path.dirname(compiled.path) == str(tmp_path / "ascend")
    with open(compiled.path) as f:
        assert f.read() == compiled.source
    assert not [p for p in os.listdir(tmp_path / "ascend") if p.endswith(".tmp")]


def test_release_form_fences_the_empty_hand_off():
    """3.2.0 cannot name pipes: an EMPTY set is fenced after the consumer's GM reads and an
    EMPTY wait before the producer's GM writes (tl.debug_barrier = pipe_barrier(PIPE_ALL));
    FULL needs no fence (the set follows the write on the writer's own pipe)."""
    ids = dict(gemm_softmax.lower("ascend").allocation.event_ids)
    full, empty = ids["scores:full"], ids["scores:empty"]
    lines = [ln.strip() for ln in source(gemm_softmax, "release").splitlines()]
    set_empty = lines.index(next(ln for ln in lines if ln.startswith(f'tl.sync_block_set("vector", "cube", {empty})')))
    assert lines[set_empty - 1].startswith("tl.debug_barrier()")
    wait_empty = lines.index(next(ln for ln in lines if ln.startswith(f'tl.sync_block_wait("vector", "cube", {empty})')))
    assert lines[wait_empty + 1].startswith("tl.debug_barrier()")
    set_full = lines.index(next(ln for ln in lines if ln.startswith(f'tl.sync_block_set("cube", "vector", {full})')))
    assert not lines[set_full - 1].startswith("tl.debug_barrier()")


def test_flags_allocated_from_the_top_of_the_documented_range(monkeypatch):
    """CANN >= 8.0.RC3 documents IDs 0-10 on A2/A3; xsync allocates downward from 10 (the
    compiler, when it allocates at all, starts at 0) and never hands out 14/15 with
    sync_block_all; XSYNC_ASCEND_EVENT_IDS raises or lowers the range."""
    ids = dict(gemm_softmax.lower("ascend").allocation.event_ids)
    assert sorted(ids.values()) == [8, 9, 10]
    monkeypatch.setenv("XSYNC_ASCEND_EVENT_IDS", "16")
    ids = dict(gemm_softmax.lower("ascend").allocation.event_ids)   # has a barrier
    assert sorted(ids.values()) == [11, 12, 13]
    monkeypatch.setenv("XSYNC_ASCEND_EVENT_IDS", "4")
    assert sorted(dict(gemm_softmax.lower("ascend").allocation.event_ids).values()) == [1, 2, 3]


def test_dump_shows_flags_per_direction_and_workspace(tmp_path, monkeypatch):
    monkeypatch.setenv("XSYNC_DUMP", str(tmp_path))
    monkeypatch.setenv("XSYNC_ASCEND_FORM", "release")
    gemm_softmax.clear_cache()
    gemm_softmax.compile("ascend")
    ids = dict(gemm_softmax.lower("ascend").allocation.event_ids)
    (table_path,) = tmp_path.glob("gemm_softmax.ascend*.alloc.txt")     # named by specialization
    table = table_path.read_text()
    assert f"flag {ids['scores:full']} (cube -> vector)" in table
    assert f"flag {ids['scores:empty']} (vector -> cube)" in table
    assert f"mode all_vector, flag {ids['team']}" in table
    assert "2 x 16384 B at offset 0 per program" in table and "c[64, 64] float32 @+0" in table
    assert "GM per program" in table and "32768 B" in table
    src = table_path.with_name(table_path.name.replace(".alloc.txt", ".py")).read_text()
    assert f'tl.sync_block_set("cube", "vector", {ids["scores:full"]})' in src



@pytest.mark.parametrize("form", ["release", "scope"])
def test_barrier_met_once_per_meeting_by_the_cube(form):
    """load and mma both sync the barrier each step; the cube meets it once per step."""
    text = source(cases.cube_roles_meet_once, form)
    mod = "al" if form == "scope" else "tl"
    flag = dict(cases.cube_roles_meet_once.lower("ascend").allocation.event_ids)["team"]
    assert text.count(f'{mod}.sync_block_all("all", {flag})') == 2     # once on the cube, once on the vector
    assert "met once for this core at line" in text
    ast.parse(text)
