"""A persistent tile loop's table reads issued ahead of their tiles (xsync/backends/nvidia/
prefetch.py, option prefetch_tile_scalars): the schedule it builds is run here, statement by
statement, against the loop's own prologue for every tile of random launches -- the values
each tile starts with, and no read out of its table's bounds unless masked off -- for the
attention kernel and for chains of one to three reads; then the spelled Gluon source and its
sm_90a compile (no GPU needed). tests/nvidia/test_gpu.py runs it on the H200."""
import operator
import random
import re

import pytest

import xsync as xs
from xsync.backends.nvidia import compile_ptx, prefetch, render_source
from xsync.kernels.flash_attn import attention_fwd, ops, schedule
from xsync.lowering import ir
from xsync.lowering.placement import Unit
from xsync.lowering.slicing import agent_body

_BIN = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
        "%": operator.mod, "&": operator.and_, "|": operator.or_}
_CMP = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
        "==": operator.eq, "!=": operator.ne}


class OutOfBounds(AssertionError):
    pass


def evaluate(e, env, tables):
    """A scalar IR expression as the GPU computes it; a read past its table raises unless
    its mask is off (then it reads 0, as gl.load(..., other=0))."""
    if isinstance(e, ir.Const):
        return e.value
    if isinstance(e, ir.Name):
        return env[e.id]
    if isinstance(e, ir.BinOp):
        return _BIN[e.op](evaluate(e.left, env, tables), evaluate(e.right, env, tables))
    if isinstance(e, ir.Compare):
        return _CMP[e.op](evaluate(e.left, env, tables), evaluate(e.right, env, tables))
    if isinstance(e, ir.UnaryOp):
        return -evaluate(e.operand, env, tables)
    assert isinstance(e, ir.Call), e
    if e.op == "load_scalar":
        mask = e.kwarg("mask")
        if mask is not None and not evaluate(mask, env, tables):
            return 0
        table, index = tables[e.args[0].id], evaluate(e.args[1], env, tables)
        if not 0 <= index < len(table):
            raise OutOfBounds(f"{e.args[0].id}[{index}] of {len(table)}")
        return table[index]
    if e.op in ("program_id", "num_programs"):
        return env[f"__{e.op}"]
    a, b = (evaluate(x, env, tables) for x in e.args)
    return {"minimum": min, "maximum": max, "cdiv": lambda a, b: -(-a // b)}[e.op](a, b)


def run(stmts, env, tables):
    for s in stmts:
        env[s.targets[0]] = evaluate(s.value, env, tables)


def consumer_loop(lowered):
    """The tile loop of the first consumer warpgroup's program."""
    agent = next(a for a in lowered.placement.agents if a.unit == Unit.CONSUMER)
    return next(s for s in ir.walk(agent_body(lowered.kernel, agent)) if isinstance(s, ir.For) and s.tile_loop)


def check_schedule(lowered, scalars, tables, programs):
    """Every program's walk through the scheduled loop: each tile's prologue values equal the
    prologue's own, computed at the tile; returns the tiles checked."""
    loop = consumer_loop(lowered)
    plan = prefetch.plan(loop, lambda e: True, set())
    assert isinstance(plan, prefetch.TileReadsAhead), plan
    base = dict(lowered.kernel.constexpr_values, **scalars, __num_programs=programs)
    checked = 0
    for pid in range(programs):
        env = dict(base, __program_id=pid)
        for _, stmts in plan.warmup:
            run(stmts, env, tables)
        bounds = [evaluate(x, env, tables) for x in (loop.start, loop.stop, loop.step)]
        for tile in range(*bounds):
            env[loop.var] = tile
            for _, stmts in plan.head:
                run(stmts, env, tables)
            want = dict(base, __program_id=pid, **{loop.var: tile})
            run(plan.prologue, want, tables)
            for s in plan.prologue:
                assert env[s.targets[0]] == want[s.targets[0]], (pid, tile, s.targets[0])
            checked += 1
    return plan, checked


def _attention(d=64, causal=1):
    plan = schedule.lookup("nvidia", d, bool(causal), 1024)
    cx, dtypes = attention_fwd.specialization()
    cx.update(plan.forward_constexprs(), D=d, CAUSAL=causal, **ops.scale_constexprs(None))
    return attention_fwd.lower("nvidia", cx, dtypes), cx, dtypes


@pytest.mark.parametrize("seed", range(6))
def test_attention_tiles_start_with_their_own_table_entries(seed):
    """The flash-attention consumer: tile table, then the sequence offsets, two reads deep;
    random tables, tile counts (none, fewer than the programs, many) and program counts."""
    rng = random.Random(seed)
    lowered = _attention(*[(64, 1), (128, 0)][seed % 2])[0]
    batch, heads = rng.randint(1, 4), rng.randint(1, 3)
    lengths = [rng.randint(0, 300) for _ in range(batch)]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    tiles = rng.choice([0, 1, rng.randint(2, 40)])
    order = [x for _ in range(tiles) for x in (rng.randrange(batch * heads), 128 * rng.randint(0, 3))]
    scalars = dict(heads=heads, group=1, tiles=tiles, q_cu_rows=heads, q_head_rows=0, q_head_cols=0,
                   kv_cu_rows=heads, kv_head_rows=0, kv_head_cols=0, lse_batch_rows=heads, lse_packed=1)
    tables = dict(tile_order=order, cu_q=cu, cu_k=cu)
    plan, checked = check_schedule(lowered, scalars, tables, programs=rng.randint(1, 9))
    assert checked == tiles
    assert plan.depth == 2 and sorted(r.depth for r in plan.reads) == [1, 1, 2, 2, 2, 2]


TABLES = dict(x=xs.float32, y=xs.float32, first=xs.int32, second=xs.int32, third=xs.int32, BLOCK=16, STAGES=2)


def _chain(prologue: str, persistent: int = 1, after: str = ""):
    """A copy kernel whose tile loop opens with ``prologue`` (it defines ``row``) and ends
    with ``after``."""
    src = f'''import xsync as xs

@xs.kernel(example=TABLES)
def chain(x, y, first, second, third, tiles, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for tile in xs.tile_range(tiles, persistent={persistent}):
{prologue}
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [row * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [row * BLOCK, 0], got.t)
            ring.release()
{after}'''
    return src


CHAINS = {
    "one read": ("        row = xs.load_scalar(first, tile)", 1),
    "three reads": ("        a = xs.load_scalar(first, tile)\n"
                    "        b = xs.load_scalar(second, a) + 1\n"
                    "        row = xs.load_scalar(third, b - 1) % 7", 3),
    "nested in one statement": ("        row = xs.load_scalar(third, xs.load_scalar(second, xs.load_scalar(first, tile)))", 3),
    "two at one depth": ("        a = xs.load_scalar(first, 2 * tile)\n"
                         "        row = xs.minimum(xs.load_scalar(second, a), xs.load_scalar(third, a + 1))", 2),
}


def _load_chain(tmp_path, name, src):
    import importlib.util

    path = tmp_path / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.TABLES = TABLES       # the kernel's example specialization
    spec.loader.exec_module(module)
    return module.chain


@pytest.mark.parametrize("name", list(CHAINS))
def test_chains_of_reads_match_the_prologue_at_every_tile(tmp_path, name):
    prologue, depth = CHAINS[name]
    kernel = _load_chain(tmp_path, name.replace(" ", "_"), _chain(prologue))
    cx, dtypes = kernel.specialization()
    lowered = kernel.lower("nvidia", cx, dtypes)
    rng = random.Random(depth)
    for _ in range(5):
        tiles = rng.randint(0, 30)
        tables = dict(first=[rng.randrange(8) for _ in range(2 * tiles + 2)],
                      second=[rng.randrange(8) for _ in range(9)], third=[rng.randrange(8) for _ in range(9)])
        plan, checked = check_schedule(lowered, dict(tiles=tiles), tables, programs=rng.randint(1, 6))
        assert plan.depth == depth and checked == tiles
    source = render_source(lowered.kernel, lowered.placement, lowered.allocation, {"prefetch_tile_scalars": True})
    work = source[source.index("def chain_consumer("):]
    work = work[:work.index("@gluon.jit")]
    # every read of the consumer is masked and ahead of its tile; the producer reads as written
    assert not re.search(r"gl\.load\((first|second|third) \+ [^,]*\)\n", work), work
    assert len(re.findall(r"mask=xs_tile_ahead\d < tiles, other=0\)", work)) >= 2 * depth - 1
    load = source[source.index("def chain_producer("):]
    assert "_ahead" not in load[:load.index("@gluon.jit")]


@pytest.mark.parametrize("case,rule", [("one tile per program", 1), ("prologue name assigned again", 2),
                                       ("reads a value the body changes", 3), ("no read", 4)])
def test_loops_it_does_not_rewrite(tmp_path, case, rule):
    prologue, persistent, after = "        row = xs.load_scalar(first, tile)", 1, ""
    if case == "one tile per program":
        persistent = 0
    elif case == "prologue name assigned again":
        after = "        row = row + 1\n"
    elif case == "no read":
        prologue = "        row = tile * 2"
    elif case == "reads a value the body changes":
        prologue = "        row = xs.load_scalar(first, tile + shift)"
    src = _chain(prologue, persistent, after)
    if case == "reads a value the body changes":
        src = src.replace("    for tile in", "    shift = 0\n    for tile in").replace(
            "            ring.release()\n", "            ring.release()\n        shift = shift + 1\n")
    kernel = _load_chain(tmp_path, "chain_" + case.replace(" ", "_"), src)
    cx, dtypes = kernel.specialization()
    lowered = kernel.lower("nvidia", cx, dtypes)
    on = render_source(lowered.kernel, lowered.placement, lowered.allocation, {"prefetch_tile_scalars": True})
    off = render_source(lowered.kernel, lowered.placement, lowered.allocation, {"prefetch_tile_scalars": False})
    assert on == off
    loop = consumer_loop(lowered)
    why = prefetch.plan(loop, lambda e: True, set())
    assert isinstance(why, str) and why.startswith(f"rule {rule}:"), why


def test_off_by_default_and_the_option_spells_it():
    lowered, _, _ = _attention()
    args = (lowered.kernel, lowered.placement, lowered.allocation)
    assert render_source(*args) == render_source(*args, {"prefetch_tile_scalars": False})
    with xs.options(nv_prefetch_tile_scalars=True):
        source = render_source(*args)
    consumer = source[source.index("def attention_fwd_consumer("):]
    assert "pair = tile_order_r0_ahead1" in consumer
    assert "gl.load(tile_order + 2 * xs_tile_ahead2, mask=xs_tile_ahead2 < tiles, other=0)" in consumer


@pytest.mark.parametrize("d,causal", [(64, 1), (64, 0), (128, 1)])
def test_attention_with_reads_ahead_compiles_without_spills(d, causal):
    """Every early read is predicated in the PTX, and the carried values (eight registers for
    attention) push no specialization the tables launch at 1k into local memory."""
    from tests.nvidia.test_compile import _stack_bytes

    lowered, cx, dtypes = _attention(d, causal)
    r = compile_ptx(attention_fwd.lower("nvidia", cx, dtypes), scalar_types={"sm_scale": "fp32"},
                    options={"prefetch_tile_scalars": True})
    assert "tile_order_r0_ahead2" in r.source and re.search(r"\.target sm_90a", r.ptx)
    assert re.search(r"@%p\d+ ld\.global[^\n]*", r.ptx)
    assert not _stack_bytes(r.cubin)
