import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for p in (ROOT, os.path.dirname(os.path.abspath(__file__))):
    if p not in sys.path:
        sys.path.insert(0, p)


@pytest.fixture(autouse=True, scope="session")
def _xsync_cache(tmp_path_factory):
    """Generated sources go to a per-session directory unless the caller chose one."""
    if not os.environ.get("XSYNC_CACHE_DIR"):
        os.environ["XSYNC_CACHE_DIR"] = str(tmp_path_factory.mktemp("xsync-cache"))
    yield


def _triton_ascend_reason():
    try:
        import triton
        from triton.backends import backends
    except Exception as exc:  # noqa: BLE001
        return f"triton-ascend is not installed ({exc}); run with the ascend venv"
    if "ascend" not in backends:
        return f"the installed triton {triton.__version__} is not triton-ascend (backends: {sorted(backends)})"
    return None


@pytest.fixture(scope="session")
def triton_ascend():
    why = _triton_ascend_reason()
    if why:
        pytest.skip(why)
