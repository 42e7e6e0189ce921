"""The attention grid of two source trees, alternated process by process, with per-point medians.

Two whole trees (library and kernel) cannot share one process: both are the package `xsync`.
A single run of each, one after the other, drifts on a shared GPU (the same kernel has
measured 115 and 185 TFLOP/s a minute apart). So this runs each tree's own
``benchmarks/attention.py`` grid in turn, ``--rounds`` times (this tree, then the other, and
again), and reports the median per grid point of xsync's TFLOP/s and of its ratio to cuDNN
(measured in the same process as each round's xsync figure):

    PYTHONPATH=. python3 benchmarks/tree_ab.py --other _baseline --rounds 3 --out DIR

The other tree is an older checkout (e.g. ``git worktree add ../base 00e8dd1``). Writes
tree_ab.json under --out: every round's rows and the medians.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _grid_run(tree: str, out: str, extra: list[str]) -> list[dict]:
    cmd = [sys.executable, "benchmarks/attention.py", "--out", out, "--no-varlen", *extra]
    env = dict(os.environ, PYTHONPATH=tree)
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "flash_attn.json")) as f:
        data = json.load(f)
    return data.get("grid") or data["rows"]


def _key(row) -> tuple:
    return row["d"], bool(row["causal"]), row["s"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", required=True, help="the other tree's root")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = parser.parse_args(argv)
    trees = {"this": (ROOT, ["--no-variants"]), "other": (os.path.abspath(args.other), [])}
    runs: dict[str, list] = {name: [] for name in trees}
    for r in range(args.rounds):
        for name, (tree, extra) in trees.items():
            out = os.path.join(args.out, f"tree_ab_{name}_{r}")
            runs[name].append(_grid_run(tree, out, extra))
            print(f"round {r}: {name} done", flush=True)
    medians = []
    for key in sorted({_key(row) for row in runs["this"][0]}):
        point = dict(d=key[0], causal=key[1], s=key[2])
        for name in trees:
            rows = [row for run in runs[name] for row in run if _key(row) == key]
            point[f"{name}_tflops"] = statistics.median(row["xsync_tflops"] for row in rows)
            point[f"{name}_ratio_vs_cudnn"] = statistics.median(row["ratio_vs_cudnn"] for row in rows)
            point[f"{name}_rounds"] = [round(row["xsync_tflops"], 1) for row in rows]
        point["change"] = point["this_tflops"] / point["other_tflops"] - 1
        point["ratio_change"] = point["this_ratio_vs_cudnn"] / point["other_ratio_vs_cudnn"] - 1
        medians.append(point)
        print(f"d={key[0]} causal={key[1]} s={key[2]}: this {point['this_tflops']:.0f} "
              f"({point['this_ratio_vs_cudnn']:.2f} cuDNN)  other {point['other_tflops']:.0f} "
              f"({point['other_ratio_vs_cudnn']:.2f})  {point['change']:+.1%}  ratio {point['ratio_change']:+.1%}",
              flush=True)
    os.makedirs(args.out, exist_ok=True)
    meta = dict(other=args.other, rounds=args.rounds, date=time.strftime("%Y-%m-%dT%H:%M:%S"))
    with open(os.path.join(args.out, "tree_ab.json"), "w") as f:
        json.dump(dict(meta=meta, medians=medians, runs=runs), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
