"""The portable vocabulary.

A kernel is an ordinary Python function decorated with :func:`kernel`. Its body reads
like one sequential program; statements inside ``with <role>:`` blocks belong to that
role, everything else (index arithmetic, loop bounds) is replicated into every agent.
xsync never executes the body as Python: the frontend reads its source, builds the
protocol IR, verifies it and hands it to one renderer per backend.

Declarations (top of the kernel body)::

    load = xs.role("load", kind="copy")               # data movement
    mma = xs.role("mma", kind="matrix")               # matrix core work
    soft = xs.role("softmax", kind="vector", replicas=2)
    tiles = xs.pipe(load, mma, stages=3,              # ring of 3 slots
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    done = xs.event(mma, soft)                         # counting signal
    team = xs.barrier(soft)                            # all replicas of `soft` meet
    everyone = xs.barrier()                            # every role of the kernel meets

Pipe verbs (CuTeDSL style)::

    producer:  slot = tiles.acquire()   # wait for a free slot
               slot.a = xs.load(a, [m, k], [BM, BK])
               tiles.commit()           # hand the slot to the consumer
    consumer:  slot = tiles.wait()      # wait for a full slot
               acc = xs.mma(slot.a, slot.b, acc)
               tiles.release()          # give the slot back

    slot i lives in ring position i % stages; the k-th wait returns the k-th commit;
    acquire blocks while `stages` slots are committed-or-held and not yet released.
    Waits and releases are counted apart (split counters): a consumer may wait for the next
    slot before releasing the one it holds; the k-th release frees the k-th slot waited
    (``release()`` the oldest held, ``release(slot)`` names it and must be that one).

    acquire -> [producer writes] -> commit -> wait -> [consumer reads] -> release
       ^                                                                  |
       +---------------------------- empty slot --------------------------+

Event verbs: ``xs.signal(ev)`` in the source role, ``xs.wait(ev)`` in the destination
role; the k-th wait returns after the k-th signal. Replicas: 1 -> N broadcasts, N -> N pairs
replica i with replica i, N -> 1 waits for every source. Barrier verb: ``team.sync()``
(every member waits) or ``team.arrive()`` (a member that only announces itself; on Ascend,
which has no arrive-only barrier, it waits like sync). Member roles placed on one agent, and
replicas one agent runs in sequence, meet once per meeting: their k-th calls in the same
loop are one meeting, performed at the last of them.

The user never writes a phase, a parity, an event ID, a barrier ID or an arrive
count: xsync derives them (``python -m xsync check module:kernel`` prints them).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect

from xsync.dtypes import DTYPES, DType, bfloat16, constexpr, float16, float32, int1, int32  # noqa: F401

ROLE_KINDS = ("copy", "matrix", "vector")
ROLE_PLACEMENTS = ("auto", "own", "merged")   # "auto" (= unset): the backend decides


def _outside(name: str):
    raise RuntimeError(
        f"xsync.{name}() only has meaning inside an @xsync.kernel body; the kernel is "
        f"compiled from its source, never called as plain Python. Launch it with "
        f"kernel[grid](*args).")


@dataclasses.dataclass(frozen=True)
class TileOpSignature:
    """What a call of a tile op may pass; the frontend checks calls against it."""
    min_args: int
    max_args: int
    params: tuple[str, ...]      # the positional parameters' names, in order (also passable by name)
    keywords: tuple[str, ...]    # keyword-only options


# name -> its signature; renderers must render every entry.
TILE_OPS: dict[str, TileOpSignature] = {}
SYNC_DECLS = ("role", "pipe", "event", "barrier")
CLUSTER_SIZES = (1, 2, 4, 8)   # programs a cluster may hold (Hopper's portable cluster sizes)


def _tile_op(min_args: int, max_args: int, keywords: tuple[str, ...] = ()):
    def wrap(fn):
        params = tuple(p.name for p in inspect.signature(fn).parameters.values()
                       if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))[:max_args]
        TILE_OPS[fn.__name__] = TileOpSignature(min_args, max_args, params, keywords)

        @functools.wraps(fn)
        def marker(*args, **kwargs):
            _outside(fn.__name__)
        return marker
    return wrap


def num_replicas(role):
    """How many replicas ``role`` is declared with, folded to that number where it is written
    (``xs.num_replicas(mma) * BM`` is a tile's rows): a constexpr that only sets ``replicas=``
    is then named nowhere in the generated code."""
    _outside("num_replicas")


# ---------------------------------------------------------------- declarations
def role(name: str, kind: str = "vector", replicas: int = 1, placement: str | None = None):
    """Declare a role: code executed by one agent (``replicas`` identical agents).

    kind: "copy" (data movement: TMA producer warp / cube MTE), "matrix" (mma work:
    wgmma warpgroup / cube core) or "vector" (elementwise work: warpgroup / vector cores).
    placement (vector roles only): "own" -- consumer warpgroup(s) of its own on Hopper, so it
    runs beside the matrix role (an epilogue overlaps the next tile's main loop); "merged" --
    share the warpgroup of the matrix role with its replica count (hand-offs in registers).
    Unset or "auto", Hopper decides (docs/tutorial.md §13); Ascend and the CPU emulator always give a
    vector role its own agents and report the request as not applicable.
    """
    _outside("role")


def pipe(src, dst, stages: int, **payload):
    """Declare a ring of ``stages`` slots from role ``src`` to role ``dst``.

    Payload fields are tiles: ``a=xs.tile([BM, BK], a.dtype)``. Every replica of
    ``dst`` receives every slot (broadcast); a slot is free once all replicas released it.
    ``interleave=N`` (an N -> N pipe, N replicas of both roles; ``stages`` a multiple of N):
    the N replica pairs share one ring of ``stages`` slots with stride N, pair r using slots
    r, r + N, ... (``stages // N`` each) instead of a ring each.
    """
    _outside("pipe")


def event(src, dst):
    """Declare a counting event from role ``src`` to role ``dst``."""
    _outside("event")


def barrier(*roles):
    """Declare a group barrier whose members are all replicas of ``roles``; with no roles,
    ``xs.barrier()``, every role of the kernel is a member (the portable "all roles meet")."""
    _outside("barrier")


def tile_range(total, persistent=True):
    """The tiles this program takes, as the iterator of a loop::

        for tile in xs.tile_range(tiles, persistent=PERSISTENT):   # PERSISTENT: a constexpr
            ...

    ``persistent`` true: tiles ``program_id(0)``, ``program_id(0) + num_programs(0)``, ...
    below ``total`` -- launch any number of programs (one per SM or AI core); every agent walks
    the same tiles and the pipes keep their counters from tile to tile. ``persistent`` false:
    the one tile ``program_id(0)`` if it is below ``total``, with no loop around the body --
    launch one program per tile (a program that needs no tile loop keeps no loop state). The
    body is written once; ``persistent`` must be known at compile time (a constexpr or a
    literal), since it decides the program's shape.
    """
    _outside("tile_range")


def tile(shape, dtype, multicast=False):
    """Shape and dtype of one pipe payload field (used inside :func:`pipe`).

    ``multicast=True`` (a kernel with :func:`cluster`): every program of the cluster receives
    the same tile in its own slot. The producer writes it with ``slot.f = xs.load(t, offsets,
    shape)`` whose offsets must not depend on the program (``xs.cluster_rank()``,
    ``xs.program_id``); on hardware with multicast the copy engine delivers one load to all of
    them (Hopper: the lead CTA's TMA multicast), so a slot is free for any program only once
    every program of the cluster released it.
    """


def cluster(programs):
    """Group ``programs`` consecutive programs of axis 0 (1, 2, 4 or 8; a constexpr) into a
    cluster: written once, before the first role. The launch's axis-0 grid must be a multiple of
    it. ``xs.cluster_id()`` numbers the clusters, ``xs.cluster_rank()`` a program inside its
    cluster, and ``xs.tile_range`` deals tiles to clusters, so every program of a cluster walks
    the same tiles. Pipe fields declared ``xs.tile(..., multicast=True)`` are shared by the
    cluster's programs (Hopper: TMA multicast and cluster-scope mbarriers); where a backend has no
    multicast each program loads its own copy, and the allocation report says so.
    """
    _outside("cluster")
    _outside("tile")


def signal(ev):
    """Signal event ``ev`` once (source role only)."""
    _outside("signal")


def wait(ev):
    """Wait for the next signal of event ``ev`` (destination role only)."""
    _outside("wait")


# ---------------------------------------------------------------- tile operations
@_tile_op(1, 1)
def program_id(axis):
    """Index of this program along grid axis ``axis``."""


@_tile_op(1, 1)
def num_programs(axis):
    """Number of programs along grid axis ``axis``."""


@_tile_op(0, 0)
def cluster_rank():
    """This program's place in its cluster, 0 .. programs - 1 (0 without :func:`cluster`)."""


@_tile_op(0, 0)
def cluster_id():
    """This program's cluster, ``program_id(0) // programs``."""


@_tile_op(0, 0)
def num_clusters():
    """Clusters in the launch, ``num_programs(0) // programs``."""


@_tile_op(0, 0)
def replica_id():
    """Which replica of the enclosing role runs this code (0 .. replicas-1)."""


@_tile_op(2, 2)
def cdiv(a, b):
    """Ceiling division of two scalars."""


@_tile_op(2, 2)
def arange(start, end):
    """1-D int32 tile [start, end) (end - start a power of two)."""


@_tile_op(2, 2)
def zeros(shape, dtype):
    """Tile of zeros."""


@_tile_op(3, 3)
def full(shape, value, dtype):
    """Tile filled with ``value``."""


@_tile_op(3, 3)
def load(tensor, offsets, shape):
    """Load the ``shape`` tile at ``offsets`` of a tensor of 1 to 4 dimensions (any strides):
    one offset per dimension; the tile is 1-D or 2-D and spans the tensor's last
    ``len(shape)`` dimensions, each leading offset picking one index
    (``xs.load(q, [b, h, m, 0], [BM, D])`` is ``q[b, h, m:m+BM, 0:D]``). Out-of-bounds reads 0.
    docs/tutorial.md "Tensors of 1 to 4 dimensions"."""


@_tile_op(2, 2)
def load_scalar(tensor, index):
    """One element of a 1-D int32 tensor (e.g. ``cu_seqlens[b]``)."""


def store(tensor, offsets, value, bounds=None, reduce=None, deterministic=False):
    """Store the 1-D or 2-D tile ``value`` at ``offsets`` (one per tensor dimension, as for
    :func:`load`: the tile spans the last dimensions). Parts outside the tensor, or at or
    beyond ``bounds`` (one end per dimension, e.g. ``[row_end, col_end]``) when given, are
    dropped (a statement).

    ``reduce="add"``: add the tile into the tensor element by element instead of writing it
    (atomically per element: several programs may add into one element -- split-K, dQ). The
    sum is complete for a reader only after the launch (the kernel may not read the tensor,
    nor plain-store to it). Element types per backend: docs/tutorial.md "Reduce-add"; others
    are refused at check. ``deterministic=True``: the adds land in a fixed order (the CPU
    emulator; refused where a backend cannot order them yet)."""
    _outside("store")


@_tile_op(2, 3)
def mma(a, b, acc=None):
    """Asynchronous ``a @ b (+ acc)`` with fp32 accumulation; pair with :func:`mma_wait`."""


@_tile_op(1, 1, ("pending",))
def mma_wait(acc, pending=0):
    """Wait until at most ``pending`` mmas are in flight; returns ``acc`` ready to read."""


@_tile_op(1, 1)
def trans(x):
    """Transpose a 2-D tile (for mma operands, e.g. K^T)."""


@_tile_op(2, 2)
def max(x, axis):  # noqa: A001 - portable name
    """Reduce with max along ``axis``."""


@_tile_op(2, 2)
def sum(x, axis):  # noqa: A001 - portable name
    """Reduce with + along ``axis``."""


@_tile_op(1, 1)
def exp2(x):
    """2**x elementwise."""


@_tile_op(1, 1)
def log2(x):
    """log2(x) elementwise."""


# Elementwise math: computed in float32 (a float16 / bfloat16 / int32 operand is converted
# first, as Triton's math functions and the Ascend vector unit need); the result is a float32
# tile -- narrow it with ``.to(dtype)``. ``abs`` keeps its operand's dtype.
@_tile_op(1, 1)
def sqrt(x):
    """Square root elementwise (float32 result)."""


@_tile_op(1, 1)
def rsqrt(x):
    """1 / sqrt(x) elementwise (float32 result)."""


@_tile_op(1, 1)
def exp(x):
    """e**x elementwise (float32 result)."""


@_tile_op(1, 1)
def log(x):
    """Natural logarithm elementwise (float32 result)."""


@_tile_op(1, 1)
def tanh(x):
    """Hyperbolic tangent elementwise (float32 result)."""


@_tile_op(1, 1)
def erf(x):
    """Error function elementwise (float32 result), e.g. GELU: ``0.5 * x * (1 + xs.erf(x * 0.7071))``."""


@_tile_op(1, 1)
def sigmoid(x):
    """1 / (1 + e**-x) elementwise (float32 result)."""


@_tile_op(1, 1)
def abs(x):  # noqa: A001 - portable name
    """|x| elementwise (the operand's dtype)."""


@_tile_op(2, 2)
def pow(x, exponent):  # noqa: A001 - portable name
    """``x ** exponent`` elementwise, float32 result; also spelled ``x ** exponent``. The exponent
    is a compile-time number: an integer (|n| <= 16) multiplies (any sign of x), any other
    number computes ``exp2(exponent * log2(x))`` (NaN for negative x, as torch.pow)."""


@_tile_op(3, 3)
def where(cond, a, b):
    """Elementwise select."""


@_tile_op(2, 2)
def maximum(a, b):
    """Elementwise maximum (tiles or scalars)."""


@_tile_op(2, 2)
def minimum(a, b):
    """Elementwise minimum (tiles or scalars)."""


# ---------------------------------------------------------------- kernels
def kernel(fn=None, **options):
    """Mark ``fn`` as an xsync kernel; launch with ``fn[grid](*args, **constexprs)``."""
    from xsync.compiler import Kernel

    if fn is None:
        return lambda f: Kernel(f, **options)
    return Kernel(fn, **options)
