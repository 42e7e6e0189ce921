"""`python -m xsync check|lower` on the examples and on a broken kernel."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def xsync(*args):
    return subprocess.run([sys.executable, "-m", "xsync", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_check_prints_protocol_allocation_and_verdict():
    r = xsync("check", "xsync.kernels.gemm_softmax:gemm_softmax")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "pipe    scores" in out and "barrier team" in out
    for backend in ("cpu", "nvidia", "ascend"):
        assert f"=== backend {backend} ===" in out
    assert "bar id 15, 256 threads" in out                   # nvidia named barrier
    assert "flag 10 (cube -> vector)" in out                  # ascend event id (top of 0-10)
    assert out.count("verdict: OK") == 3


def test_check_reports_counterexample_and_fails():
    r = xsync("check", "tests/core/broken_kernels.py:missing_release", "--backend", "cpu")
    assert r.returncode == 1
    assert "DeadlockError" in r.stdout and "shortest interleaving" in r.stdout
    assert "broken_kernels.py:" in r.stdout


def test_check_flash_attention_all_backends():
    r = xsync("check", "xsync.kernels.flash_attn.kernel:attention_fwd", "--set", "CAUSAL=0")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "register hand-off" in r.stdout                    # hopper: mma+softmax share a warpgroup
    assert "GM workspace ring" in r.stdout                    # ascend: cube<->vector workspace


def test_lower_cpu_writes_files(tmp_path):
    r = xsync("lower", "xsync.kernels.gemm:gemm", "--backend", "cpu", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "def agent_load(ag" in (tmp_path / "gemm.cpu.py").read_text()
    assert "allocation for cpu" in (tmp_path / "gemm.cpu.alloc.txt").read_text()


def test_check_reports_what_the_render_step_refuses():
    """check = lower: Ascend refuses, when it renders, a kernel that synchronizes cube and vector
    cores without matrix work (a role of kind 'matrix' that never multiplies); check says so and
    exits 1 (it said OK before), as lower does."""
    spec = "tests/core/corpus.py:correct_credit_backpressure"
    r = xsync("check", spec, "--backend", "ascend")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "REJECTED: BackendError" in r.stdout and "does no matrix work" in r.stdout
    r = xsync("lower", spec, "--backend", "ascend")
    assert r.returncode == 1 and "does no matrix work" in r.stderr
    r = xsync("check", spec, "--backend", "cpu")
    assert r.returncode == 0 and "verdict: OK — verified for cpu" in r.stdout, r.stdout + r.stderr


def test_check_and_lower_refuse_a_kernel_that_is_not_proven(tmp_path):
    """Exit 1 and VerifierLimitError without the opt-in; with --accept-bounded (or the
    environment) exit 0 and a verdict that says NOT PROVEN and who accepted it."""
    spec = "tests/core/corpus.py:bounded_carried_count"
    r = xsync("check", spec, "--backend", "nvidia")
    assert r.returncode == 1 and "REJECTED: VerifierLimitError" in r.stdout, r.stdout + r.stderr
    assert "not proven on the nvidia placement" in r.stdout and "--accept-bounded" in r.stdout
    r = xsync("check", spec, "--backend", "nvidia", "--accept-bounded")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdict: NOT PROVEN — accepted bounded by --accept-bounded: verified for nvidia" in r.stdout
    r = xsync("lower", spec, "--backend", "cpu")
    assert r.returncode == 1 and "REJECTED: VerifierLimitError" in r.stderr
    r = xsync("lower", spec, "--backend", "cpu", "--accept-bounded")
    assert r.returncode == 0 and "def agent_load(ag" in r.stdout, r.stderr
    # accepted, it lowers and renders on Ascend too (copy -> vector: one vector core)
    r = xsync("check", spec, "--backend", "ascend", "--accept-bounded")
    assert r.returncode == 0 and "verdict: NOT PROVEN — accepted bounded by --accept-bounded" in r.stdout, \
        r.stdout + r.stderr


def test_bad_spec_is_a_clear_error():
    r = xsync("check", "xsync.kernels.gemm:nope")
    assert r.returncode != 0 and "has no xsync kernel 'nope'" in r.stderr + r.stdout


def test_lower_every_backend_prints_generated_source():
    expect = {"cpu": "def agent_load(ag",
              "nvidia": "gl.warp_specialize(", "ascend": "tl.sync_block_set("}
    for backend, needle in expect.items():
        r = xsync("lower", "xsync.kernels.flash_attn.kernel:attention_fwd", "--backend", backend)
        assert r.returncode == 0, r.stderr
        assert needle in r.stdout, backend
        assert f"allocation for {backend}" in r.stdout


def test_bench_without_gpu_says_so():
    r = xsync("bench", "flash_attn", "--quick")
    assert r.returncode == 2
    assert "needs a CUDA GPU" in r.stderr


def test_demo_runs_on_the_cpu_emulator():
    r = subprocess.run([sys.executable, "-m", "xsync", "demo"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env={**os.environ, "XSYNC_BACKEND": "cpu"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "5 of 5 kernels match torch on the cpu backend" in r.stdout
