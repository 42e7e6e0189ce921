"""The repository's ``kernels/`` folder found as a top-level ``kernels`` (a checkout's root on
``sys.path``, as the README runs the GPU tests) beside other libraries.

``kernels`` is also the import name of Hugging Face's kernel hub (PyPI ``kernels``, a
dependency of transformers). Importing the name must not raise, must not run any of the
folder's modules a second time (a second copy of a kernel, or of a torch op definition), and
must leave the name to the PyPI package where one is installed (xsync/_source_kernels.py).
Each case runs in a fresh interpreter with the checkout's root first on ``sys.path``.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import sysconfig

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Ends every probe: each kernels/ file is loaded by one module object, named under xsync.kernels.
ONE_COPY = r"""
import os, sys
folder = os.path.join(sys.argv[1], "kernels") + os.sep
seen = {}
for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if path and os.path.realpath(path).startswith(folder):
        assert module.__spec__.name.startswith("xsync.kernels"), (name, module.__spec__.name)
        seen.setdefault(os.path.realpath(path), set()).add(id(module))
twice = sorted(p for p, ids in seen.items() if len(ids) > 1)
assert seen and not twice, ("kernels/ modules loaded twice", twice)
print("ok")
"""


def _hub_installed() -> bool:
    try:
        importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="transformers is not installed here (extra `models`)")


def _probe(code: str, python_path: list[str], *args: str, flags=()) -> str:
    """Run ``code`` + ONE_COPY in a fresh interpreter (argv[1] is the checkout's root)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "XSYNC_"))}
    env["PYTHONPATH"] = os.pathsep.join(python_path)
    p = subprocess.run([sys.executable, *flags, "-c", code + ONE_COPY, ROOT, *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.rstrip().endswith("ok"), p.stdout + p.stderr
    return p.stdout


@pytest.fixture(scope="module")
def without_hub(tmp_path_factory):
    """A sys.path on which the PyPI ``kernels`` is not installed: this interpreter's
    site-packages mirrored by symbolic links, less the hub's package and metadata (the probe
    runs with ``-S``, so the real site-packages stays off the path)."""
    mirror = tmp_path_factory.mktemp("site-packages-without-kernels")
    for folder in dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")):
        for entry in os.listdir(folder):
            if entry != "kernels" and not entry.startswith("kernels-") and not os.path.lexists(mirror / entry):
                os.symlink(os.path.join(folder, entry), mirror / entry)
    return [ROOT, str(mirror)]


def test_import_kernels_without_the_hub_is_xsync_kernels(without_hub):
    _probe(r"""
import importlib.metadata, sys
import kernels
import kernels.flash_attn.ops
import kernels.gemm
import xsync.kernels, xsync.kernels.flash_attn.ops, xsync.kernels.gemm
assert kernels is xsync.kernels
assert kernels.flash_attn.ops is xsync.kernels.flash_attn.ops
assert sys.modules["kernels.flash_attn"] is sys.modules["xsync.kernels.flash_attn"]
assert kernels.flash_attn.ops.__spec__.name == "xsync.kernels.flash_attn.ops"
from kernels.flash_attn import attention
assert attention is xsync.kernels.flash_attn.ops.attention
import torch
assert hasattr(torch.ops.xsync, "attention") and hasattr(torch.ops.xsync, "attention_backward")
# what a probe for the hub package sees: no distribution metadata, no version, none of its API
try:
    importlib.metadata.version("kernels")
    raise AssertionError("metadata for 'kernels' found")
except importlib.metadata.PackageNotFoundError:
    pass
assert not hasattr(kernels, "__version__") and not hasattr(kernels, "get_kernel")
try:
    import kernels.no_such_module
    raise AssertionError("kernels.no_such_module imported")
except ModuleNotFoundError:
    pass
""", without_hub, flags=["-S"])


def test_kernels_imported_after_xsync_kernels_is_the_same_module(without_hub):
    _probe(r"""
import sys
import xsync.kernels.flash_attn
import kernels.flash_attn.ops, kernels.flash_attn.grad
assert kernels.flash_attn.grad is sys.modules["xsync.kernels.flash_attn.grad"]
""", without_hub, flags=["-S"])


def test_another_checkout_on_the_path_is_not_the_hub(without_hub, tmp_path):
    """Two checkouts on sys.path (another worktree, say): neither's kernels/ is taken for the hub."""
    (tmp_path / "xsync").mkdir()
    (tmp_path / "xsync" / "_source_kernels.py").write_text("")
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("raise AssertionError('the other checkout ran')\n")
    _probe(r"""
import kernels, xsync.kernels
assert kernels is xsync.kernels
""", [without_hub[0], str(tmp_path), *without_hub[1:]], flags=["-S"])


@pytest.mark.skipif(not _hub_installed(), reason="the PyPI package `kernels` is not installed here")
def test_import_kernels_hands_the_name_to_the_hub_package():
    _probe(r"""
import importlib.metadata, os, sys
import kernels
hub = importlib.metadata.distribution("kernels").locate_file("kernels/__init__.py")
assert os.path.realpath(kernels.__file__) == os.path.realpath(hub), (kernels.__file__, str(hub))
assert hasattr(kernels, "get_kernel")
import xsync.kernels.flash_attn
import torch
assert kernels is not xsync.kernels and hasattr(torch.ops.xsync, "attention")
""", [ROOT])


@needs_transformers
@pytest.mark.parametrize("first", ["transformers", "xsync"])
def test_import_transformers_from_a_checkout(first):
    out = _probe(r"""
import sys
if sys.argv[2] == "xsync":
    from xsync.kernels.flash_attn import attention
import transformers
import transformers.modeling_utils   # imports the hub-kernels integration, which imports `kernels`
from transformers.utils.import_utils import is_kernels_available
from xsync.kernels.flash_attn import attention
import torch
assert hasattr(torch.ops.xsync, "attention")
print("hub kernels available:", is_kernels_available())
""", [ROOT], first)
    assert f"hub kernels available: {_hub_installed()}" in out, out


@needs_transformers
def test_import_transformers_without_the_hub(without_hub):
    """transformers installed without the hub (or an older one): its probe sees no package."""
    _probe(r"""
import transformers, transformers.modeling_utils
from transformers.utils.import_utils import is_kernels_available
assert not is_kernels_available()
import xsync.kernels.flash_attn
""", without_hub, flags=["-S"])
