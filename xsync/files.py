"""Files xsync writes (generated sources, dumps, pictures): whole or not at all."""
from __future__ import annotations

import os
import secrets


def cache_dir(*parts: str) -> str:
    """Where generated sources live: the cache_dir option (XSYNC_CACHE_DIR, default
    ~/.cache/xsync)/parts."""
    from xsync import config

    return config.cache_dir(*parts)


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
