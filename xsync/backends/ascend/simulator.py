"""Ascend cube/vector simulator: runs the triton-ascend source xsync generated, on the CPU.

``XSYNC_BACKEND=ascend-sim`` launches through here. What runs is the generated module
itself, not the portable kernel: the module is split per core the way the HIVM compiler
splits a mixed kernel (``hivm-split-mix-kernel``: a cube function and a vector function,
each keeping the scalar code), and every AI core is simulated as three threads::

        AI core k (one program):   cube ──set──▶ vector 0      vector 0 ──set──▶ cube
                                        └─set──▶ vector 1      vector 1 ──set──▶ cube

Each thread executes its function under triton-ascend's interpreter (``TRITON_INTERPRET``
machinery: numpy tiles over the real memory of the torch CPU tensors, so GM workspaces are
real tensors shared by the cores). The cross-core ops are the hardware's:

* a flag is a counter at its receiver, per AI core and flag ID: a set adds one, a wait
  blocks until it is positive and takes one; at most 15 sets may be pending;
* a cube set reaches both vector cores (each gets a count); a cube wait needs a set from
  each vector core (both counts positive, both taken);
* ``sync_block_all(mode)`` is a barrier over the launched cores of that kind
  (``all_cube``/``all_vector``/``all``) or over the two vector cores of one AI core
  (``all_sub_vector``).

Exactly one simulated core runs at a time (a baton handed on at every cross-core op), so a
run is deterministic and the interpreter's global state (the program index) is set for the
core that holds the baton. A release-form kernel runs the same vector code on both vector
cores (the compiler's sub-block binding would give each half the rows; both halves compute
the same values here, so results are identical); the scope form's ``al.sub_vec_id()`` is 0
or 1 per vector core.

When no core can move, the run stops at once with a :class:`~xsync.errors.StallError`
naming, for each blocked core, the flag, the xsync pipe/event/barrier behind it, the
generated line, the kernel line and the loop iteration. A 16th pending set, flags left
pending when a program ends, and a core that sets a flag it does not own are reported as
:class:`~xsync.errors.SimulationError`. A wall-clock limit (``cpu_timeout``) ends runs
that compute forever.
"""
from __future__ import annotations

import ast
import contextlib
import importlib.util
import math
import os
import re
import sys
import threading
import time
import types
from dataclasses import dataclass, field

from xsync import config, files
from xsync.backends.ascend.replicas import Core as CoreKind
from xsync.errors import SimulationError, StallError
from xsync.lowering.verifier.check import run_time_verdict

MAX_PENDING = 15      # sets one flag counter can hold
# Combine functions the interpreter recognises by identity and reduces with numpy (tl.max,
# tl.sum, ...); wrapping them would send every reduction down its element-by-element path.
_REDUCE_COMBINERS = ("_elementwise_max", "_elementwise_min", "_sum_combine", "_prod_combine",
                     "_argmin_combine_tie_break_left", "_argmax_combine_tie_break_left")
_LANGUAGE_LOCK = threading.RLock()   # the interpreter patches triton.language process-wide


def availability() -> tuple[bool, str]:
    try:
        from triton.backends import backends
        from triton.runtime.interpreter import InterpretedFunction  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - no triton, or another triton
        return False, f"triton-ascend is not installed ({exc})"
    if "ascend" not in backends:
        return False, "the installed triton is not triton-ascend (run in the ascend environment)"
    return True, ""


# ---------------------------------------------------------------- splitting
def split_source(module, core: CoreKind) -> str:
    """The generated module with the other cores' parts blanked out (line numbers kept, so
    reports and tracebacks point at the generated file's own lines)."""
    lines = module.source.split("\n")
    for part in module.parts:
        if part.core != core:
            for i in range(part.first - 1, part.last):
                lines[i] = ""
    return "\n".join(lines)


