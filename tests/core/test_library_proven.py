"""Every library kernel, at every specialization the ops and tests launch (the render snapshot's
cases, tests/snapshot/render.py), is proven on the placement it runs on: not rejected, and not
merely checked up to bounds (a verdict that is not proven would be refused at launch)."""
import pytest

from tests.snapshot import render

# rendered with the verifier off on purpose: a kernel written to hang (the hang-debug test)
KNOWN_BROKEN = {"debug-hang-gemm_extra_wait"}


def _cases(backend):
    for case in render.CASES[backend]():
        if case.name.startswith("corpus-") or case.name in KNOWN_BROKEN:
            continue
        # the portable backends' cases repeat per source form / scheduler: one is enough
        if backend != "nvidia" and not case.name.endswith(("-release", "-threads")):
            continue
        yield case


@pytest.mark.parametrize("backend", render.BACKENDS)
def test_every_library_specialization_is_proven(backend):
    not_proven = []
    for case in _cases(backend):
        report = case.kernel.lower(backend, case.constexprs, check=True).report
        if not report.proven:
            not_proven.append(f"{case.name}: {report.summary()}")
    assert not_proven == []
