"""`xsync trace`: the CPU runtime's event recorder, the timeline model and its SVG/PNG files."""
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter

import pytest
import torch

from xsync.kernels.flash_attn.kernel import attention_fwd
from xsync.kernels.gemm import gemm
from xsync.kernels.gemm_softmax import gemm_softmax
from tests.core import broken_kernels as bk
from xsync import trace as tr
from xsync.backends.cpu import runtime, schedulers
from xsync.errors import StallError
from xsync.compiler import Kernel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIL = pytest.importorskip("PIL.Image", reason="PNG output needs pillow (the trace extra)")


def check_files(tl, tmp_path, stem):
    """Both files open as images: SVG parses with an <svg> root, PNG loads with a sane size."""
    svg, png = str(tmp_path / f"{stem}.svg"), str(tmp_path / f"{stem}.png")
    tr.write(tl, svg)
    tr.write(tl, png)
    root = ET.parse(svg).getroot()
    assert root.tag in ("svg", "{http://www.w3.org/2000/svg}svg")
    assert int(root.get("width")) > 600 and int(root.get("height")) > 200
    with PIL.open(png) as im:
        im.verify()
    with PIL.open(png) as im:
        w, h = im.size
        assert im.format == "PNG" and 1000 <= w <= 12000 and 300 <= h <= 4000
        assert len(im.getcolors(1 << 20) or range(999)) > 20   # not a blank canvas
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".xsync-")]  # atomic: no leftovers
    texts = [t.text for t in root.iter() if t.tag.endswith("text")]
    return root, texts


def test_gemm_softmax_trace_writes_svg_and_png(tmp_path):
    result = tr.trace_kernel(gemm_softmax)
    tl = result.timeline
    assert result.error is None and not tl.deadlock
    assert tl.lanes == ["load", "mma", "epilogue[0]", "epilogue[1]"]
    assert {m.obj for m in tl.marks} == {"tiles", "scores", "team"}
    assert tl.spans and tl.links
    _, texts = check_files(tl, tmp_path, "gemm_softmax")
    for lane in tl.lanes:
        assert lane in texts
    assert "legend:" in texts and any(t and t.startswith("time (") for t in texts)


def test_flash_attention_trace_writes_svg_and_png(tmp_path):
    result = tr.trace_kernel(attention_fwd)
    tl = result.timeline
    assert tl.lanes == ["load", "q_load[0]", "q_load[1]", "mma[0]", "mma[1]", "softmax[0]", "softmax[1]"]
    assert {m.obj for m in tl.marks} == {"q_in", "k_in", "v_in", "s_out", "p_in", "pv_out"}
    check_files(tl, tmp_path, "attention")


def _gemm_softmax_recorded(k_steps=3, tiles=2, stages=2):
    BM = BN = BK = 16
    a, b = torch.randn(BM, k_steps * BK).bfloat16(), torch.randn(k_steps * BK, tiles * BN).bfloat16()
    out = torch.zeros(BM, tiles * BN)
    with runtime.record() as rec:
        gemm_softmax[(1, 1)](a, b, out, BM, tiles * BN, k_steps * BK, BM=BM, BN=BN, BK=BK,
                             STAGES=stages, TILES=tiles, backend="cpu")
    ref = torch.cat([torch.softmax(x, 1) for x in (a.float() @ b.float()).split(BN, 1)], 1)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)   # recording changes nothing
    (prog,) = rec.programs
    return prog


def test_recorder_pairs_each_wait_with_its_commit():
    K_STEPS, TILES, STAGES = 3, 2, 2
    prog = _gemm_softmax_recorded(K_STEPS, TILES, STAGES)
    ops = prog.ops
    sync = [op for op in ops if op.kind != "work"]
    kinds = Counter((op.label, op.kind, op.obj) for op in sync)
    n_tiles = K_STEPS * TILES
    assert kinds[("load", "acquire", "tiles")] == kinds[("load", "commit", "tiles")] == n_tiles
    assert kinds[("mma", "wait", "tiles")] == kinds[("mma", "release", "tiles")] == n_tiles
    assert kinds[("mma", "commit", "scores")] == TILES
    for r in (0, 1):
        assert kinds[(f"epilogue[{r}]", "wait", "scores")] == TILES     # broadcast to both
        assert kinds[(f"epilogue[{r}]", "sync", "team")] == TILES

    by_dst = {}
    for j, i in prog.pairs:
        by_dst.setdefault(i, []).append(j)
    pairs = Counter((ops[j].kind, ops[i].kind, ops[i].obj) for j, i in prog.pairs)
    # every pipe wait has exactly one partner: the commit with the same sequence number
    for i, op in enumerate(ops):
        if op.kind == "wait":
            (j,) = by_dst[i]
            assert ops[j].kind == "commit" and ops[j].obj == op.obj and ops[j].seq == op.seq
            assert ops[j].t_start <= op.t_end              # the commit came first
    assert pairs[("commit", "wait", "tiles")] == n_tiles
    assert pairs[("commit", "wait", "scores")] == 2 * TILES
    # acquire j waits for release j - stages (none for the first `stages` slots)
    assert pairs[("release", "acquire", "tiles")] == n_tiles - STAGES
    assert pairs[("release", "acquire", "scores")] == 2 * max(0, TILES - 2)
    for j, i in prog.pairs:
        if ops[i].kind == "acquire":
            assert ops[j].kind == "release" and ops[j].obj == ops[i].obj
            assert ops[i].seq - ops[j].seq == prog.objects[ops[i].obj].stages
    # each barrier meeting: the other member's arrival
    assert pairs[("sync", "sync", "team")] == 2 * TILES
    # blocked ops carry the runtime's account of what they waited on
    for op in sync:
        if op.blocked_ns is not None:
            assert op.obj in op.waits_on and op.t_start <= op.blocked_ns <= op.t_end
    # lines and loop iterations also for the non-blocking verbs (from the generated source)
    src = open(gemm_softmax.fn.__code__.co_filename).read().splitlines()
    commits = [op for op in sync if op.kind == "commit" and op.obj == "tiles"]
    assert all("tiles.commit()" in src[op.line - 1] for op in commits)
    assert [(op.iteration["t"], op.iteration["k"]) for op in commits] == \
        [(t, k) for t in range(TILES) for k in range(0, K_STEPS * 16, 16)]
    # work spans fill the gaps between one agent's sync ops
    assert any(op.kind == "work" and op.label == "epilogue[0]" for op in ops)


