"""Verification time of the flagship kernels, this tree against the pre-wave verifier (issue 11:
"verification time for the flagship kernels stays within 2x of today's").

    python benchmarks/verify_time.py [--baseline DIR] [--runs N] [--rounds R] [--json FILE]
                                     [--profile K:B]

Each tree is measured in its own fresh process (cwd and PYTHONPATH = that tree), so the
process-wide caches of generated code start empty in both. Per kernel and placement:

  prepare   frontend parse + placement (+ the schedule passes and skeleton, where the tree has
            them): everything ``Kernel.lower`` does before the verifier
  verify    ``verify(kernel, placement[, skeleton])`` on the prepared kernel
  first     the first ``verify`` call of the process (its generated-code caches empty)
  lower     ``Kernel.lower(backend, *specialization(), check=True)`` end to end

All but ``first`` are medians of --runs calls (default 7) after one warm-up call. With
--rounds R the two trees' processes alternate R times (this tree, the baseline, this tree,
...) and each number is the median over the rounds: a shared machine drifts by more than the
difference being measured between two processes run minutes apart. The kernel
source is whatever the tree holds (the forward's tile loop may be persistent or one guarded
tile per program; both verify the same way). Kernels the baseline lacks show "-".
--profile attention_fwd:ascend prints the top cProfile items of that verify call instead.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_BASELINE = "/work/main/_baseline"
BACKENDS = ("cpu", "nvidia", "ascend")
# (module, kernel): the forward, the GEMM examples, the backward kernels
KERNELS = (("xsync.kernels.flash_attn.kernel", "attention_fwd"),
           ("xsync.kernels.gemm", "gemm"),
           ("xsync.kernels.gemm", "gemm_persistent"),
           ("xsync.kernels.flash_attn.backward", "attention_bwd_preprocess"),
           ("xsync.kernels.flash_attn.backward", "attention_bwd_dkdv"),
           ("xsync.kernels.flash_attn.backward", "attention_bwd_dq"))


# ---------------------------------------------------------------- child (runs inside one tree)
def _own_kernels(tree: str) -> None:
    """Resolve ``xsync.kernels`` to ``tree``/kernels ahead of any other finder: an editable
    install of another checkout in the same environment would otherwise supply its kernels."""
    import importlib.abc
    import importlib.util

    folder = os.path.join(tree, "kernels")

    class TreeKernels(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            if fullname != "xsync.kernels":
                return None
            return importlib.util.spec_from_file_location(
                fullname, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])

    sys.meta_path.insert(0, TreeKernels())


def _tools():
    """(place, prepare extras) for the tree on sys.path: the pre-wave tree has no passes and
    its verifier derives the skeleton itself."""
    try:
        from xsync.backends import place
    except ImportError:
        from xsync.lowering.placement import place
    try:
        from xsync.lowering import passes
        from xsync.lowering.passes import PassLog
        from xsync.lowering.protocol import derive
    except ImportError:
        passes = PassLog = derive = None
    return place, passes, PassLog, derive


def _prepare(kern, backend, tools):
    """(verify arguments) for one specialization, as ``Kernel._lower`` builds them."""
    from xsync.lowering.frontend import parse_kernel

    place, passes, PassLog, derive = tools
    try:
        from xsync.backends import target_of
        backend = target_of(backend)
    except ImportError:
        pass
    cx, dt = kern.specialization()
    kernel = parse_kernel(kern.fn, cx, dt)
    placement = place(kernel, backend)
    if passes is None:
        return (kernel, placement)
    kernel = passes.run(kernel, placement, PassLog())
    return (kernel, placement, derive(kernel, placement))


def _scope(kern):
    """The kernel's own configuration defaults (``@xs.kernel(options=...)``), as ``lower``
    applies them; the pre-wave tree has none."""
    import contextlib

    try:
        from xsync import config
        return config.kernel_scope(kern.options)
    except (ImportError, AttributeError):
        return contextlib.nullcontext()


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def _child(runs: int, profile: str | None) -> None:
    import importlib
    import time

    from xsync.lowering.verify import verify

    tools = _tools()
    out = {}
    if profile:
        import cProfile
        import pstats

        name, backend = profile.split(":")
        module = next(m for m, k in KERNELS if k == name)
        kern = getattr(importlib.import_module(module), name)
        with _scope(kern):
            args = _prepare(kern, backend, tools)
            verify(*args)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(runs):
                verify(*args)
            prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(35)
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
        return
    for module, name in KERNELS:
        try:
            kern = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        for backend in BACKENDS:
            row = {}
            prep, ver, low = [], [], []
            with _scope(kern):
                args = _prepare(kern, backend, tools)
                t1 = time.perf_counter()
                report = verify(*args)
                row["first"] = time.perf_counter() - t1
                for _ in range(runs):
                    t0 = time.perf_counter()
                    args = _prepare(kern, backend, tools)
                    t1 = time.perf_counter()
                    verify(*args)
                    t2 = time.perf_counter()
                    prep.append(t1 - t0)
                    ver.append(t2 - t1)
            cx, dt = kern.specialization()
            kern.lower(backend, cx, dt, check=True)
            for _ in range(runs):
                t0 = time.perf_counter()
                kern.lower(backend, cx, dt, check=True)
                low.append(time.perf_counter() - t0)
            row.update(prepare=_median(prep), verify=_median(ver), lower=_median(low),
                       assignments=report.assignments, steps=report.states,
                       simulated=getattr(report, "simulated", None))
            out[f"{name}:{backend}"] = row
    import xsync.kernels
    assert os.path.dirname(xsync.kernels.__file__) == os.path.join(os.getcwd(), "kernels")
    json.dump(out, sys.stdout)


# ---------------------------------------------------------------- parent
def measure(tree: str, runs: int, profile: str | None = None):
    """Run the child in ``tree`` (its own process, its own sys.path)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XSYNC_")}
    env["PYTHONPATH"] = tree
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--runs", str(runs)] + (
        ["--profile", profile] if profile else [])
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"measuring {tree} failed:\n{done.stderr}")
    return done.stdout if profile else json.loads(done.stdout)


