"""Compile the Hopper lowering to sm_90a PTX + cubin on any machine (no GPU) and check
the synchronization structure the PTX shows."""
import re

import pytest

import xsync as xs
from xsync.kernels.gemm import gemm
from xsync.kernels.gemm_softmax import gemm_softmax
from tests.nvidia.nv_kernels import gemm_extra_wait, handoff, shared_partition_barrier
from xsync.backends.nvidia import bars_offset_from_ptx, compile_ptx
from xsync.errors import BackendError

GEMM_DTYPES = dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32)


def lines(ptx, pattern):
    return [l.strip() for l in ptx.splitlines() if re.search(pattern, l)]


def named_barrier_rows(lowered):
    """(id, threads) of every named barrier, as the allocation table states them."""
    out = {}
    for r in lowered.allocation.rows:
        if r.what == "named barrier":
            m = re.match(r"bar id (\d+), (\d+) threads", r.resource)
            out[r.obj] = (int(m.group(1)), int(m.group(2)))
    return out


def common_sync_checks(ptx, expect_bytes, wait_groups=(0,), producer_regs=40):
    """``expect_bytes``: the bytes every TMA-filled slot expects (an int), or the set of them
    where rings differ (attention's K/V ring and its Q ring)."""
    assert lines(ptx, r"mbarrier\.try_wait\.parity"), "no mbarrier wait"
    expects = lines(ptx, r"mbarrier\.arrive\.expect_tx")
    want = {expect_bytes} if isinstance(expect_bytes, int) else set(expect_bytes)
    got = {int(l.rstrip(";").rsplit(",", 1)[1]) for l in expects}
    assert expects and got == want, expects
    assert lines(ptx, r"cp\.async\.bulk\.tensor\.2d"), "no TMA copy"
    waits = {int(x) for x in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)}
    assert waits == set(wait_groups), waits
    assert lines(ptx, r"wgmma\.mma_async")
    assert lines(ptx, rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{producer_regs};"), "producer register budget"
    assert lines(ptx, r"setmaxnreg\.inc")
    assert lines(ptx, r"\.target sm_90a")


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_gemm_stages_compile(stages):
    consts = dict(BM=128, BN=128, BK=64, STAGES=stages)
    r = compile_ptx(gemm, consts, GEMM_DTYPES)
    assert len(r.cubin) > 10_000
    # wait deferral keeps one wgmma in flight once the ring has two slots; rings up to
    # 113 KB leave room for two CTAs per SM, whose producers then get 24 registers
    common_sync_checks(r.ptx, 2 * (128 * 64 * 2), wait_groups=(0,) if stages == 1 else (0, 1),
                       producer_regs=24 if stages <= 3 else 40)
    assert (".maxnreg 128" in r.ptx) == (stages <= 3)
    # full + empty barrier per stage
    assert len(lines(r.ptx, r"mbarrier\.init")) == 2 * stages
    # ring arithmetic derived by xsync, kernel lines cited
    assert f"tiles_waited % {stages}" in r.source
    assert f"((tiles_acquired // {stages}) & 1) ^ 1" in r.source
    assert "# line" in r.source and "tiles.release()" in r.source
    assert r.metadata.shared >= stages * 32768


def test_gemm_softmax_compile():
    lowered = gemm_softmax.lower("nvidia")
    r = compile_ptx(lowered)
    # three consumer warpgroups: the producers give up registers so each consumer gets 160
    common_sync_checks(r.ptx, 2 * (64 * 64 * 2), wait_groups=(0, 1), producer_regs=32)
    assert lines(r.ptx, r"setmaxnreg\.inc\.sync\.aligned\.u32\s+160;")
    (bid, threads), = named_barrier_rows(lowered).values()
    syncs = lines(r.ptx, rf"bar\.sync\s+{bid},\s*{threads};")
    assert len(syncs) == 2, syncs  # one per epilogue replica partition
    # scores pipe: register-filled ring, empty barriers count both replicas
    assert "mbarrier.init(xs_bars.index(SCORES_EMPTY + 0), count=2)" in r.source
    assert "scores_c.index(res).store(acc)" in r.source
    assert "fence_async_shared()" in r.source
    # 3 consumer warpgroups + producer: 4 + 4 + 4 + (1 + 3 padding) warps
    assert r.metadata.num_warps == 16


def test_named_barrier_arrive_and_sync():
    lowered = handoff.lower("nvidia")
    r = compile_ptx(lowered)
    (bid, threads), = named_barrier_rows(lowered).values()
    assert len(lines(r.ptx, rf"bar\.arrive\s+{bid},\s*{threads};")) == 1
    assert len(lines(r.ptx, rf"bar\.sync\s+{bid},\s*{threads};")) == 1


def test_register_budget_override(monkeypatch):
    monkeypatch.setenv("XSYNC_NV_PRODUCER_REGS", "24")
    r = compile_ptx(gemm, dict(BM=128, BN=128, BK=64, STAGES=2), GEMM_DTYPES)
    assert lines(r.ptx, r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;")
    r = compile_ptx(gemm, dict(BM=128, BN=128, BK=64, STAGES=2), GEMM_DTYPES, options={"producer_regs": 32})
    assert lines(r.ptx, r"setmaxnreg\.dec\.sync\.aligned\.u32\s+32;")


@pytest.mark.parametrize("kernel", [gemm, gemm_softmax])
def test_hang_debug_variant_compiles(kernel):
    r = compile_ptx(kernel, debug_hang=True)
    polls = re.findall(r"XS_POLL:\s*mbarrier\.try_wait\.parity\.shared::cta\.b64", r.ptx)
    assert len(polls) >= len(r.render.wait_sites) > 0  # replicas share a function: inlined per partition
    assert "trap;" in r.ptx and "%globaltimer" in r.ptx
    assert r.bars_smem == bars_offset_from_ptx(r.ptx) and r.bars_smem > 0
    assert f"XS_BARS_SMEM = gl.constexpr({r.bars_smem})" in r.source


def test_hang_debug_env(monkeypatch):
    monkeypatch.setenv("XSYNC_DEBUG_HANG", "1")
    monkeypatch.setenv("XSYNC_VERIFY", "0")
    r = compile_ptx(gemm_extra_wait)
    assert r.bars_smem is not None
    sites = [(s.role, s.verb, s.obj) for s in r.render.wait_sites]
    assert ("mma", "wait", "tiles") in sites and ("load", "acquire", "tiles") in sites


def test_generated_source_is_cached_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("XSYNC_CACHE_DIR", str(tmp_path))
    r = compile_ptx(gemm, dict(BM=128, BN=128, BK=64, STAGES=2), GEMM_DTYPES)
    files = list((tmp_path / "nvidia").iterdir())
    assert [f for f in files if f.suffix == ".py"], files
    assert not [f for f in files if f.name.startswith(".xsync-")], "temp file left behind"
    assert any(f.read_text() == r.source for f in files if f.suffix == ".py")


def test_register_b_operand_is_rejected():
    @xs.kernel(example=dict(a=xs.bfloat16, c=xs.float32, BM=64, BN=64))
    def bad(a, c, M, N, BM: xs.constexpr, BN: xs.constexpr):
        load = xs.role("load", kind="copy")
        mma = xs.role("mma", kind="matrix")
        t = xs.pipe(load, mma, stages=1, a=xs.tile([BM, BN], a.dtype))
        with load:
            s = t.acquire()
            s.a = xs.load(a, [0, 0], [BM, BN])
            t.commit()
        with mma:
            g = t.wait()
            z = xs.zeros([BN, BN], xs.bfloat16)
            acc = xs.mma(g.a, z)
            acc = xs.mma_wait(acc, pending=0)
            t.release()
            xs.store(c, [0, 0], acc)

    with pytest.raises(BackendError) as err:
        compile_ptx(bad)
    assert "B operand" in str(err.value) and ":" in str(err.value).splitlines()[0]


def test_flash_attention_single_source_compiles():
    """kernels/flash_attn on Hopper: K/V by TMA, two ping-pong consumer warpgroups whose
    mma and softmax roles share registers (no barrier for s_out / p_in / pv_out)."""
    from xsync.kernels.flash_attn import attention_fwd

    from xsync.backends.nvidia.passes import common, overlap as overlap_pass

    lowered = attention_fwd.lower("nvidia")
    r = compile_ptx(lowered, scalar_types={"sm_scale": "fp32"})
    overlap = common.enabled(lowered.options, overlap_pass.OPTION)   # keeps PV in flight: wait 1
    common_sync_checks(r.ptx, {128 * 128 * 2, 64 * 128 * 2}, wait_groups=(0, 1) if overlap else (0,))
    assert r.metadata.num_warps == 12          # 2 consumer warpgroups + 3 producer warps (load, 2 x q_load) + 1 padding
    assert lines(r.ptx, r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.bf16\.bf16")
    for pipe in ("s_out", "p_in", "pv_out"):
        assert pipe.upper() + "_FULL" not in r.source
    assert "k_in_k.index(kt).permute((1, 0))" in r.source     # xs.trans on a shared-memory operand
    assert "DotOperandLayout(operand_index=0" in r.source     # register A operand (P)


def _launched_specializations():
    """(head_dim, causal, schedule) of every schedule the ops can launch on Hopper."""
    from xsync.kernels.flash_attn import ops, schedule

    out = {}
    for d in ops.HEAD_DIMS:
        for causal in (0, 1):
            for length in (128, 1024, 2048, 4096, 8192, 16384, 1 << 20):
                plan = schedule.lookup("nvidia", d, causal, length)
                out[(d, causal, plan)] = None
    return list(out)


def _cuobjdump(cubin: bytes, flag: str) -> str | None:
    """cuobjdump ``flag`` of a cubin (the one triton ships), or None where it ships none."""
    import pathlib
    import subprocess
    import tempfile

    import triton

    tool = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool), flag, f.name], capture_output=True, text=True, check=True).stdout


