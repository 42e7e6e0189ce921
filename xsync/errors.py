"""Errors are part of the API.

Every error xsync raises names where it happened in the user's kernel (file:line),
which role / pipe / event / barrier is involved, and how to fix it. The message is
assembled from those parts so that every raise site supplies them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLoc:
    """A position in the user's kernel source."""

    file: str
    line: int
    function: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        return f"{where} (in {self.function})" if self.function else where


class XSyncError(Exception):
    """Base class: `what` went wrong at `loc`, involving `objects`; `fix` says how to mend it."""

    def __init__(self, what: str, *, loc: SourceLoc | None = None, objects: tuple[str, ...] = (),
                 fix: str = "", details: str = ""):
        self.what = what
        self.loc = loc
        self.objects = tuple(objects)
        self.fix = fix
        self.details = details
        super().__init__(self._format())

    def _format(self) -> str:
        head = f"{self.loc}: {self.what}" if self.loc else self.what
        parts = [head]
        if self.objects:
            parts.append("  involves: " + ", ".join(self.objects))
        if self.details:
            parts.append("\n".join("  " + line for line in self.details.rstrip().splitlines()))
        if self.fix:
            parts.append("  fix: " + self.fix)
        return "\n".join(parts)


class KernelSourceError(XSyncError):
    """The kernel source uses the xsync vocabulary wrongly (found by the frontend)."""


class ProtocolError(XSyncError):
    """The synchronization protocol is wrong (found by the verifier before compilation)."""


class DeadlockError(ProtocolError):
    """Some interleaving of the agents reaches a state where nobody can move."""


class LeftoverError(ProtocolError):
    """The protocol ends with synchronization nobody consumed: a committed slot never waited,
    a waited slot never released, a signal never waited, a barrier meeting left incomplete
    (the next tile or launch would see it). Raised by the verifier and the CPU emulator."""


class SlotOrderError(ProtocolError):
    """A commit without a slot from acquire, or a release without a slot from wait (verifier
    and CPU emulator)."""


class CounterLimitError(ProtocolError):
    """A signaller runs further ahead of its waiter than the hardware counter can tell."""


class PhaseAliasingError(CounterLimitError):
    """Hopper: an mbarrier (or named barrier) two phases ahead of a waiter; a parity wait
    cannot tell phase k from phase k + 2."""


class FlagOverflowError(CounterLimitError):
    """Ascend: more sets pending on one cross-core flag than it counts (15)."""


class VerifierLimitError(XSyncError):
    """The verifier cannot prove the protocol for every trip count and scalar value: the values
    are too many to cover within its budget, or it checked them only up to bounds (``report``:
    the bounded verdict, whose ``unproven`` items say what was not covered). Nothing is
    accepted unchecked; a bounded verdict only with ``accept_bounded=True``."""

    def __init__(self, what: str, *, report=None, **parts):
        super().__init__(what, **parts)
        self.report = report


class AllocationError(XSyncError):
    """A hardware budget (event IDs, named barriers, shared memory) is exceeded."""


class BackendError(XSyncError):
    """The requested backend is unknown or cannot run on this machine."""


class StallError(XSyncError):
    """At run time every live agent waits and none can proceed (CPU emulator / GPU debug mode)."""


class SimulationError(XSyncError):
    """At run time a simulated or emulated protocol broke a hardware rule: a flag overflowed,
    synchronization was left pending at the end, or a core ran an op it does not own."""


class LaunchError(XSyncError):
    """The kernel was launched with arguments that do not fit its signature."""


class UnsupportedError(XSyncError, NotImplementedError):
    """A valid request that xsync does not implement (a ``torch.func`` transform or forward-mode
    AD through a library op, double backward): refused, never answered wrongly."""


class DistributedError(XSyncError):
    """A distributed op (xsync.distributed) cannot run across its process group: the ranks'
    inputs disagree, a rank refused its own input, or an exchange with a peer failed or timed
    out (a rank died or stopped calling). Raised on every rank that reaches the failure."""


class CacheWarning(UserWarning):
    """The cache folder (``XSYNC_CACHE_DIR``) cannot be written; xsync uses a fallback."""
