"""Bad input never gives a silent wrong answer: a table of bad inputs to the attention ops,
the varlen contract, the configuration, the CLI and the caches, each with the error it must
raise (naming the problem and the fix) or the right answer it must give."""
import math
import os
import stat
import subprocess
import sys

import pytest
import torch

import xsync
from xsync import config, files
from xsync.config import ConfigError
from xsync.errors import BackendError, LaunchError
from xsync.kernels.flash_attn import attention, attention_varlen

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def t(*shape, dtype=torch.bfloat16, **kw):
    return torch.randn(*shape, **kw).to(dtype)


def qkv(b=1, h=2, s=24, d=64, dtype=torch.bfloat16):
    return t(b, h, s, d, dtype=dtype), t(b, h, s, d, dtype=dtype), t(b, h, s, d, dtype=dtype)


def noncontig():
    x = t(1, 2, 64, 24).transpose(-1, -2)
    return x, t(1, 2, 24, 64), t(1, 2, 24, 64)


# ---------------------------------------------------------------- the ops
OP_ERRORS = [
    # (id, call, error text, fix text)
    ("q-not-a-tensor", lambda: attention([1.0], *qkv()[1:]), "q is a list", "torch tensors"),
    ("q-3d", lambda: attention(t(2, 24, 64), *qkv()[1:]), "expected 4 dims", "[batch, heads, seq, head_dim]"),
    ("float32", lambda: attention(*qkv(dtype=torch.float32)), "dtype torch.float32", "bfloat16"),
    ("mixed-dtypes", lambda: attention(qkv()[0], *qkv(dtype=torch.float16)[1:]), "dtypes differ", "one dtype"),
    ("head-dim-32", lambda: attention(*qkv(d=32)), "supported head dims are 64, 96, 128, 256", "next supported one (64)"),
    ("k-v-differ", lambda: attention(qkv()[0], t(1, 2, 24, 64), t(1, 2, 20, 64)), "differ", "one shape"),
    ("gqa-ratio", lambda: attention(t(1, 3, 24, 64), t(1, 2, 24, 64), t(1, 2, 24, 64)),
     "3 query heads are not a multiple of 2", "divide"),
    ("batch-differs", lambda: attention(t(2, 2, 24, 64), t(1, 2, 24, 64), t(1, 2, 24, 64)),
     "batch sizes differ", "one batch size"),
    ("meta-k", lambda: torch.ops.xsync.attention(qkv()[0], t(1, 2, 24, 64, device="meta"), qkv()[2], False, 1.0),
     "k is on meta but q is on cpu", "one device"),
    ("meta-all", lambda: torch.ops.xsync.attention(*(t(1, 2, 24, 64, device="meta") for _ in range(3)), False, 1.0),
     "q is on the meta device", "real tensors"),
    ("scale-nan", lambda: attention(*qkv(), sm_scale=float("nan")), "sm_scale=nan is not a finite number", "finite"),
    ("scale-inf", lambda: attention(*qkv(), sm_scale=float("inf")), "sm_scale=inf is not a finite number", "finite"),
    ("scale-str", lambda: attention(*qkv(), sm_scale="0.1"), "sm_scale='0.1' is not a number", "finite float"),
    ("direct-op-float32", lambda: torch.ops.xsync.attention(*qkv(dtype=torch.float32), False, 0.1),
     "dtype torch.float32", "bfloat16"),
]


@pytest.mark.parametrize("name,call,what,fix", OP_ERRORS, ids=[c[0] for c in OP_ERRORS])
def test_op_errors(name, call, what, fix):
    with pytest.raises(LaunchError) as err:
        call()
    assert what in err.value.what and fix in err.value.fix, str(err.value)


def test_column_strided_q_is_copied_not_refused():
    """A last dimension with stride != 1 (issue 37: accepted; one copy, docs/entry_points.md)."""
    q, k, v = noncontig()
    o, _ = attention(q, k, v)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
    torch.testing.assert_close(o.double(), want, atol=2e-2, rtol=2e-2)


def lens_cu(lens):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)


def packed(total, h=2, d=64):
    return t(total, h, d), t(total, h, d), t(total, h, d)


