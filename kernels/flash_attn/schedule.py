"""Tiles and schedules of the attention kernel, per backend, head_dim and sequence length:
a small committed table, looked up per call (no search at run time).

A schedule fixes the kernel's constexprs (BM rows per consumer replica, BN keys per step,
STAGES of the K/V rings) and how many programs run the persistent tile loop (``persistent``:
one program per SM on Hopper, each walking its share of the tiles, instead of one program per
tile). The Hopper rows come from ``benchmarks/flash_attn_tune.py`` on the H200 (the run is
committed under benchmarks/results/); the CPU and Ascend rows from what their memories hold
(see kernel.py for the Ascend budgets).
"""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Schedule:
    BM: int                 # query rows per consumer replica (a tile is replicas * BM rows)
    BN: int                 # keys per step
    STAGES: int             # K/V ring slots
    persistent: bool        # programs = min(tiles, cores/SMs) instead of one per tile
    # under a causal mask, how tiles are dealt (tiles.py): by pair (None), as without a mask,
    # or by work, longest first in a snake over the programs, within groups of this many
    # pairs (0: all pairs in one group; small groups keep the pairs whose K and V programs
    # running at once read few, so they stay in L2)
    causal_group: int | None = None
    # slots of the Q ring (the q_load role's TMA copies of each tile's query rows): two let the
    # next tile's Q land while this tile runs, where shared memory holds them beside K and V
    q_stages: int = 1
    # consumer replicas of the forward (mma and softmax, and the q_load copies): Hopper consumer
    # warpgroups, one per BM rows; Ascend's two vector cores take one each, so it keeps two
    replicas: int = 2
    # Hopper spellings a row may fix (None: the configuration decides, XSYNC_NV_EXP2_FMA and
    # XSYNC_NV_PREFETCH_TILE_SCALARS; the ops set them around this schedule's launch): the share
    # of P's exponentials computed on the FMA pipe ("1/4", "1/2": xsync/backends/nvidia/exp2.py)
    # and the tile loop's table reads issued ahead of their tiles (prefetch.py). No row fixes
    # them yet: benchmarks/flash_attn_ab.py's exp2_* and prefetch candidates time them.
    exp2_fma: str | None = None
    reads_ahead: bool | None = None
    # what the ops launch instead where this schedule's kernel spills to local memory under the
    # installed Triton (its register budget was measured with one compiler: Triton 3.9 spills
    # the persistent three-replica d64 kernel, 104 B a thread, where 3.6 does not); the ops
    # read the spill from the first launch's compiled kernel (ops.py, launched_schedule)
    fallback: Schedule | None = None
    # backward only: dQ reduce-added (fp32) by the dK/dV kernel (backward.py, FUSED_DQ) instead
    # of the separate dQ kernel; xsync.options(attn_fused_dq=...) overrides it (grad.py)
    fused_dq: bool = False
    # what a sliding-window launch (WINDOW=1: kernel.py's window masks, more live tiles) takes
    # instead, where this schedule's windowed kernel does not fit the memories (None: the same)
    windowed: Schedule | None = None
    # backward only: the dQ kernel's schedule where it differs from dK/dV's (None: the same);
    # Ascend d128 runs dQ in four sub-tile replicas, which dK/dV's L0C cannot hold
    dq: Schedule | None = None

    @property
    def tile_rows(self) -> int:
        """Query rows of one forward tile: BM per consumer replica."""
        return self.replicas * self.BM

    def constexprs(self) -> dict:
        return dict(BM=self.BM, BN=self.BN, STAGES=self.STAGES, PERSISTENT=int(self.persistent))

    def fixed_options(self) -> dict:
        """The xsync options this schedule fixes for its launches (``xs.options(**...)``)."""
        out = {}
        if self.exp2_fma is not None:
            out["nv_exp2_fma"] = self.exp2_fma
        if self.reads_ahead is not None:
            out["nv_prefetch_tile_scalars"] = self.reads_ahead
        return out

    def forward_constexprs(self) -> dict:
        """The forward kernel's (kernel.py): the backward kernels have no Q ring."""
        return dict(self.constexprs(), Q_STAGES=self.q_stages, REPLICAS=self.replicas)

    def backward_constexprs(self, dq: bool = False) -> dict:
        """The dK/dV kernel's (backward.py), or with ``dq`` the dQ kernel's: a program takes
        ``REPLICAS * BM`` keys (dK/dV) or query rows (dQ)."""
        own = self.dq if dq and self.dq is not None else self
        return dict(own.constexprs(), REPLICAS=own.replicas)