def _ms(x) -> str:
    return f"{'-':>8}" if x is None else f"{x * 1e3:8.1f}"


def table(now: dict, before: dict) -> str:
    head = (f"{'kernel:placement':34} {'verify':>8} {'before':>8} {'ratio':>6} | {'first':>8} "
            f"{'before':>8} | {'lower':>8} {'before':>8} | {'prep':>7} | {'assign':>6} {'sim':>4}")
    lines = [head, "-" * len(head)]
    for key, row in now.items():
        old = before.get(key, {})
        ratio = f"{row['verify'] / old['verify']:6.2f}" if old else "     -"
        lines.append(
            f"{key:34} {_ms(row['verify'])} {_ms(old.get('verify'))} {ratio} | {_ms(row['first'])} "
            f"{_ms(old.get('first'))} | {_ms(row['lower'])} {_ms(old.get('lower'))} | "
            f"{row['prepare'] * 1e3:7.1f} | {row['assignments']:6d} {row['simulated'] or 0:4d}")
    lines.append("milliseconds; verify/lower: median of runs after a warm-up; first: the first "
                 "verify in a fresh process; prep: parse + placement + passes (this tree)")
    return "\n".join(lines)


def _over_rounds(rounds: list[dict]) -> dict:
    """Per kernel and number, the median over the rounds (counts are the same in each)."""
    if not rounds:
        return {}
    out = {}
    for key, row in rounds[0].items():
        out[key] = {k: (_median([r[key][k] for r in rounds]) if isinstance(v, float) else v)
                    for k, v in row.items()}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", default=DEFAULT_BASELINE)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=1, help="alternate the two trees' processes R times")
    ap.add_argument("--json", help="write both trees' numbers here")
    ap.add_argument("--profile", help="KERNEL:BACKEND: cProfile of that verify call (this tree)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        # the tree under measurement comes from PYTHONPATH, not this script's folder
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in (HERE, ROOT)]
        sys.path.insert(0, os.getcwd())
        _own_kernels(os.getcwd())
        return _child(args.runs, args.profile)
    if args.profile:
        print(measure(ROOT, args.runs, args.profile))
        return
    has_baseline = os.path.isdir(args.baseline)
    nows, befores = [], []
    for _ in range(max(1, args.rounds)):
        nows.append(measure(ROOT, args.runs))
        if has_baseline:
            befores.append(measure(args.baseline, args.runs))
    now, before = _over_rounds(nows), _over_rounds(befores)
    print(table(now, before))
    if args.rounds > 1:
        print(f"each number: the median over {args.rounds} alternating rounds")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"now": now, "baseline": before}, f, indent=1)


if __name__ == "__main__":
    main()
