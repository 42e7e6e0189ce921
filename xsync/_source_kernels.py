"""Resolve ``xsync.kernels`` in a source checkout.

An installed wheel holds the kernels in ``xsync/kernels`` (pyproject maps the repository's
``kernels/`` folder there). A source checkout run with ``PYTHONPATH=.`` has them in
``<checkout>/kernels``; this finder points ``xsync.kernels`` at that folder so the same
import path works in both places.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_NAME = "xsync.kernels"


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