CU = lens_cu([5, 9, 3])        # total 17
VARLEN_ERRORS = [
    ("cu-not-from-0", lambda: attention_varlen(*packed(17), CU + 1, CU, 9, 9), "cu_seqlens_q starts at 1, not 0", "start with 0"),
    ("cu-decreasing", lambda: attention_varlen(*packed(17), torch.tensor([0, 9, 5, 17], dtype=torch.int32), CU, 9, 9),
     "cu_seqlens_q decreases at entry 2 (9 -> 5)", "never decrease"),
    ("cu-short", lambda: attention_varlen(*packed(17), lens_cu([5, 9]), lens_cu([5, 9]), 9, 9),
     "cu_seqlens_q ends at 14 but q holds 17 tokens", "total token count"),
    ("cu-k-past-total", lambda: attention_varlen(*packed(17), CU, lens_cu([5, 9, 5]), 9, 9),
     "cu_seqlens_k ends at 19 but k holds 17 tokens", "at most k's"),
    ("max-q-too-small", lambda: attention_varlen(*packed(17), CU, CU, 8, 9),
     "max_seqlen_q=8 but a sequence in cu_seqlens_q has 9 tokens", ">= the longest sequence (9)"),
    ("max-q-zero", lambda: attention_varlen(*packed(17), CU, CU, 0, 9), "max_seqlen_q=0", "longest"),
    ("max-q-negative", lambda: attention_varlen(*packed(17), CU, CU, -1, 9), "max_seqlen_q=-1 is not a length", "longest"),
    ("max-k-too-small", lambda: attention_varlen(*packed(17), CU, CU, 9, 4), "max_seqlen_k=4", "longest"),
    ("max-float", lambda: attention_varlen(*packed(17), CU, CU, 9.5, 9), "9.5 is not an integer", "int"),
    ("cu-int64", lambda: attention_varlen(*packed(17), CU.long(), CU, 9, 9), "cu_seqlens_q must be a 1-D int32 tensor", "int32"),
    ("cu-meta", lambda: attention_varlen(*packed(17), CU.to("meta"), CU, 9, 9), "cu_seqlens_q must be a 1-D int32 tensor on cpu", "device"),
    ("cu-lengths-differ", lambda: attention_varlen(*packed(17), CU, lens_cu([5, 12]), 9, 9),
     "cu_seqlens_q has 4 entries and cu_seqlens_k 3", "one entry per sequence"),
    ("cu-empty", lambda: attention_varlen(*packed(17), torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), 9, 9),
     "cu_seqlens_q is empty", "start with 0"),
    ("varlen-dense-layout", lambda: attention_varlen(*qkv(), CU, CU, 9, 9), "expected 3 dims", "[total, heads, head_dim]"),
]


@pytest.mark.parametrize("name,call,what,fix", VARLEN_ERRORS, ids=[c[0] for c in VARLEN_ERRORS])
def test_varlen_contract(name, call, what, fix):
    with pytest.raises(LaunchError) as err:
        call()
    assert what in err.value.what and fix in err.value.fix, str(err.value)


def sdpa(q, k, v, **kw):
    return torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kw)


def test_nan_in_q_propagates_like_sdpa():
    q, k, v = qkv()
    q[0, 1, 7, 3] = float("nan")
    o, lse = attention(q, k, v)
    ref = sdpa(q, k, v)
    assert o[0, 1, 7].isnan().all() and ref[0, 1, 7].isnan().all() and lse[0, 1, 7].isnan()
    finite = ~ref.isnan()
    assert (o.double()[finite] - ref[finite]).abs().max() < 2e-2


def test_nan_in_k_poisons_the_rows_that_see_it():
    q, k, v = qkv()
    k[0, 0, 10, 0] = float("nan")
    o, _ = attention(q, k, v, causal=True)
    ref = sdpa(q, k, v, is_causal=True)
    assert torch.equal(o[0, 0].isnan().any(-1), ref[0, 0].isnan().any(-1))   # rows >= 10 only
    assert not o[0, 0, :10].isnan().any() and o[0, 0, 10:].isnan().all()


def test_extreme_finite_scale_gives_sdpas_answer():
    q, _, v = qkv()
    k = torch.zeros_like(q)                      # equal logits: the average of v
    o, _ = attention(q, k, v, sm_scale=1e29)
    assert torch.allclose(o.float(), v.float().mean(-2, keepdim=True).expand_as(o), atol=1e-2)
    q, k, v = qkv()
    o, _ = attention(q, k, v, sm_scale=1e29)     # one-hot rows: SDPA picks the max key
    assert (o.double() - sdpa(q, k, v, scale=1e29)).abs().max() < 1e-2


