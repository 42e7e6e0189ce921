"""NVIDIA test matrix setup.

Run with an environment that has upstream triton 3.6-3.9 (``bash scripts/test.sh nvidia``
or ``nvidia-newest``; on a GPU host from the source tree: ``PYTHONPATH=. python -m pytest
tests/nvidia``). Compile tests need no GPU; GPU tests skip with a
reason when no Hopper GPU is visible. Generated sources and Triton's cache go to a
temporary directory unless XSYNC_CACHE_DIR / TRITON_CACHE_DIR are set.
"""
import os
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

_tmp = tempfile.mkdtemp(prefix="xsync-nv-tests-")
for _var, _sub in (("XSYNC_CACHE_DIR", "xsync"), ("TRITON_CACHE_DIR", "triton")):
    if not os.environ.get(_var):
        os.environ[_var] = os.path.join(_tmp, _sub)

try:
    import triton.experimental.gluon  # noqa: F401
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_GLUON = False


def gpu_reason() -> str:
    """Empty when a Hopper GPU can run the kernels, else why not."""
    if not HAVE_GLUON:
        return "upstream triton 3.6-3.9 with Gluon is not installed"
    from xsync.backends.nvidia import availability

    ok, why = availability()
    return "" if ok else why


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("XSYNC_DEBUG_HANG", "XSYNC_VERIFY", "XSYNC_BACKEND"):
        monkeypatch.delenv(var, raising=False)


def pytest_collection_modifyitems(config, items):
    if not HAVE_GLUON:
        skip = pytest.mark.skip(reason="upstream triton 3.6-3.9 with Gluon is not installed (bash scripts/env.sh nvidia)")
        for item in items:
            item.add_marker(skip)
