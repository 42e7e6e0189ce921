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
from xsync.lowering import ir


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


NESTED = "\n".join("    " + line for line in BODY.splitlines()) + "\n"
SOURCE_ERRORS = {   # name -> (kernel body after HEADER, line of the error, words in it)
    "data_count": ("    total = xs.load_scalar(idx, 0)\n"
                   "    for tile in xs.tile_range(total, persistent=FLAG):\n" + BODY, 10,
                   "the host cannot compute"),
    "nested": ("    if rows > 0:\n        for tile in xs.tile_range(rows, persistent=FLAG):\n" + NESTED, 10,
               "top-level"),
    "runtime_flag": ("    for tile in xs.tile_range(rows, persistent=rows):\n" + BODY, 9, "compile time"),
    "as_value": ("    first = xs.tile_range(rows, persistent=FLAG)\n"
                 "    for tile in range(0, rows):\n" + BODY, 9, "only the iterator of a tile loop"),
}


@pytest.mark.parametrize("name", sorted(SOURCE_ERRORS))
def test_tile_range_misuse_is_a_source_error_at_its_line(tmp_path, name):
    body, line, words = SOURCE_ERRORS[name]
    kern = _src(tmp_path, HEADER + body, name)
    with pytest.raises(KernelSourceError) as err:
        kern.lower("cpu", dict(BM=16, FLAG=0))
    assert f"{name}.py:{line}" in str(err.value) and words in str(err.value)


def test_a_data_dependent_tile_count_is_fine_persistent(tmp_path):
    kern = _src(tmp_path, HEADER + SOURCE_ERRORS["data_count"][0], "data_count")
    kern.lower("cpu", dict(BM=16, FLAG=1))   # persistent: any count, read on the device


@pytest.mark.parametrize("flag", [0, 1])
def test_verifier_checks_the_single_tile_form_as_the_loop(tmp_path, flag):
    """A slot released only for some tiles is rejected in both forms (the loop is verified)."""
    kern = _src(tmp_path, HEADER + "    for tile in xs.tile_range(rows, persistent=FLAG):\n"
                + BODY.replace("            tiles.release()\n", "            if tile > 0:\n                tiles.release()\n"),
                f"leak{flag}")
    with pytest.raises(ProtocolError):
        kern.lower("cpu", dict(BM=16, FLAG=flag), check=True)


@pytest.mark.parametrize("persistent", [0, 1])
def test_attention_both_forms_match_sdpa(persistent, monkeypatch):
    """The flagship with either form on the emulator, GQA and a ragged last tile."""
    torch.manual_seed(0)
    b, hq, hk, s, d = 1, 4, 2, 50, 64
    q = torch.randn(b, hq, s, d).bfloat16()
    k, v = torch.randn(b, hk, s, d).bfloat16(), torch.randn(b, hk, s, d).bfloat16()
    plan = schedule.lookup("cpu", d, True, s)
    forced = schedule.Schedule(plan.BM, plan.BN, plan.STAGES, bool(persistent))
    monkeypatch.setattr(schedule, "TABLE", (schedule.Row("cpu", None, None, None, forced),))
    out, _ = ops.attention(q, k, v, causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(2, 1), v.float().repeat_interleave(2, 1), is_causal=True)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    lowered = attention_fwd.lower("cpu", dict(forced.constexprs(), D=d, CAUSAL=1))
    (tile_loop,) = [x for x in lowered.kernel.body if isinstance(x, ir.For)]
    assert tile_loop.single_tile == (not persistent)