def test_recorder_is_off_by_default(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("recording agent built without record()")
    monkeypatch.setattr(schedulers, "RecordingAgent", boom)
    a, b, c = torch.randn(16, 32).bfloat16(), torch.randn(32, 16).bfloat16(), torch.zeros(16, 16)
    gemm[(1, 1)](a, b, c, 16, 16, 32, BM=16, BN=16, BK=16, STAGES=2, backend="cpu")
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-4, atol=1e-4)


def test_deadlock_draws_the_verifiers_counterexample(tmp_path):
    result = tr.trace_kernel(bk.missing_release)
    tl, err = result.timeline, result.error
    assert tl.deadlock and tl.unit == "step" and result.recording is None
    assert "shortest interleaving (7 steps)" in str(err)
    steps = [m for m in tl.marks if not m.stuck]
    stuck = [m for m in tl.marks if m.stuck]
    assert len(steps) == 7 and tl.stuck_lanes == ["load", "work"]
    assert {tl.lanes[m.lane]: m.verb for m in stuck} == {"load": "acquire", "work": "wait"}
    assert all("pipe 'ring'" in m.waits_on for m in stuck)
    # commit k -> wait k arrows, and each stuck op points at the lane it waits on
    pairs = [(tl.marks[ln.src].verb, tl.marks[ln.dst].verb) for ln in tl.links if ln.kind == "pair"]
    assert pairs.count(("commit", "wait")) == 2 and ("release", "acquire") in pairs
    assert sorted((tl.lanes[tl.marks[ln.src].lane], tl.lanes[-1 - ln.dst])
                  for ln in tl.links if ln.kind == "waits-on") == [("load", "work"), ("work", "load")]
    root, texts = check_files(tl, tmp_path, "missing_release")
    assert texts.count("STUCK") == 2
    assert any(t and "waits: acquire on pipe 'ring'" in t for t in texts)
    red = [e for e in root.iter() if e.tag.endswith("rect") and e.get("stroke") == tr.STALL_EDGE]
    assert len(red) >= 2


def test_three_way_cycle_marks_every_lane_stuck(tmp_path):
    tl = tr.trace_kernel(bk.three_way_cycle).timeline
    assert tl.stuck_lanes == ["a", "b", "c"]
    assert sum(ln.kind == "waits-on" for ln in tl.links) == 3
    check_files(tl, tmp_path, "cycle")


def _hook(settings):
    x, y = torch.randn(64, 16), torch.zeros(64, 16)
    return (1,), (x, y, 4), dict(BLOCK=16, STAGES=1)


def test_stall_on_the_emulator_is_drawn_with_stuck_lanes(monkeypatch, tmp_path):
    monkeypatch.setenv("XSYNC_VERIFY", "0")          # let it run into the watchdog
    k = Kernel(bk.missing_release.fn, example=bk.EX, trace=_hook)
    result = tr.trace_kernel(k)
    assert isinstance(result.error, StallError)
    assert result.timeline.stuck_lanes == ["load", "work"]
    check_files(result.timeline, tmp_path, "stall")


def test_kernel_without_hook_gets_a_clear_error():
    k = Kernel(gemm.fn, example=gemm.example)
    with pytest.raises(tr.TraceSetupError) as info:
        tr.trace_kernel(k)
    assert "no trace= hook" in str(info.value) and "def make_args(settings)" in str(info.value)


def test_bad_output_name(tmp_path):
    tl = tr.trace_kernel(bk.three_way_cycle).timeline
    with pytest.raises(tr.TraceSetupError, match=r"\.svg or \.png"):
        tr.write(tl, str(tmp_path / "x.jpg"))


def test_cli_trace(tmp_path):
    out = tmp_path / "gemm.svg"
    r = subprocess.run([sys.executable, "-m", "xsync", "trace", "xsync.kernels.gemm:gemm", "--out", str(out),
                        "--set", "STAGES=3", "--grid", "1,1"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "grid (1, 1)" in r.stdout and out.exists()
    assert "STAGES=3" in out.read_text()
    r = subprocess.run([sys.executable, "-m", "xsync", "trace",
                        "tests/core/broken_kernels.py:missing_release", "--out", str(tmp_path / "d.png")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "DEADLOCK" in r.stdout and (tmp_path / "d.png").exists()
