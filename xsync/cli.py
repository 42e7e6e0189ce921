"""The `xsync` command line (also `python -m xsync`).

    xsync check MODULE:KERNEL [--backend B] [--set NAME=VALUE ...] [--accept-bounded]
    xsync lower MODULE:KERNEL --backend B [--out DIR] [--set NAME=VALUE ...] [--accept-bounded]
    xsync trace MODULE:KERNEL [--out file.svg|file.png] [--set NAME=VALUE ...] [--grid 1,2]
    xsync bench NAME   flash_attn|gemm|examples|model|dropin|context_parallel: vs torch on a GPU, with a progress bar
    xsync config   every XSYNC_* option with its resolved value
    xsync demo     the main job: examples + flash attention on the default backend vs torch

MODULE is an importable module (``xsync.kernels.gemm``) or a path to a .py file.

``check`` reports everything lowering would refuse: the verifier's verdict and the backend's
render step (pure text, no toolchain). It exits 1 where a backend rejects the kernel, or where
its verdict is not proven (checked only up to bounds) unless ``--accept-bounded`` (or the
kernel's ``accept_bounded`` option) accepts it; the verdict then reads NOT PROVEN.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

from xsync import api
from xsync.errors import XSyncError
from xsync import backends as registry


class UsageError(Exception):
    """A mistake in how xsync was called: one line on stderr, exit code 2."""


def load_kernel(spec: str):
    """Resolve ``module:kernel`` (module path or file path) to a Kernel object."""
    from xsync.compiler import Kernel

    if ":" not in spec:
        raise UsageError(f"expected MODULE:KERNEL, got {spec!r} (e.g. xsync.kernels.gemm:gemm)")
    mod_name, _, attr = spec.rpartition(":")
    if not attr or not mod_name:
        raise UsageError(f"expected MODULE:KERNEL, got {spec!r} (e.g. xsync.kernels.gemm:gemm)")
    if mod_name.endswith(".py") or os.sep in mod_name or (os.altsep and os.altsep in mod_name):
        path = os.path.abspath(mod_name)
        if os.path.isdir(path):
            raise UsageError(f"{mod_name} is a directory; name a .py file (e.g. {mod_name}/kernel.py:NAME)")
        if not path.endswith(".py"):
            if os.path.isfile(path + ".py"):
                path += ".py"
            else:
                raise UsageError(f"{mod_name} is not a .py file; name the file with its .py suffix "
                                 f"or an importable module (dots, no slashes)")
        if not os.path.isfile(path):
            raise UsageError(f"no such file {mod_name!r}")
        # as `python kern.py` runs it: the file's folder first on sys.path, so a kernel file
        # may import its sibling modules
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        module_spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except XSyncError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's file fails to load
            raise UsageError(f"cannot load {mod_name}: {type(exc).__name__}: {exc}") from exc
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(mod_name)
        except XSyncError:
            raise
        except Exception as exc:  # noqa: BLE001 - ImportError, SyntaxError in the user's module ...
            raise UsageError(f"cannot import {mod_name!r}: {type(exc).__name__}: {exc}") from exc
    kernel = getattr(module, attr, None)
    if not isinstance(kernel, Kernel):
        found = sorted(n for n, v in vars(module).items() if isinstance(v, Kernel))
        raise UsageError(f"{mod_name} has no xsync kernel {attr!r}"
                         + (f" (kernels there: {', '.join(found)})" if found else ""))
    return kernel


def parse_settings(kernel, settings: list[str]) -> tuple[dict, dict]:
    """`--set BM=64 --set a=bfloat16` on top of the kernel's example specialization: names
    must be the kernel's constexpr or tensor parameters, values ints/floats or dtypes."""
    constexprs, dtypes = kernel.specialization()
    params = list(kernel.signature.parameters)
    const_names = set(kernel.constexpr_names())
    for item in settings:
        name, sep, raw = item.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or not name or not raw:
            raise UsageError(f"--set expects NAME=VALUE, got {item!r}")
        if name not in params:
            close = [p for p in params if p.lower() == name.lower()]
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UsageError(f"--set {name}: kernel {kernel.__name__!r} has no parameter {name!r}{hint}; "
                             f"constexprs: {', '.join(sorted(const_names)) or 'none'}")
        if name in const_names:
            try:
                constexprs[name] = int(raw, 0)
            except ValueError:
                try:
                    constexprs[name] = float(raw)
                except ValueError:
                    raise UsageError(f"--set {name}={raw}: constexpr {name} takes a number") from None
            continue
        valid = ", ".join(d for d in api.DTYPES if d != "int1")
        if name not in dtypes and (raw not in api.DTYPES or raw == "int1"):
            raise UsageError(f"--set {name}={raw}: {name} is a run-time scalar parameter, not "
                             f"settable by --set (check verifies every value of it; --set sets "
                             f"constexprs ({', '.join(sorted(const_names)) or 'none'}) and tensor "
                             f"dtypes ({valid})); fix: drop --set {name}=...")
        if raw not in api.DTYPES or raw == "int1":
            raise UsageError(f"--set {name}={raw}: tensor {name}'s dtype is one of {valid}")
        dtypes[name] = api.DTYPES[raw]
    missing = [n for n in kernel.constexpr_names() if n not in constexprs]
    if missing:
        raise UsageError(f"kernel {kernel.__name__!r} needs values for {', '.join(missing)}: "
                         f"add --set {missing[0]}=... or an example=dict(...) in @xs.kernel")
    return constexprs, dtypes


