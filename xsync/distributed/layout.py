"""Where each rank's tokens sit in the whole sequence, and which blocks a ring step computes.

Two layouts split a sequence of S tokens over W ranks:

- ``"zigzag"`` (load-balanced for causal attention): the sequence is cut into 2W chunks and rank r
  holds chunks r and 2W-1-r, concatenated. Under a causal mask every rank then does about the same
  work: an early chunk sees few keys, its partner near the end sees many.
- ``"contiguous"``: W chunks, rank r holds chunk r (the last rank does the most causal work).

Chunk sizes follow ``torch.tensor_split``: the first ``S % n`` of the n chunks hold one token more,
so a length that does not divide gives ragged chunks and S < n gives empty ones; every rank
computes the same bounds from S and W alone, so no rank needs another's offsets.

A ring step pairs this rank's queries with one rank's keys. Chunks of different ranks never
overlap, so under a causal mask a (query chunk, key chunk) pair is either the same chunk (the
diagonal: a causal block), wholly before the queries (fully visible) or wholly after (skipped).
:func:`step_blocks` turns the pairs into as few kernel calls as the layout allows: one a step for
the zig-zag layout (all queries against the source's first chunk, or the second query chunk
against all keys), as in torch's context_parallel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

LAYOUTS = ("zigzag", "contiguous")


@dataclass(frozen=True)
class Segment:
    """``length`` tokens of the whole sequence from ``start``, held contiguously by one rank."""

    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True)
class Block:
    """One kernel call of a ring step: local query rows [q_lo, q_hi) against local key rows
    [k_lo, k_hi) of the keys held this step; ``causal``: a diagonal block (square, masked)."""

    q_lo: int
    q_hi: int
    k_lo: int
    k_hi: int
    causal: bool


def _bounds(seq_len: int, parts: int) -> list[Segment]:
    base, extra = divmod(seq_len, parts)
    out, start = [], 0
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        out.append(Segment(start, n))
        start += n
    return out


def check_layout(layout: str) -> None:
    from xsync.errors import LaunchError

    if layout not in LAYOUTS:
        raise LaunchError(f"xsync.distributed: unknown sequence layout {layout!r}",
                          fix=f"pass layout= one of {', '.join(map(repr, LAYOUTS))}")


def segments(seq_len: int, rank: int, world: int, layout: str = "zigzag") -> tuple[Segment, ...]:
    """The pieces of the whole sequence (of ``seq_len`` tokens) that ``rank`` holds, in the order
    it holds them."""
    check_layout(layout)
    if layout == "contiguous":
        return (_bounds(seq_len, world)[rank],)
    chunks = _bounds(seq_len, 2 * world)
    return chunks[rank], chunks[2 * world - 1 - rank]


def local_length(seq_len: int, rank: int, world: int, layout: str = "zigzag") -> int:
    return sum(s.length for s in segments(seq_len, rank, world, layout))


def positions(seq_len: int, rank: int, world: int, layout: str = "zigzag", device=None) -> torch.Tensor:
    """The global token positions of ``rank``'s local sequence (for rotary embeddings, or to
    gather labels): an int64 tensor of its local length."""
    parts = [torch.arange(s.start, s.end, device=device) for s in segments(seq_len, rank, world, layout)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=device)


def shard(x: torch.Tensor, rank: int, world: int, dim: int = 2, layout: str = "zigzag") -> torch.Tensor:
    """``rank``'s part of the whole sequence ``x`` (sequence along ``dim``; 2 for [B, H, S, D])."""
    segs = segments(x.shape[dim], rank, world, layout)
    return torch.cat([x.narrow(dim, s.start, s.length) for s in segs], dim=dim)


def unshard(parts: Sequence[torch.Tensor], dim: int = 2, layout: str = "zigzag") -> torch.Tensor:
    """The whole sequence from every rank's part (``parts[r]`` from rank r), as :func:`shard`
    split it. See :func:`xsync.distributed.gather` for the collective form."""
    from xsync.errors import LaunchError

    world = len(parts)
    seq_len = sum(p.shape[dim] for p in parts)
    pieces: list = [None] * (2 * world if layout == "zigzag" else world)
    for r, p in enumerate(parts):
        segs = segments(seq_len, r, world, layout)
        if sum(s.length for s in segs) != p.shape[dim]:
            raise LaunchError(
                f"xsync.distributed.unshard: part {r} holds {p.shape[dim]} tokens along dim {dim}; "
                f"the {layout} split of {seq_len} tokens over {world} ranks gives rank {r} "
                f"{sum(s.length for s in segs)}",
                fix="pass every rank's part in rank order, as shard() made them")
        slots = (r,) if layout == "contiguous" else (r, 2 * world - 1 - r)
        at = 0
        for slot, s in zip(slots, segs):
            pieces[slot] = p.narrow(dim, at, s.length)
            at += s.length
    return torch.cat(pieces, dim=dim)


def step_blocks(q_segs: Sequence[Segment], k_segs: Sequence[Segment], causal: bool,
                same_rank: bool) -> list[Block]:
    """The kernel calls of one ring step: this rank's query segments against the key segments
    held this step (``same_rank``: its own keys). Empty when every pair is masked."""
    nq, nk = sum(s.length for s in q_segs), sum(s.length for s in k_segs)
    if nq == 0 or nk == 0:
        return []
    if not causal:
        return [Block(0, nq, 0, nk, False)]
    if same_rank:
        # own keys: the local order is the global order (each layout keeps its chunks ascending),
        # so the global causal mask is the local square causal mask
        return [Block(0, nq, 0, nk, True)]
    # per query segment, the local key ranges wholly before it (chunks of two ranks are disjoint)
    rows: list[tuple[int, int, tuple[tuple[int, int], ...]]] = []
    q_at = 0
    for qs in q_segs:
        runs: list[list[int]] = []
        k_at = 0
        for ks in k_segs:
            if qs.length and ks.length:
                if ks.start < qs.end and qs.start < ks.end:
                    raise AssertionError(f"ranks share tokens: {qs} and {ks}")
                if ks.end <= qs.start:
                    if runs and runs[-1][1] == k_at:
                        runs[-1][1] = k_at + ks.length
                    else:
                        runs.append([k_at, k_at + ks.length])
            k_at += ks.length
        if qs.length:
            rows.append((q_at, q_at + qs.length, tuple(map(tuple, runs))))
        q_at += qs.length
    # adjacent query segments that see the same key ranges share a call
    merged: list[list] = []
    for lo, hi, runs in rows:
        if merged and merged[-1][1] == lo and merged[-1][2] == runs:
            merged[-1][1] = hi
        else:
            merged.append([lo, hi, runs])
    return [Block(lo, hi, klo, khi, False) for lo, hi, runs in merged for klo, khi in runs]
