"""The real HIVM compiler on a lowered kernel, without an NPU.

triton-ascend compiles a kernel in stages: ``ttir`` and ``ttadapter`` (its own
``triton-adapter-opt``, giving HIVM-flavoured MLIR) and then ``bishengir-compile``, the HIVM
compiler, which runs every device pass — the mix-kernel split into a cube and a vector
function, sub-block binding (the two vector cores take half the rows each), intra-core sync
injection, memory planning — and finally hands the module to ``hivmc`` (CANN-only) for
machine code. The PyPI package ``ascendnpu-ir`` ships ``bishengir-compile``; without CANN it
stops at ``hivmc`` with "External hivmc run fails, returning module before running external
compiler", which marks a kernel that passed every HIVM pass.

:func:`compile_lowered` runs that pipeline with the options triton-ascend itself passes for
A2/A3 targets (:func:`compile_options` derives them from triton-ascend's ``NPUOptions``
defaults plus xsync's :data:`~xsync.backends.ascend.COMPILE_OPTIONS`, the way
``linalg_to_bin_enable_npu_compile_A2_A3`` builds its command line) and returns the IR after
the split, after the binding and at the end of each device function.

Version skew: ``ascendnpu-ir`` 1.2.0 is newer than the bishengir that CANN 8.5 pairs with
triton-ascend 3.2.0, so a kernel it accepts could still meet an older compiler's limits.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from xsync.errors import BackendError

HIVMC_MARK = "External hivmc run fails, returning module before running external compiler"
# Passes whose output the tests read: the split, the binding, and the last pass that touches
# cross-core sync ops (it runs per device function).
DUMP_AFTER = ("hivm-split-mix-kernel", "hivm-bind-sub-block", "hivm-add-ffts-to-syncblocksetop",
              "hivm-plan-memory")
# Local memories of an Ascend 910B AI core (bytes), as the compiler names them after
# hivm-plan-memory: the vector core's unified buffer, the cube's L1 and L0C.
CAPACITY = {"ub": 192 * 1024, "cbuf": 512 * 1024, "cc": 128 * 1024}
_PLACED_RE = re.compile(r"hivm\.hir\.pointer_cast\(([^)]*)\) : memref<((?:\d+x)+)(\w+)[^>]*"
                        r"#hivm\.address_space<(\w+)>>")
_ELEMENT_BITS = {"f32": 32, "i32": 32, "f16": 16, "bf16": 16, "i16": 16, "i8": 8, "i64": 64, "i1": 1}
_UB_RE = re.compile(r"ub overflow, requires (\d+) bits while (\d+) bits available")
_OVERFLOW_RE = re.compile(r"(\w+) overflow, requires (\d+) bits while (\d+) bits available")
SYNC_RE = re.compile(r"hivm\.hir\.sync_block_(set|wait)\[<(CUBE|VECTOR)>, <(PIPE_\w+)>, <(PIPE_\w+)>\]"
                     r" flag = (\d+)")
BARRIER_RE = re.compile(r"hivm\.hir\.sync_block\[<(ALL\w*)>, (\d+) : i16\]")


def compiler_path() -> str | None:
    """bishengir-compile from the ascendnpu-ir package, if installed."""
    try:
        import ascendnpuir
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(ascendnpuir.__file__), "bin", "bishengir-compile")
    return path if os.access(path, os.X_OK) else None


def compile_options(arch: str) -> list[str]:
    """bishengir-compile's options as triton-ascend 3.2.0 passes them for an A2/A3 target
    (``linalg_to_bin_enable_npu_compile_A2_A3``), from ``NPUOptions`` with xsync's options."""
    from triton.backends.ascend.compiler import NPUOptions

    from xsync.backends.ascend import COMPILE_OPTIONS

    opts = NPUOptions(**COMPILE_OPTIONS)
    flags = [f"--target={arch}"]
    # (NPUOptions field, bishengir-compile flag) in triton-ascend's order
    table = (("multibuffer", "enable-auto-multi-buffer"),
             ("enable_auto_bind_sub_block", "enable-auto-bind-sub-block"),
             ("enable_hivm_auto_cv_balance", "enable-hivm-auto-cv-balance"),
             ("sync_solver", "enable-hivm-graph-sync-solver"),
             ("unit_flag", "enable-hivm-unit-flag-sync"),
             ("inject_barrier_all", "enable-hivm-inject-barrier-all-sync"),
             ("inject_block_all", "enable-hivm-inject-block-all-sync"),
             ("limit_auto_multi_buffer_only_for_local_buffer",
              "limit-auto-multi-buffer-only-for-local-buffer"),
             ("set_workspace_multibuffer", "set-workspace-multibuffer"),
             ("tile_mix_vector_loop", "tile-mix-vector-loop"),
             ("tile_mix_cube_loop", "tile-mix-cube-loop"),
             ("limit_auto_multi_buffer_of_local_buffer", "limit-auto-multi-buffer-of-local-buffer"),
             ("disable_auto_inject_block_sync", "disable-auto-inject-block-sync"))
    for name, flag in table:
        value = getattr(opts, name, None)
        if value is not None:
            flags.append(f"--{flag}={value}")
    flags += ["--enable-hfusion-compile=true", "--enable-hivm-compile=true",
              "--enable-triton-kernel-compile=true"]
    return flags


