"""The wheel a user installs.

Built from a copy of the source tree (as ``pip wheel`` does for a user: build isolation,
the pyproject's setuptools), installed with ``pip install`` into a fresh virtual
environment that holds torch 2.13.0 and nothing of the source tree, then run from an
empty directory: ``xsync demo``, ``python -m xsync``, and every import path the README and
docs name. Also: the wheel holds only the ``xsync`` package plus its metadata (no generic
top-level ``kernels``), ships ``py.typed`` and the LICENSE, states the SPDX license, and
the build prints no setuptools deprecation warning.

Takes about a minute on two cores (70 s measured, 45 s of it building and installing:
mostly torch into the fresh environment, which pip takes from the local wheel file where
there is one).
"""
from __future__ import annotations

import email
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH = "torch==2.13.0"   # the version scripts/env.sh pins
# what a fresh clone has that the build does not need, and what a build leaves behind
IGNORED = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                 ".pytest_cache", ".xsync-dump", "out", ".whl", ".carry")


def _run(cmd, cwd, env=None, timeout=600):
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def _user_env(venv: str) -> dict:
    """The environment a user's shell would have: the fresh venv first on PATH, nothing that
    points Python at the source tree or changes xsync's defaults."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("XSYNC_", "PYTHON", "VIRTUAL_ENV", "PYTEST"))}
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = venv
    env["XSYNC_CACHE_DIR"] = os.path.join(venv, "xsync-cache")
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel path, build log, venv, empty working directory, user environment)."""
    try:
        import venv as _venv  # noqa: F401
        import ensurepip  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"this Python cannot create virtual environments with pip ({exc})")
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist, venv, elsewhere = (str(tmp / n) for n in ("src", "dist", "venv", "elsewhere"))
    shutil.copytree(ROOT, src, ignore=IGNORED)
    os.makedirs(elsewhere)
    rc, build_log = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", dist, src], cwd=elsewhere)
    assert rc == 0, build_log[-4000:]
    wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    wheel = os.path.join(dist, wheels[0])
    rc, out = _run([sys.executable, "-m", "venv", venv], cwd=elsewhere)
    assert rc == 0, out
    env = _user_env(venv)
    py = os.path.join(venv, "bin", "python")
    # torch first, pinned (a user has theirs); then the wheel as a user installs it, with its
    # dependencies resolved against that torch
    for what in ([TORCH], [wheel]):
        rc, out = _run([py, "-m", "pip", "install", "--disable-pip-version-check", "-q", *what],
                       cwd=elsewhere, env=env)
        assert rc == 0, out[-4000:]
    return wheel, build_log, venv, elsewhere, env


def test_wheel_holds_only_the_xsync_package(installed):
    wheel = installed[0]
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = email.message_from_bytes(z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))))
        license_text = {n: z.read(n) for n in names if n.endswith(".dist-info/licenses/LICENSE")}
    top = {n.split("/")[0] for n in names}
    dist_info = f"xsync-{meta['Version']}.dist-info"
    assert top == {"xsync", dist_info}, sorted(top)
    # every module of the source tree is in the package: xsync/ as is, kernels/ as xsync/kernels/
    expected = set()
    for folder, prefix in (("xsync", "xsync"), ("kernels", "xsync/kernels")):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
            for f in filenames:
                if f.endswith(".py") or f == "py.typed":
                    expected.add(os.path.normpath(os.path.join(prefix, rel, f)))
    assert "xsync/py.typed" in expected
    assert expected <= set(names), sorted(expected - set(names))
    # PEP 639 metadata: the SPDX expression and the license file, no legacy License classifier
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    with open(os.path.join(ROOT, "LICENSE"), "rb") as f:
        assert list(license_text.values()) == [f.read()]
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")], classifiers
    assert 'triton<3.10,>=3.6; extra == "nvidia"' in meta.get_all("Requires-Dist")


def test_build_prints_no_deprecation_warning(installed):
    build_log = installed[1]
    warnings = [line for line in build_log.splitlines() if re.search(r"deprecat", line, re.I)]
    assert not warnings, "\n".join(warnings)


def test_documented_imports_resolve_in_the_installed_wheel(installed):
    _, _, venv, elsewhere, env = installed
    probe = r"""
import os, sys, importlib, importlib.util
site = sys.argv[1]
import xsync
import xsync.kernels.gemm, xsync.kernels.gemm_softmax, xsync.kernels.examples
import xsync.distributed, xsync.distributed.torch_cp
from xsync.kernels.flash_attn import attention, attention_varlen
import torch
assert hasattr(torch.ops.xsync, "attention"), "torch.ops.xsync.attention is not registered"
for mod in (xsync, xsync.kernels, xsync.kernels.gemm, sys.modules["xsync.kernels.flash_attn"]):
    assert os.path.realpath(mod.__file__).startswith(site), (mod.__name__, mod.__file__)
assert importlib.util.find_spec("kernels") is None, "a top-level 'kernels' is importable"
print("imports ok")
"""
    site = os.path.realpath(os.path.join(venv, "lib"))
    rc, out = _run([os.path.join(venv, "bin", "python"), "-c", probe, site], cwd=elsewhere, env=env)
    assert rc == 0 and "imports ok" in out, out


def test_demo_runs_outside_the_source_tree(installed):
    _, _, venv, elsewhere, env = installed
    rc, out = _run([os.path.join(venv, "bin", "xsync"), "demo"], cwd=elsewhere, env=env)
    assert rc == 0, out[-4000:]
    m = re.search(r"^(\d+) of (\d+) kernels match torch on the cpu backend\.$", out, re.M)
    assert m and m.group(1) == m.group(2) and int(m.group(1)) >= 5, out[-2000:]


@pytest.mark.parametrize("args, expect", [
    (["check", "xsync.kernels.gemm:gemm", "--backend", "cpu"], r"^verdict: OK"),
    (["lower", "xsync.kernels.gemm:gemm", "--backend", "nvidia"], r"xs_tma_load\("),
    (["lower", "xsync.kernels.flash_attn:attention_fwd", "--backend", "ascend"], r"tl\.sync_block_set\("),
], ids=["check-cpu", "lower-nvidia", "lower-ascend"])
def test_python_m_xsync(installed, args, expect):
    _, _, venv, elsewhere, env = installed
    rc, out = _run([os.path.join(venv, "bin", "python"), "-m", "xsync", *args], cwd=elsewhere, env=env)
    assert rc == 0, out[-4000:]
    assert re.search(expect, out, re.M), out[-2000:]
