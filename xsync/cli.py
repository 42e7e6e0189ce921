"""The `xsync` command line (also `python -m xsync`).

    xsync check MODULE:KERNEL [--backend B] [--set NAME=VALUE ...]
    xsync lower MODULE:KERNEL --backend B [--out DIR] [--set NAME=VALUE ...]
    xsync trace MODULE:KERNEL [--out file.svg|file.png] [--set NAME=VALUE ...] [--grid 1,2]
    xsync bench flash_attn|gemm [--quick]   benchmark vs torch on a GPU, with a progress bar
    xsync config   every XSYNC_* option with its resolved value
    xsync demo     the main job: examples + flash attention on the default backend vs torch

MODULE is an importable module (``xsync.kernels.gemm``) or a path to a .py file.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

from xsync import api
from xsync.errors import XSyncError
from xsync.lowering.placement import BACKENDS


def load_kernel(spec: str):
    """Resolve ``module:kernel`` (module path or file path) to a Kernel object."""
    from xsync.kernel import Kernel

    if ":" not in spec:
        raise SystemExit(f"xsync: expected MODULE:KERNEL, got {spec!r} (e.g. xsync.kernels.gemm:gemm)")
    mod_name, _, attr = spec.rpartition(":")
    if mod_name.endswith(".py") or os.sep in mod_name:
        path = os.path.abspath(mod_name)
        if not os.path.exists(path):
            raise SystemExit(f"xsync: no such file {mod_name!r}")
        module_spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(mod_name)
        except ImportError as exc:
            raise SystemExit(f"xsync: cannot import {mod_name!r}: {exc}") from exc
    kernel = getattr(module, attr, None)
    if not isinstance(kernel, Kernel):
        found = sorted(n for n, v in vars(module).items() if isinstance(v, Kernel))
        raise SystemExit(f"xsync: {mod_name} has no xsync kernel {attr!r}"
                         + (f" (kernels there: {', '.join(found)})" if found else ""))
    return kernel


def parse_settings(kernel, settings: list[str]) -> tuple[dict, dict]:
    """`--set BM=64 --set a=bfloat16` on top of the kernel's example specialization."""
    constexprs, dtypes = kernel.specialization()
    for item in settings:
        name, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"xsync: --set expects NAME=VALUE, got {item!r}")
        if raw in api.DTYPES:
            dtypes[name] = api.DTYPES[raw]
            continue
        try:
            constexprs[name] = int(raw)
        except ValueError:
            try:
                constexprs[name] = float(raw)
            except ValueError:
                constexprs[name] = raw
    missing = [n for n in kernel.constexpr_names() if n not in constexprs]
    if missing:
        raise SystemExit(f"xsync: kernel {kernel.__name__!r} needs values for {', '.join(missing)}: "
                         f"add --set {missing[0]}=... or an example=dict(...) in @xs.kernel")
    return constexprs, dtypes


def describe(lowered) -> str:
    k = lowered.kernel
    lines = [f"roles:"]
    for r in k.roles:
        lines.append(f"  {r.name:<12} kind={r.kind:<7} replicas={r.replicas}   (line {r.loc.line})")
    lines.append("sync objects:")
    for p in k.pipes:
        fields = ", ".join(f"{f.name}{list(f.shape)} {f.dtype.name}" for f in p.fields) or "no payload"
        lines.append(f"  pipe    {p.name:<10} {p.src} -> {p.dst}, {p.stages} stage(s), {fields}"
                     f"   (line {p.loc.line})")
    for e in k.events:
        lines.append(f"  event   {e.name:<10} {e.src} -> {e.dst}   (line {e.loc.line})")
    for b in k.barriers:
        lines.append(f"  barrier {b.name:<10} members {', '.join(b.members)}   (line {b.loc.line})")
    return "\n".join(lines)


def cmd_check(args) -> int:
    kernel = load_kernel(args.kernel)
    constexprs, dtypes = parse_settings(kernel, args.set)
    backends = [args.backend] if args.backend else list(BACKENDS)
    spec = " ".join(f"{k}={v}" for k, v in sorted(constexprs.items()))
    spec += "".join(f" {k}={v.name}" for k, v in sorted(dtypes.items()))
    print(f"kernel {kernel.__name__}  ({kernel.fn.__code__.co_filename}:{kernel.fn.__code__.co_firstlineno})")
    print(f"specialization: {spec}")
    failures = 0
    shown = False
    for backend in backends:
        print(f"\n=== backend {backend} ===")
        try:
            lowered = kernel.lower(backend, constexprs, dtypes, check=True)
        except XSyncError as err:
            failures += 1
            print(f"REJECTED: {type(err).__name__}")
            print(err)
            continue
        if not shown:
            print(describe(lowered))
            shown = True
        print("agents:")
        for a in lowered.placement.agents:
            print(f"  {a.name:<12} {a.replicas} x {a.hardware}: roles {', '.join(a.roles)}")
        print(lowered.allocation.table())
        print(f"verdict: OK — {lowered.report.summary()}")
    return 1 if failures else 0