@dataclass(frozen=True)
class HivmResult:
    """One bishengir-compile run on one kernel specialization."""

    kernel: str
    reached_hivmc: bool          # every HIVM pass ran (stopped only for the CANN-only hivmc)
    seconds: float
    options: tuple[str, ...]
    log: str
    after_split: str = ""        # whole module after hivm-split-mix-kernel
    after_binding: str = ""      # whole module after hivm-bind-sub-block
    functions: dict = field(default_factory=dict)   # device function -> its final IR
    timed_out: bool = False
    placed: dict = field(default_factory=dict)      # device function -> IR after plan-memory

    def memory(self) -> dict[str, dict[str, int]]:
        """Peak bytes per local memory of each device function, from the buffers
        hivm-plan-memory placed (offset + size, multi-buffered copies included)."""
        out: dict[str, dict[str, int]] = {}
        for fn, text in self.placed.items():
            peaks = {}
            for m in _PLACED_RE.finditer(text):
                offsets = [int(x) for x in re.findall(r"%c(\d+)_i64", m.group(1))]
                n = 1
                for d in m.group(2).rstrip("x").split("x"):
                    n *= int(d)
                size = -(-n * _ELEMENT_BITS.get(m.group(3), 32) // 8)
                space = m.group(4)
                peaks[space] = max([peaks.get(space, 0)] + [o + size for o in offsets])
            if peaks:
                out[fn] = peaks
        return out

    @property
    def overflows(self) -> list[tuple[str, int, int]]:
        """(memory, required bits, available bits) of every local memory that overflowed, in
        the log's order (the compiler plans the cube's and the vector's functions in parallel,
        so where both overflow either may come first)."""
        seen = []
        for m in _OVERFLOW_RE.finditer(self.log):
            item = (m.group(1), int(m.group(2)), int(m.group(3)))
            if item not in seen:
                seen.append(item)
        return seen

    @property
    def overflow(self) -> tuple[str, int, int] | None:
        """The first of :attr:`overflows`, or None."""
        return (self.overflows or [None])[0]

    @property
    def error(self) -> str:
        lines = [ln for ln in self.log.splitlines() if "error:" in ln and HIVMC_MARK not in ln]
        return "\n".join(lines)

    def sync_ops(self, text: str | None = None) -> list[tuple]:
        """(set|wait, CUBE|VECTOR, sender pipe, receiver pipe, flag) in ``text`` (default: the
        final device functions)."""
        texts = [text] if text is not None else list(self.functions.values())
        return [m.groups()[:4] + (int(m.group(5)),) for t in texts for m in SYNC_RE.finditer(t)]

    def barrier_ops(self, text: str | None = None) -> list[tuple[str, int]]:
        texts = [text] if text is not None else list(self.functions.values())
        return [(m.group(1), int(m.group(2))) for t in texts for m in BARRIER_RE.finditer(t)]

    def flags(self, text: str | None = None) -> set[int]:
        """Every cross-core flag ID the IR uses (sets, waits, sync_block_all)."""
        return {op[4] for op in self.sync_ops(text)} | {b[1] for b in self.barrier_ops(text)}

    def describe(self) -> str:
        if self.timed_out:
            return f"{self.kernel}: bishengir-compile did not finish in {self.seconds:.0f} s"
        if self.reached_hivmc:
            return f"{self.kernel}: every HIVM pass ran ({self.seconds:.1f} s), stopped at hivmc"
        if self.overflows:
            return f"{self.kernel}: " + "; ".join(
                f"{mem.upper()} overflow: needs {need // 8} B, the core has {have // 8} B"
                for mem, need, have in self.overflows)
        return f"{self.kernel}: bishengir-compile failed:\n{self.error or self.log[-2000:]}"


def run(mlir: str, name: str, arch: str = "Ascend910B3", timeout: float = 600.0) -> HivmResult:
    """bishengir-compile on one ``.ttadapter`` module."""
    path = compiler_path()
    if path is None:
        raise BackendError("bishengir-compile is not installed (PyPI package ascendnpu-ir)",
                           fix="bash scripts/env.sh ascend installs it into .venv/ascend")
    options = compile_options(arch)
    with tempfile.TemporaryDirectory(prefix="xsync-hivm-") as tmp:
        src = os.path.join(tmp, f"{name}.ttadapter.mlir")
        with open(src, "w") as f:
            f.write(mlir)
        dumps = os.path.join(tmp, "ir")
        cmd = [path, src, *options, f"--mlir-print-ir-after={','.join(DUMP_AFTER)}",
               f"--mlir-print-ir-tree-dir={dumps}", "-o", os.path.join(tmp, "kernel")]
        start = time.monotonic()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            log, timed_out = done.stdout + done.stderr, False
        except subprocess.TimeoutExpired as exc:
            log = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
            timed_out = True
        seconds = time.monotonic() - start
        split = binding = ""
        functions, placed, placed_names = {}, {}, {}
        for root, _dirs, names in os.walk(dumps):
            for n in names:
                text = open(os.path.join(root, n)).read()
                if n.endswith(f"_{DUMP_AFTER[0]}.mlir") and root.endswith("symbol-name"):
                    split = text
                elif n.endswith(f"_{DUMP_AFTER[1]}.mlir") and root.endswith("symbol-name"):
                    binding = text
                elif n.endswith(f"_{DUMP_AFTER[2]}.mlir") or n.endswith(f"_{DUMP_AFTER[3]}.mlir"):
                    fn = os.path.basename(root).removeprefix("func_func_")
                    if fn.endswith("_function"):       # host helper functions
                        continue
                    if n.endswith(f"_{DUMP_AFTER[2]}.mlir"):
                        functions[fn] = text
                    elif n > placed_names.get(fn, ""):  # the last plan-memory run wins
                        placed[fn], placed_names[fn] = text, n
    return HivmResult(name, HIVMC_MARK in log and not timed_out, seconds, tuple(options), log,
                      split, binding, functions, timed_out, placed)


def compile_lowered(lowered, arch: str = "Ascend910B3", scalars: dict | None = None,
                    form: str | None = "release", timeout: float = 600.0) -> HivmResult:
    """triton-ascend's frontend and adapter, then bishengir-compile, on a lowered kernel
    (``kernel.lower("ascend", ...)``)."""
    from xsync.backends.ascend import compile_hivm

    _ttir, mlir = compile_hivm(lowered, arch=arch, scalars=scalars, form=form)
    return run(mlir, lowered.kernel.name, arch, timeout)
