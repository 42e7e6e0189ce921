"""Resolve ``xsync.kernels`` in a source checkout, and the top-level name ``kernels`` there.

An installed wheel holds the kernels in ``xsync/kernels`` (pyproject maps the repository's
``kernels/`` folder there). A source checkout run with ``PYTHONPATH=.`` has them in
``<checkout>/kernels``; ``install`` points ``xsync.kernels`` at that folder so the same import
path works in both places.

With the checkout's root on ``sys.path`` the folder is also found as a top-level ``kernels``,
the import name of Hugging Face's kernel hub (PyPI ``kernels``, a dependency of transformers).
The folder's ``__init__`` then calls ``resolve_top_level_name``, which gives the name away::

    import kernels ──► PyPI `kernels` elsewhere on sys.path? ──yes──► that package
                                       │no
                                       ▼
                       sys.modules["kernels"] = xsync.kernels, and kernels.<sub> = xsync.kernels.<sub>

Either way the folder's modules run once, under ``xsync.kernels``, so every torch op is
defined once. The folder has no distribution metadata, so a probe that asks
``importlib.metadata`` for ``kernels`` finds the PyPI package or nothing.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_NAME = "xsync.kernels"
_TOP = "kernels"


class _SourceKernelsFinder(importlib.abc.MetaPathFinder):
    def __init__(self, folder: str):
        self.folder = folder

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _NAME:
            return None
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(self.folder, "__init__.py"), submodule_search_locations=[self.folder])


def install(package_dir: str) -> None:
    """Install the finder when ``package_dir`` (xsync/) has no kernels of its own."""
    if os.path.isdir(os.path.join(package_dir, "kernels")):
        return  # an installed wheel
    folder = os.path.join(os.path.dirname(package_dir), "kernels")
    if not os.path.isfile(os.path.join(folder, "__init__.py")):
        return
    if not any(isinstance(f, _SourceKernelsFinder) for f in sys.meta_path):
        # ahead of an editable install's finder, which maps xsync.kernels to the checkout it was
        # installed from (another worktree's, say)
        sys.meta_path.insert(0, _SourceKernelsFinder(folder))


def resolve_top_level_name(init_file: str) -> None:
    """Run by ``kernels/__init__.py`` when the folder is imported as ``kernels``: replace the
    half-made module in ``sys.modules`` (the import statement returns whatever is there once
    the ``__init__`` ends) by the PyPI package ``kernels`` or, without one, by ``xsync.kernels``."""
    root = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(init_file))))
    elsewhere = [p for p in sys.path if isinstance(p, str) and os.path.realpath(p or os.curdir) != root
                 and not _is_checkout(p or os.curdir)]
    spec = importlib.machinery.PathFinder.find_spec(_TOP, elsewhere)
    if spec is not None and spec.origin is not None:   # a namespace portion is no package
        package = importlib.util.module_from_spec(spec)
        sys.modules[_TOP] = package
        spec.loader.exec_module(package)   # on failure the import system drops sys.modules[_TOP]
        return
    import xsync.kernels
    sys.modules[_TOP] = xsync.kernels
    if not any(isinstance(f, _TopLevelAliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TopLevelAliasFinder())


def _is_checkout(entry: str) -> bool:
    """A ``sys.path`` entry that holds an xsync source checkout (its ``kernels/`` is never the
    PyPI package, and running it would hand the name back and forth)."""
    return os.path.isfile(os.path.join(entry, "xsync", "_source_kernels.py")) and \
        os.path.isdir(os.path.join(entry, _TOP))


class _TopLevelAliasFinder(importlib.abc.MetaPathFinder):
    """``kernels.<sub>`` is ``xsync.kernels.<sub>`` while ``kernels`` is ``xsync.kernels``
    (without it the import system would run the folder's modules a second time)."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_TOP + ".") or sys.modules.get(_TOP) is not sys.modules.get(_NAME):
            return None
        real = importlib.util.find_spec(_NAME + fullname[len(_TOP):])
        if real is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real.name),
                                               is_package=real.submodule_search_locations is not None)


class _AliasLoader(importlib.abc.Loader):
    """Loads a name as an already importable module object, leaving that module's own spec."""

    def __init__(self, real_name: str):
        self.real_name = real_name
        self.real_spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.real_name)
        self.real_spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self.real_spec   # module_from_spec set the alias's spec on it
