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
    from xsync.errors import LeftoverError, ProtocolError, StallError

    names = [n for n in dir(C) if n.startswith("cluster") and n != "cluster_gemm"
             and n != "cluster_multicast_offsets_depend_on_rank"]
    assert len(names) >= 4, names
    for name in names:
        kernel = getattr(C, name)
        try:
            kernel.lower("cpu")
            verdict, at = "ok", None
        except ProtocolError as err:
            verdict, at = "rejected", int(re.search(r"with n = (\d+)", str(err)).group(1))
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