def _stack_bytes(cubin: bytes) -> int | None:
    """The kernel's per-thread stack (local memory: ptxas spills) from cuobjdump's resource
    usage, or None where triton ships no cuobjdump."""
    text = _cuobjdump(cubin, "--dump-resource-usage")
    return None if text is None else int(re.search(r"STACK:(\d+)", text).group(1))


@pytest.mark.parametrize("d,causal,plan", _launched_specializations(),
                         ids=lambda x: f"R{x.replicas}-BM{x.BM}-BN{x.BN}-S{x.STAGES}-P{int(x.persistent)}-Q{x.q_stages}"
                         if hasattr(x, "BM") else str(x))
def test_every_launched_attention_specialization_compiles(d, causal, plan):
    """Every specialization the ops launch on Hopper (head_dim, causal, and the schedule the
    table picks per length: tiles, stages, Q slots, consumer replicas, the tile loop) goes
    through Gluon and ptxas here, so a layout that only one of them gets wrong fails in CI, not
    on the GPU; and none spills under this Triton, or the row names a fallback that does not
    (the ops switch to it: ops.launched_schedule). Three consumer warpgroups at 160 registers
    keep d64's S, P, O and the next S in flight out of local memory under Triton 3.6, where the
    table was measured; Triton 3.9 spills the persistent one (104 B a thread)."""
    from xsync.kernels.flash_attn import attention_fwd, ops

    def compiled(plan):
        cx, dtypes = attention_fwd.specialization()
        cx.update(plan.forward_constexprs(), **ops.dim_constexprs(d), CAUSAL=causal, **ops.scale_constexprs(None))
        r = compile_ptx(attention_fwd.lower("nvidia", cx, dtypes), scalar_types={"sm_scale": "fp32"})
        assert lines(r.ptx, rf"wgmma\.mma_async\.sync\.aligned\.m64n{ops.tile_dim(d)}k16\.f32\.bf16\.bf16")   # P @ V
        assert lines(r.ptx, rf"wgmma\.mma_async\.sync\.aligned\.m64n{plan.BN}k16\.f32\.bf16\.bf16")  # Q @ K^T
        assert r.metadata.num_warps == 4 * plan.replicas + 4       # consumers + the producer warps' group
        return _stack_bytes(r.cubin)

    # ends at a plan without stack (0, or None where triton ships no cuobjdump)
    stack = compiled(plan)
    while stack:
        assert plan.fallback is not None, f"{plan}: {stack} B of stack a thread (ptxas spilled) and no fallback"
        plan = plan.fallback
        stack = compiled(plan)