def test_a_row_that_sees_no_key_is_zero_with_lse_inf():
    q, k, v = t(1, 1, 40, 64), t(1, 1, 16, 64), t(1, 1, 16, 64)
    o, lse = attention(q, k, v, causal=True)      # bottom-right: rows 0..23 see no key
    assert (o[0, 0, :24] == 0).all() and torch.isinf(lse[0, 0, :24]).all() and (lse[0, 0, :24] > 0).all()
    assert torch.isfinite(lse[0, 0, 24:]).all()


def test_empty_sequences_in_varlen():
    lens = [0, 5, 0, 7]
    cu = lens_cu(lens)
    o, lse = attention_varlen(*packed(12), cu, cu, 7, 7)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()


# ---------------------------------------------------------------- configuration
ENV_ERRORS = [
    ("XSYNC_VERIFY", "maybe", "XSYNC_VERIFY=maybe is not valid", "one of 1, true, on, yes, 0, false, off, no"),
    ("XSYNC_CPU_TIMEOUT", "-1", "XSYNC_CPU_TIMEOUT=-1 is not valid: too small", "finite number >= 0.001"),
    ("XSYNC_CPU_TIMEOUT", "0", "XSYNC_CPU_TIMEOUT=0 is not valid: too small", ">= 0.001"),
    ("XSYNC_CPU_TIMEOUT", "nan", "XSYNC_CPU_TIMEOUT=nan is not valid: not finite", "finite number"),
    ("XSYNC_CPU_TIMEOUT", "inf", "XSYNC_CPU_TIMEOUT=inf is not valid: not finite", "finite number"),
    ("XSYNC_CPU_TIMEOUT", "abc", "XSYNC_CPU_TIMEOUT=abc is not valid", "finite number"),
    ("XSYNC_NV_CONSUMER_REGS", "-5", "XSYNC_NV_CONSUMER_REGS=-5 is not valid: too small", ">= 24 and <= 256"),
    ("XSYNC_NV_CONSUMER_REGS", "100", "not a multiple of 8", "a multiple of 8"),
    ("XSYNC_NV_FUSE_MMA", "perhaps", "XSYNC_NV_FUSE_MMA=perhaps is not valid", "one of 1, true"),
    ("XSYNC_NV_PINGPONG", "sometimes", "XSYNC_NV_PINGPONG=sometimes is not valid", "one of 0, 1, each, first, wrap"),
    ("XSYNC_BACKEND", "gpu", "XSYNC_BACKEND=gpu is not valid", "auto, cpu, nvidia, ascend, ascend-sim"),
    ("XSYNC_ASCEND_EVENT_IDS", "0", "XSYNC_ASCEND_EVENT_IDS=0 is not valid: too small", ">= 1 and <= 16"),
    ("XSYNC_ASCEND_FORM", "fancy", "XSYNC_ASCEND_FORM=fancy is not valid", "auto, release, scope"),
    ("XSYNC_CHECK_INPUTS", "2", "XSYNC_CHECK_INPUTS=2 is not valid", "one of 1, true"),
]


@pytest.mark.parametrize("var,value,what,fix", ENV_ERRORS, ids=[f"{v}={x}" for v, x, *_ in ENV_ERRORS])
def test_environment_values_are_validated(monkeypatch, var, value, what, fix):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as err:
        config.current()
    assert what in err.value.what and fix in err.value.fix and var in err.value.fix


def test_python_options_are_validated_and_scoped():
    with pytest.raises(ConfigError, match="unknown option 'bogus'"):
        with xsync.options(bogus=1):
            pass
    with pytest.raises(ConfigError, match=r"nv_consumer_regs=-5\) is not valid"):
        with xsync.options(nv_consumer_regs=-5):
            pass
    with xsync.options(verify=False, nv_fuse_mma=False) as s:
        assert s.verify is False and config.current().nv_fuse_mma is False
        with xsync.options(verify=True):
            assert config.current().verify is True and config.current().nv_fuse_mma is False
    assert config.current().verify is True and config.current().nv_fuse_mma is None


