"""The synchronization structure of a kernel's hot loops, read from its PTX.

A hot loop is an innermost loop (a label and a later branch back to it) that issues a
wgmma. Its structure is the sequence of wgmma issues (by shape), wgmma fences, commits and
group waits (by pending count), mbarrier operations and named-barrier operations, in
program order -- what decides how the tensor core overlaps the rest. Registers,
predicates and debug lines are left out: two sources that compute a predicate differently
(a held-slot flag or the loop counter) have the same structure.
"""
from __future__ import annotations

import re

LABEL = re.compile(r"^(\$L__BB\d+_\d+):")
BACK_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+);")
OPS = (
    (re.compile(r"\bwgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)"), lambda m: f"wgmma {m.group(1)}"),
    (re.compile(r"\bwgmma\.wait_group\.sync\.aligned\s+(\d+)"), lambda m: f"wait_group {m.group(1)}"),
    (re.compile(r"\bwgmma\.fence\.sync\.aligned"), lambda m: "fence"),
    (re.compile(r"\bwgmma\.commit_group\.sync\.aligned"), lambda m: "commit_group"),
    (re.compile(r"\bmbarrier\.(try_wait\.parity|arrive\.expect_tx|arrive|expect_tx|init)"),
     lambda m: f"mbarrier.{m.group(1)}"),
    (re.compile(r"\b(bar|barrier)\.(sync|arrive)"), lambda m: f"bar.{m.group(2)}"),
)


def _loops(lines):
    """(first, last) line indices of every loop: a label and a later branch back to it."""
    where = {}
    out = []
    for i, line in enumerate(lines):
        m = LABEL.match(line.strip())
        if m:
            where[m.group(1)] = i
        b = BACK_BRANCH.search(line)
        if b and b.group(1) in where and where[b.group(1)] < i:
            out.append((where[b.group(1)], i))
    return out


def structure(lines) -> tuple[str, ...]:
    out = []
    for line in lines:
        code = line.split("//")[0]
        for pattern, name in OPS:
            m = pattern.search(code)
            if m:
                out.append(name(m))
                break
    return tuple(out)


def hot_loops(ptx: str) -> list[tuple[str, ...]]:
    """The structure of every innermost loop that issues a wgmma, in PTX order."""
    lines = ptx.splitlines()
    loops = [(a, b) for a, b in _loops(lines)
             if any("wgmma.mma_async" in l for l in lines[a:b + 1])]
    inner = [(a, b) for a, b in loops
             if not any((a, b) != (c, d) and a <= c and d <= b for c, d in loops)]
    return [structure(lines[a:b + 1]) for a, b in sorted(inner)]