def test_flash_attention_pv_fused_into_accumulator():
    """The kernel writes the split form (`pv = mma(p, v)`, then `o_acc = o_acc * alpha + pv`
    in the softmax role); on Hopper both ends share a partition, so the renderer fuses it
    into one accumulating wgmma (docs/design.md §5); Q is read from its shared-memory ring as it
    landed (no conversion in the loop)."""
    from xsync.kernels.flash_attn import attention_fwd

    consts = dict(BM=64, BN=128, D=128, CAUSAL=0, STAGES=2)
    fused = compile_ptx(attention_fwd, consts, scalar_types={"sm_scale": "fp32"},
                        options={"overlap_softmax": False})   # one softmax copy, as in split
    src = fused.source
    assert re.search(r"pv = warpgroup_mma\(.*, o_acc \* alpha\[:, None\], is_async=True\)", src), src
    assert "o_acc = pv_out_pv" in src
    assert "+ pv_out_pv" not in src
    loop = src[src.index("for n in range"):src.index("# role 'softmax' (line", src.index("o_acc = pv_out_pv"))]
    assert "convert_layout(q_in" not in loop and "warpgroup_mma(q_in_q.index(qt)," in loop
    split = compile_ptx(attention_fwd, consts, scalar_types={"sm_scale": "fp32"}, options={"fuse_mma": False})
    assert "o_acc = o_acc * alpha[:, None] + pv_out_pv" in split.source
    # PTX: the rescale-and-add (64 fma per thread and consumer warpgroup) is gone; the
    # wgmma accumulates into the rescaled o_acc instead of a zero-initialised product
    fma = lambda ptx: len(lines(ptx, r"fma\.rn\.f32"))  # noqa: E731
    assert fma(fused.ptx) + 2 * 64 <= fma(split.ptx), (fma(fused.ptx), fma(split.ptx))
    assert len(lines(fused.ptx, r"wgmma\.mma_async")) == len(lines(split.ptx, r"wgmma\.mma_async"))


def test_split_mma_not_fused_when_product_is_reused():
    """Fusion needs exactly one `E + product` use with E unchanged since the mma."""
    from xsync.backends.nvidia import render_source

    @xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=64, BN=64))
    def reused(a, b, c, BM: xs.constexpr, BN: xs.constexpr):
        load = xs.role("load", kind="copy")
        mma = xs.role("mma", kind="matrix")
        t = xs.pipe(load, mma, stages=1, a=xs.tile([BM, BN], a.dtype), b=xs.tile([BN, BN], b.dtype))
        with load:
            s = t.acquire()
            s.a = xs.load(a, [0, 0], [BM, BN])
            s.b = xs.load(b, [0, 0], [BN, BN])
            t.commit()
        with mma:
            acc = xs.zeros([BM, BN], xs.float32)
            g = t.wait()
            r = xs.mma(g.a, g.b)
            r = xs.mma_wait(r, pending=0)
            t.release()
            acc = acc + r
            acc = acc + r * 2.0
            xs.store(c, [0, 0], acc)

    lowered = reused.lower("nvidia")
    src = render_source(lowered.kernel, lowered.placement, lowered.allocation)
    assert "acc = acc + r\n" in src or "acc = acc + r " in src
    assert "gl.zeros([64, 64], gl.float32, ACC_N64), is_async=True)" in src


def ptx_loops(ptx):
    """Bodies of the PTX loops: the lines from a label to a later branch back to it."""
    body = ptx.splitlines()
    labels, loops = {}, []
    for i, l in enumerate(body):
        m = re.match(r"^(\$L__\w+):", l.strip())
        if m:
            labels[m.group(1)] = i
        m = re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+);", l)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            loops.append(body[labels[m.group(1)]:i + 1])
    return loops