def test_codegen_options_are_part_of_the_cache_key():
    """The compile cache key is the backend's option objects (and verify): an option of the
    backend recompiles, another backend's option or a run-time option does not."""
    from xsync.kernels.gemm import gemm
    cx = dict(BM=16, BN=16, BK=16, STAGES=2)
    base = gemm.compile("cpu", cx)
    with xsync.options(cpu_mode="cooperative"):
        other = gemm.compile("cpu", cx)
    assert other is not base and other.mode == "cooperative"   # a cpu RenderOptions field
    with xsync.options(verify=False):
        assert gemm.compile("cpu", cx) is not base
    assert gemm.compile("cpu", cx) is base
    with xsync.options(nv_fuse_mma=False):        # an nvidia option: not the cpu backend's
        assert gemm.compile("cpu", cx) is base
    with xsync.options(cpu_timeout=5):            # a run-time option: same compiled kernel
        assert gemm.compile("cpu", cx) is base


def test_option_objects_come_from_the_configuration():
    from xsync.backends import get
    nvidia = get("nvidia")
    lower, render = config.lower_options(nvidia), config.render_options(nvidia)
    assert lower.fuse_mma is None and render.exp2_fma == "0" and render.debug_hang is False
    with xsync.options(nv_fuse_mma=False, nv_pingpong="wrap", nv_exp2_fma="1/4"):
        assert config.lower_options(nvidia) == type(lower)(fuse_mma=False, pingpong="wrap")
        assert config.render_options(nvidia).exp2_fma == "1/4"
        # keywords over the configuration, parsed like the option that feeds the field
        assert config.lower_options(nvidia, {"pingpong": False}).pingpong == "0"
    # every field names the option feeding it: no hand-kept map
    assert type(lower).config_names()["overlap_softmax"] == "nv_overlap"
    assert set(type(render).config_names().values()) <= set(config.BY_NAME)


def test_option_at_the_wrong_stage_is_an_error():
    from xsync.backends.cpu import compile_kernel as cpu_compile
    from xsync.backends.nvidia import render_source
    from xsync.kernels.gemm import gemm
    lowered = gemm.lower("nvidia")
    args = (lowered.kernel, lowered.placement, lowered.allocation)
    with pytest.raises(ConfigError) as err:
        render_source(*args, {"fuse_mma": False})
    assert "'fuse_mma' is a lowering option of the nvidia backend, given at rendering" in err.value.what
    assert "kernel.lower('nvidia', ..., options=" in err.value.fix and "XSYNC_NV_FUSE_MMA" in err.value.fix
    with pytest.raises(ConfigError) as err:
        gemm.lower("nvidia", options={"exp2_fma": "1/2"})
    assert "'exp2_fma' is a rendering option of the nvidia backend, given at lowering" in err.value.what
    assert "compile_kernel / compile_ptx options=" in err.value.fix
    lowered = gemm.lower("cpu")
    with pytest.raises(ConfigError, match="given at rendering"):
        config.render_options(lowered.backend, config.lower_options(lowered.backend))
    cpu_compile(lowered.kernel, lowered.placement, lowered.allocation, {"mode": "cooperative"})


def test_option_unknown_to_the_backend_is_an_error():
    from xsync.kernels.gemm import gemm
    with pytest.raises(ConfigError) as err:
        gemm.lower("cpu", options={"fuse_mma": False})
    assert "unknown lowering option 'fuse_mma' for the cpu backend (an option of the nvidia backend)" \
        in err.value.what
    assert "rendering options: mode" in err.value.fix
    with pytest.raises(ConfigError, match="unknown lowering option 'bogus' for the nvidia backend"):
        gemm.lower("nvidia", options={"bogus": 1})
    with pytest.raises(ConfigError, match=r"kernel.lower\(maxnreg=7\) is not valid"):
        gemm.lower("nvidia", options={"maxnreg": 7})


def test_lowering_options_reach_the_passes_and_the_allocator():
    from xsync.kernels.gemm import gemm
    cx = dict(BM=128, BN=128, BK=64, STAGES=2)
    on = gemm.lower("nvidia", cx)
    off = gemm.lower("nvidia", cx, options={"defer_mma_wait": False, "producer_regs": 32})
    assert off.options.defer_mma_wait is False and on.options.defer_mma_wait is None
    assert "defer-mma-wait: applied" in on.passes.text() and "defer-mma-wait: applied" not in off.passes.text()
    assert "producer 32" in off.allocation.table()
    with xsync.options(nv_defer_mma_wait=False, nv_producer_regs=32):    # the same, from the configuration
        assert gemm.lower("nvidia", cx).allocation.table() == off.allocation.table()


