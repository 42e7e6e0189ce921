"""Files xsync writes (generated sources, dumps, pictures): whole or not at all.

The cache (``XSYNC_CACHE_DIR``) holds generated sources named by their content's hash, so an
entry never goes stale with a new xsync or toolchain (Triton keys its own cache by its
version); a damaged entry is rewritten (:func:`write_checked`), a damaged bytecode file beside
it is dropped and the module run from its source (:func:`exec_generated`), and a cache
folder that cannot be written falls back, with a warning, to a private folder under the
system's temporary directory.
"""
from __future__ import annotations

import marshal
import os
import secrets
import tempfile
import threading
import warnings

from xsync.errors import CacheWarning

_usable: dict[str, str] = {}       # configured cache folder -> the folder written (once probed)
_usable_lock = threading.Lock()


def cache_dir(*parts: str) -> str:
    """Where generated sources live: the cache_dir option (XSYNC_CACHE_DIR, default
    ~/.cache/xsync)/parts, or a fallback under the temporary directory if that cannot be
    written (a read-only home, a file in its place)."""
    from xsync import config

    wanted = config.cache_dir(*parts)
    hit = _usable.get(wanted)
    if hit is None:
        with _usable_lock:
            hit = _usable[wanted] = _writable(wanted, parts)
    return hit


def _probe(directory: str):
    """Raise OSError unless a file can be created in ``directory``."""
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".xsync-probe-", dir=directory)
    os.close(fd)
    os.unlink(tmp)


def _writable(wanted: str, parts: tuple[str, ...]) -> str:
    from xsync import config

    try:
        _probe(wanted)
        return wanted
    except OSError as exc:
        reason = exc.strerror or str(exc)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    fallback = os.path.join(tempfile.gettempdir(), f"xsync-cache-{uid}", *parts)
    try:
        _probe(fallback)
    except OSError as exc:
        raise config.ConfigError(
            f"the cache folder {wanted} cannot be written ({reason}; {config.set_by('cache_dir')}), "
            f"nor the fallback {fallback} ({exc.strerror or exc})",
            fix="set XSYNC_CACHE_DIR (or xsync.options(cache_dir=...)) to a writable folder") from exc
    warnings.warn(f"xsync: the cache folder {wanted} cannot be written ({reason}); generated "
                  f"modules go to {fallback} instead. Set XSYNC_CACHE_DIR to a writable folder "
                  f"to choose where.", CacheWarning, stacklevel=3)
    return fallback


def exec_generated(spec, module):
    """``spec.loader.exec_module(module)`` for a generated module in the cache, healing a
    damaged bytecode file (bad marshal data, truncated): Python's import raises on one whose
    header is intact, forever; it is removed and the module runs from its source."""
    try:
        spec.loader.exec_module(module)
        return
    except Exception:
        if not _bad_bytecode(spec.origin):
            raise       # the module's own failure, not the cache's
    with open(spec.origin, encoding="utf-8") as f:
        code = compile(f.read(), spec.origin, "exec")
    exec(code, module.__dict__)  # noqa: S102 - our own generated code


def _bad_bytecode(path: str) -> bool:
    """Whether ``path``'s cached bytecode exists and cannot be read; such a file is removed
    (where the folder allows), so the next import writes a good one."""
    import importlib.util

    try:
        pyc = importlib.util.cache_from_source(path)
        with open(pyc, "rb") as f:
            data = f.read()
    except (OSError, ValueError, NotImplementedError):
        return False
    try:
        marshal.loads(data[16:])        # after the 16-byte header (magic, flags, stamp, size)
        return False
    except Exception:  # noqa: BLE001 - ValueError, EOFError, TypeError: all mean damaged
        pass
    try:
        os.unlink(pyc)
    except OSError:
        pass          # a read-only __pycache__: every import runs from the source
    return True


def digest(text: str | bytes) -> str:
    """Short content hash used in generated file names."""
    import hashlib

    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()[:16]


def write_checked(path: str, text: str):
    """Make ``path`` hold exactly ``text``: a missing, edited, truncated or undecodable file
    is rewritten (atomically), so what is imported is always what xsync generated."""
    try:
        with open(path, "rb") as f:
            if f.read() == text.encode():
                return
    except OSError:
        pass
    write_atomic(path, text)


def write_atomic(path: str, data: str | bytes):
    """Write ``data`` to ``path`` through a temporary file and a rename, so a failure
    leaves either the old file or nothing — never half a file. The temporary file is created
    with mode 0666, so the process umask applies as for any new file (reading the umask would
    mean setting it, process-wide)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else data
    for _ in range(100):
        tmp = os.path.join(directory, f".xsync-{os.getpid()}-{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise OSError(f"cannot create a temporary file in {directory}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