ACCEPT_FLAG = "--accept-bounded"


def _accept(args):
    """The ``accept_bounded`` argument of Kernel.lower for ``--accept-bounded`` (None: the
    option's value, which the kernel or the environment may set)."""
    return ACCEPT_FLAG if args.accept_bounded else None


def lower_and_render(kernel, backend, constexprs=None, dtypes=None, accept_bounded=None,
                     check: bool | None = None):
    """(lowered, source): what ``xsync lower`` produces; raises what lowering would."""
    from xsync import config

    lowered = kernel.lower(backend, constexprs, dtypes, check=check, accept_bounded=accept_bounded)
    with config.kernel_scope(kernel.options):      # the kernel's own defaults apply here too
        render_options = config.render_options(backend)
    source = backend.render_source(lowered.kernel, lowered.placement, lowered.allocation,
                                   render_options)
    return lowered, source


def cmd_check(args) -> int:
    kernel = load_kernel(args.kernel)
    constexprs, dtypes = parse_settings(kernel, args.set)
    backends = [registry.get(args.backend)] if args.backend else [registry.get(t) for t in registry.target_names()]
    return check_kernel(kernel, constexprs, dtypes, backends, _accept(args))


def check_kernel(kernel, constexprs: dict, dtypes: dict, backends, accept_bounded=None) -> int:
    """``xsync check`` of one specialization on ``backends``: prints the protocol, placement,
    allocation and verdict per backend; 1 where a backend rejects it (what lowering and
    rendering would raise), else 0."""
    spec = " ".join(f"{k}={v}" for k, v in sorted(constexprs.items()))
    spec += "".join(f" {k}={v.name}" for k, v in sorted(dtypes.items()))
    print(f"kernel {kernel.__name__}  ({kernel.fn.__code__.co_filename}:{kernel.fn.__code__.co_firstlineno})")
    print(f"specialization: {spec}")
    failures = 0
    shown = False
    for backend in backends:
        print(f"\n=== backend {backend.name} ===")
        try:
            # the render step too: its legality errors are lowering's
            lowered, _ = lower_and_render(kernel, backend, constexprs, dtypes, accept_bounded, check=True)
        except XSyncError as err:
            failures += 1
            print(f"REJECTED: {type(err).__name__}")
            print(err)
            continue
        if not shown:
            print(lowered.kernel.describe())
            shown = True
        print("agents:")
        for a in lowered.placement.agents:
            print(f"  {a.name:<12} {a.replicas} x {a.hardware}: roles {', '.join(a.roles)}")
        print(lowered.allocation.table())
        if lowered.report.proven:
            print(f"verdict: OK — {lowered.report.summary()}")
        else:     # accepted bounded: the summary starts NOT PROVEN and says by whom
            print(f"verdict: {lowered.report.summary()}")
    return 1 if failures else 0


