"""Ascend attention cost model: time on paper for a cube + vector flash-attention design, with
the GM workspaces' L2 residency modelled explicitly (issue 40, deliverable 1).

No NPU is reachable from this project, so Ascend speed is estimated. This module holds the
hardware facts (:class:`Chip`, each with its source), the few factors no document gives
(:class:`Calibration`, fitted on published measurements by
``xsync.backends.ascend.cost_published.fit``), a design description (:class:`Design`: tile
shape, hand-off dtypes, ring depth, flags, workspace scope) and the model
(:func:`step_costs`, :func:`estimate`). :func:`design_from_lowered` reads a design from an
xsync kernel lowered for Ascend (its workspace rings, pipes, passes and the statements of its
step loop); ``cost_published`` describes the published kernels from their sources.

The model, per step of one AI core (``rows`` query rows x ``keys`` keys; the cube plus two
vector cores, each vector core holding ``rows / 2``):

* **cube pipes**, each its own queue, overlapped by multi-buffering inside the core: M (the
  mmad FLOPs at ``Chip.cube_flops_per_cycle`` x ``Calibration.cube_eff``), MTE1 (operands
  L1 -> L0A/L0B; K/V once per mmad group), MTE2 (K, V and P into L1), FIXP (S and PV out of
  L0C to the GM workspace). Cube time = the slowest pipe + its flag operations.
* **vector pipes** (one vector core): MTE2 (its half of S and PV in), V (elementwise ops at
  64 fp32 lanes a cycle x ``vec_eff``), MTE3 (its half of P out).
* **software pipeline**: with the cube issuing QKᵀ ``lookahead`` steps ahead of the softmax it
  waits on, a step costs max(cube, vector, recurrence / (lookahead + 1)), where the
  recurrence is the latency of one step through both sides (S out, the softmax, P back, PV,
  plus two flag hand-offs of ``sync_us``). ``lookahead = 0`` is the serialized schedule.
* **memory**: every hand-off is written once and read once. The workspaces stay in L2 while
  the live footprint (active programs x workspace) fits L2 beside the K/V working set; else
  the excess goes to HBM every step. Workspaces addressed per block (not per core) leave
  their distinct footprint past L2 to be written back once. Chip-wide, a step cannot be
  shorter than its L2 bytes x active cores over the L2 bandwidth (5 x HBM); the kernel cannot
  be shorter than its HBM bytes (inputs, outputs, spilled workspace) over the HBM bandwidth.
* **kernel**: host/launch overhead + waves x (pipeline fill + Q load + O store) + the steps
  of the busiest core x the step time. Waves = ceil(blocks / cores); a causal mask halves
  the steps (balanced tile orders assumed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from xsync.backends.ascend import memory

VEC_LANES_FP32 = 64     # a vector core's 256-byte vector unit: 64 fp32 (128 fp16) lanes a cycle


@dataclass(frozen=True)
class Chip:
    """Documented facts of one Ascend part (per chip or die; per AI core where said)."""

    name: str
    ai_cores: int                  # cube cores (each with 2 vector cores: "1C2V")
    freq_ghz: float
    hbm_tb_s: float
    cube_flops_per_cycle: int = 2 * 16 * 16 * 16   # one 16x16x16 fp16/bf16 fractal MAC a cycle
    vector_cores_per_ai_core: int = 2
    ub_bytes: int = memory.UB_BYTES
    l1_bytes: int = memory.L1_BYTES
    l0a_bytes: int = 64 * 1024
    l0b_bytes: int = 64 * 1024
    l0c_bytes: int = memory.L0C_BYTES
    l2_bytes: int = 192 * 1024 * 1024
    l2_over_hbm: float = 5.0       # L2 bandwidth / HBM bandwidth
    mte1_bytes_per_cycle: int = 256   # L1 -> L0A/L0B (assumed: not documented, not calibrated)
    source: str = ""

    @property
    def peak_tflops(self) -> float:
        return self.ai_cores * self.cube_flops_per_cycle * self.freq_ghz * 1e9 / 1e12

    @property
    def hz(self) -> float:
        return self.freq_ghz * 1e9

    @property
    def l2_tb_s(self) -> float:
        return self.hbm_tb_s * self.l2_over_hbm


# Sources of the capacities (every part here is a dav-c220 AI core):
#   UB 192 KB, L1 512 KB, L0A/L0B 64 KB, L0C 128 KB, L2 192 MB, L2 bandwidth 5x HBM:
#   Huawei's ascend-boost-comm ``example/ops/include/hardware.h`` (HardwareInfo<ASCEND_V220>:
#   l2BW = 5, hbmBW = 1, l2Size = 192 MiB, ubSize, l1Size, l0{A,B,C}Size); the same figures
#   as the HIVM compiler's plan-memory limits (memory.py).
#   Cube: 16x16x16 fp16 MACs a cycle (4096 MAC, 8192 FLOP) per AI core.
CHIPS = {
    "910B2": Chip(
        "Ascend 910B2", ai_cores=24, freq_ghz=1.8, hbm_tb_s=1.6,
        source="24 AI cores at 1.8 GHz: 24 x 8192 x 1.8e9 = 353.9 TFLOP/s, the peak behind "
               "hw-native-sys/pto-isa kernels/manual/common/flash_atten/README.md's utilisation "
               "column (168.50 TFLOP/s = 47.61 %); HBM 1.6 TB/s (the public figure the earlier "
               "table used; not checked against a Huawei datasheet here)"),
    "910B3": Chip(
        "Ascend 910B3", ai_cores=20, freq_ghz=1.8, hbm_tb_s=1.6,
        source="20 AI cores (as commonly reported; not verified here), clock assumed as 910B2; the same GM "
               "bandwidth as B1/B2 (pto-isa flash_atten README: only 910B4 has half); no "
               "published attention measurement on it: not calibrated"),
    "A3": Chip(
        "Ascend 910_93 (A3), one die", ai_cores=24, freq_ghz=1.8, hbm_tb_s=1.6,
        source="24 AI cores per die (tilelang-ascend fa_opt expert kernel: NUM_CORES = 24, "
               "measured on A3); clock and per-die HBM assumed as 910B2"),
}


@dataclass(frozen=True)
class Calibration:
    """The factors no document gives, fitted on the published measurements
    (``cost_published.fit``; the residuals in benchmarks/results/ascend_cost_fit.json)."""

    mte2_bytes_per_cycle: float    # GM/L2 -> L1/UB per MTE2 (and MTE3) queue
    fixp_bytes_per_cycle: float    # L0C -> GM through FIXP (fp32 out: the cube's store)
    vec_eff: float                 # achieved share of 64 fp32 lanes a cycle on the softmax
    cube_eff: float                # achieved share of the mmad peak (L0 fill, fractal edges)
    sync_us: float                 # latency of one cross-core flag hand-off (set -> wait)
    flag_us: float                 # issue cost of one flag op (set or wait) on its core


# Fitted by cost_published.fit() on the measurements of cost_published.MEASUREMENTS.
CALIBRATION = Calibration(mte2_bytes_per_cycle=128.0, fixp_bytes_per_cycle=48.0, vec_eff=0.7,
                          cube_eff=0.9, sync_us=1.0, flag_us=0.15)


@dataclass(frozen=True)
class Design:
    """One flash-attention forward design, as the model sees it."""

    name: str
    rows: int                      # query rows per block (per AI core step)
    keys: int                      # keys per step
    d: int = 128
    in_bytes: int = 2              # Q/K/V element
    s_bytes: int = 4               # S hand-off element (cube -> vector)
    p_bytes: int = 2               # P hand-off element (vector -> cube)
    o_bytes: int = 4               # PV hand-off element (cube -> vector)
    o_trips: int = 1               # times the [rows, d] tile crosses a step (2: a round trip)
    mmad_groups: int = 1           # separate mmad groups per step (replicas reload K/V to L0B)
    lookahead: int = 1             # steps the cube's QKᵀ runs ahead (0: serialized)
    slots: int = 2                 # ring depth (GM slots per pipe)
    cube_flag_ops: float = 6.0     # flag sets + waits per step on the cube
    vec_flag_ops: float = 6.0      # ... on one vector core
    ops_per_score: float = 6.0     # vector ops per score element per step
    ops_per_out: float = 2.0       # vector ops per output element per step
    ws_bytes: int = 0              # GM workspace per program (ws_per_block: per block)
    ws_per_block: bool = False     # the workspace is addressed by block, not by core
    persistent: bool = True        # one program per core walks the blocks
    host_us: float = 0.0           # launch / framework overhead (from the smallest published run)
    traffic: dict | None = None    # bytes per step per queue, read from a lowered kernel
    flops_per_step: float | None = None   # cube FLOPs per step (None: 4 rows keys d)
    vec_elems_per_step: float | None = None   # vector element ops per step, one vector core
    note: str = ""
    source: str = ""

    def step_bytes(self) -> dict:
        """Bytes one step moves per queue (cube MTE2/FIXP, one vector core's MTE2/MTE3)."""
        if self.traffic is not None:
            return dict(self.traffic)
        r, k, d = self.rows, self.keys, self.d
        half = r / 2
        return {
            "cube_mte2": 2 * k * d * self.in_bytes + r * k * self.p_bytes
            + (self.o_trips - 1) * r * d * self.o_bytes,
            "cube_fixp": r * k * self.s_bytes + r * d * self.o_bytes,
            "vec_mte2": half * k * self.s_bytes + half * d * self.o_bytes,
            "vec_mte3": half * k * self.p_bytes + (self.o_trips - 1) * half * d * self.o_bytes,
            "cube_mte1": self.mmad_groups * 2 * k * d * self.in_bytes
            + r * k * self.in_bytes + r * d * self.in_bytes,
        }


@dataclass(frozen=True)
class Problem:
    batch: int
    heads: int
    seq: int
    d: int = 128
    causal: bool = False
    kv_heads: int | None = None     # grouped-query attention (None: = heads)
    cores: int | None = None        # cores used (None: the chip's)
    q_seq: int | None = None        # query rows when not ``seq`` (keys)

    @property
    def queries(self) -> int:
        return self.q_seq or self.seq

    @property
    def flops(self) -> float:
        f = 4.0 * self.batch * self.heads * self.queries * self.seq * self.d
        return f / 2 if self.causal else f


def step_costs(dsn: Design, chip: Chip, cal: Calibration = CALIBRATION) -> dict:
    """The per-step time of each queue (µs), the recurrence, and the step time of one core."""
    hz = chip.hz
    b = dsn.step_bytes()
    us = 1e6
    flops = dsn.flops_per_step or 4 * dsn.rows * dsn.keys * dsn.d
    m = flops / (chip.cube_flops_per_cycle * hz * cal.cube_eff) * us
    mte1 = b["cube_mte1"] / (chip.mte1_bytes_per_cycle * hz) * us
    cube_mte2 = b["cube_mte2"] / (cal.mte2_bytes_per_cycle * hz) * us
    fixp = b["cube_fixp"] / (cal.fixp_bytes_per_cycle * hz) * us
    ops = dsn.vec_elems_per_step or \
        dsn.rows / 2 * (dsn.keys * dsn.ops_per_score + dsn.d * dsn.ops_per_out)
    vec = ops / (VEC_LANES_FP32 * hz * cal.vec_eff) * us
    vec_mte2 = b["vec_mte2"] / (cal.mte2_bytes_per_cycle * hz) * us
    vec_mte3 = b["vec_mte3"] / (cal.mte2_bytes_per_cycle * hz) * us
    cube = max(m, mte1, cube_mte2, fixp) + dsn.cube_flag_ops * cal.flag_us
    vector = max(vec, vec_mte2, vec_mte3) + dsn.vec_flag_ops * cal.flag_us
    # one step through both sides: QKᵀ, S out, S in, softmax, P out, P in, PV, PV out, + 2 hand-offs
    recurrence = m + fixp + vec_mte2 + vec + vec_mte3 + cube_mte2 + 2 * cal.sync_us
    pipelined = recurrence / (dsn.lookahead + 1)
    step = max(cube, vector, pipelined)
    bound = max((cube, "cube"), (vector, "vector"), (pipelined, "recurrence"))[1]
    l2_bytes = b["cube_mte2"] + b["cube_fixp"] + 2 * (b["vec_mte2"] + b["vec_mte3"])
    handoff = 2 * (b["cube_fixp"] + 2 * b["vec_mte3"])       # the workspaces: written + read
    return {"cube_mmad_us": m, "cube_mte1_us": mte1, "cube_mte2_us": cube_mte2, "cube_fixp_us": fixp,
            "vector_us": vec, "vec_mte2_us": vec_mte2, "vec_mte3_us": vec_mte3,
            "cube_us": cube, "vec_core_us": vector, "recurrence_us": recurrence,
            "pipelined_us": pipelined, "step_us": step, "bound": bound,
            "l2_bytes": l2_bytes, "handoff_bytes": handoff, "cube_flops": flops,
            "flags_us": max(dsn.cube_flag_ops, dsn.vec_flag_ops) * cal.flag_us}


def _steps_per_core(dsn: Design, p: Problem, cores: int) -> tuple[float, int, int]:
    """(steps of the busiest core, blocks, waves)."""
    per_head = math.ceil(p.queries / dsn.rows)
    blocks = p.batch * p.heads * per_head
    steps_full = math.ceil(p.seq / dsn.keys)
    waves = math.ceil(blocks / cores)
    if not p.causal:
        return waves * steps_full, blocks, waves
    # causal: block i (of per_head) sees (i + 1) * rows keys; balanced orders spread the work
    total = p.batch * p.heads * sum(math.ceil((i + 1) * dsn.rows / dsn.keys) for i in range(per_head))
    return max(total / cores, steps_full), blocks, waves


def l2_residency(dsn: Design, p: Problem, chip: Chip, cores: int, blocks: int) -> dict:
    """Where the workspaces live: the live footprint against L2 beside K/V, and the bytes
    written back to HBM once (distinct per-block addresses past L2)."""
    # blocks are taken head by head (the tile orders of the kernels modelled): the K/V of the
    # heads the active cores work on at once (+ the next one) are the live working set
    kv_heads = p.kv_heads or p.heads
    per_kv_head = max(blocks // max(p.batch * kv_heads, 1), 1)
    heads_live = min(p.batch * kv_heads, math.ceil(min(blocks, cores) / per_kv_head) + 1)
    kv_live = heads_live * 2 * p.seq * p.d * dsn.in_bytes
    avail = max(chip.l2_bytes - kv_live, 0)
    units = min(blocks, cores)
    live = units * dsn.ws_bytes
    spill_share = 0.0 if live <= avail else 1.0 - avail / live
    distinct = (blocks if dsn.ws_per_block else units) * dsn.ws_bytes
    return {"ws_live_bytes": live, "l2_avail_bytes": avail, "ws_spill_share": spill_share,
            "ws_distinct_bytes": distinct, "ws_writeback_bytes": max(0, distinct - avail),
            "kv_live_bytes": kv_live}


def estimate(dsn: Design, p: Problem, chip: Chip, cal: Calibration = CALIBRATION,
             l2_resident: bool = True) -> dict:
    """Estimated time and TFLOP/s of ``dsn`` on ``p``, with the breakdown. ``l2_resident=False``
    is the old assumption (every hand-off written to and read back from HBM)."""
    dsn = replace(dsn, d=p.d)
    if dsn.traffic is None and (dsn.keys > p.seq or dsn.rows > p.queries):
        # a sequence shorter than the tile: the tile shrinks to it (formula designs only)
        dsn = replace(dsn, keys=min(dsn.keys, p.seq), rows=min(dsn.rows, p.queries))
    cores = min(p.cores or chip.ai_cores, chip.ai_cores)
    st = step_costs(dsn, chip, cal)
    steps, blocks, waves = _steps_per_core(dsn, p, cores)
    active = min(blocks, cores)
    res = l2_residency(dsn, p, chip, cores, blocks)
    if not l2_resident:
        res["ws_spill_share"] = 1.0
    # chip-wide: L2 bandwidth shared by the active cores; spilled per-step hand-offs go to HBM
    l2_step = st["l2_bytes"] * active / (chip.l2_tb_s * 1e12) * 1e6
    # a spilled hand-off is written to HBM and read back from it: both cross HBM
    hbm_step = st["handoff_bytes"] * res["ws_spill_share"] * active / (chip.hbm_tb_s * 1e12) * 1e6
    step = max(st["step_us"], l2_step, hbm_step)
    bound = st["bound"] if step == st["step_us"] else ("L2" if l2_step >= hbm_step else "HBM")
    hz = chip.hz
    qo = 2 * dsn.rows * p.d * dsn.in_bytes / (cal.mte2_bytes_per_cycle * hz) * 1e6
    fill = st["recurrence_us"] + qo
    core_us = waves * fill + steps * step
    kv_heads = p.kv_heads or p.heads
    hbm_bytes = (p.batch * p.d * dsn.in_bytes * (2 * p.queries * p.heads + 2 * p.seq * kv_heads)
                 + res["ws_writeback_bytes"])
    hbm_us = hbm_bytes / (chip.hbm_tb_s * 1e12) * 1e6
    total = dsn.host_us + max(core_us, hbm_us)
    return {"design": dsn.name, "chip": chip.name, "seq": p.seq, "batch": p.batch,
            "heads": p.heads, "causal": p.causal, "cores": cores, "blocks": blocks,
            "waves": waves, "steps_per_core": steps, "step_us": step, "step_bound": bound,
            "l2_step_us": l2_step, "hbm_step_us": hbm_step, "fill_us": fill,
            "hbm_us": hbm_us, "host_us": dsn.host_us, "est_us": total,
            "est_tflops": p.flops / (total * 1e-6) / 1e12, "step": st, "l2": res}