def test_backend_registry():
    from xsync.backends import Backend, get, names, select, target_names
    assert names() == ("cpu", "nvidia", "ascend", "ascend-sim")
    assert target_names() == ("cpu", "nvidia", "ascend")
    sim = get("ascend-sim")
    assert isinstance(sim, Backend) and sim.target is get("ascend").target and sim.target_name == "ascend"
    assert select(sim) is sim and get(sim) is sim
    assert select("cpu") is get("cpu") and select("auto") is select("") is select()
    with pytest.raises(BackendError, match="unknown backend 'tpu'") as err:
        get("tpu")
    assert "cpu, nvidia, ascend, ascend-sim" in err.value.fix
    from xsync.kernels.gemm import gemm
    lowered = gemm.lower("ascend-sim")
    assert lowered.backend is sim and lowered.placement.target is sim.target
    assert lowered.placement.backend == "ascend"      # the target's name, stored once


def test_auto_selection_prefers_available_backends(monkeypatch):
    from xsync.backends import get, registry
    monkeypatch.setattr(registry, "_SELECTED", {})
    for name, ok in (("nvidia", False), ("ascend", True)):
        monkeypatch.setattr(get(name), "_availability", (ok, "" if ok else "no GPU"))
    assert registry.select("auto") is get("ascend")
    monkeypatch.setattr(registry, "_SELECTED", {})
    monkeypatch.setattr(get("ascend"), "_availability", (False, "no NPU"))
    assert registry.select("auto") is get("cpu")


def test_kernel_options_are_validated():
    with pytest.raises(ConfigError, match="@xs.kernel\\(options=...\\) of 'k'"):
        def k(x):
            pass
        xsync.kernel(options={"nv_regs": 1})(k)


# ---------------------------------------------------------------- the CLI
def cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "xsync", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


CLI_ERRORS = [
    (("check", "nope"), "expected MODULE:KERNEL"),
    (("check", "tests/core/no_such_kernels:k"), "not a .py file"),
    (("check", "tests/core/no_such_kernels.py:k"), "no such file"),
    (("check", "tests/core:k"), "is a directory"),
    (("check", "no_such_module_xyz:k"), "cannot import 'no_such_module_xyz'"),
    (("check", "xsync.kernels.gemm:nope"), "has no xsync kernel 'nope'"),
    (("check", "xsync.kernels.gemm:gemm", "--set", "stages=1"), "has no parameter 'stages' (did you mean STAGES?)"),
    (("check", "xsync.kernels.gemm:gemm", "--set", "a=float64"), "dtype is one of float16, bfloat16, float32, int32"),
    (("check", "xsync.kernels.gemm:gemm", "--set", "BM=wide"), "constexpr BM takes a number"),
    (("check", "xsync.kernels.gemm:gemm", "--set", "BM"), "--set expects NAME=VALUE"),
    (("lower", "xsync.kernels.gemm:gemm", "--backend", "cpu", "--out", "README.md"), "is a file; name a directory"),
    (("lower", "xsync.kernels.gemm:gemm", "--backend", "cpu", "--out", "/proc/xsync-no-such"), "cannot write to /proc/xsync-no-such"),
    (("trace", "xsync.kernels.gemm:gemm", "--out", "tests"), "is a directory; name a .svg or .png file"),
    (("trace", "xsync.kernels.gemm:gemm", "--out", "t.pdf"), "must end in .svg or .png"),
    (("trace", "xsync.kernels.gemm:gemm", "--grid", "1,2,3,4"), "1 to 3 positive sizes"),
    (("trace", "xsync.kernels.gemm:gemm", "--grid", "two"), "--grid expects sizes"),
]


