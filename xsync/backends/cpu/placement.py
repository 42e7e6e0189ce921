"""CPU emulator placement: every role (and replica) is its own thread.

Target: events and pipes are counting semaphores and barriers are counts over the member
threads, so no counter can overflow or alias; ``arrive()`` does not wait.
"""
from xsync.lowering.placement import Agent, Target

TARGET = Target("cpu", event="a counting semaphore", barrier="a barrier over the member threads")


def place(kernel):
    return [Agent(r.name, (r.name,), r.replicas, "thread", unit="thread") for r in kernel.roles]
