"""No silent non-proofs (issue 34): a verdict is proven, rejected, or not proven. A kernel
that is not proven is not lowered, compiled or launched unless ``accept_bounded`` accepts it
(``@xs.kernel``, ``xsync.options``, ``XSYNC_ACCEPT_BOUNDED``, ``--accept-bounded``), and then
its report says NOT PROVEN; the emulator's stall report says what the verifier did."""
import os
import subprocess
import sys

import pytest
import torch

import xsync as xs
from tests.core import corpus as C
from xsync.errors import LeftoverError, StallError, VerifierLimitError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = dict(x=xs.float32, y=xs.float32, BLOCK=16, STAGES=1)


def _skip_release_late(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    # a counter carried across iterations decides a release: the verifier checks the loop only
    # up to its bound (133 iterations), and the release skipped at c == 200 lies beyond it
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages=STAGES, t=xs.tile([BLOCK, BLOCK], xs.float32))
    c = 0
    for i in range(n):
        with load:
            s = ring.acquire()
            s.t = xs.load(x, [0, 0], [BLOCK, BLOCK])
            ring.commit()
        with work:
            got = ring.wait()
            xs.store(y, [0, 0], got.t)
            if c != 200:
                ring.release()
        c = c + 1


skip_release_late = xs.kernel(example=SPEC)(_skip_release_late)
accepted_late = xs.kernel(example=SPEC, accept_bounded=True)(_skip_release_late)


def _args(n=202):
    return torch.randn(16, 16), torch.zeros(16, 16), n


def test_not_proven_is_refused_where_it_is_verified_and_names_the_gap():
    with pytest.raises(VerifierLimitError) as info:
        skip_release_late.lower("cpu")
    err = info.value
    assert err.report is not None and err.report.status == "not proven" and err.report.unproven
    msg = str(err)
    assert "not proven on the cpu placement" in msg
    assert "loop at line" in msg and "value carried across iterations" in msg       # which loop
    assert "up to 133 iterations" in msg and "the values tried of n" in msg          # which bound, scalars
    assert "compare its counter only with constants" in err.fix                      # how to help
    assert "accept_bounded=True" in err.fix and "--accept-bounded" in err.fix        # the opt-in
    for compile_or_launch in (lambda: skip_release_late.compile("cpu"),
                              lambda: skip_release_late[(1,)](*_args(4), BLOCK=16, STAGES=1, backend="cpu")):
        with pytest.raises(VerifierLimitError, match="not proven"):
            compile_or_launch()


@pytest.mark.parametrize("how", ["kernel", "options", "environment", "argument"])
def test_each_opt_in_lowers_and_says_not_proven(how, monkeypatch):
    if how == "kernel":
        report, by = accepted_late.lower("cpu").report, "@xs.kernel(accept_bounded=True)"
    elif how == "options":
        with xs.options(accept_bounded=True):
            report, by = skip_release_late.lower("cpu").report, "xsync.options(accept_bounded=True)"
    elif how == "environment":
        monkeypatch.setenv("XSYNC_ACCEPT_BOUNDED", "1")
        report, by = skip_release_late.lower("cpu").report, "XSYNC_ACCEPT_BOUNDED=1"
    else:
        report, by = skip_release_late.lower("cpu", accept_bounded=True).report, "accept_bounded=True"
    assert report.status == "bounded" and report.accepted_by == by
    assert report.summary().startswith(f"NOT PROVEN — accepted bounded by {by}: verified for cpu up to")


def test_an_inner_block_can_refuse_what_the_kernel_accepts():
    with xs.options(accept_bounded=False):
        with pytest.raises(VerifierLimitError):
            accepted_late.lower("cpu")


def test_proven_kernels_are_unchanged():
    report = C.hint_too_few_stages_fixed.lower("cpu").report
    assert report.proven and report.status == "proven" and not report.accepted_by
    assert not report.summary().startswith("NOT PROVEN")