@dataclass(frozen=True)
class Row:
    backend: str            # "nvidia" | "ascend" | "cpu"
    head_dim: int | None    # None: any
    causal: bool | None     # None: either
    max_seq: int | None     # the row applies up to this query length (None: any)
    schedule: Schedule


CPU = Schedule(BM=16, BN=32, STAGES=2, persistent=False)
# The emulator's cost is per step (thread hand-offs), not per element: long sequences take
# large tiles (3001 tokens: 1 s instead of 28 s for one head); short ones keep the small tiles,
# so the tests still walk several blocks and the masked boundary blocks.
CPU_LONG = Schedule(BM=64, BN=128, STAGES=2, persistent=False)
# ASCEND (d64; d128 before the rows below, whose own comment gives what they changed):
# one program per AI core; causal tiles by work, pair by pair (not measured on an NPU: tiles.py
# checks the deal's balance for each shape and takes one group where it is poor).
# 128 query rows a step (BM = 64 per replica), as the native kernels: the cube's flags, K/V
# loads and the recurrence's fixed costs are paid per step, so twice the rows a step halve
# them per FLOP. Modelled on the 910B2 (benchmarks/results/flash_attn_ascend_cost.md, d128
# s16k non-causal) 49 -> 68 TFLOP/s; the HIVM compiler places UB 182 KB of 192, L1 320 KB of
# 512, L0C 64 KB of 128 (d128; d64: UB 141 KB). BM = 32 with BN = 256 models about the same
# (71) and is slower causal at 4k (more masked keys); STAGES = 3 changes nothing here (K and
# V are same-core values on the cube, no ring in L1). With S's 3-slot ring (kernel.py: the cube
# two steps ahead, cross-agent-pipeline rule 8) 68 -> 81, bound by the cube's FIXP and flags.
# Not measured on an NPU.
# The windowed d128 kernel keeps 64 rows x 128 keys a step: with its masks at 128 rows the
# compiler places 191 KB of the 192 KB UB, too close to the limit to take unmeasured.
# d128: 128 rows x 512 keys a step, as the native kernels' S tiles, in four 32-row replicas
# that are sub-tiles (passes/subtile_replicas.py: the cube stores each replica's S and PV before
# the next product, a vector core loads each replica's S, runs its softmax and sends its P before
# the next replica's): the cube's flags, PV's FIXP store and the recurrence's fixed costs are
# paid per step, so 4x the scores a step quarter them per FLOP. Modelled on the 910B2 (d128,
# s 4k/8k/16k/32k, TFLOP/s; benchmarks/results/flash_attn_ascend_cost.md) 77/80/81/82 ->
# 124/144/156/164 non-causal, 70/76/80/81 -> 92/119/141/155 causal. The HIVM compiler places
# UB 183712 B (causal 179680) of 196608, L1 512 KB (filled by multi-buffering), L0C 64 KB (one
# replica's 32 x 512 S product at a time). As rendered before that pass (every replica's product,
# S and P live at once) it overflows UB (240320 B) and L0C (262144 B); 64 x 512 (two replicas)
# models 104/120/131/137 and 128 x 256 107/116/121/124. Not measured on an NPU.
ASCEND = Schedule(BM=64, BN=128, STAGES=2, persistent=True, causal_group=1)
ASCEND_D128 = Schedule(BM=32, BN=512, STAGES=2, persistent=True, causal_group=1, replicas=4,
                       windowed=replace(ASCEND, BM=32))
HOPPER = Schedule(BM=64, BN=128, STAGES=3, persistent=False)
ASCEND_D256 = Schedule(BM=32, BN=64, STAGES=2, persistent=True, causal_group=1)