def _loop_vars_by_line(source: str, name: str) -> dict[int, tuple[str, ...]]:
    """For each line of kernel ``name``: the loop variables of the for-loops around it."""
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    out: dict[int, tuple[str, ...]] = {}

    def visit(stmts, loops):
        for s in stmts:
            for line in range(s.lineno, (s.end_lineno or s.lineno) + 1):
                out[line] = loops
            if isinstance(s, ast.For) and isinstance(s.target, ast.Name):
                visit(s.body, loops + (s.target.id,))
            else:
                for block in ("body", "orelse", "finalbody"):
                    inner = getattr(s, block, None)
                    if inner and isinstance(inner, list) and isinstance(inner[0], ast.stmt):
                        visit(inner, loops)
    visit(fn.body, ())
    return out


# ---------------------------------------------------------------- the machine
@dataclass
class Core:
    """One simulated core of one AI core."""

    ai_core: int               # index of the program in its wave (the AI core it occupies)
    program: tuple[int, int, int]
    kind: CoreKind
    sub: int                   # vector core 0 / 1 (0 for the cube)
    path: str                  # the split source it runs
    state: str = "ready"       # ready | blocked | done
    waiting: "Wait | None" = None
    where: tuple = ()          # (generated line, loop iteration text) of the op it is in
    error: BaseException | None = None

    @property
    def label(self) -> str:
        name = "cube" if self.kind is CoreKind.CUBE else f"vector {self.sub}"
        return f"AI core {self.ai_core} (program {self.program}) {name}"


@dataclass(frozen=True)
class Wait:
    what: str                  # "flag" | "barrier"
    flag: int
    counters: tuple            # counter keys that must be positive (flags)
    barrier: tuple = ()        # barrier key


class _Abort(BaseException):
    """Unwinds a simulated core when the run is stopped."""