@pytest.mark.parametrize("args,what", CLI_ERRORS, ids=[" ".join(a) for a, _ in CLI_ERRORS])
def test_cli_user_errors_are_one_line_exit_2(args, what):
    r = cli(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xsync: ") and what in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_cli_environment_error_is_one_line():
    r = subprocess.run([sys.executable, "-m", "xsync", "config"], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "XSYNC_VERIFY": "maybe"}, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "XSYNC_VERIFY=maybe is not valid" in r.stderr


def test_cli_debug_shows_the_traceback():
    r = cli("--debug", "check", "nope")
    assert r.returncode == 2 and "Traceback" in r.stderr and "expected MODULE:KERNEL" in r.stderr


def test_cli_is_quiet_on_a_closed_pipe():
    p = subprocess.Popen([sys.executable, "-m", "xsync", "check", "xsync.kernels.gemm:gemm"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()                      # like `| head -1`
    err = p.stderr.read().decode()
    p.wait(timeout=300)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert p.returncode == 0


# ---------------------------------------------------------------- caches and dumps
@pytest.mark.parametrize("damage", ["edited", "truncated", "not-utf8"])
def test_a_damaged_generated_file_is_rewritten(tmp_path, damage):
    path = tmp_path / "gen.py"
    text = "x = 1\n# generated\n"
    files.write_checked(str(path), text)
    spoiled = {"edited": b"x = 2\n# generated\n", "truncated": b"x = ", "not-utf8": b"\xff\xfe\x00x"}[damage]
    path.write_bytes(spoiled)
    files.write_checked(str(path), text)
    assert path.read_text() == text


def test_atomic_writer_leaves_the_umask_alone(tmp_path, monkeypatch):
    def no_umask(*a):
        raise AssertionError("write_atomic must not touch the process umask")
    mask = os.umask(0o022)
    os.umask(mask)
    monkeypatch.setattr(os, "umask", no_umask)
    files.write_atomic(str(tmp_path / "f.txt"), "hello")
    mode = stat.S_IMODE(os.stat(tmp_path / "f.txt").st_mode)
    assert mode == 0o666 & ~mask
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_dump_writes_each_specialization_once_under_its_own_names(tmp_path):
    from xsync.kernels.gemm import gemm
    with xsync.options(dump=str(tmp_path)):
        gemm.compile("cpu", dict(BM=16, BN=16, BK=16, STAGES=2))
        gemm.compile("cpu", dict(BM=16, BN=16, BK=16, STAGES=3))
        names = sorted(os.listdir(tmp_path))
        assert len(names) == 4 and len({n.split(".")[2] for n in names}) == 2, names
        first = tmp_path / names[0]
        before = first.stat().st_mtime_ns
        gemm.compile("cpu", dict(BM=16, BN=16, BK=16, STAGES=2))     # cached: not rewritten
        assert first.stat().st_mtime_ns == before
    table = next(p for p in names if p.endswith(".alloc.txt"))
    assert (tmp_path / table).read_text().startswith("specialization: ")


# ---------------------------------------------------------------- autograd modes, timeouts
def _reference(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double()).to(q.dtype)


@pytest.mark.parametrize("mode", ["inference_mode", "no_grad", "requires_grad"])
def test_the_emulator_runs_in_the_callers_autograd_mode(mode):
    q, k, v = qkv(s=40)
    if mode == "requires_grad":
        q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
        o, lse = attention(q, k, v)
    else:
        with getattr(torch, mode)():
            o, lse = attention(q, k, v)
        assert not o.requires_grad
    torch.testing.assert_close(o.detach().float(), _reference(q.detach(), k.detach(), v.detach()).float(),
                               atol=2e-2, rtol=2e-2)


TIMEOUT_RUNS = """
import threading, torch, xsync as xs
from xsync.kernels.flash_attn import attention
q = torch.randn(1, 2, 96, 64).bfloat16()
for i in range(100):
    with xs.options(cpu_timeout=0.001):
        try:
            attention(q, q, q)
        except xs.LaunchError as err:
            assert "did not finish within" in str(err), err
        else:
            raise SystemExit("no timeout")
    assert threading.active_count() == 1, threading.enumerate()
print("stopped cleanly")
"""


def test_the_emulator_timeout_stops_every_thread():
    """100 timed-out launches in one process: each leaves no agent thread behind, and the
    process exits normally (a thread still computing at exit aborts the interpreter)."""
    r = subprocess.run([sys.executable, "-c", TIMEOUT_RUNS], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    assert r.returncode == 0 and "stopped cleanly" in r.stdout, (r.returncode, r.stderr[-2000:])