# First matching row wins; each backend ends with a catch-all. Hopper rows: the fastest
# candidate per (head_dim, causal, length) of benchmarks/results/flash_attn_tune.json (H200,
# one process, TFLOP/s): persistent programs win for short non-causal sequences (the
# prologue/epilogue of a tile overlaps the next tile's loads; d128 s1k 424 vs 392, d64 s1k
# 332 vs 302), lose for causal ones (the strided share is unbalanced: d128 s16k 410 vs 568);
# BN=64 helps short causal d128 (fewer masked keys per boundary step: 267 vs 246 at 1k), up to
# 1k only: at 2k BN=128 wins again (results/runs/flash_attn_ab_20261201_short.json, interleaved:
# 387 vs 368 at 2k, 257 vs 276 at 1k).
# Non-persistent rows compile without the tile loop (xs.tile_range): d64 causal 1k 183 vs 179
# with the loop kept (same run). Three K/V stages by default: with three the merge-pipes pass gives K and V one ring
# (xsync/backends/nvidia/passes/merge_pipes.py), which beats two rings of two or three stages,
# interleaved in one process (benchmarks/flash_attn_ab.py, results/runs/flash_attn_ab_20261201.json,
# d128: s8k 578 vs 544 / 536 non-causal, 530 vs 515 / 511 causal; s16k causal 591 vs 560 / 559).
# Causal persistent launches deal tiles by work (tiles.py) in groups of one pair: against one
# program per tile, interleaved (benchmarks/flash_attn_ab.py, runs/flash_attn_ab_20261202_causal_order_b.json,
# TFLOP/s) d64 1k/2k/4k/8k 210/297/364/406 vs 180/268/338/389, 16k 431 vs 432; d128 1k 297 vs
# 278, 2k 384 vs 378, 4k-16k behind (462/510/429 vs 473/538/608). Dealt pair by pair (strided)
# they lose (d64 1k 163, d128 16k 415: the busiest program gets 1.57x the mean work); one group
# of all pairs balances best but loses L2 at short lengths (d128 2k 338, runs/..._causal_order_a.json).
# Q through its own ring (the q_load role, kernel.py) against the consumer's register load, whole
# grid alternated process by process (benchmarks/tree_ab.py, runs/tree_ab_20261202_q_ring.json,
# TFLOP/s): d128 non-causal 1k/2k/4k 473/550/605 vs 440/532/583, d64 1k/2k 348/398 vs 329/387,
# causal d128 1k 309 vs 298; d64 beyond 4k loses 1-4% (non-causal 8k 428 vs 445). Two Q slots
# where they fit beside K and V (d64, and d128 with BN=64), one for d128's 3 x 64 KB K/V ring.
# With the per-row statistics stored in their own layout (no shared-memory round trips in the
# epilogue; d64 causal 1k: 1.1k instead of 3.8k cycles a tile, runs/tile_timeline_20261202_*.json)
# the short rows moved again, interleaved in one process (runs/flash_attn_ab_20261202_row_store_*.json,
# TFLOP/s): d64 non-causal 8k/16k at three merged stages 443/444 vs 417/424 at two; causal d128
# 2k/4k at two stages, persistent, dealt by work 484/523 vs 417/495 (one program per tile, three
# stages), while from 8k one program per tile keeps its lead (553 vs 534).
# Three consumer replicas (tiles of 192 rows, as FA3 runs d64) against two, interleaved in one
# process (runs/flash_attn_ab_20261203_r3.json, TFLOP/s, three replicas at 160 consumer registers
# (alloc.py) / two / cuDNN): d64 non-causal 2k/4k/8k/16k 447/458/485/489 vs 423/429/441/440
# (cuDNN 450/458/460/452), 1k 379 vs 396; d64 causal 16k 455 vs 429, while up to 8k causal
# three lose (1k 150 vs 281, 8k 391 vs 426: a 192-row tile crosses more masked key blocks).
# Again at the allocator's 32 / 160 registers (runs/flash_attn_ab_20261203_r3_regs32.json): 8k
# non-causal 479 vs 430. For short causal ones neither 64-key steps, two stages nor a deal by
# work for three closes the gap (1k: 225 / 145 / 154-192 vs 285; runs/..._d64_candidates.json).
# d128 does not fit three (its O accumulator alone is 64 registers a thread: local memory).
# Where a three-replica kernel spills under another Triton, the ops fall back to the two-replica
# schedule these rows had before (schedule.fallback).
# With the scale fused into exp2's argument (kernel.py, SCALE_POSITIVE: d64 1k-16k +5-9%,
# runs/flash_attn_ab_20261203_scale_first.json) short causal d64 deals its tiles by work in
# groups of four pairs (runs/flash_attn_ab_20261203_short_causal_{a,b}.json, TFLOP/s, groups of
# four / one / cuDNN): 1k 317/317 vs 300/301 (cuDNN 332/324), 2k 379/377 vs 373/373; 4k even
# (411 vs 413), 8k behind (411 vs 441). d128 causal 1k: all candidates within the noise.
D64_SHORT = Schedule(BM=64, BN=128, STAGES=3, persistent=True, q_stages=2)
TABLE: tuple[Row, ...] = (
    Row("nvidia", 64, False, 1024, D64_SHORT),
    Row("nvidia", 64, False, None, Schedule(BM=64, BN=128, STAGES=3, persistent=True, q_stages=2,
                                            replicas=3, fallback=D64_SHORT)),
    # d128 short non-causal: two K/V stages leave room for O's TMA-store staging tiles (128 KB of
    # K/V, 32 of Q, 32 of staging), which beats three merged stages without them
    # (runs/flash_attn_ab_20261202_stages_q.json: 1k/2k/4k 506/551/579 vs 456/511/567)
    Row("nvidia", 128, False, 4096, Schedule(BM=64, BN=128, STAGES=2, persistent=True)),
    Row("nvidia", 128, True, 1024, Schedule(BM=64, BN=64, STAGES=3, persistent=True, causal_group=1,
                                            q_stages=2)),
    # two K/V stages leave room for the staging tiles here too (128 KB of K/V, 32 of Q, 32 of O)
    Row("nvidia", 128, True, 4096, Schedule(BM=64, BN=128, STAGES=2, persistent=True, causal_group=1)),
    Row("nvidia", 64, True, 2048, Schedule(BM=64, BN=128, STAGES=3, persistent=True, causal_group=4,
                                           q_stages=2)),
    Row("nvidia", 64, True, 8192, Schedule(BM=64, BN=128, STAGES=3, persistent=True, causal_group=1,
                                           q_stages=2)),
    Row("nvidia", 64, True, None, Schedule(BM=64, BN=128, STAGES=3, persistent=False, replicas=3,
                                           fallback=HOPPER)),
    # d256 (not measured: no H200 run yet): Q (2 x 64 x 256), K and V (2 stages x 64 x 256) in
    # bf16 are 192 KB of the 227 KB of shared memory, and each consumer's O accumulator
    # (64 x 256 fp32) is 128 registers a thread beside 64-key S and P tiles -- FA3 runs d256 with
    # 64-80 keys a step and two stages too. d96 runs d128's rows (128-wide tiles, ops.tile_dim).
    Row("nvidia", 256, None, None, Schedule(BM=64, BN=64, STAGES=2, persistent=False)),
    Row("nvidia", None, None, None, HOPPER),
    # d256 on the 910B (kernel.py's budgets, hivm-plan-memory): BN = 64 halves the cube's K/V
    # ring in L1 and the S/P tiles in UB, so both replicas' 256-wide O and PV tiles fit the
    # 192 KB unified buffer (xsync/backends/ascend/memory.py checks it)
    Row("ascend", 256, None, None, ASCEND_D256),
    Row("ascend", 64, None, None, ASCEND),
    Row("ascend", None, None, None, ASCEND_D128),
    Row("cpu", None, None, 256, CPU),
    Row("cpu", None, None, None, CPU_LONG),
)

