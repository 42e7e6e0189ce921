"""Host cost per call: wall microseconds of back-to-back calls (no sync in between, so a
launch path slower than the GPU shows as wall time), for xsync's attention and torch SDPA on
the same tiny problems, measured in alternating rounds (a shared host's slow spells hit both;
the ratios are medians of round-by-round ratios), plus each layer of xsync's path on its own
(where the time goes), the
GPU time per call from a replayed CUDA graph (the floor under any wall reading), and the
wall time with Triton's own launcher in place of the direct C launch.

    python benchmarks/host_path.py [--out DIR] [--profile]

Writes host_path.json (and, with --profile, a cProfile listing of the full xsync call).
Needs a CUDA GPU (Hopper for the xsync nvidia backend).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks._gpu import cuda_missing  # noqa: E402 - after the source tree is on sys.path

SHAPES = (dict(b=1, h=1, s=128, d=64), dict(b=1, h=32, s=1024, d=128))


def wall_us(fn, calls=300, rounds=5) -> float:
    """Median over rounds of (wall time of `calls` back-to-back calls + one sync) / calls."""
    import torch

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return _median(out)


def _median(xs: list) -> float:
    """The middle reading (the upper one of an even count)."""
    return sorted(xs)[len(xs) // 2]


def interleaved_wall_us(fns: dict, calls=200, rounds=15) -> tuple[dict, dict]:
    """Wall us per call of each of ``fns`` measured in alternating rounds (the order rotates
    every round), so a host that slows down for a while slows every contender alike.
    Returns ({name: median us}, {name: median over rounds of first's us / name's us}) where
    first is the first name: the ratio of two readings taken side by side, round by round."""
    import torch

    names = list(fns)
    for fn in fns.values():
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    readings = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            fn = fns[n]
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            readings[n].append((time.perf_counter() - t0) / calls * 1e6)

    first = names[0]
    ratios = {n: _median([a / b for a, b in zip(readings[first], readings[n])]) for n in names[1:]}
    return {n: _median(v) for n, v in readings.items()}, ratios


def gpu_us(fn) -> float:
    import triton.testing
    return triton.testing.do_bench(fn, warmup=10, rep=50) * 1e3


def graph_us(fn, calls=20, replays=10) -> float | None:
    """GPU microseconds per call with no host in the way: `calls` calls captured in one CUDA
    graph, replayed back to back (the floor a wall reading cannot go below); None where the
    call cannot be captured."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except RuntimeError:
        return None
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (calls * replays)


def triton_launcher_wall_us(fn) -> float:
    """Wall us of `fn` with prepared launches going through Triton's kernel.run instead of
    the C launcher directly (xsync/backends/nvidia/launcher.py): what the direct path saves."""
    from xsync.backends.nvidia import compiled as nvidia
    from xsync.kernels.flash_attn import ops

    saved = nvidia.DIRECT_LAUNCH
    nvidia.DIRECT_LAUNCH = False
    ops._PLANS.clear()
    try:
        return wall_us(fn)
    finally:
        nvidia.DIRECT_LAUNCH = saved
        ops._PLANS.clear()


def layers(shape):
    """name -> zero-argument callable, from the public op down to Triton's launch."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from xsync.kernels.flash_attn import attention, ops

    b, h, s, d = shape["b"], shape["h"], shape["s"], shape["d"]
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = {}
    for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        def sdpa(backend=backend):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v)
        try:
            sdpa()
            out[name] = sdpa
        except RuntimeError:
            pass
    out["sdpa_default"] = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)
    out["xsync_attention"] = lambda: attention(q, k, v)
    out["xsync_torch_op"] = lambda: torch.ops.xsync.attention(q, k, v, False, d ** -0.5)
    out["xsync_impl"] = lambda: ops.attention_impl(q, k, v, False, d ** -0.5)
    # below the op: the kernel launch as ops._run makes it, the compiled kernel's launch, the
    # host arguments (TMA descriptors) alone, and Triton's JIT launch with prepared arguments
    from xsync.kernels.flash_attn.kernel import attention_fwd

    o = torch.empty_like(q)
    lse = torch.empty(b * h, s, device="cuda", dtype=torch.float32)
    cu_q, cu_k = ops._dense_offsets(b, s, s, q.device)
    plan = ops.launched_schedule("nvidia", d, False, s)     # what ops launches for this shape
    grid, compiled, kargs, constexprs = ops.launch(
        attention_fwd, q.view(-1, d), k.view(-1, d), v.view(-1, d), o.view(-1, d), lse, cu_q, cu_k,
        s, b, h, h, d, False, d ** -0.5, (h, s, 0, h, s, 0, h, 0), "nvidia", plan)
    kw = dict(constexprs, backend="nvidia")
    out["xsync_kernel_launch"] = lambda: attention_fwd[grid](*kargs, **kw)
    run_args, _, _ = attention_fwd.bind(kargs, {k: v for k, v in kw.items() if k != "backend"})
    out["xsync_compiled_launch"] = lambda: compiled.launch(grid, run_args)
    out["xsync_host_args"] = lambda: compiled.host_args(run_args)
    argv, opts = compiled.host_args(run_args), compiled.launch_options()
    grid3 = tuple(grid) + (1, 1)
    out["triton_jit_launch"] = lambda: compiled.jit_fn[grid3](*argv, **opts)
    return out


def profile(fn, path):
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        fn()
    prof.disable()
    with open(path, "w") as f:
        pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(45)


def measure(profile_dir: str | None = None) -> list[dict]:
    """One row per shape: wall us of every layer, GPU us of xsync and cuDNN, and xsync's wall
    ratio to each SDPA call; with `profile_dir`, a cProfile listing of the full xsync call."""
    rows = []
    for shape in SHAPES:
        fns = layers(shape)
        row = dict(shape)
        # the public call and the SDPA calls side by side, round by round (their ratios); the
        # layers below the public call one after another (where the time goes)
        side_by_side = ["xsync_attention"] + [n for n in ("sdpa_default", "sdpa_cudnn", "sdpa_flash") if n in fns]
        walls, ratios = interleaved_wall_us({n: fns[n] for n in side_by_side})
        for name, fn in fns.items():
            row[f"{name}_wall_us"] = round(walls[name] if name in walls else wall_us(fn), 1)
        row["xsync_attention_via_triton_launcher_wall_us"] = round(triton_launcher_wall_us(fns["xsync_attention"]), 1)
        for name in ("xsync_attention", "sdpa_default"):
            graph = graph_us(fns[name])
            row[f"{name}_graph_gpu_us"] = None if graph is None else round(graph, 1)
        row["xsync_gpu_us"] = round(gpu_us(fns["xsync_attention"]), 1)
        row["sdpa_cudnn_gpu_us"] = round(gpu_us(fns["sdpa_cudnn"]), 1) if "sdpa_cudnn" in fns else None
        for ref, ratio in ratios.items():
            row[f"ratio_vs_{ref}"] = round(ratio, 2)
        rows.append(row)
        print(row, flush=True)
        if profile_dir:
            tag = f"b{shape['b']}h{shape['h']}s{shape['s']}d{shape['d']}"
            profile(fns["xsync_attention"], os.path.join(profile_dir, f"host_profile_{tag}.txt"))
    return rows


def main(argv=None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    if cuda_missing(__file__):
        return 2
    os.makedirs(args.out, exist_ok=True)
    rows = measure(args.out if args.profile else None)
    with open(os.path.join(args.out, "host_path.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