def test_accept_bounded_is_part_of_the_compile_cache_key():
    skip_release_late.clear_cache()
    with pytest.raises(VerifierLimitError):
        skip_release_late.compile("cpu")
    with xs.options(accept_bounded=True):
        accepted = skip_release_late.compile("cpu")
        assert accepted.lowered.report.status == "bounded"
        assert skip_release_late.compile("cpu") is accepted          # cached under the option
    with pytest.raises(VerifierLimitError):                          # not served from that entry
        skip_release_late.compile("cpu")
    with xs.options(verify=False):
        unverified = skip_release_late.compile("cpu")
    assert unverified is not accepted and unverified.lowered.report is None


@pytest.mark.parametrize("mode", ["threads", "cooperative"])
def test_stall_report_says_what_the_verifier_did(mode):
    """The same deadlock (at n = 202) reported by the emulator: with the verifier off it says so
    (the wording of before); accepted bounded, it says the verdict was not proven, by whom, and
    what was not covered -- never that the verifier was off."""
    with xs.options(verify=False, cpu_mode=mode):
        with pytest.raises(StallError) as off:
            skip_release_late[(1,)](*_args(), BLOCK=16, STAGES=1, backend="cpu")
    assert "the verifier was off (XSYNC_VERIFY=0) or the stall depends on run-time values" in off.value.fix
    with xs.options(cpu_mode=mode):
        with pytest.raises(StallError) as bounded:
            accepted_late[(1,)](*_args(), BLOCK=16, STAGES=1, backend="cpu")
    fix = bounded.value.fix
    assert "XSYNC_VERIFY=0" not in fix and "verifier was off" not in fix
    assert "checked this kernel only up to bounds" in fix
    assert "@xs.kernel(accept_bounded=True) accepted" in fix and "value carried across iterations" in fix
    # below the bound the accepted kernel runs clean
    with xs.options(cpu_mode=mode):
        accepted_late[(1,)](*_args(5), BLOCK=16, STAGES=1, backend="cpu")


def test_leftover_report_says_the_kernel_was_proven_when_it_was():
    from xsync.lowering.verifier.check import run_time_verdict

    lowered = C.hint_too_few_stages_fixed.lower("cpu")
    assert "proved this kernel's protocol on the cpu placement" in run_time_verdict(lowered)
    assert run_time_verdict(C.hint_too_few_stages_fixed.lower("cpu", check=False)) is None
    assert "no verifier verdict" in run_time_verdict(None)
    with xs.options(verify=False):
        with pytest.raises(LeftoverError) as off:
            C.consistent_leftover_not_release[(1,)](torch.randn(96, 16), torch.zeros(96, 16), 2,
                                                     BLOCK=16, STAGES=2, backend="cpu")
    assert "(the verifier was off, XSYNC_VERIFY=0)" in off.value.fix


def _xsync(*args, env=None):
    return subprocess.run([sys.executable, "-m", "xsync", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def test_cli_check_fails_on_not_proven_and_accepts_loudly():
    spec = "tests/core/corpus.py:bounded_carried_count"
    r = _xsync("check", spec, "--backend", "cpu")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "REJECTED: VerifierLimitError" in r.stdout and "not covered:" in r.stdout
    assert "--accept-bounded" in r.stdout
    r = _xsync("check", spec, "--backend", "cpu", "--accept-bounded")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdict: NOT PROVEN — accepted bounded by --accept-bounded: verified for cpu up to" in r.stdout
    assert "verdict: OK" not in r.stdout
    r = _xsync("check", spec, "--backend", "cpu", env={"XSYNC_ACCEPT_BOUNDED": "1"})
    assert r.returncode == 0 and "accepted bounded by XSYNC_ACCEPT_BOUNDED=1" in r.stdout, r.stdout


def test_cli_lower_refuses_not_proven_unless_accepted(tmp_path):
    spec = "tests/core/corpus.py:bounded_carried_count"
    r = _xsync("lower", spec, "--backend", "cpu")
    assert r.returncode == 1 and "REJECTED: VerifierLimitError" in r.stderr, r.stdout + r.stderr
    r = _xsync("lower", spec, "--backend", "cpu", "--accept-bounded", "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    table = (tmp_path / "bounded_carried_count.cpu.alloc.txt").read_text()
    assert "NOT PROVEN — accepted bounded by --accept-bounded" in table