class Machine:
    """Flags, barriers and the baton for one wave of programs."""

    def __init__(self, sim: "Simulation", cores: list[Core], wave_cores: int):
        self.sim = sim
        self.cores = cores
        self.cond = threading.Condition()
        self.holder: Core | None = None
        self.counters: dict[tuple, int] = {}
        self.barriers: dict[tuple, set] = {}
        self.aborted = False
        self.failure: BaseException | None = None
        self.wave_cores = wave_cores
        self.local = threading.local()
        # one "your turn" event per core: handing the baton on wakes exactly one thread
        self.turns = {id(c): threading.Event() for c in cores}

    # ------------------------------------------------------------ baton
    def take_baton(self, core: Core):
        turn = self.turns[id(core)]
        turn.wait()
        turn.clear()
        if self.aborted:
            raise _Abort()
        self.sim.enter(core)

    def pass_baton(self, core: Core):
        """Hand the baton to the next core that can move (round robin); detect a stall."""
        with self.cond:
            order = self.cores
            start = order.index(core) if core in order else -1
            nxt = None
            for k in range(1, len(order) + 1):
                cand = order[(start + k) % len(order)]
                if cand.state == "ready":
                    nxt = cand
                    break
            if nxt is None:
                if any(c.state == "blocked" for c in order):
                    self.stop(self.sim.stall_error(self))
                self.holder = None
            else:
                self.holder = nxt
                self.turns[id(nxt)].set()

    def stop(self, error: BaseException | None):
        with self.cond:
            if self.failure is None and error is not None:
                self.failure = error
            self.aborted = True
            for turn in self.turns.values():
                turn.set()

    # ------------------------------------------------------------ cross-core ops
    def receivers(self, core: Core, receiver: CoreKind) -> list[tuple]:
        """Counter keys a set by ``core`` adds to: (ai core, flag ID, receiving core, from)."""
        if receiver is CoreKind.VECTOR:
            return [(CoreKind.VECTOR, 0), (CoreKind.VECTOR, 1)]
        return [(CoreKind.CUBE, core.sub)]

    def op(self, core: Core, name: str, sender_or_mode: str, flag: int):
        site = self.sim.site(core)
        with self.cond:
            core.where = site
            if name == "sync_block_set":
                self._set(core, sender_or_mode, flag)
            elif name == "sync_block_wait":
                self._wait(core, sender_or_mode, flag)
            else:
                self._barrier(core, sender_or_mode, flag)
        self.pass_baton(core)
        self.take_baton(core)

    def _owner_check(self, core: Core, sender: str, flag: int, verb: str):
        if verb == "set" and sender != core.kind:
            self.stop(SimulationError(
                f"{core.label} executes sync_block_set with sender '{sender}' on flag {flag}",
                details=self.sim.where_text(core),
                fix="a set runs on its sender core; the generated code put it on the wrong side"))
            raise _Abort()
        if verb == "wait" and sender == core.kind:
            self.stop(SimulationError(
                f"{core.label} waits on flag {flag} for sets from its own kind ('{sender}')",
                details=self.sim.where_text(core),
                fix="cross-core flags run cube -> vector or vector -> cube"))
            raise _Abort()

    def _set(self, core: Core, sender: str, flag: int):
        self._owner_check(core, sender, flag, "set")
        receiver = CoreKind.VECTOR if core.kind is CoreKind.CUBE else CoreKind.CUBE
        keys = [(core.ai_core, flag) + r for r in self.receivers(core, receiver)]
        for key in keys:
            if self.counters.get(key, 0) >= MAX_PENDING:
                self.stop(SimulationError(
                    f"flag overflow: {core.label} sets flag {flag} ({self.sim.flag_name(flag)}) "
                    f"while {MAX_PENDING} sets are already pending at {self.sim.receiver_text(key)}; "
                    f"an Ascend flag counts at most {MAX_PENDING}",
                    details=self.sim.where_text(core),
                    fix="add back-pressure (a pipe whose stages bound the lead, or an event back) so "
                        "the setter cannot run 16 sets ahead of the waiter"))
                raise _Abort()
        for key in keys:
            self.counters[key] = self.counters.get(key, 0) + 1
        self._wake()

    def _wait(self, core: Core, sender: str, flag: int):
        self._owner_check(core, sender, flag, "wait")
        if core.kind is CoreKind.VECTOR:
            keys = ((core.ai_core, flag, CoreKind.VECTOR, core.sub),)
        else:
            keys = ((core.ai_core, flag, CoreKind.CUBE, 0), (core.ai_core, flag, CoreKind.CUBE, 1))
        core.waiting = Wait("flag", flag, keys)
        self._try_wait(core)

    def _try_wait(self, core: Core):
        w = core.waiting
        if w.what == "flag":
            if all(self.counters.get(k, 0) > 0 for k in w.counters):
                for k in w.counters:
                    self.counters[k] -= 1
                core.waiting, core.state = None, "ready"
            else:
                core.state = "blocked"
        else:
            members = self.barrier_members(w.barrier, core)
            arrived = self.barriers.get(w.barrier, set())
            if members <= arrived:
                core.waiting, core.state = None, "ready"
            else:
                core.state = "blocked"

    def _wake(self):
        for c in self.cores:
            if c.state == "blocked" and c.waiting is not None:
                self._try_wait(c)

    def barrier_members(self, key, core: Core) -> set:
        mode, _flag, ai = key
        if mode == "all_sub_vector":
            return {id(c) for c in self.cores if c.kind is CoreKind.VECTOR and c.ai_core == ai}
        kinds = {"all_cube": (CoreKind.CUBE,), "all_vector": (CoreKind.VECTOR,),
                 "all": (CoreKind.CUBE, CoreKind.VECTOR)}[mode]
        return {id(c) for c in self.cores if c.kind in kinds}

    def _barrier(self, core: Core, mode: str, flag: int):
        if mode not in ("all_cube", "all_vector", "all", "all_sub_vector"):
            self.stop(SimulationError(f"sync_block_all with unknown mode {mode!r}",
                                      details=self.sim.where_text(core)))
            raise _Abort()
        if (mode == "all_cube" and core.kind is not CoreKind.CUBE) or \
                (mode in ("all_vector", "all_sub_vector") and core.kind is not CoreKind.VECTOR):
            return  # the compiler drops the barrier from cores outside its mode
        meeting = self.sim.meeting(core, mode, flag)
        key = (mode, (flag, meeting), core.ai_core if mode == "all_sub_vector" else None)
        self.barriers.setdefault(key, set()).add(id(core))
        core.waiting = Wait("barrier", flag, (), key)
        self._try_wait(core)
        self._wake()

    def leftovers(self) -> list[str]:
        return [f"flag {key[1]} ({self.sim.flag_name(key[1])}) has {n} set(s) pending at "
                f"{self.sim.receiver_text(key)}" for key, n in sorted(self.counters.items()) if n]