def cmd_lower(args) -> int:
    from xsync.kernel import dump

    kernel = load_kernel(args.kernel)
    constexprs, dtypes = parse_settings(kernel, args.set)
    try:
        lowered = kernel.lower(args.backend, constexprs, dtypes)
        module = importlib.import_module(f"xsync.backends.{args.backend}")
        source = module.render_source(lowered.kernel, lowered.placement, lowered.allocation)
    except XSyncError as err:
        print(f"REJECTED: {type(err).__name__}\n{err}", file=sys.stderr)
        return 1
    if args.out:
        dump(args.out, lowered, source)
        print(f"wrote {os.path.join(args.out, f'{lowered.kernel.name}.{args.backend}.py')} and "
              f"{lowered.kernel.name}.{args.backend}.alloc.txt")
        return 0
    print(source)
    print("# " + lowered.allocation.table().replace("\n", "\n# "))
    return 0


def _settings(items: list[str]) -> dict:
    """`--set` values alone (for a kernel's trace= hook): ints, floats, dtypes or strings."""
    out = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"xsync: --set expects NAME=VALUE, got {item!r}")
        for conv in (lambda r: api.DTYPES[r], int, float, str):
            try:
                out[name] = conv(raw)
                break
            except (KeyError, ValueError):
                continue
    return out


def cmd_trace(args) -> int:
    from xsync import trace as tr

    kernel = load_kernel(args.kernel)
    constexprs, dtypes = parse_settings(kernel, args.set)
    grid = None
    if args.grid:
        try:
            grid = tuple(int(g) for g in args.grid.replace("x", ",").split(",") if g.strip())
        except ValueError:
            raise SystemExit(f"xsync: --grid expects sizes like 2 or 1,2, got {args.grid!r}") from None
    out = args.out or f"{kernel.__name__}.trace.svg"
    if os.path.splitext(out)[1].lower() not in (".svg", ".png"):
        raise SystemExit(f"xsync: --out must end in .svg or .png, got {out!r}")
    try:
        result = tr.trace_kernel(kernel, _settings(args.set), constexprs=constexprs, dtypes=dtypes,
                                 grid=grid, backend=args.backend)
        tr.write(result.timeline, out)
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


BENCHMARKS = ("flash_attn", "gemm")


def cmd_bench(args) -> int:
    """Run benchmarks/<name>.py from the source tree (they need a CUDA GPU)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "benchmarks", f"{args.name}.py")
    if not os.path.exists(path):
        raise SystemExit(f"xsync: {path} not found; `xsync bench` runs from a source checkout "
                         f"(benchmarks: {', '.join(BENCHMARKS)})")
    spec = importlib.util.spec_from_file_location(f"xsync_bench_{args.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(args.rest)


def cmd_config(args) -> int:
    from xsync import config

    print(config.current().describe())
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="xsync", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="protocol, allocation and verifier verdict per backend")
    p.add_argument("kernel", help="MODULE:KERNEL, e.g. xsync.kernels.gemm:gemm")
    p.add_argument("--backend", choices=BACKENDS)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="constexpr value or tensor dtype (e.g. BM=64, a=float16)")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("lower", help="print or write the generated source and allocation table")
    p.add_argument("kernel")
    p.add_argument("--backend", choices=BACKENDS, required=True)
    p.add_argument("--out", help="directory to write <kernel>.<backend>.py and .alloc.txt")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    p.set_defaults(func=cmd_lower)
    p = sub.add_parser("trace", help="draw a timeline of a small CPU-emulator run (or of the "
                                     "verifier's deadlock counterexample) as SVG or PNG")
    p.add_argument("kernel", help="MODULE:KERNEL; small arguments come from the kernel's trace= hook")
    p.add_argument("--out", help="output file, .svg or .png (default <kernel>.trace.svg)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="passed to the trace= hook (e.g. STAGES=3) and to the verifier")
    p.add_argument("--grid", help="override the hook's grid, e.g. 2 or 1,2")
    p.add_argument("--backend", choices=BACKENDS, default="cpu",
                   help="placement whose deadlock counterexample to draw (runs are always on cpu)")
    p.set_defaults(func=cmd_trace)
    p = sub.add_parser("bench", help="run a benchmark side by side with torch (GPU), with progress")
    p.add_argument("name", choices=BENCHMARKS)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="benchmark options, e.g. --quick")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("config", help="the resolved configuration: every XSYNC_* option, its value "
                                      "and what it does")
    p.set_defaults(func=cmd_config)
    p = sub.add_parser("demo", help="run the examples and flash attention on the default backend vs torch")
    p.set_defaults(func=lambda a: __import__("xsync.demo", fromlist=["main"]).main(a))
    args = parser.parse_args(argv)
    return args.func(args)
