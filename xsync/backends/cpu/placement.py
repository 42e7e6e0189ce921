"""CPU emulator placement: every role (and replica) is its own thread."""
from xsync.lowering.placement import Agent


def place(kernel):
    return [Agent(r.name, (r.name,), r.replicas, "thread") for r in kernel.roles]
