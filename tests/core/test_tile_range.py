"""xs.tile_range: one kernel body, launched persistent (any number of programs walk the tiles)
or one program per tile (compiled without a loop). Both give the same result on the CPU
emulator; the single-tile form refuses a grid that would skip tiles, before anything runs;
the verifier checks the loop in both forms."""
import pytest
import torch

import xsync as xs
from xsync.errors import KernelSourceError, LaunchError, ProtocolError
from xsync.kernels.flash_attn import ops, schedule
from xsync.kernels.flash_attn.kernel import attention_fwd


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BM=16, BN=16, PERSISTENT=0))
def scale_rows(x, y, rows, cols, factor, BM: xs.constexpr, BN: xs.constexpr,
               PERSISTENT: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    tiles = xs.pipe(load, work, stages=2, t=xs.tile([2 * BM, BN], xs.float32))
    row_blocks = xs.cdiv(rows, 2 * BM)
    for tile in xs.tile_range(row_blocks * xs.cdiv(cols, BN), persistent=PERSISTENT):
        m = tile % row_blocks * (2 * BM)
        n = tile // row_blocks * BN
        with load:
            s = tiles.acquire()
            s.t = xs.load(x, [m, n], [2 * BM, BN])
            tiles.commit()
        with work:
            got = tiles.wait()
            out = got.t * factor
            tiles.release()
            xs.store(y, [m, n], out, bounds=[rows, cols])


def _run(persistent, programs, rows=70, cols=40):
    x = torch.randn(rows, cols)
    y = torch.full_like(x, 7.0)
    tiles = -(-rows // 32) * -(-cols // 16)
    grid = (tiles if programs is None else programs,)
    scale_rows[grid](x, y, rows, cols, 3.0, BM=16, BN=16, PERSISTENT=persistent, backend="cpu")
    return x, y, tiles


@pytest.mark.parametrize("persistent,programs", [(0, None), (1, None), (1, 3), (1, 1), (0, 99)])
def test_both_forms_scale_every_tile(persistent, programs):
    x, y, _ = _run(persistent, programs)
    torch.testing.assert_close(y, x * 3.0)


def test_single_tile_refuses_a_grid_that_skips_tiles():
    x = torch.randn(70, 40)
    y = torch.full_like(x, 7.0)
    with pytest.raises(LaunchError) as err:
        scale_rows[(5,)](x, y, 70, 40, 3.0, BM=16, BN=16, PERSISTENT=0, backend="cpu")
    msg = str(err.value)
    assert "test_tile_range.py" in msg and "5 program(s)" in msg and "for 9 tiles" in msg
    assert "launch 9 programs" in msg and "persistent=True" in msg
    assert torch.equal(y, torch.full_like(x, 7.0))     # nothing ran, nothing half-written


def test_single_tile_compiles_without_a_loop():
    from xsync.backends.cpu import compile_kernel

    for persistent, loop in ((0, False), (1, True)):
        lowered = scale_rows.lower("cpu", dict(BM=16, BN=16, PERSISTENT=persistent))
        source = compile_kernel(lowered.kernel, lowered.placement, lowered.allocation).source
        assert ("for tile in range(" in source) == loop
        assert ("tile = ag.program_id(0)" in source) != loop


def _src(tmp_path, body, name="k"):
    """A kernel defined in a file of its own (the frontend reads the source)."""
    path = tmp_path / f"{name}.py"
    path.write_text(body)
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.kern


HEADER = '''import xsync as xs


@xs.kernel(example=dict(x=xs.float32, idx=xs.int32, BM=16, FLAG=0))
def kern(x, idx, rows, BM: xs.constexpr, FLAG: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    tiles = xs.pipe(load, work, stages=2, t=xs.tile([BM, BM], xs.float32))
'''
BODY = '''        with load:
            s = tiles.acquire()
            s.t = xs.load(x, [tile * BM, 0], [BM, BM])
            tiles.commit()
        with work:
            got = tiles.wait()
            tiles.release()
'''


def test_tile_count_the_host_cannot_compute_is_a_source_error(tmp_path):
    kern = _src(tmp_path, HEADER + "    total = xs.load_scalar(idx, 0)\n"
                "    for tile in xs.tile_range(total, persistent=FLAG):\n" + BODY, "data_count")
    with pytest.raises(KernelSourceError) as err:
        kern.lower("cpu", dict(BM=16, FLAG=0))
    assert "data_count.py:10" in str(err.value) and "the host cannot compute" in str(err.value)
    kern.lower("cpu", dict(BM=16, FLAG=1))   # persistent: any count, read on the device


def test_single_tile_loop_must_be_top_level(tmp_path):
    kern = _src(tmp_path, HEADER + "    if rows > 0:\n        for tile in xs.tile_range(rows, persistent=FLAG):\n"
                + "\n".join("    " + line for line in BODY.splitlines()) + "\n", "nested")
    with pytest.raises(KernelSourceError) as err:
        kern.lower("cpu", dict(BM=16, FLAG=0))
    assert "nested.py:10" in str(err.value) and "top-level" in str(err.value)


def test_persistent_must_be_known_at_compile_time(tmp_path):
    kern = _src(tmp_path, HEADER + "    for tile in xs.tile_range(rows, persistent=rows):\n" + BODY, "runtime_flag")
    with pytest.raises(KernelSourceError) as err:
        kern.lower("cpu", dict(BM=16, FLAG=0))
    assert "runtime_flag.py:9" in str(err.value) and "compile time" in str(err.value)


@pytest.mark.parametrize("flag", [0, 1])
def test_verifier_checks_the_single_tile_form_as_the_loop(tmp_path, flag):
    """A slot released only for some tiles is rejected in both forms (the loop is verified)."""
    kern = _src(tmp_path, HEADER + "    for tile in xs.tile_range(rows, persistent=FLAG):\n"
                + BODY.replace("            tiles.release()\n", "            if tile > 0:\n                tiles.release()\n"),
                f"leak{flag}")
    with pytest.raises(ProtocolError):
        kern.lower("cpu", dict(BM=16, FLAG=flag), check=True)


@pytest.mark.parametrize("persistent", [0, 1])
def test_attention_both_forms_match_sdpa(persistent):
    """The flagship with either form on the emulator, GQA and a ragged last tile."""
    torch.manual_seed(0)
    b, hq, hk, s, d = 1, 4, 2, 50, 64
    q = torch.randn(b, hq, s, d).bfloat16()
    k, v = torch.randn(b, hk, s, d).bfloat16(), torch.randn(b, hk, s, d).bfloat16()
    plan = schedule.lookup("cpu", d, True, s)
    forced = schedule.Schedule(plan.BM, plan.BN, plan.STAGES, bool(persistent))
    saved = schedule.TABLE
    schedule.TABLE = (schedule.Row("cpu", None, None, None, forced),)
    try:
        out, _ = ops.attention(q, k, v, causal=True)
    finally:
        schedule.TABLE = saved
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(2, 1), v.float().repeat_interleave(2, 1), is_causal=True)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    assert attention_fwd.lower("cpu", dict(BM=plan.BM, BN=plan.BN, D=d, CAUSAL=1, STAGES=2,
                                           PERSISTENT=persistent)).kernel.body


def test_tile_range_outside_a_for_is_a_source_error(tmp_path):
    kern = _src(tmp_path, HEADER + "    first = xs.tile_range(rows, persistent=FLAG)\n"
                "    for tile in range(0, rows):\n" + BODY, "as_value")
    with pytest.raises(KernelSourceError) as err:
        kern.lower("cpu", dict(BM=16, FLAG=0))
    assert "as_value.py:9" in str(err.value) and "only the iterator of a tile loop" in str(err.value)
