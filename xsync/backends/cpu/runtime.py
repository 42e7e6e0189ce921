"""CPU emulator runtime: exact sync semantics, torch tile ops, stall watchdog, leftover check.

Every agent instance of a program runs the agent function the CPU renderer generated. The
sync objects are built from the protocol's skeleton (``xsync.lowering.protocol``): each
pipe and event is a set of channels (1 -> N broadcast, N -> N paired, N -> 1 gather),
each barrier a count over its member instances -- the same objects the verifier reasons
about, never re-derived here. The programs of a cluster that share a multicast pipe
(``xs.cluster`` with ``xs.tile(..., multicast=True)``) run together, as the instances of the
cluster's skeleton (``xsync.lowering.cluster_protocol``): each program's producer fills its own
copy of a multicast slot, which is free (full) only once every program released (committed) it.

Two schedulers run the same semantics (``XSYNC_CPU_MODE``):

* ``threads`` (default): one thread per agent instance. All sync objects of a program
  share one condition variable, so the runtime always knows who waits on what: when every
  live agent is blocked, no signal can ever arrive, and the watchdog raises a StallError
  that names each agent, the object it waits on, the kernel line and the loop iteration --
  within milliseconds, instead of hanging.
* ``cooperative``: the agent functions are generators (``yield from ag.wait(...)``) run
  by one deterministic round-robin scheduler in the calling thread: no threads, no locks,
  the same StallError when a full round makes no progress. Protocols without heavy tile
  work run about 20x faster this way (the differential test of the verifier uses it).

Whatever the scheduler, the emulator reports what the verifier would: a commit or release
without its slot (:class:`SlotOrderError`, at the call), and at program end any slot or
signal left unconsumed or barrier meeting left incomplete (:class:`LeftoverError`), with
role, object, line and loop iteration.

``with record() as trace:`` turns on an event recorder for launches from this thread
(threads scheduler): each agent instance logs its sync ops (with the time spent blocked and
what it waited on) and the work spans between them, and every wait/acquire/barrier sync is
paired with the commit/signal/release/arrival that let it through (``xsync trace`` draws
this). Without an active recorder the launcher builds the plain Agent and Monitor: no
per-op cost.

The jobs live in their own modules: ``channels`` (sync objects, monitor, stall and leftover
errors), ``agents`` (the verbs agent code calls), ``schedulers`` (threads, cooperative),
``tile_ops`` (torch) and ``recording`` (the event recorder); this module is the one name the
generated source imports (``from xsync.backends.cpu import runtime as rt``).
"""
from __future__ import annotations

# The generated agent code calls these names as ``rt.<name>``; the launcher, ``xsync trace``
# and the tests use the rest.
from xsync.backends.cpu.agents import Agent, CoopAgent  # noqa: F401
from xsync.backends.cpu.channels import (  # noqa: F401
    BarrierRT, EventChannel, Monitor, PipeChannel, Program)
from xsync.backends.cpu.recording import Op, ProgramTrace, SyncObjectInfo, Trace, record  # noqa: F401
from xsync.backends.cpu.schedulers import CoopScheduler, run_grid  # noqa: F401
from xsync.backends.cpu.tile_ops import (  # noqa: F401
    TORCH_DTYPES, abs_, arange, cdiv, erf, exp, exp2, full, load, load_scalar, log, log2, maximum,
    minimum, pow_, reduce_max, reduce_sum, rsqrt, sigmoid, sqrt, store, store_add, tanh, trans, where,
    zeros)
