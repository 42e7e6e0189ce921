"""Every renderer's source, byte for byte, for every library kernel and option specialization of
tests/snapshot/render.py (Gluon, triton-ascend in both forms, the CPU emulator's in both
schedulers; corpus kernels included): a change to generated code must be intended (re-record
with ``python -m tests.snapshot.render --write`` and say why in the commit)."""
import json

import pytest

from tests.snapshot import render


@pytest.mark.parametrize("backend", render.BACKENDS)
def test_rendered_sources_match_the_golden_hashes(backend):
    with open(render.golden_path(backend)) as f:
        golden = json.load(f)
    got = render.snapshot(backend)
    assert len(got) == len(golden) > 80
    assert render.compare(got, golden) == []


def test_verdicts_and_reports_match_the_golden_texts():
    """The verifier's verdict and report for every corpus and library kernel on every target
    (tests/snapshot/verdicts.py; re-record with ``python -m tests.snapshot.verdicts --write``)."""
    from tests.snapshot import verdicts

    with open(verdicts.GOLDEN) as f:
        golden = json.load(f)
    got = verdicts.snapshot()
    assert len(got) == len(golden) > 200
    assert {n: got.get(n) for n in golden if got.get(n) != golden[n]} == {}