def cmd_lower(args) -> int:
    from xsync.compiler import dump

    kernel = load_kernel(args.kernel)
    constexprs, dtypes = parse_settings(kernel, args.set)
    backend = registry.get(args.backend)
    try:
        lowered, source = lower_and_render(kernel, backend, constexprs, dtypes, _accept(args))
    except XSyncError as err:
        print(f"REJECTED: {type(err).__name__}\n{err}", file=sys.stderr)
        return 1
    if args.out:
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise UsageError(f"--out {args.out} is a file; name a directory")
        try:
            paths = dump(args.out, lowered, source)
        except OSError as exc:
            raise UsageError(f"cannot write to {args.out}: {exc.strerror or exc}") from exc
        print("wrote " + " and ".join(paths))
        return 0
    print(source)
    print("# " + lowered.allocation.table().replace("\n", "\n# "))
    return 0


def cmd_trace(args) -> int:
    from xsync import trace as tr

    kernel = load_kernel(args.kernel)
    constexprs, dtypes = parse_settings(kernel, args.set)
    grid = None
    if args.grid:
        try:
            grid = tuple(int(g) for g in args.grid.replace("x", ",").split(",") if g.strip())
        except ValueError:
            raise UsageError(f"--grid expects sizes like 2 or 1,2, got {args.grid!r}") from None
        if not 1 <= len(grid) <= 3 or any(g < 1 for g in grid):
            raise UsageError(f"--grid takes 1 to 3 positive sizes, got {args.grid!r}")
    out = args.out or f"{kernel.__name__}.trace.svg"
    if os.path.isdir(out):
        raise UsageError(f"--out {out} is a directory; name a .svg or .png file")
    if os.path.splitext(out)[1].lower() not in (".svg", ".png"):
        raise UsageError(f"--out must end in .svg or .png, got {out!r}")
    chosen = [item.partition("=")[0].strip() for item in args.set]
    hook_settings = {n: constexprs[n] if n in constexprs else dtypes[n] for n in chosen}
    try:
        result = tr.trace_kernel(kernel, hook_settings, constexprs=constexprs, dtypes=dtypes,
                                 grid=grid, backend=args.backend)
        try:
            tr.write(result.timeline, out)
        except OSError as exc:
            raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from exc
    except XSyncError as err:
        print(f"REJECTED: {type(err).__name__}\n{err}", file=sys.stderr)
        return 1
    tl = result.timeline
    if tl.deadlock:
        print(f"DEADLOCK: the verifier rejects {kernel.__name__}; drew its counterexample "
              f"({sum(not m.stuck for m in tl.marks)} steps, stuck: {', '.join(tl.stuck_lanes)})\n{result.error}")
    else:
        stalls = sum(1 for m in tl.marks if m.stall_from is not None)
        print(f"ran {kernel.__name__} on the CPU emulator, grid {result.grid}: {len(tl.lanes)} lanes, "
              f"{len(tl.marks)} sync ops, {len(tl.links)} arrows, {stalls} stalls")
        if result.error is not None:
            print(f"STALLED (stuck: {', '.join(tl.stuck_lanes)})\n{result.error}")
    print(f"wrote {out}")
    return 0


# `xsync bench NAME` runs benchmarks/<file>.py (attention.py: a file named flash_attn.py would
# shadow the flash_attn package FA4 is imported from)
BENCHMARKS = {"flash_attn": "attention", "gemm": "gemm", "examples": "examples", "model": "model_step",
              "dropin": "dropin", "context_parallel": "context_parallel"}


