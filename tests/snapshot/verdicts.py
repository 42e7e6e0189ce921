"""Snapshot of the verifier's verdicts and reports: every corpus kernel (tests/core/corpus.py)
and every library kernel at its example specialization, on every lowering target, as
``xsync check`` reports it (the report's summary, or the error's class and message).

    python -m tests.snapshot.verdicts            # compare with tests/snapshot/verdicts.json
    python -m tests.snapshot.verdicts --write    # record it
    python -m tests.snapshot.verdicts --show N   # print the recorded text of one case

Unlike the render snapshot this stores the text itself (short), so a difference can be read.
A refactor of the verifier must leave every entry unchanged.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from tests.snapshot.render import _example_cases, _library, portable

GOLDEN = os.path.join(os.path.dirname(__file__), "verdicts.json")
TARGETS = ("cpu", "nvidia", "ascend")


def kernels() -> list[tuple[str, object]]:
    from tests.core import corpus
    from xsync.compiler import Kernel

    examples, gvars, avariants = _library()
    out = [(f"example-{k.fn.__name__}", k) for k in examples]
    out += [(f"example-{n}", k) for n, k in gvars]
    out += [(f"variant-{n}", k) for n, k in avariants]
    out += [(c.name, c.kernel) for c in _example_cases() if not c.name.startswith("ex-gemm_bias_act-act")]
    out.append(("ex-gemm_bias_act", _example_cases()[0].kernel))
    out += [(f"corpus-{n}", k) for n, k in sorted(vars(corpus).items()) if isinstance(k, Kernel)]
    return out


def _text(text: str) -> str:
    """The text with the checkout's path left out (a clone elsewhere records the same)."""
    return portable(text)


def verdict(kernel, target: str) -> str:
    from xsync.errors import XSyncError

    try:
        lowered = kernel.lower(target, check=True)
    except XSyncError as exc:
        return _text(f"{type(exc).__name__}: {exc}")
    return _text(lowered.report.summary())


def snapshot() -> dict[str, str]:
    return {f"{name}@{t}": verdict(k, t) for name, k in kernels() for t in TARGETS}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--show")
    a = ap.parse_args(argv)
    if a.show:
        with open(GOLDEN) as f:
            print(json.load(f)[a.show])
        return 0
    got = snapshot()
    if a.write:
        with open(GOLDEN, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {len(got)} verdicts to {GOLDEN}")
        return 0
    with open(GOLDEN) as f:
        golden = json.load(f)
    diff = [n for n in sorted(set(got) | set(golden)) if got.get(n) != golden.get(n)]
    print(f"{len(got)} verdicts, {len(golden)} golden, {len(diff)} differences")
    for n in diff:
        print(f"== {n}\n-- golden:\n{golden.get(n)}\n-- now:\n{got.get(n)}")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
