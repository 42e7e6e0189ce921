"""The direct C launch (xsync/backends/nvidia/launcher.py) relies on Triton 3.6's launcher
layout; these check, against the installed Triton (3.6 and 3.9 matrices, no GPU needed), that
the structural guard accepts exactly that layout and turns others away."""
import inspect

import pytest

import triton
import triton.backends.nvidia.driver as driver

from xsync.backends.nvidia import launcher


def test_triton_36_layout_is_the_known_one():
    if not triton.__version__.startswith("3.6"):
        assert not launcher.layout_known(driver), (
            f"Triton {triton.__version__} matches the 3.6 launcher layout: check launcher.py's "
            "argument tuple against its driver before letting it launch directly")
        return
    assert launcher.layout_known(driver)
    # what prepare_c_launch builds per call: the 13 fixed arguments, then the expanded ones
    assert len(launcher.C_ARGS_FORMAT) == 13
    src = " ".join(inspect.getsource(driver.CudaLauncher.__call__).split())
    assert "global_scratch, profile_scratch, *args)" in src


def test_wrapper_closure_names_the_c_launcher():
    """wrap_handle_tensordesc's closure holds the C function as `launcher` (what c_launch reads)."""
    if not triton.__version__.startswith("3.6"):
        pytest.skip(f"Triton {triton.__version__}: launches keep Triton's launcher (layout not 3.6's)")
    inner = driver.wrap_handle_tensordesc(print, {0: "tensordesc<bf16[64, 64]>"}, None)
    assert "launcher" in inner.__code__.co_freevars
    assert inner.__closure__[inner.__code__.co_freevars.index("launcher")].cell_contents is print