def cmd_bench(args) -> int:
    """Run benchmarks/<name>.py from the source tree (they need a CUDA GPU)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "benchmarks", f"{BENCHMARKS.get(args.name, args.name)}.py")
    if not os.path.exists(path):
        raise UsageError(f"{path} not found; `xsync bench` runs from a source checkout "
                         f"(benchmarks: {', '.join(BENCHMARKS)})")
    spec = importlib.util.spec_from_file_location(f"xsync_bench_{args.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(args.rest)


def cmd_config(args) -> int:
    from xsync import config

    print(config.current().describe())
    return 0


def one_line(err: BaseException) -> str:
    if isinstance(err, XSyncError):
        where = f"{err.loc}: " if err.loc else ""
        fix = f" (fix: {err.fix})" if err.fix else ""
        return f"{where}{err.what}{fix}".replace("\n", " ")
    return str(err).replace("\n", " ")


def main(argv=None) -> int:
    """Run a command. A user error is one line on stderr and exit code 2 (--debug also prints
    the traceback); a closed stdout (| head) ends quietly."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    try:
        return _run(argv)
    except BrokenPipeError:
        # the reader went away (xsync check ... | head): stop without a word
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except (UsageError, XSyncError) as err:
        if debug:
            import traceback
            traceback.print_exc()
        print(f"xsync: {one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("xsync: interrupted", file=sys.stderr)
        return 130


def _run(argv) -> int:
    parser = argparse.ArgumentParser(prog="xsync", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="--debug (anywhere): print the traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="protocol, allocation and verifier verdict per backend")
    p.add_argument("kernel", help="MODULE:KERNEL, e.g. xsync.kernels.gemm:gemm")
    p.add_argument("--backend", choices=registry.target_names())
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="constexpr value or tensor dtype (e.g. BM=64, a=float16)")
    p.add_argument(ACCEPT_FLAG, action="store_true",
                   help="accept a verdict that is not proven (checked only up to bounds); "
                        "it reads NOT PROVEN")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("lower", help="print or write the generated source and allocation table")
    p.add_argument("kernel")
    p.add_argument("--backend", choices=registry.target_names(), required=True)
    p.add_argument("--out", help="directory to write <kernel>.<backend>.py and .alloc.txt")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument(ACCEPT_FLAG, action="store_true",
                   help="lower a kernel whose verdict is not proven (checked only up to bounds)")
    p.set_defaults(func=cmd_lower)
    p = sub.add_parser("trace", help="draw a timeline of a small CPU-emulator run (or of the "
                                     "verifier's deadlock counterexample) as SVG or PNG")
    p.add_argument("kernel", help="MODULE:KERNEL; small arguments come from the kernel's trace= hook")
    p.add_argument("--out", help="output file, .svg or .png (default <kernel>.trace.svg)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="passed to the trace= hook (e.g. STAGES=3) and to the verifier")
    p.add_argument("--grid", help="override the hook's grid, e.g. 2 or 1,2")
    p.add_argument("--backend", choices=registry.target_names(), default="cpu",
                   help="placement whose deadlock counterexample to draw (runs are always on cpu)")
    p.set_defaults(func=cmd_trace)
    p = sub.add_parser("bench", help="run a benchmark side by side with torch (GPU), with progress")
    p.add_argument("name", choices=list(BENCHMARKS))
    p.add_argument("rest", nargs=argparse.REMAINDER, help="benchmark options, e.g. --quick")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("config", help="the resolved configuration: every XSYNC_* option, its value "
                                      "and what it does")
    p.set_defaults(func=cmd_config)
    p = sub.add_parser("demo", help="run the examples and flash attention on the default backend vs torch")
    p.set_defaults(func=lambda a: __import__("xsync.demo", fromlist=["main"]).main(a))
    args = parser.parse_args(argv)
    return args.func(args)