def wgmma_loop(ptx):
    loops = [lp for lp in ptx_loops(ptx) if any("wgmma.mma_async" in l for l in lp)]
    assert len(loops) == 1, len(loops)
    return "\n".join(loops[0])


def test_gemm_wait_deferral():
    """defer_mma_wait (default on): the K loop waits with wgmma.wait_group 1 (the wgmma just
    issued stays in flight) and releases the previous slot; the loop's last wgmma is
    drained after the loop. Off: every wgmma is waited to 0 in the loop."""
    consts = dict(BM=128, BN=128, BK=64, STAGES=3)
    r = compile_ptx(gemm, consts, GEMM_DTYPES)
    loop = wgmma_loop(r.ptx)
    assert re.search(r"wgmma\.wait_group\.sync\.aligned 1;", loop), loop
    assert not re.search(r"wgmma\.wait_group\.sync\.aligned 0;", loop), loop
    assert len(lines(loop, r"mbarrier\.arrive\.shared")) == 1          # the deferred release, predicated
    after = r.ptx[r.ptx.index(loop) + len(loop):]
    assert re.search(r"wgmma\.wait_group\.sync\.aligned 0;", after)
    src = r.source
    assert "warpgroup_mma_wait(1, deps=[acc, tiles_a.index(ab), tiles_b.index(ab)])" in src
    # the held slot: every iteration but the first releases the previous one (guard k > 0)
    assert "pred=k > 0" in src and "acc = warpgroup_mma_wait(0, deps=[acc])" in src
    # the drain and the last release come right after the loop, before the epilogue reads acc
    tail = src[src.index("acc = warpgroup_mma_wait(0, deps=[acc])"):]
    assert tail.index("tiles.release() of the last slot") < tail.index("gl.store(c")

    off = compile_ptx(gemm, consts, GEMM_DTYPES, options={"defer_mma_wait": False})
    loop = wgmma_loop(off.ptx)
    assert re.search(r"wgmma\.wait_group\.sync\.aligned 0;", loop)
    assert "pred=k > 0" not in off.source
    assert {int(x) for x in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", off.ptx)} == {0}


def test_wait_deferral_needs_a_private_accumulator():
    """An accumulator read elsewhere in the loop (here: stored every step) is not deferred."""
    from xsync.backends.nvidia import render_source

    @xs.kernel(example=dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.float32, BM=64, BN=64, BK=64))
    def peeks(a, b, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr):
        load = xs.role("load", kind="copy")
        mma = xs.role("mma", kind="matrix")
        t = xs.pipe(load, mma, stages=2, a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
        with mma:
            acc = xs.zeros([BM, BN], xs.float32)
        for k in range(0, K, BK):
            with load:
                s = t.acquire()
                s.a = xs.load(a, [0, k], [BM, BK])
                s.b = xs.load(b, [k, 0], [BK, BN])
                t.commit()
            with mma:
                g = t.wait()
                acc = xs.mma(g.a, g.b, acc)
                acc = xs.mma_wait(acc, pending=0)
                t.release()
                xs.store(c, [0, 0], acc)

    lowered = peeks.lower("nvidia")
    src = render_source(lowered.kernel, lowered.placement, lowered.allocation)
    assert "warpgroup_mma_wait(0, deps=[acc, t_a.index(g), t_b.index(g)])" in src
    assert "xs_held_" not in src


@pytest.mark.parametrize("where", ["wrap", "first", "each"])
def test_flash_attention_pingpong_scheduler_barriers(where):
    """Option pingpong: the two consumer warpgroups take turns issuing their wgmmas
    through the scheduler barrier pair the allocation reserves (256 threads each):
    replica r bar.syncs lo + r before its wgmma, bar.arrives lo + 1 - r after; replica 1
    arrives once before the loop, replica 0 once after it (balanced at exit)."""
    from xsync.kernels.flash_attn import attention_fwd

    with xs.options(nv_pingpong=where, nv_overlap=False):
        lowered = attention_fwd.lower("nvidia", dict(BM=64, BN=128, D=128, CAUSAL=1, STAGES=2))
    # the pass declares the two turn barriers; the allocator numbers them like any barrier
    turns = named_barrier_rows(lowered)
    assert sorted(turns) == ["consumer_turn0", "consumer_turn1"]
    (t0, n0), (t1, n1) = turns["consumer_turn0"], turns["consumer_turn1"]
    assert n0 == n1 == 256 and {t0, t1} == {14, 15}          # above the compiler's 0, 1, 2, 3 (+padding)
    assert f"placement {where!r}" in lowered.passes.text()
    r = compile_ptx(lowered, scalar_types={"sm_scale": "fp32"})
    src = r.source[r.source.index("def attention_fwd_consumer"):]
    loop = src[src.index("for n in range"):src.index("# role 'softmax' (line", src.index("o_acc = pv_out_pv"))]
    # each turn site is a branch on the (constexpr) replica: two spelled lines per site
    n_sync = loop.count("-- pingpong: wait for this replica's turn")
    n_arrive = loop.count("-- pingpong: hand the turn to the other replica")
    assert (n_sync, n_arrive) == ((4, 4) if where == "each" else (2, 2))
    assert loop.count(f"xs_named_barrier_sync({t0}, 256)") == loop.count(f"xs_named_barrier_sync({t1}, 256)")
    head = src[:src.index("for n in range")]
    tail = src[src.index("o_acc = pv_out_pv"):]
    assert f"xs_named_barrier_arrive({t0}, 256)" in head and "pingpong: replica 0 issues first" in head
    # closing handshake: replica 0 takes replica 1's last hand-over, then releases it
    assert f"xs_named_barrier_sync({t0}, 256)" in tail and "pingpong: this loop's turns are over" in tail
    # the first wgmma of the loop comes after the sync, the arrive after a wgmma issue and
    # before its wait
    i_sync = loop.index("-- pingpong: wait for this replica's turn")
    assert i_sync < loop.index("warpgroup_mma(q_in_q")
    i_arr = loop.index("-- pingpong: hand the turn to the other replica")
    assert loop.rindex("= warpgroup_mma(", 0, i_arr) < i_arr < loop.index("warpgroup_mma_wait(", i_arr)
    lo, hi = min(t0, t1), max(t0, t1)
    # PTX: each consumer warpgroup syncs its own ID and arrives on the other's, 256 threads
    ptx = r.ptx
    for op, bid in (("sync", lo), ("sync", hi), ("arrive", lo), ("arrive", hi)):
        assert lines(ptx, rf"\bbar\.{op}\s+{bid},\s*256;"), (op, bid)
    ids = {int(m) for m in re.findall(r"\bbar\.(?:sync|arrive)\s+(\d+),\s*256;", ptx)}
    assert ids == {lo, hi}
    common_sync_checks(ptx, {128 * 128 * 2, 64 * 128 * 2})


def lowered_with(kernel, consts=None, **settings):
    """``kernel`` lowered for nvidia with these configuration options (the schedule passes
    and the allocator read them while lowering)."""
    with xs.options(**settings):
        return kernel.lower("nvidia", consts)


def source_of(lowered):
    from xsync.backends.nvidia import render_source
    return render_source(lowered.kernel, lowered.placement, lowered.allocation)


def test_pingpong_off_and_replica_dependent_loops_untouched(monkeypatch):
    """On by default ("each"); off by option: no turn barrier in the source, and none
    reserved (the pass declares its barriers only where it fires). A loop whose trip count
    depends on the replica is left as written (the replicas could disagree on the
    number of turns)."""
    import dataclasses

    from xsync.kernels.flash_attn import attention_fwd
    from xsync.backends import place
    from xsync.backends.nvidia.passes import pingpong
    from xsync.lowering import ir
    from xsync.lowering.frontend import parse_kernel
    from xsync.lowering.passes import PassLog

    monkeypatch.delenv("XSYNC_NV_PINGPONG", raising=False)
    consts = dict(BM=64, BN=128, D=128, CAUSAL=0, STAGES=2)
    turn = "-- pingpong: wait for this replica's turn"
    off = lowered_with(attention_fwd, consts, nv_pingpong="0", nv_overlap=False)
    assert "pingpong:" not in source_of(off) and named_barrier_rows(off) == {}
    default = lowered_with(attention_fwd, consts, nv_overlap=False)
    assert source_of(default).count(turn) == 2 * 2                # on, placement "each": 2 sites
    assert sorted(named_barrier_rows(default)) == ["consumer_turn0", "consumer_turn1"]
    # with overlap-softmax (default on) and pingpong not given, the rotated loop runs
    # without turn barriers, and none is reserved; an explicit pingpong keeps them
    ov = lowered_with(attention_fwd, consts, nv_overlap=True)
    assert "overlap_softmax" in source_of(ov) and turn not in source_of(ov) and named_barrier_rows(ov) == {}
    assert "pass pingpong: not applied to agent 'consumer': rule 4" in ov.passes.text()
    both = lowered_with(attention_fwd, consts, nv_overlap=True, nv_pingpong="each")
    assert "overlap_softmax" in source_of(both) and source_of(both).count(turn) == 4 * 2

    def skew(body):   # for n in range(0, hi + replica_id(), BN)
        out = []
        for s in body:
            if isinstance(s, ir.For):
                stop = ir.BinOp("+", s.stop, ir.Call("replica_id", ())) if s.var == "n" else s.stop
                s = ir.For(s.var, s.start, stop, s.step, tuple(skew(s.body)), s.loc)
            elif isinstance(s, ir.If):
                s = ir.If(s.cond, tuple(skew(s.body)), tuple(skew(s.orelse)), s.loc)
            out.append(s)
        return tuple(out)
    cx, dtypes = attention_fwd.specialization(consts)
    parsed = parse_kernel(attention_fwd.fn, cx, dtypes)
    skewed = dataclasses.replace(parsed, body=skew(parsed.body))
    with xs.options(nv_overlap=False):
        log = PassLog()
        assert pingpong.run(skewed, place(skewed, "nvidia"), log) == skewed
        assert "rule 2: the loop's trip count may differ between the replicas" in log.text()
        log = PassLog()
        assert pingpong.run(parsed, place(parsed, "nvidia"), log) != parsed
        assert "pass pingpong: applied to loop at line" in log.text()


def _ptxas_log(ptx):
    """ptxas -v output for a PTX module, to see wgmma serialization. The ptxas is the one
    Triton compiles sm_90 with, found through its API (`get_ptxas(arch)` on 3.6-3.9): 3.9
    ships several and emits a PTX version that the older one cannot read."""
    import os
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    from xsync.backends.nvidia import TARGET_ARCH
    ptxas = get_ptxas(TARGET_ARCH).path
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as fh:
            fh.write(ptx)
        p = subprocess.run([ptxas, "-arch=sm_90a", "-v", src, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout + p.stderr


@pytest.mark.parametrize("causal", [0, 1])
def test_flash_attention_overlap_softmax(causal):
    """overlap_softmax: the loop issues S_n = QK^T and PV_{n-1} back to back, waits with
    wgmma.wait_group 1 for S_n (PV stays in flight during the softmax), then 0 for PV;
    the first softmax is peeled into the prologue and the last PV into the epilogue, so
    K and V are each waited and released twice in the source (prologue/epilogue + loop).
    ptxas keeps the wgmmas asynchronous (no C7514 serialization)."""
    from xsync.kernels.flash_attn import attention_fwd

    consts = dict(BM=64, BN=128, D=128, CAUSAL=causal, STAGES=2)
    r = compile_ptx(attention_fwd, consts, scalar_types={"sm_scale": "fp32"},
                    options={"overlap_softmax": True, "pingpong": "each"})
    src = r.source[r.source.index("def attention_fwd_consumer"):r.source.index("def attention_fwd(")]
    assert "if lo < hi:" in src and "for n in range(lo + BN, hi, BN):" in src
    loop = src[src.index("for n in range(lo + BN, hi, BN):"):src.index("overlap_softmax: the last PV completes")]
    i_s, i_pv = loop.index("s = warpgroup_mma(q_in_q"), loop.index("pv = warpgroup_mma(")
    i_w1 = loop.index("s, pv = warpgroup_mma_wait(1, deps=[s, pv])")
    i_soft = loop.index("m_new = gl.maximum(")
    i_w0 = loop.index("pv = warpgroup_mma_wait(0, deps=[pv])")
    assert i_s < i_pv < i_w1 < i_soft < i_w0 < loop.index("o_acc = pv_out_pv")
    assert loop.index("K_IN_EMPTY", i_w1) < i_soft                      # K released before the softmax
    assert loop.index("V_IN_EMPTY", i_w0) > i_w0                        # V released after PV completes
    for what in ("K_IN_FULL + kt", "K_IN_EMPTY + k_in_released", "V_IN_FULL + vt", "V_IN_EMPTY + v_in_released"):
        assert src.count(what) == 2, (what, src.count(what))
    assert src.count("m_new = gl.maximum(") == 2 * 2   # softmax: prologue + loop, each in both SCALE_POSITIVE forms
    assert src.count("-- pingpong: wait for this replica's turn") == 4 * 2  # ping-pong: every wgmma issue
    # PTX: per consumer partition one wgmma loop with wait_group 1 then 0, and no wgmma
    # wait inside a branch of the loop
    # (the innermost PTX loops with a wgmma: 2 commit groups, one wait of each count;
    # LLVM may rotate the block, so the order is not checked here)
    loops = [lp for lp in ptx_loops(r.ptx) if sum("wgmma.commit_group" in l for l in lp) == 2]
    assert len({lp[0] for lp in loops}) == 2, [lp[0] for lp in loops]  # the two consumer warpgroups
    for lp in loops:
        waits = [int(x) for x in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", "\n".join(lp))]
        assert sorted(waits) == [0, 1], waits
    assert {int(x) for x in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", r.ptx)} == {0, 1}
    log = _ptxas_log(r.ptx)
    assert "C7514" not in log and "serialized" not in log, log
    common_sync_checks(r.ptx, {128 * 128 * 2, 64 * 128 * 2}, wait_groups=(0, 1))


def test_overlap_softmax_switch_and_non_matching(monkeypatch):
    """Off: the loop is rendered as written. XSYNC_NV_OVERLAP=0 turns it off, on by default.
    A loop the rewrite does not match exactly is left alone: ping-pong placement "wrap" (its
    turn spans the softmax), the unfused split form (no accumulating PV), other kernels."""
    from xsync.kernels.flash_attn import attention_fwd

    consts = dict(BM=64, BN=128, D=128, CAUSAL=1, STAGES=2)
    off = source_of(lowered_with(attention_fwd, consts, nv_overlap=False))
    on = source_of(lowered_with(attention_fwd, consts, nv_overlap=True))

    def consumer(src):
        return src[src.index("def attention_fwd_consumer"):src.index("def attention_fwd(")]
    assert "overlap_softmax" not in off and "for n in range(lo, hi, BN):" in consumer(off)
    assert "overlap_softmax" in on and "for n in range(lo, hi, BN):" not in consumer(on)
    monkeypatch.delenv("XSYNC_NV_OVERLAP", raising=False)
    assert source_of(attention_fwd.lower("nvidia", consts)) == on
    monkeypatch.setenv("XSYNC_NV_OVERLAP", "0")
    assert source_of(attention_fwd.lower("nvidia", consts)) == off
    monkeypatch.setenv("XSYNC_NV_OVERLAP", "1")
    assert source_of(attention_fwd.lower("nvidia", consts)) == on
    monkeypatch.delenv("XSYNC_NV_OVERLAP")
    for opts in ({"nv_pingpong": "wrap"}, {"nv_fuse_mma": False}):
        lw = lowered_with(attention_fwd, consts, nv_overlap=True, **opts)
        src = source_of(lw)
        assert "overlap_softmax" not in src and "for n in range(lo, hi, BN):" in consumer(src), opts
        assert "pass overlap-softmax: not applied to loop at line" in lw.passes.text()
    for kern in (gemm_softmax, handoff):
        assert source_of(lowered_with(kern, nv_overlap=True)) == source_of(lowered_with(kern, nv_overlap=False))


def test_barrier_met_once_per_meeting_by_a_shared_partition():
    """xs.barrier() over three roles, two of them in the consumer warpgroup: each partition
    performs one bar.sync per meeting (the skeleton's meeting points), with the threads of
    both partitions, so nothing waits for a second arrival that never comes."""
    lowered = shared_partition_barrier.lower("nvidia")
    (bid, threads), = named_barrier_rows(lowered).values()
    assert threads == 32 * (4 + 1)
    r = compile_ptx(lowered)
    start = r.source.index("def shared_partition_barrier_consumer")
    consumer = r.source[start:r.source.index("@gluon.jit", start)]
    assert consumer.count(f"xs_named_barrier_sync({bid}, {threads})") == 1
    assert "met once for this partition at line" in consumer
    assert len(lines(r.ptx, rf"bar\.sync\s+{bid},\s*{threads};")) == 2   # consumer + producer


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_host_descriptor_matches_tritons_constructor(dtype):
    """The launch path's descriptors (copied from a validated template) hold exactly what
    Triton's own constructor would make for the same tensor, for every later tensor; the
    template keeps no tensor alive; an empty tensor still gets the constructor's error."""
    import gc
    import weakref

    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from xsync.backends.nvidia import host_descriptor
    from xsync.backends.nvidia.layouts import nvmma_shared_layout

    dt = getattr(torch, dtype)
    block = [64, 64]
    layout = nvmma_shared_layout(block, getattr(xs, dtype))
    templates = {}
    first = torch.randn(300, 64).to(dt)
    host_descriptor(templates, "q", first, block, layout, TensorDescriptor)
    gone = weakref.ref(first)
    del first
    gc.collect()
    assert gone() is None, "the descriptor template keeps the first tensor alive"
    for rows, cols, stride in ((128, 64, 64), (77, 64, 128), (1, 64, 64)):
        x = torch.randn(rows, stride).to(dt)[:, :cols]
        ours = host_descriptor(templates, "q", x, block, layout, TensorDescriptor)
        theirs = TensorDescriptor(x, list(x.shape), list(x.stride()), block, layout)
        assert ours == theirs and ours.__dict__ == theirs.__dict__
    with pytest.raises(AssertionError, match="shape must be positive"):
        host_descriptor(templates, "q", torch.empty(0, 64).to(dt), block, layout, TensorDescriptor)


def test_persistent_gemm_keeps_the_deferred_wait():
    """gemm_persistent compiles with the same hot loop as gemm: one wgmma kept in flight
    across K steps (wait_group 1 in the loop, 0 after it), TMA loads, producer registers."""
    from xsync.kernels.gemm import gemm_persistent

    consts = dict(BM=128, BN=128, BK=64, STAGES=4, GROUP_M=8)
    r = compile_ptx(gemm_persistent, consts, GEMM_DTYPES)
    common_sync_checks(r.ptx, expect_bytes=32768, wait_groups=(0, 1))


def test_persistent_2wg_gemm_compiles_with_both_consumers_deferring():
    """gemm_persistent_2wg (256x128 tiles): two consumer warpgroups at the full register
    budget, one wgmma in flight across K steps, a 4 x 48 KB ring that fits the SM."""
    from xsync.kernels.gemm import gemm_persistent_2wg

    consts = dict(BM=128, BN=128, BK=64, STAGES=4, GROUP_M=8)
    r = compile_ptx(gemm_persistent_2wg, consts, GEMM_DTYPES)
    waits = {int(x) for x in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", r.ptx)}
    assert waits == {0, 1}
    assert lines(r.ptx, r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232;")
    assert lines(r.ptx, r"cp\.async\.bulk\.tensor\.2d")
    assert 4 * 48 * 1024 <= r.metadata.shared <= 227 * 1024


def test_tma_store_epilogue_where_shared_memory_has_room():
    """A consumer's whole-tile xs.store goes through a staging tile and a TMA store (a bulk
    copy shared -> global, waited before the staging tile is written again and before the
    partition ends), guarded by the tile lying inside its bounds and the tensor suiting TMA;
    the masked store stays for the rest. d128's 224 KB of K/V/Q rings at three stages leave no room;
    tma_store=False (XSYNC_NV_TMA_STORE=0) turns it off."""
    from xsync.backends.nvidia.staging import STAGING_SMEM_LIMIT
    from xsync.kernels.flash_attn import attention_fwd, schedule

    def build(d, length=1024, **options):
        cx = dict(schedule.lookup("nvidia", d, False, length).forward_constexprs(), D=d, CAUSAL=0, SCALE_POSITIVE=1)
        return compile_ptx(attention_fwd, cx, scalar_types={"sm_scale": "fp32"}, options=options)

    r = build(64)
    assert lines(r.ptx, r"cp\.async\.bulk\.tensor\.2d\.global\.shared")
    assert lines(r.ptx, r"cp\.async\.bulk\.wait_group\.read\s+0")
    assert "if (o_tma_ok != 0) & (q_row + row0 + 64 <= q_row + q_len)" in r.source
    assert "xs_tma_store(o_store_desc, [q_row + row0, h * q_head_cols]" in r.source
    assert r.source.count("gl.store(") == 2            # O's fallback and the LSE row
    assert r.metadata.shared <= STAGING_SMEM_LIMIT + 4096     # rings + staging, barriers and scratch
    wide = build(128, 16384)                           # three 64 KB K/V stages and a 32 KB Q ring
    assert "xs_tma_store" not in wide.source and not lines(wide.ptx, r"cp\.async\.bulk\.tensor\.2d\.global\.shared")
    off = build(64, tma_store=False)
    assert "xs_tma_store" not in off.source and "o_tma_ok" not in off.source


def test_two_warpgroup_gemm_stages_bf16_c_beside_three_ring_slots():
    """The persistent 256x128 GEMM with bf16 C: three 48 KB ring slots and two 32 KB staging
    tiles (208 KB) fit under the renderer's limit, so C leaves by TMA stores; four slots
    (192 KB) leave no room and C leaves through masked stores; so do three under the 200 KB the
    limit was before (the renderer option ``staging_smem_limit``, benchmarks/gemm.py's _smem<KB>)."""
    import xsync as xs
    from xsync.backends.nvidia.staging import STAGING_SMEM_LIMIT
    from xsync.kernels.gemm import gemm_persistent_2wg

    def build(stages, **options):
        return compile_ptx(gemm_persistent_2wg, dict(BM=128, BN=128, BK=64, STAGES=stages, GROUP_M=8),
                           dict(a=xs.bfloat16, b=xs.bfloat16, c=xs.bfloat16), options=options)

    three = build(3)
    assert "xs_tma_store(c_store_desc" in three.source
    assert lines(three.ptx, r"cp\.async\.bulk\.tensor\.2d\.global\.shared")
    assert 208 * 1024 <= three.metadata.shared <= min(STAGING_SMEM_LIMIT + 4096, 227 * 1024)
    four = build(4)
    assert "xs_tma_store" not in four.source and four.metadata.shared <= 227 * 1024
    assert "xs_tma_store" not in build(3, staging_smem_limit=200 * 1024).source


def test_one_row_store_keeps_the_vectors_layout():
    """``xs.store(lse, [r, c], lse_row[None, :])`` is spelled as a 1-D store in the layout the
    per-row statistics live in (a slice of the accumulator layout), so the epilogue converts no
    vector to a column slice (each such conversion is a shared-memory round trip with barriers);
    the LSE row still lands where the [1, BM] tile would (tests/nvidia/test_gpu.py checks it)."""
    from xsync.kernels.flash_attn import attention_fwd, schedule

    for d, causal in ((64, 0), (128, 1)):
        cx = dict(schedule.lookup("nvidia", d, bool(causal), 2048).forward_constexprs(), D=d, CAUSAL=causal,
                  SCALE_POSITIVE=1)
        r = compile_ptx(attention_fwd, cx, scalar_types={"sm_scale": "fp32"})
        assert "one row, in the layout its values live in" in r.source
        lse_store = [x for x in r.source.splitlines() if "gl.store(lse + " in x]
        assert len(lse_store) == 1 and "[:, None]" not in lse_store[0] and "[None, :]" not in lse_store[0]
        assert re.search(r"xs_cols\d+ = lse_c \+ row0 \+ gl.arange\(0, 64, layout=gl.SliceLayout\(1, ACC_N\d+\)\)",
                         r.source)
        assert not re.search(r"convert_layout\([^\n]*gl.SliceLayout\(0, ", r.source)


def _tile_range_copy(x, y, tiles_total, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    for tile in xs.tile_range(tiles_total):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [tile * BLOCK, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [tile * BLOCK, 0], got.t)
            ring.release()


def test_tma_store_only_outside_plain_loops():
    """TMA stores of one location would not be ordered, so a store inside a loop that is not
    a tile loop (gemm_softmax's column blocks, or a loop over tiles written by hand rather than
    declared with xs.tile_range) stays a masked store; the persistent GEMM's, inside its tile
    loop, and the one-tile GEMM's (S=1: room for two CTAs with staging) go by TMA."""
    from xsync.backends.nvidia import render_source
    from xsync.kernels.gemm import gemm, gemm_persistent
    from xsync.kernels.gemm_softmax import gemm_softmax

    def source(kernel, cx=None, dtypes=None):
        lw = kernel.lower("nvidia", cx, dtypes)
        return render_source(lw.kernel, lw.placement, lw.allocation)

    assert "xs_tma_store" not in source(gemm_softmax)
    # the same tiles walked by a hand-written range(program_id(0), n, num_programs(0)): only
    # xs.tile_range declares a tile loop, so this store stays masked
    from tests.core.corpus import correct_persistent_tiles
    declared = xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16, STAGES=2))(_tile_range_copy)
    assert "xs_tma_store(y_store_desc" in source(declared)
    assert "xs_tma_store" not in source(correct_persistent_tiles, dict(BLOCK=16, STAGES=2))
    assert "xs_tma_store(c_store_desc" in source(gemm_persistent)
    assert "xs_tma_store(c_store_desc" in source(gemm, dict(BM=128, BN=128, BK=64, STAGES=1), GEMM_DTYPES)
    assert "xs_tma_store" not in source(gemm, dict(BM=128, BN=128, BK=64, STAGES=3), GEMM_DTYPES)
