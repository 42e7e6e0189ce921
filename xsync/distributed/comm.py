"""The process group side of ring attention: the ring's neighbours, the batched send/receive
that rotates a buffer one rank along the ring, the agreement check before the ring starts, and
the translation of a failed or timed-out exchange into a DistributedError on every rank.

A dead peer closes its sockets (gloo: "Connection closed by peer", within a second) or stops
answering (any backend: the wait times out after the group's timeout, set by
``init_process_group(timeout=...)``, or the ``timeout`` given to ring_attention). Either way each
rank raises DistributedError; no rank waits forever.
"""
from __future__ import annotations

import datetime
import struct
from dataclasses import dataclass

import torch
import torch.distributed as dist

from xsync.errors import DistributedError, XSyncError
from xsync.distributed import layout as _layout

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_FIX_PEER = ("if a rank died, its own log says why (restart the job: the group cannot go on without it); "
             "otherwise every rank must make the same xsync.distributed calls in the same order, and a "
             "rank that is only slow needs a longer timeout (init_process_group(timeout=...) or "
             "ring_attention(timeout=...))")


class Comm:
    """This rank's place in the ring of ``group`` (None: the default group)."""

    def __init__(self, group=None, timeout: datetime.timedelta | float | None = None):
        if not dist.is_available() or not dist.is_initialized():
            raise DistributedError(
                "xsync.distributed: torch.distributed is not initialized",
                fix="call torch.distributed.init_process_group(backend, timeout=...) on every rank first "
                    "('gloo' on CPUs, 'nccl' on GPUs)")
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        if self.rank < 0:
            raise DistributedError("xsync.distributed: this process is not a member of the group it was given",
                                   fix="call ring_attention only on the ranks of `group`")
        if isinstance(timeout, (int, float)):
            timeout = datetime.timedelta(seconds=timeout)
        self.timeout = timeout
        self.next = (self.rank + 1) % self.world
        self.prev = (self.rank - 1) % self.world

    def fail(self, what: str, exc: BaseException) -> DistributedError:
        text = str(exc).strip()
        cause = "no answer within the timeout (a peer is stuck, slow or not calling)" \
            if "timed out" in text.lower() or "timeout" in text.lower() else \
            "the connection to a peer broke (a rank probably died)"
        return DistributedError(
            f"xsync.distributed: rank {self.rank} of {self.world}: {what} failed: {cause}",
            details=f"torch.distributed: {text.splitlines()[0] if text else type(exc).__name__}",
            fix=_FIX_PEER)

    def _wait(self, works, what: str) -> None:
        try:
            for w in works:
                if self.timeout is None:
                    w.wait()
                else:
                    w.wait(self.timeout)
        except RuntimeError as exc:       # torch.distributed.DistError and its kinds are RuntimeErrors
            raise self.fail(what, exc) from exc

    def rotate(self, send: torch.Tensor, recv_numel: int, what: str, tag: int) -> "Pending":
        """Send the flat ``send`` to the next rank and receive ``recv_numel`` elements from the
        previous one, both in flight until :meth:`Pending.wait`. Zero-element messages are not
        sent (every rank knows every size). One rank: the buffer comes back as it is."""
        if self.world == 1:
            return Pending(self, [], send, what, send)
        recv = torch.empty(recv_numel, dtype=send.dtype, device=send.device)
        ops = []
        if recv_numel:
            ops.append(dist.P2POp(dist.irecv, recv, group=self.group, group_peer=self.prev, tag=tag))
        if send.numel():
            ops.append(dist.P2POp(dist.isend, send, group=self.group, group_peer=self.next, tag=tag))
        try:
            works = dist.batch_isend_irecv(ops) if ops else []
        except RuntimeError as exc:
            raise self.fail(what, exc) from exc
        return Pending(self, works, recv, what)

    def all_gather(self, t: torch.Tensor, what: str) -> torch.Tensor:
        out = torch.empty(self.world * t.numel(), dtype=t.dtype, device=t.device)
        try:
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            work = gather(out, t, group=self.group, async_op=True)
        except RuntimeError as exc:
            raise self.fail(what, exc) from exc
        self._wait([work], what)
        return out.view(self.world, *t.shape)


class Pending:
    """An exchange in flight; :meth:`wait` returns the received buffer."""

    def __init__(self, comm: Comm, works, recv: torch.Tensor, what: str):
        self.comm, self.works, self.recv, self.what = comm, works, recv, what

    def wait(self) -> torch.Tensor:
        self.comm._wait(self.works, self.what)
        return self.recv


@dataclass(frozen=True)
class Meta:
    """What every rank agreed on before the ring: shapes of every rank's q and k, and the
    segments of the whole sequence each rank holds (None without a causal mask: positions do
    not matter then)."""

    world: int
    batch: int
    hq: int
    hkv: int
    head_dim: int
    q_len: tuple[int, ...]
    k_len: tuple[int, ...]
    q_segs: tuple[tuple[_layout.Segment, ...], ...]
    k_segs: tuple[tuple[_layout.Segment, ...], ...]

    def kv_numel(self, rank: int) -> int:
        """Elements of rank's packed K and V."""
        return 2 * self.batch * self.hkv * self.k_len[rank] * self.head_dim

    def kv_shape(self, rank: int) -> tuple[int, int, int, int]:
        return (self.batch, self.hkv, self.k_len[rank], self.head_dim)

    def blocks(self, rank: int, src: int, causal: bool) -> list[_layout.Block]:
        """The kernel calls of rank's ring step that holds src's keys (layout.step_blocks)."""
        if causal:
            return _layout.step_blocks(self.q_segs[rank], self.k_segs[src], True, src == rank)
        return _layout.step_blocks((_layout.Segment(0, self.q_len[rank]),), (_layout.Segment(0, self.k_len[src]),),
                                   False, src == rank)