# ---------------------------------------------------------------- one launch
class Simulation:
    def __init__(self, compiled, grid: tuple[int, ...], source_module=None, timeout: float = 600.0):
        from triton.runtime.interpreter import InterpretedFunction

        self.timeout = timeout      # seconds of wall clock (the cpu_timeout option)
        self.compiled = compiled
        self.kernel = compiled.kernel
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        module = source_module or compiled.module
        self.module = module
        self.flag_names = {flag: key for key, flag in compiled.allocation.event_ids}
        self.fns: dict[str, object] = {}
        self.paths: dict[str, str] = {}
        self.lines: dict[str, list[str]] = {}
        self.loops: dict[str, dict] = {}
        self._meetings: dict = {}
        digest = files.digest(module.source)
        for core in sorted({p.core for p in module.parts}):
            text = split_source(module, core)
            path = os.path.join(files.cache_dir("ascend", "sim"), f"{self.kernel.name}_{digest}.{core}.py")
            files.write_checked(path, text)
            spec = importlib.util.spec_from_file_location(f"xsync_sim_{self.kernel.name}_{digest}_{core}", path)
            mod = importlib.util.module_from_spec(spec)
            if module.form == "scope":
                mod.__dict__["al"] = _ScopeShim(self)
                text_for_exec = text.replace("import triton.language.extra.cann.extension as al",
                                             "# (xsync simulator: al is provided)")
                exec(compile(text_for_exec, path, "exec"), mod.__dict__)  # noqa: S102 - our own generated code
            else:
                files.exec_generated(spec, mod)     # heals a damaged .pyc
            jit = getattr(mod, module.entry)
            self.fns[core] = InterpretedFunction(jit.fn)
            self.paths[core] = path
            self.lines[core] = text.split("\n")
            self.loops[core] = _loop_vars_by_line(text, module.entry)
        self.machine: Machine | None = None
        self.local = threading.local()

    # ------------------------------------------------------------ reporting helpers
    def flag_name(self, flag: int) -> str:
        key = self.flag_names.get(flag)
        if key is None:
            return "not in xsync's allocation"
        obj, _, side = key.partition(":")
        return f"pipe '{obj}' {side.upper()}" if side else f"'{obj}'"

    def receiver_text(self, key) -> str:
        _ai, _flag, kind, sub = key
        return f"the cube (sets from vector {sub})" if kind is CoreKind.CUBE else f"vector {sub}"

    def site(self, core: Core) -> tuple:
        path = core.path
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename != path:
            frame = frame.f_back
        if frame is None:
            return (0, "")
        line = frame.f_lineno
        names = self.loops[core.kind].get(line, ())
        iters = []
        for n in names:
            v = frame.f_locals.get(n)
            v = getattr(getattr(v, "handle", None), "data", v)
            try:
                v = int(v.item() if hasattr(v, "item") else v)
            except (TypeError, ValueError):
                continue
            iters.append(f"{n}={v}")
        return (line, ", ".join(iters))

    def where_text(self, core: Core) -> str:
        line, iters = core.where or (0, "")
        if not line:
            return f"{core.label}"
        text = self.lines[core.kind][line - 1].strip()
        kernel_line = re.search(r"line (\d+)(?:\D*)$", text)
        at = f"{self.kernel.file}:{kernel_line.group(1)}" if kernel_line else self.kernel.file
        it = f" (iteration {iters})" if iters else ""
        return f"{core.label}: {at}{it}\n  generated line {line}: {text}"

    def meeting(self, core: Core, mode: str, flag: int) -> int:
        key = (id(core), mode, flag)
        self._meetings[key] = self._meetings.get(key, 0) + 1
        return self._meetings[key]

    def core_state(self, machine: Machine, c: Core) -> str:
        """What one core is doing, without the AI-core label (for grouping)."""
        if c.state == "done":
            return "finished"
        w = c.waiting
        if w is None:
            return "ready"
        line, iters = c.where or (0, "")
        text = self.lines[c.kind][line - 1].strip() if line else ""
        kernel_line = re.search(r"line (\d+)(?:\D*)$", text)
        at = f"{self.kernel.file}:{kernel_line.group(1)}" if kernel_line else self.kernel.file
        it = f" (iteration {iters})" if iters else ""
        if w.what == "flag":
            have = ", ".join(f"{self.receiver_text(k)} has {machine.counters.get(k, 0)}"
                             for k in w.counters)
            what = f"sync_block_wait on flag {w.flag} ({self.flag_name(w.flag)}): {have}"
        else:
            what = f"sync_block_all({w.barrier[0]!r}, {w.flag}) waiting for the other cores"
        return f"{at}{it}\n    generated line {line}: {text}\n    waits: {what}"

    def stall_error(self, machine: Machine) -> StallError:
        # One entry per (core, state); AI cores doing the same thing are listed together.
        groups: dict[tuple, list[Core]] = {}
        for c in machine.cores:
            groups.setdefault((c.kind, c.sub, self.core_state(machine, c)), []).append(c)
        lines = []
        for (kind, sub, state), cs in groups.items():
            name = "cube" if kind is CoreKind.CUBE else f"vector {sub}"
            ais = ", ".join(str(c.ai_core) for c in cs)
            progs = ", ".join(str(c.program) for c in cs)
            who = f"{name} of AI core {ais} (program {progs})" if len(cs) == 1 else \
                f"{name} of AI cores {ais} (programs {progs})"
            lines.append(f"{who}: {state}")
        verdict = run_time_verdict(getattr(self.compiled, "lowered", None))
        return StallError(
            f"Ascend simulation of '{self.kernel.name}' stalled: no core can move",
            details="\n".join(lines),
            fix="every wait needs its set on the other core (same flag ID); check the flag IDs and "
                "that sets and waits run the same number of times (xsync check shows the protocol); "
                + ("the verifier was off (XSYNC_VERIFY=0)" if verdict is None else verdict))

    # ------------------------------------------------------------ running
    def enter(self, core: Core):
        from triton.runtime.interpreter import interpreter_builder

        interpreter_builder.grid_dim = self.grid
        interpreter_builder.grid_idx = core.program
        self.local.core = core

    def run(self, args: list):
        from triton.runtime.interpreter import _implicit_cvt

        programs = [(x, y, z) for x in range(self.grid[0]) for y in range(self.grid[1])
                    for z in range(self.grid[2])]
        if not programs:
            return
        fn0 = next(iter(self.fns.values()))
        names = fn0.arg_names
        converted = [_implicit_cvt(a) for a in args]
        kwargs = dict(zip(names, converted))
        # Programs interact only through sync_block_all: without one, one program (AI core) at
        # a time is the same computation; with one, every program is resident at once (the
        # launcher already checked grid <= AI cores).
        wave = len(programs) if self.kernel.barriers else 1
        timeout = self.timeout
        deadline = time.monotonic() + timeout
        with _language_patched(self, [f.fn for f in self.fns.values()]):
            rewritten = {core: f.rewrite() for core, f in self.fns.items()}
            for start in range(0, len(programs), wave):
                self._run_wave(programs[start:start + wave], rewritten, kwargs, deadline, timeout)

    def _run_wave(self, programs, rewritten, kwargs, deadline, timeout):
        cores: list[Core] = []
        for ai, prog in enumerate(programs):
            if CoreKind.CUBE in rewritten:
                cores.append(Core(ai, prog, CoreKind.CUBE, 0, self.paths[CoreKind.CUBE]))
            if CoreKind.VECTOR in rewritten:
                # a mix kernel runs its vector function on both vector cores of the AI core; a
                # vector-only one ("aiv") is one vector core a program (what a reduce-add counts)
                subs = (0, 1) if CoreKind.CUBE in rewritten else (0,)
                cores += [Core(ai, prog, CoreKind.VECTOR, s, self.paths[CoreKind.VECTOR]) for s in subs]
        machine = Machine(self, cores, len(programs))
        self.machine = machine
        threads = []
        for c in cores:
            t = threading.Thread(target=self._core_main, args=(machine, c, rewritten[c.kind], kwargs),
                                 name=f"xsync-sim {c.label}", daemon=True)
            threads.append(t)
        machine.holder = cores[0]
        machine.turns[id(cores[0])].set()
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                machine.stop(StallError(
                    f"Ascend simulation of '{self.kernel.name}' ran longer than {timeout:g} s "
                    f"(cpu_timeout)",
                    details="\n".join(self.where_text(c) for c in cores if c.state != "done"),
                    fix="raise XSYNC_CPU_TIMEOUT for big problems, or shrink the launch"))
                for u in threads:
                    u.join(5.0)
                break
        if machine.failure is not None:
            raise machine.failure
        left = machine.leftovers()
        if left:
            raise SimulationError(
                f"Ascend simulation of '{self.kernel.name}': the program ends with flags pending; "
                f"the next program on the AI core would start with them",
                details="\n".join(left),
                fix="every set needs its wait: check loop bounds on both cores and the producer's "
                    "drain of EMPTY flags")

    def _core_main(self, machine: Machine, core: Core, fn, kwargs):
        machine.local.core = core
        try:
            machine.take_baton(core)
            fn(**kwargs)
            core.state = "done"
        except _Abort:
            core.state = "done"
            return
        except BaseException as exc:  # noqa: BLE001 - reported to the launcher
            core.state = "done"
            err = SimulationError(f"{core.label} failed: {type(exc).__name__}: {exc}",
                                  details=self.where_text(core))
            err.__cause__ = exc
            machine.stop(err)
            return
        machine.pass_baton(core)

    # ------------------------------------------------------------ the hook
    def hook(self, name: str, arg, event_id):
        core = self.local.core
        self.machine.op(core, name, str(arg), int(event_id))


