"""The module cache: generated Gluon sources as real ``.py`` files (Gluon's JIT reads the
source with ``inspect``), under ``$XSYNC_CACHE_DIR/nvidia`` (default ``~/.cache/xsync``),
named by the source's hash and written atomically (temp file + ``os.replace``)."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading

from xsync import files

_import_lock = threading.Lock()


def cache_dir() -> str:
    return files.cache_dir("nvidia")


def load_module(name: str, source: str):
    """Write ``source`` to the cache as ``<name>_<hash>.py`` and import it."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    modname = f"xsync_gluon_{name}_{digest}"
    with _import_lock:
        path = os.path.join(cache_dir(), modname + ".py")
        # an edited, truncated or undecodable file is rewritten, never imported as it is
        files.write_checked(path, source)
        if modname in sys.modules:
            return sys.modules[modname]
        spec = importlib.util.spec_from_file_location(modname, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[modname] = module
        try:
            files.exec_generated(spec, module)     # heals a damaged .pyc
        except BaseException:
            del sys.modules[modname]
            raise
        return module