_FIELDS = ("refused", "batch", "q heads", "kv heads", "q length", "kv length", "head dim", "dtype",
           "causal", "layout", "sm_scale")
_AGREE = ("batch", "q heads", "kv heads", "head dim", "dtype", "causal", "layout", "sm_scale")


def _describe(q, k, v, causal: bool, scale: float, layout: str, refused: bool, device) -> torch.Tensor:
    def dims(t, i):
        return t.shape[i] if isinstance(t, torch.Tensor) and t.dim() == 4 else -1

    dtype = q.dtype if isinstance(q, torch.Tensor) else None
    row = [int(refused), dims(q, 0), dims(q, 1), dims(k, 1), dims(q, 2), dims(k, 2), dims(q, 3),
           _DTYPES.index(dtype) if dtype in _DTYPES else -1, int(bool(causal)),
           _layout.LAYOUTS.index(layout) if layout in _layout.LAYOUTS else -1,
           struct.unpack("<q", struct.pack("<d", float(scale)))[0]]
    return torch.tensor(row, dtype=torch.int64, device=device)


def _show(name: str, value: int) -> str:
    if name == "dtype":
        return str(_DTYPES[value]) if 0 <= value < len(_DTYPES) else "unsupported"
    if name == "layout":
        return repr(_layout.LAYOUTS[value]) if 0 <= value < len(_layout.LAYOUTS) else "unknown"
    if name == "sm_scale":
        return repr(struct.unpack("<d", struct.pack("<q", value))[0])
    if name == "causal":
        return str(bool(value))
    return str(value)


def agree(comm: Comm, q, k, v, causal: bool, scale: float, layout: str, local: XSyncError | None) -> Meta:
    """Gather every rank's shapes and settings (one all_gather, before any exchange) and check
    that they form one problem; every rank reads the same table, so every rank raises the same
    error. ``local``: this rank's own refusal of its input (raised here after the gather, so the
    other ranks learn of it instead of waiting for this one)."""
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    if dist.get_backend(comm.group) == "nccl" and device.type != "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    table = comm.all_gather(_describe(q, k, v, causal, scale, layout, local is not None, device),
                            "the shape check before the ring (all_gather)").tolist()
    rows = [dict(zip(_FIELDS, r)) for r in table]
    if local is not None:
        raise local
    refused = [r for r, row in enumerate(rows) if row["refused"]]
    if refused:
        raise DistributedError(
            f"xsync.distributed: rank {comm.rank} of {comm.world}: rank(s) {refused} refused their input "
            f"(their own error says why)", fix="fix the input on the rank(s) named (every rank passes tensors the attention kernel takes)")
    diffs = [f"{name}: " + ", ".join(f"rank {r} {_show(name, row[name])}" for r, row in enumerate(rows))
             for name in _AGREE if len({row[name] for row in rows}) > 1]
    if diffs:
        raise DistributedError(
            f"xsync.distributed: rank {comm.rank} of {comm.world}: the ranks' inputs disagree",
            details="\n".join(diffs),
            fix="every rank passes its part of one problem: the same batch, heads, head dim, dtype, "
                "causal, layout and sm_scale; only the sequence lengths differ")
    q_len = tuple(row["q length"] for row in rows)
    k_len = tuple(row["kv length"] for row in rows)
    q_segs = k_segs = tuple(() for _ in rows)
    if causal:
        q_segs, k_segs = _causal_segments(comm, q_len, k_len, layout)
    r0 = rows[0]
    return Meta(comm.world, r0["batch"], r0["q heads"], r0["kv heads"], r0["head dim"], q_len, k_len,
                q_segs, k_segs)


def _causal_segments(comm: Comm, q_len, k_len, layout: str):
    world = comm.world
    if q_len != k_len:
        bad = [r for r in range(world) if q_len[r] != k_len[r]]
        raise DistributedError(
            f"xsync.distributed: rank {comm.rank} of {world}: causal ring attention needs each rank's "
            f"queries and keys to be the same tokens, but rank(s) {bad} hold "
            + ", ".join(f"{q_len[r]} queries and {k_len[r]} keys" for r in bad),
            fix="shard q, k and v of one sequence alike (xsync.distributed.shard), or pass causal=False")
    total = sum(q_len)
    want = tuple(_layout.local_length(total, r, world, layout) for r in range(world))
    if want != q_len:
        raise DistributedError(
            f"xsync.distributed: rank {comm.rank} of {world}: the ranks hold {list(q_len)} tokens, but the "
            f"{layout} split of {total} tokens over {world} ranks gives {list(want)}",
            fix=f"split the sequence with xsync.distributed.shard(x, rank, world, layout={layout!r}), "
                f"which the causal mask's positions assume")
    segs = tuple(_layout.segments(total, r, world, layout) for r in range(world))
    return segs, segs
