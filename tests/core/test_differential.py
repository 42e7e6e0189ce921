"""The differential test: seeded random protocols (tests/core/protogen.py), the verifier's
verdict against CPU-emulator runs over many trip counts. CI runs seeds 0..1999 on up to
two processes; a longer run is one command:

    .venv/core/bin/python -m tests.core.protogen --seeds 0:20000
"""
import os
from concurrent.futures import ProcessPoolExecutor

from tests.core import protogen

SEEDS = range(0, 2000)


def _chunk(seeds):
    outcomes = protogen.run(seeds)
    bad = [(o.name, o.disagreement) for o in outcomes if o.disagreement]
    verdicts = {}
    for o in outcomes:
        v = o.verdicts.get("cpu")
        verdicts[v] = verdicts.get(v, 0) + 1
    return len(outcomes), verdicts, bad


def test_verifier_agrees_with_the_emulator_on_generated_protocols():
    workers = max(1, min(2, os.cpu_count() or 1))
    seeds = list(SEEDS)
    chunks = [seeds[k::workers] for k in range(workers)]
    if workers == 1:
        results = [_chunk(chunks[0])]
    else:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(_chunk, chunks))
    total = sum(r[0] for r in results)
    verdicts: dict = {}
    for _, v, _ in results:
        for k, n in v.items():
            verdicts[k] = verdicts.get(k, 0) + n
    bad = [b for r in results for b in r[2]]
    assert total >= 2000, total
    # the generator must produce both kinds: protocols that verify and ones that do not
    assert verdicts.get("ok", 0) > total // 2 and sum(n for k, n in verdicts.items() if k != "ok") > total // 10, verdicts
    assert not bad, "\n\n".join(f"{name}:\n{protogen.generate(int(name[4:])).source}\n{why}" for name, why in bad[:3])


def test_generated_kernels_are_real_sources():
    p = protogen.generate(7)
    assert p.source.startswith("import xsync as xs") and "@xs.kernel" in p.source
    assert protogen.generate(7).source == p.source          # seeded: the same every run


def test_small_protocols_cross_check_every_interleaving():
    """For small runs, a breadth-first search over every interleaving ends in the one state
    the greedy run reaches (the confluence the verifier relies on)."""
    import tempfile
    import sys

    from xsync.lowering.frontend import parse_kernel
    from xsync.backends import place
    from xsync.lowering.verify import verify
    from xsync.errors import XSyncError

    d = tempfile.mkdtemp(prefix="xsync-protos-")
    sys.path.insert(0, d)
    protos = [protogen.generate(s) for s in range(0, 60)]
    module = protogen.load(protos, d)
    checked = searched = 0
    for p in protos:
        kernel = getattr(module, p.name)
        for backend in ("cpu", "nvidia", "ascend"):
            kir = parse_kernel(kernel.fn, {}, {})
            try:
                report = verify(kir, place(kir, backend), exhaustive=True)
            except XSyncError:
                continue
            checked += 1
            searched += report.cross_checked
    assert checked > 60 and searched > 300, (checked, searched)


def test_cluster_verdicts_agree_with_the_emulator():
    """The corpus's cluster kernels (xs.cluster with a multicast pipe): the CPU verdict against
    the emulator running whole clusters, 1 and 2 clusters, every n up to 8: a proven kernel runs
    clean everywhere, a rejected one stalls or leaves something over at its counterexample's n."""
    import re

    import torch

    import xsync as xs
    from tests.core import corpus as C
    from xsync.errors import KernelSourceError, LeftoverError, ProtocolError, StallError

    import inspect

    # the copy pipelines (x, y, n): the GEMM-shaped ones are run by test_corpus
    names = [n for n in dir(C) if n.startswith("cluster")
             and list(inspect.signature(getattr(C, n).fn).parameters)[:3] == ["x", "y", "n"]]
    assert len(names) >= 4, names
    for name in names:
        kernel = getattr(C, name)
        try:
            kernel.lower("cpu")
            verdict, at = "ok", None
        except ProtocolError as err:
            verdict, at = "rejected", int(re.search(r"with n = (\d+)", str(err)).group(1))
        except KernelSourceError:
            continue      # refused by the frontend: nothing runs (test_corpus checks the message)
        size = kernel.lower("cpu", check=False).kernel.cluster
        failed = set()
        for n in range(0, 9):
            for clusters in (1, 2):
                programs = clusters * size
                x, y = torch.randn((n + 8) * 16, 16), torch.zeros(programs * (n + 1) * 16 + 64, 16)
                try:
                    with xs.options(verify=False, cpu_mode="cooperative"):
                        kernel[(programs,)](x, y, n, BLOCK=16, STAGES=2, backend="cpu")
                except (StallError, LeftoverError):
                    failed.add(n)
        if verdict == "ok":
            assert not failed, f"{name} is proven but the emulator fails at n in {sorted(failed)}"
        else:
            assert at in failed, f"{name} is rejected at n = {at}, which the emulator runs clean ({sorted(failed)})"


