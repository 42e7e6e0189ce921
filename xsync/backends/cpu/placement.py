"""CPU emulator placement: every role (and replica) is its own thread.

Target: events and pipes are counting semaphores and barriers are counts over the member
threads, so no counter can overflow or alias; ``arrive()`` does not wait. No schedule
passes: the emulator runs the protocol as written.
"""
from xsync.backends.cpu import alloc
from xsync.lowering.placement import Agent, Placed, Target, Unit, not_applicable

TARGET = Target("cpu", event="a counting semaphore", barrier="a barrier over the member threads",
                allocate=alloc.allocate,
                # torch adds under a lock; deterministic: queued, applied at the program's end
                reduce_add_dtypes=("float32", "float16", "bfloat16", "int32"),
                reduce_add="a torch add under a lock", reduce_add_deterministic=True,
                multicast_missing="threads share no copy engine; the programs of a cluster run "
                                  "together and wait for each other's releases")


def place(kernel):
    agents = tuple(Agent(r.name, (r.name,), r.replicas, "thread", Unit.THREAD) for r in kernel.roles)
    return Placed(agents, not_applicable(kernel, "cpu", "every role replica is a thread of its own"))
