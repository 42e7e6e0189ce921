"""Compiled-kernel caches are keyed by everything the source reads, and the on-disk cache
heals or reports what is wrong with it (issue 35, deliverable 3)."""
import importlib.util
import os
import py_compile
import sys
import threading

import pytest
import torch

import xsync as xs
from xsync import files
from xsync.config import ConfigError
from xsync.errors import CacheWarning

SCALE = 1.0      # read by `scaled` below: rebinding it must recompile


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16))
def scaled(x, y, BLOCK: xs.constexpr):
    w = xs.role("w", kind="vector")
    with w:
        t = xs.load(x, [0, 0], [BLOCK, BLOCK])
        xs.store(y, [0, 0], t * SCALE)


def _closure_kernel(factor):
    @xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16))
    def times(x, y, BLOCK: xs.constexpr):
        w = xs.role("w", kind="vector")
        with w:
            t = xs.load(x, [0, 0], [BLOCK, BLOCK])
            xs.store(y, [0, 0], t * factor)
    return times


def _run(kernel):
    x, y = torch.ones(16, 16), torch.zeros(16, 16)
    kernel[(1,)](x, y, BLOCK=16, backend="cpu")
    return y[0, 0].item()


def test_rebinding_a_global_the_kernel_reads_recompiles(monkeypatch):
    assert _run(scaled) == 1.0
    monkeypatch.setitem(globals(), "SCALE", 3.0)
    assert _run(scaled) == 3.0          # was 1.0: the stale compiled kernel was reused
    monkeypatch.setitem(globals(), "SCALE", 1.0)
    assert _run(scaled) == 1.0          # and the first specialization is still cached
    assert len({key[1] for key in scaled._cache}) == 2


def test_closure_values_are_read_and_keyed():
    assert _run(_closure_kernel(2.0)) == 2.0
    assert _run(_closure_kernel(5.0)) == 5.0


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XSYNC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _damage_pyc_and_reload(source, damage):
    from xsync.backends.nvidia.modules import load_module

    module = load_module("heal", source)
    pyc = py_compile.compile(module.__file__, doraise=True)
    with open(pyc, "rb") as f:
        data = f.read()
    with open(pyc, "wb") as f:
        f.write(damage(data))
    del sys.modules[module.__name__]
    return load_module("heal", source), pyc


@pytest.mark.parametrize("damage", [lambda d: d[:16] + b"\xff\x00 not marshal data",   # bad marshal
                                    lambda d: d[:20]],                                 # truncated
                         ids=["bad-marshal", "truncated"])
def test_damaged_bytecode_is_detected_and_healed(cache, damage):
    # a source of its own per case: the module name is the source's hash
    module, pyc = _damage_pyc_and_reload(f"VALUE = 41 + 1  # {cache}\n", damage)
    assert module.VALUE == 42        # was a raw ValueError / EOFError from importlib, forever
    assert not os.path.exists(pyc)   # removed: the next import writes a good one


def test_edited_cache_source_is_rewritten(cache):
    from xsync.backends.nvidia.modules import load_module

    module = load_module("edited", "VALUE = 1\n")
    with open(module.__file__, "w") as f:
        f.write("VALUE = 2  # truncat")
    del sys.modules[module.__name__]
    assert load_module("edited", "VALUE = 1\n").VALUE == 1


def test_unwritable_cache_falls_back_with_a_warning_naming_the_variable(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XSYNC_CACHE_DIR", str(blocker))
    monkeypatch.setattr(files, "_usable", {})
    with pytest.warns(CacheWarning, match="XSYNC_CACHE_DIR"):
        where = files.cache_dir("nvidia")
    assert where != str(blocker / "nvidia") and os.path.isdir(where)
    files.write_checked(os.path.join(where, "probe.py"), "x = 1\n")


def test_unwritable_cache_and_fallback_is_a_config_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XSYNC_CACHE_DIR", str(blocker))
    monkeypatch.setattr(files, "_usable", {})
    monkeypatch.setattr("tempfile.tempdir", str(blocker))      # the fallback is blocked too
    with pytest.raises(ConfigError) as info:
        files.cache_dir("ascend")
    assert f"XSYNC_CACHE_DIR={blocker}" in str(info.value)
    assert "XSYNC_CACHE_DIR" in info.value.fix


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes read-only folders")
def test_read_only_cache_folder_falls_back(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    monkeypatch.setenv("XSYNC_CACHE_DIR", str(ro))
    monkeypatch.setattr(files, "_usable", {})
    try:
        with pytest.warns(CacheWarning, match="XSYNC_CACHE_DIR"):
            assert not files.cache_dir("nvidia").startswith(str(ro))
    finally:
        ro.chmod(0o700)


def test_dump_naming_a_file_is_a_config_error(tmp_path, monkeypatch):
    target = tmp_path / "dump.txt"
    target.write_text("")
    monkeypatch.setenv("XSYNC_DUMP", str(target))
    with pytest.raises(ConfigError) as info:
        _run(scaled)
    msg = str(info.value)
    assert "is a file" in msg and f"XSYNC_DUMP={target}" in msg
    assert "XSYNC_DUMP" in info.value.fix


def test_dump_to_an_unwritable_folder_is_a_config_error(monkeypatch):
    monkeypatch.setenv("XSYNC_DUMP", "/proc/xsync-dump-here")      # /proc refuses even root
    with pytest.raises(ConfigError) as info:
        _run(scaled)
    assert "cannot be written" in str(info.value) and "XSYNC_DUMP" in info.value.fix


def test_dump_writes_every_specialization(tmp_path, monkeypatch):
    monkeypatch.setenv("XSYNC_DUMP", str(tmp_path))
    _run(scaled)
    assert any(p.name.endswith(".py") for p in tmp_path.iterdir())


def test_concurrent_writers_leave_one_whole_file(tmp_path):
    path = str(tmp_path / "entry.py")
    texts = [f"VALUE = {i}\n" + "# pad\n" * 2000 for i in range(8)]
    threads = [threading.Thread(target=files.write_atomic, args=(path, t)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(path) as f:
        assert f.read() in texts                                   # whole, never interleaved
    assert [p.name for p in tmp_path.iterdir()] == ["entry.py"]    # no temporary left behind


def test_bytecode_check_leaves_good_files(tmp_path):
    src = tmp_path / "good.py"
    src.write_text("A = 1\n")
    pyc = py_compile.compile(str(src), doraise=True)
    assert not files._bad_bytecode(str(src)) and os.path.exists(pyc)
    assert importlib.util.cache_from_source(str(src)) == pyc