_CLUSTER_TEMPLATE = '''
import xsync as xs


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=16, STAGES=2))
def {name}(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr):
    xs.cluster({size})
    load = xs.role("load", kind="copy")
    work = xs.role("work", kind="vector")
    ring = xs.pipe(load, work, stages={stages}, t=xs.tile([BLOCK, BLOCK], xs.float32, multicast=True))
    mine = xs.pipe(load, work, stages={stages}, t=xs.tile([BLOCK, BLOCK], xs.float32))
    first = xs.cluster_id() * {size}
    row = first + xs.cluster_rank()
    for j in range({ring_trips}):
        with load:
            if {commit}:
                s = ring.acquire()
                s.t = xs.load(x, [xs.cluster_id() * BLOCK, 0], [BLOCK, BLOCK])
                ring.commit()
        with work:
            if {wait}:
                got = ring.wait()
                xs.store(y, [xs.program_id(0) * BLOCK, 0], got.t)
                if {release}:
                    ring.release()
    for j in range(n + xs.cluster_rank()):
        with load:
            o = mine.acquire()
            o.t = xs.load(x, [xs.cluster_rank() * BLOCK, 0], [BLOCK, BLOCK])
            mine.commit()
        with work:
            got = mine.wait()
            xs.store(y, [xs.program_id(0) * BLOCK, 0], got.t)
            mine.release()
'''

# mutation -> (template fields, whether the cluster is consistent); the per-program pipe 'mine'
# always runs n + rank steps in both roles (per program: fine)
_CLUSTER_MUTATIONS = {
    "none": ({}, True),
    "release_rank0_only": (dict(release="xs.cluster_rank() == 0"), False),
    "release_skipped_late": (dict(release="xs.cluster_rank() != 1 or j != 4"), False),
    "trips_by_rank": (dict(ring_trips="n + xs.cluster_rank() // 1 % 2"), False),
    "one_program_skips_a_slot": (dict(commit="xs.cluster_rank() != 1 or j != 2",
                                      wait="xs.cluster_rank() != 1 or j != 2"), False),
    "one_cluster_skips_a_slot": (dict(commit="xs.cluster_id() != 1 or j != 2",
                                      wait="xs.cluster_id() != 1 or j != 2"), True),
    "trips_by_cluster": (dict(ring_trips="n + xs.cluster_id()"), True),
    # a named value read by conditions: the program's row (differs inside the cluster), the
    # cluster's first row (the same for all its programs)
    "named_rank_guard": (dict(commit="row != n", wait="row != n"), False),
    "named_cluster_guard": (dict(commit="first != n", wait="first != n"), True),
}


def test_generated_cluster_protocols_agree_with_the_emulator():
    """Cluster kernels with a multicast pipe and a per-program pipe, mutated on the program's
    rank (hangs the cluster) or on the cluster id (consistent inside each cluster): the CPU
    verdict against the emulator over n = 0..8 and 1..3 clusters, and each counterexample
    (its n, cluster id and cluster count) replayed."""
    import importlib
    import re
    import sys
    import tempfile

    import torch

    import xsync as xs
    from xsync.errors import LeftoverError, ProtocolError, StallError

    d = tempfile.mkdtemp(prefix="xsync-clusters-")
    sources, cases = [], []
    for size in (2, 4):
        for stages in (1, 2):
            for mutation, (fields, ok) in _CLUSTER_MUTATIONS.items():
                name = f"cl{size}_s{stages}_{mutation}"
                values = {**dict(name=name, size=size, stages=stages, ring_trips="n", commit="True",
                                 wait="True", release="True"), **fields}
                sources.append(_CLUSTER_TEMPLATE.format(**values))
                cases.append((name, size, ok))
    with open(f"{d}/xsync_cluster_protos.py", "w") as f:
        f.write("\n".join(sources))
    sys.path.insert(0, d)
    module = importlib.import_module("xsync_cluster_protos")

    def fails(kernel, n, programs) -> bool:
        x, y = torch.randn(64 * 16, 16), torch.zeros((programs + 1) * 16, 16)
        try:
            with xs.options(verify=False, cpu_mode="cooperative"):
                kernel[(programs,)](x, y, n, BLOCK=16, STAGES=2, backend="cpu")
        except (StallError, LeftoverError):
            return True
        return False

    for name, size, ok in cases:
        kernel = getattr(module, name)
        try:
            kernel.lower("cpu")
            err = None
        except ProtocolError as e:
            err = e
        assert (err is None) == ok, f"{name}: expected {'proven' if ok else 'rejected'}:\n{err}"
        failed = {(n, c) for n in range(9) for c in (1, 2, 3) if fails(kernel, n, c * size)}
        if ok:
            assert not failed, f"{name} is proven, but the emulator fails at (n, clusters) {sorted(failed)}"
            continue
        assert "(program " in str(err) and "pipe 'ring' is multicast" in str(err), str(err)
        seen = dict((k, int(v)) for k, v in re.findall(r"([\w.()]+) = (-?\d+)", str(err).split("\n")[2]))
        clusters = max(seen.get("xs.num_clusters()", 1), seen.get("xs.cluster_id()", 0) + 1)
        assert fails(kernel, seen["n"], clusters * size), f"{name}: its counterexample runs clean:\n{err}"