# The backward kernels (backward.py). BM: keys per replica of dK/dV, query rows per replica of
# dQ (a program takes REPLICAS*BM, two replicas unless a row says otherwise); BN: query rows
# (dK/dV) or keys (dQ) per step. Hopper: 128 rows per
# program with 64-wide steps (32 at d128), so two fp32 accumulators and two score tiles fit one
# consumer warpgroup's registers, the tile's own K/V (dK/dV) or Q/dO (dQ) rows waiting in shared
# memory (not yet tuned on the H200); Ascend: the forward's 64 rows per program.
BACKWARD_TABLE: tuple[Row, ...] = (
    # d128 steps 32 rows (dK/dV) or keys (dQ): with 64, dK/dV's two fp32 accumulators (128
    # registers a thread) beside Sᵀ, dPᵀ, Pᵀ and dSᵀ spill (192 B a thread under Triton 3.6,
    # 152 under 3.9; tests/nvidia/test_compile_backward.py checks every row for local memory)
    Row("nvidia", 128, None, None, Schedule(BM=64, BN=32, STAGES=2, persistent=False)),
    # d256: as d128's, 32-row steps; the two 64 x 256 fp32 accumulators of dK/dV (256 registers
    # a thread) cannot fit one warpgroup -- a GPU run has to settle the split (FA3 splits dK/dV
    # over two warpgroups); until then this row is correct, not fast
    Row("nvidia", 256, None, None, Schedule(BM=64, BN=32, STAGES=2, persistent=False)),
    Row("nvidia", None, None, None, Schedule(BM=64, BN=64, STAGES=2, persistent=False)),
    # d256: 16 rows a replica -- at 32, dK/dV's four 32 x 256 fp32 accumulators (two replicas)
    # and the S/dP products need 160 KB of the cube's 128 KB L0C (HIVM's plan-memory)
    Row("ascend", 256, None, None, Schedule(BM=16, BN=64, STAGES=2, persistent=True)),
    # 64 keys (dK/dV) or rows (dQ) a program: at BM = 64 the cube's two replicas' accumulators
    # and products need 256 KB (dK/dV) or 192 KB (dQ) of L0C (memory.py rule 7, as the HIVM
    # compiler reports); the cube runs a step ahead (cross-agent-pipeline rule 9): modelled
    # backward 25 -> 44 TFLOP/s at d128 s16k (benchmarks/results/flash_attn_ascend_cost.md)
    # d128: dQ in four 32-row sub-tile replicas and 256 keys a step (128 x 256 steps,
    # passes/subtile_replicas.py: the cube stores each replica's S and dP, a vector core turns
    # each replica's into dS, in turn); the cube's flags, K/V loads and fixed costs are paid per
    # step, so 4x the scores a step quarter them per FLOP. Modelled on the 910B2 (d128, s
    # 4k/8k/16k/32k, TFLOP/s; benchmarks/results/flash_attn_ascend_cost.md) dQ 43/44/45/45 ->
    # 64/68/70/72 non-causal, 39/42/44/45 -> 55/63/67/70 causal; backward 42/43/44/44 ->
    # 48/50/51/52, causal 39/42/43/44 -> 44/48/50/51. The HIVM compiler places UB 174368 B
    # (causal 184672) of 196608, L1 512 KB (filled by multi-buffering), L0C 131072 B of 131072
    # (the four 32 x 128 fp32 dQ accumulators and one replica's 32 x 256 S and dP; no room left
    # for larger steps). 128 x 128 steps model 47/48/49/49 (causal UB 195744 B). dK/dV keeps
    # two replicas of 64 x 128 steps: four replicas' dK and dV accumulators alone are 128 KB,
    # all of L0C (refused); four 16-key replicas model slower (21 against 29 at s16k). A
    # windowed dQ keeps dK/dV's schedule (grad.py). Not measured on an NPU.
    Row("ascend", 128, None, None, Schedule(BM=32, BN=128, STAGES=2, persistent=True,
                                            dq=Schedule(BM=32, BN=256, STAGES=2, persistent=True, replicas=4))),
    Row("ascend", None, None, None, Schedule(BM=32, BN=128, STAGES=2, persistent=True)),
    # the CPU fuses dQ into the dK/dV kernel (one pass over the score tiles instead of two;
    # tests/core/test_backward_fused_dq.py checks it against float64). Hopper keeps the dQ
    # kernel until the fused one is timed on a GPU; Ascend too (its fused kernel lowers and is
    # proven, but is neither HIVM-compiled nor simulated yet).
    Row("cpu", None, None, 256, replace(CPU, fused_dq=True)),
    Row("cpu", None, None, None, replace(CPU_LONG, fused_dq=True)),
)


def target(backend) -> str:
    """The lowering target of ``backend`` (a Backend or its name): the table's ``backend``
    column (ascend-sim runs the ascend rows)."""
    from xsync.backends import get

    return get(backend).target_name


def lookup(backend: str, head_dim: int, causal: bool, max_seq: int,
           table: tuple[Row, ...] | None = None, window: bool = False) -> Schedule:
    """The first row of ``table`` (the forward's TABLE by default, read at the call, or
    BACKWARD_TABLE) that fits; ``window``: a sliding-window launch's (``Schedule.windowed``)."""
    want = target(backend)
    # a padded head dim (96) runs the rows of its tile width (128): the same tiles and memory
    width = 1 << max(0, head_dim - 1).bit_length()
    for row in TABLE if table is None else table:
        if row.backend != want:
            continue
        if row.head_dim is not None and row.head_dim != width:
            continue
        if row.causal is not None and row.causal != bool(causal):
            continue
        if row.max_seq is not None and max_seq > row.max_seq:
            continue
        return row.schedule.windowed if window and row.schedule.windowed else row.schedule
    raise LookupError(f"no attention schedule for backend {str(backend)!r}")