class _ScopeShim(types.SimpleNamespace):
    """``triton.language.extra.cann.extension`` as the scope form uses it."""

    class PIPE:
        PIPE_S = "PIPE_S"
        PIPE_V = "PIPE_V"
        PIPE_M = "PIPE_M"
        PIPE_MTE1 = "PIPE_MTE1"
        PIPE_MTE2 = "PIPE_MTE2"
        PIPE_MTE3 = "PIPE_MTE3"
        PIPE_FIX = "PIPE_FIX"
        PIPE_ALL = "PIPE_ALL"

    def __init__(self, sim: Simulation):
        super().__init__()
        self._sim = sim

    @staticmethod
    def scope(core_mode=None):
        return contextlib.nullcontext()

    def sub_vec_id(self):
        return self._sim.local.core.sub

    def sync_block_set(self, sender, receiver, event_id, sender_pipe=None, receiver_pipe=None):
        self._sim.hook("sync_block_set", sender, event_id)

    def sync_block_wait(self, sender, receiver, event_id, sender_pipe=None, receiver_pipe=None):
        self._sim.hook("sync_block_wait", sender, event_id)

    def sync_block_all(self, mode, event_id):
        self._sim.hook("sync_block_all", mode, event_id)


@contextlib.contextmanager
def _language_patched(sim: Simulation, fns):
    """triton-ascend's interpreter patches ``triton.language`` process-wide; restore it after,
    so compiling in the same process still works, and route cross-core ops to the machine."""
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interpreter
    from triton.runtime.interpreter import (InterpretedFunction, ReduceOps, TensorHandle, _patch_lang,
                                            interpreter_builder)
    from triton.runtime.jit import JITFunction

    with _LANGUAGE_LOCK:
        # Library functions written with @triton.jit (tl.zeros, tl.max, ...) are interpreted too,
        # as TRITON_INTERPRET=1 at import time would make them.
        library = [m for name, m in list(sys.modules.items())
                   if m is not None and (name.startswith("triton.language")
                                         or name.startswith("triton.triton_patch.language"))]
        modules = list(dict.fromkeys([tl, tl.core, tl.math, interpreter] + library))
        classes = [tl.tensor, tl.dtype, ReduceOps]
        saved = [(m, dict(vars(m))) for m in modules]
        saved_cls = [(c, dict(c.__dict__)) for c in classes]
        saved_builder = dict(vars(interpreter_builder))
        try:
            import triton
            for m in library:
                jitted = [(n, v) for n, v in vars(m).items() if isinstance(v, JITFunction)]
                if jitted and "triton" not in vars(m):
                    m.triton = triton   # the interpreter's rewrite calls triton.language.semantic
                for name, value in jitted:
                    if name not in _REDUCE_COMBINERS:
                        setattr(m, name, InterpretedFunction(value.fn))
            patch_tensor = interpreter._patch_lang_tensor

            def patch_lang_tensor(tensor):
                # The interpreter converts 1-element arrays with int(), which numpy 2 refuses.
                patch_tensor(tensor)
                tensor.__index__ = lambda self: int(self.handle.data.item())
            interpreter._patch_lang_tensor = patch_lang_tensor
            for fn in fns:
                _patch_lang(fn)
            interpreter_builder.create_custom_op_for_inter_core_sync = sim.hook

            def create_dot(a, b, d, input_precision, max_num_imprecise_acc):
                # The interpreter keeps bf16 as raw uint16 bits and its own dot multiplies
                # those integers (wrong under numpy 2); the cube computes in fp32.
                return TensorHandle(np.matmul(_as_f32(a), _as_f32(b), dtype=np.float32)
                                    + d.data.astype(np.float32), d.dtype.scalar)
            interpreter_builder.create_dot = create_dot
            _round_casts_to_nearest_even(interpreter_builder)
            generic = ReduceOps.apply_impl

            def apply_impl(self, input):
                # triton-ascend's tl.max/tl.min combine functions are not among the ones the
                # interpreter reduces with numpy; without this every reduction runs element by
                # element in Python.
                ufunc = _NUMPY_REDUCE.get(getattr(getattr(self.combine_fn, "fn", None), "__name__", ""))
                if ufunc is None or (isinstance(input, tuple) and len(input) != 1):
                    return generic(self, input)
                x = input[0] if isinstance(input, tuple) else input
                data = x.handle.data if self.axis is not None else x.handle.data.reshape(-1)
                out = ufunc.reduce(data, axis=self.axis if self.axis is not None else 0,
                                   keepdims=self.keep_dims)
                return self.to_tensor(out, x.dtype)
            ReduceOps.apply_impl = apply_impl
            yield
        finally:
            for m, old in saved:
                # Names the interpreter added to module globals stay: its cached rewritten
                # functions read them on the next run. Replaced attributes are put back.
                for k, v in old.items():
                    if vars(m).get(k) is not v:
                        setattr(m, k, v)
            for c, old in saved_cls:
                for k in list(c.__dict__):
                    if k not in old:
                        delattr(c, k)
                for k, v in old.items():
                    if c.__dict__.get(k) is not v:
                        setattr(c, k, v)
            vars(interpreter_builder).clear()
            vars(interpreter_builder).update(saved_builder)


