"""The Hopper renderer's Gluon source, byte for byte, for every kernel and pass-option
specialization of tests/nvidia/render_snapshot.py: a change to the generated code must be
intended (re-record with ``python -m tests.nvidia.render_snapshot --write`` and say why)."""
import json

from tests.nvidia import render_snapshot


def test_rendered_sources_match_the_golden_hashes():
    with open(render_snapshot.GOLDEN) as f:
        golden = json.load(f)
    got = render_snapshot.snapshot()
    assert len(got) == len(golden) > 80
    assert render_snapshot.compare(got, golden) == []
