"""CPU emulator allocation: a thread per agent replica, counting semaphores and slot buffers
per pipe and event, a barrier over the member threads. Nothing to budget: the rows are for
``xsync check``; the runtime reads the skeleton itself."""
from __future__ import annotations

from xsync.lowering import holding
from xsync.lowering.alloc import Allocation, Row


def allocate(kernel, placement, skel, options=None) -> Allocation:
    rows = []
    for a in placement.agents:
        rows.append(Row(a.name, "thread(s)", f"{a.replicas} x {a.hardware}", f"roles: {', '.join(a.roles)}"))
    held = holding.most_held(kernel)
    for link in skel.links:
        rings = f"{link.rings} rings x " if link.rings > 1 else ""
        if link.kind == "pipe" and link.interleave > 1:
            rows.append(Row(link.obj, "pipe", f"1 ring of {link.stages} slot(s) shared by {link.rings} "
                            f"pairs ({link.capacity} each), 2 counting semaphores per pair",
                            f"pair r: slot r + {link.interleave} * (i % {link.capacity}); {link.pairing}"))
        elif link.kind == "pipe":
            rows.append(Row(link.obj, "pipe", f"{rings}{link.stages} slot(s), 2 counting semaphores",
                            f"slot = i % stages; {link.pairing}"))
        if link.kind == "pipe":
            row = holding.counter_row(kernel, link, "acquired, committed (producer); waited, released "
                                      "(per consumer)", held)
            rows += [row] if row else []
        else:
            rows.append(Row(link.obj, "event", f"{rings}counting semaphore",
                            f"k-th wait after k-th signal; {link.pairing}"))
    for b in skel.barriers:
        rows.append(Row(b.obj, "barrier", f"barrier over {b.arrivals} thread(s)",
                        f"members: {', '.join(b.member_roles)}"))
    return Allocation("cpu", tuple(rows))