def _numpy_reduce_table():
    import numpy as np

    return {"_elementwise_max_default": np.fmax, "_elementwise_max_propagate_nan": np.maximum,
            "_elementwise_max": np.maximum, "_elementwise_min": np.minimum,
            "_elementwise_min_default": np.fmin, "_elementwise_min_propagate_nan": np.minimum,
            "_sum_combine": np.add}


class _LazyTable(dict):
    def get(self, key, default=None):
        if not self:
            self.update(_numpy_reduce_table())
        return dict.get(self, key, default)


_NUMPY_REDUCE = _LazyTable()


def _as_f32(handle):
    import numpy as np
    import triton.language as tl

    data = handle.data
    scalar = handle.dtype.scalar if hasattr(handle.dtype, "scalar") else handle.dtype
    if scalar == tl.bfloat16:
        return (data.astype(np.uint32) << 16).view(np.float32)
    return data.astype(np.float32)


def _round_casts_to_nearest_even(builder):
    """Make the interpreter's float casts round like the hardware: to nearest, ties to even.

    The interpreter casts fp32 <-> bf16 by truncation (its ``cast_impl`` passes no rounding
    mode), its RTNE rounds ties away and can carry a full mantissa into the sign, and it casts
    any other type to or from bf16 (kept as raw uint16 bits) with ``astype`` of the bits.
    Casts that involve fp8 keep the interpreter's own conversion."""
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interpreter
    from triton.runtime.interpreter import TensorHandle

    cast_impl, fp_to_fp = builder.cast_impl, builder.create_fp_to_fp
    toward_zero = interpreter._ir.ROUNDING_MODE.RTZ

    def convert(src, dst_type, rounding_mode=None):
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        value = _as_f32(src) if src_ty == tl.bfloat16 else src.data
        if dst_ty == tl.bfloat16:
            data = bf16_bits(value.astype(np.float32), rounding_mode == toward_zero)
        else:
            data = value.astype(interpreter._get_np_dtype(dst_ty))
            if rounding_mode == toward_zero and dst_ty.is_floating():
                wide = value.astype(np.float64)
                away = np.abs(data.astype(np.float64)) > np.abs(wide)
                data = np.where(away, np.nextafter(data, np.zeros_like(data)), data)
        return TensorHandle(np.asarray(data).reshape(np.shape(src.data)), dst_ty)

    def bf16_bits(f32, toward_zero_):
        bits = f32.view(np.uint32)
        nan = (bits & 0x7FFFFFFF) > 0x7F800000
        if toward_zero_:
            rounded = bits >> 16
        else:   # add just under half an ulp, plus one when the kept lsb is odd: ties to even
            rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16
        return np.where(nan, (bits >> 16) | 0x0040, rounded).astype(np.uint16)

    def rounded_cast_impl(self, src, dst_type):
        # create_fp_trunc, create_fp_ext, create_si_to_fp, ... all call self.cast_impl.
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        with np.errstate(over="ignore", invalid="ignore"):   # overflow to inf, as the hardware
            if tl.bfloat16 in (src_ty, dst_ty) and not src_ty.is_fp8() and not dst_ty.is_fp8():
                return convert(src, dst_type)
            return cast_impl(src, dst_type)

    def rounded_fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar.is_fp8() or dst_type.scalar.is_fp8():
            return fp_to_fp(src, dst_type, rounding_mode)
        with np.errstate(over="ignore", invalid="ignore"):
            return convert(src, dst_type, rounding_mode)

    builder.cast_impl = types.MethodType(rounded_cast_impl, builder)
    builder.create_fp_to_fp = types.MethodType(rounded_fp_to_fp, builder)


def simulate(compiled, grid, args: dict, source_module=None, timeout: float | None = None):
    """Run ``compiled`` (a CompiledAscend) on CPU tensors; outputs land in ``args``' tensors.
    ``timeout``: seconds (default: the cpu_timeout option now)."""
    ok, why = availability()
    if not ok:
        from xsync.errors import BackendError
        raise BackendError(f"cannot simulate '{compiled.kernel.name}': {why}",
                           fix="run in the ascend environment (bash scripts/env.sh ascend)")
    grid = tuple(int(g) for g in grid)
    if math.prod(grid) == 0:
        return
    compiled.check_grid(grid)
    if timeout is None:
        timeout = config.current().cpu_timeout
    sim = Simulation(compiled, grid, source_module, timeout)
    sim.run(compiled.host_args(grid, args))
