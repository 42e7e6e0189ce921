"""Flash-attention forward: the single kernel source for Hopper, Ascend and the CPU.

Roles and pipes (one tile = one sequence x head x REPLICAS*BM query rows; REPLICAS = 2 unless
the schedule says otherwise):

    q_load (copy, REPLICAS) ──q_in (paired)──┐
                                               ▼
    load (copy) ──k_in, v_in──▶ mma (matrix, REPLICAS) ──s_out──▶ softmax (vector, REPLICAS)
                                     ▲                                   │
                                     └──────────────p_in─────────────────┘
                                     mma ──pv_out──▶ softmax

Replica r of mma/softmax owns query rows [m_block + r*BM, m_block + (r+1)*BM); K and V
tiles are broadcast to every replica, replica r of q_load copies replica r's Q rows (an N -> N
pipe pairs replica r with replica r), and mma holds that slot for the whole tile. The softmax
keeps the running max `m_i`, the running sum `l_i` and the output accumulator `o_acc`; PV
arrives as a fresh product and the softmax rescales: `o_acc = o_acc * alpha + pv` (the split
form, docs/design.md §5).

Placement does the rest:
* Hopper: mma and softmax share a consumer warpgroup per replica (three for d64 at 2k and
  beyond, as FA3: schedule.py), so s_out / p_in / pv_out
  are register hand-offs; the schedule passes fuse the PV product into the accumulator
  (`o_acc = mma(p, v, o_acc * alpha)`) and overlap the softmax with the next S and the
  previous PV; the load role is a 1-warp TMA producer (K and V: one ring after merge-pipes),
  and each q_load replica another: Q lands in shared memory by TMA and feeds the S wgmma from
  there, ahead of the consumer in a persistent loop (with Q_STAGES = 2, while the previous
  tile still runs) instead of a register load the consumer waits for at every tile.
* Ascend: load, q_load and mma sit on the cube core (it computes S and PV for both vector
  cores, replica after replica), the softmax on the two vector cores; s_out, p_in and
  pv_out cross cores through global-memory workspace slots and cube<->vector flags.
* CPU emulator: every role replica is a thread.

Tiles (ops.block_sizes): BM rows per replica (a tile is REPLICAS*BM rows), BN keys per step.
Hopper: BM = 64, BN = 128. Ascend (schedule.py): d128 128 rows x 512 keys in four 32-row replicas
that are sub-tiles (the subtile-replicas pass); d64 128 x 128; d256 BM = 32, BN = 64. Memory on
the Ascend 910B, measured by the ascend matrix's compiler stage (after hivm-plan-memory): each
vector core holds half the rows of each replica's tiles (sub-block binding), one replica's S and
P at a time: 179680-183712 B of its 196608 B unified buffer at d128 (d64: 141600 B); the cube
keeps Q, K and V in L1 and one replica's S or PV product in L0C (64 KB of 128 KB). The windowed
d128 kernel keeps 64 x 128 (schedule.py); 128 x 512 in two 64-row replicas does not fit (UB
307 KB, L0C 256 KB). s_out's 3 slots let Ascend's cube run QKᵀ two steps ahead (rule 8).

Sequences are addressed through cumulative lengths (`cu_q`, `cu_k`) as in
flash_attn_varlen_func; a dense batch is the special case of equal lengths. A head's
rows start at `cu[b] * cu_rows + h * head_rows` and its columns at `h * head_cols`, so
the same kernel reads [B*H*S, D] (dense: cu_rows=H, head_rows=S, head_cols=0) and packed
[total, H*D] (varlen: cu_rows=1, head_rows=0, head_cols=D) layouts. The log-sum-exp goes to row
`b * lse_batch_rows + h`, column `q_start * lse_packed + i`: [B*H, S] for dense batches,
[H, total] for packed ones.

Sliding window (WINDOW=1, flash-attn's window_size: window.py): query i sees keys i + k_len -
q_len - win_left ..= i + k_len - q_len + win_right, the extents run-time scalars. The key loop
starts at the block the tile's first row sees first (not 0) and ends after the last key its last
row sees; blocks crossing either edge of the window are masked, the others not. With WINDOW=0
its arms fold away (Triton drops an arm a constexpr turns off): the kernel compiles as without.
"""
import xsync as xs

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
INF = float("inf")


def _trace_args(settings):
    """Small launch for `xsync trace` (CPU emulator): one sequence, one head, 2*BM query
    rows (one program: both mma/softmax replicas busy) against 3*BN keys (3 K/V steps).
    Dense [B*H*S, D] layout as in ops.attention. --set overrides BM, BN, D, CAUSAL, STAGES."""
    import math

    import torch

    cx = dict(BM=16, BN=32, D=64, CAUSAL=0, STAGES=2, SCALE_POSITIVE=1)
    cx.update({k: v for k, v in settings.items() if k in cx})
    sq, sk, d = 2 * cx["BM"], 3 * cx["BN"], cx["D"]
    q = torch.randn(sq, d).bfloat16()
    k, v = torch.randn(sk, d).bfloat16(), torch.randn(sk, d).bfloat16()
    o, lse = torch.empty_like(q), torch.empty(1, sq)
    cu_q = torch.tensor([0, sq], dtype=torch.int32)
    cu_k = torch.tensor([0, sk], dtype=torch.int32)
    layout = (1, sq, 0, 1, sk, 0, 1, 0)   # heads=1: (cu_rows, head_rows, head_cols) x2, lse
    order = torch.tensor([0, 0], dtype=torch.int32)   # the one tile: pair 0, rows from 0
    args = (q, k, v, o, lse, cu_q, cu_k, order, 1.0 / math.sqrt(d), 1, 1, 1, *layout)
    return (1,), args, cx


@xs.kernel(example=dict(q=xs.bfloat16, k=xs.bfloat16, v=xs.bfloat16, o=xs.bfloat16,
                        lse=xs.float32, cu_q=xs.int32, cu_k=xs.int32, tile_order=xs.int32,
                        BM=64, BN=128, D=128, CAUSAL=1, STAGES=2), trace=_trace_args)
def attention_fwd(q, k, v, o, lse, cu_q, cu_k, tile_order, sm_scale, heads, group, tiles,
                  q_cu_rows, q_head_rows, q_head_cols, kv_cu_rows, kv_head_rows, kv_head_cols,
                  lse_batch_rows, lse_packed,
                  BM: xs.constexpr, BN: xs.constexpr, D: xs.constexpr, CAUSAL: xs.constexpr,
                  STAGES: xs.constexpr, PERSISTENT: xs.constexpr = 1, Q_STAGES: xs.constexpr = 1,
                  REPLICAS: xs.constexpr = 2, SCALE_POSITIVE: xs.constexpr = 0, D_PAD: xs.constexpr = 0,
                  WINDOW: xs.constexpr = 0, win_left=0, win_right=0):
    load = xs.role("load", kind="copy")
    q_load = xs.role("q_load", kind="copy", replicas=REPLICAS)
    mma = xs.role("mma", kind="matrix", replicas=REPLICAS)
    softmax = xs.role("softmax", kind="vector", replicas=REPLICAS)
    k_in = xs.pipe(load, mma, stages=STAGES, k=xs.tile([BN, D + D_PAD], k.dtype))
    v_in = xs.pipe(load, mma, stages=STAGES, v=xs.tile([BN, D + D_PAD], v.dtype))
    s_out = xs.pipe(mma, softmax, stages=3 - WINDOW, s=xs.tile([BM, BN], xs.float32))
    p_in = xs.pipe(softmax, mma, stages=2, p=xs.tile([BM, BN], q.dtype))
    pv_out = xs.pipe(mma, softmax, stages=2, pv=xs.tile([BM, D + D_PAD], xs.float32))
    q_in = xs.pipe(q_load, mma, stages=Q_STAGES, q=xs.tile([BM, D + D_PAD], q.dtype))

    # Tiles: with PERSISTENT, program p takes tiles p, p + P, p + 2P, ... (P = programs
    # launched); without, the one tile p (one program per tile, no loop state to carry).
    # A tile is one (sequence, head) pair and REPLICAS*BM query rows: tile i's pair and first row
    # are entries 2i and 2i + 1 of tile_order, a table of `tiles` entries the host makes
    # (tiles.py: pair by pair, or under a causal mask by work, longest first, in a snake over
    # the programs; for packed sequences from their lengths, on the device, the tiles that hold
    # rows first). Replicated in every agent: all walk the same tiles, and the pipes keep their
    # counters from tile to tile. The protocol reads the rows left from the tile's first
    # (rows_left), not the row itself: so the verifier checks every value of it, and of the key
    # count, together (a tile without rows does nothing).
    qk_scale = sm_scale * LOG2E
    for tile in xs.tile_range(tiles, persistent=PERSISTENT):
        pair = xs.load_scalar(tile_order, 2 * tile)
        m_block = xs.load_scalar(tile_order, 2 * tile + 1)
        b = pair // heads
        h = pair % heads
        kv_h = h // group
        q_start = xs.load_scalar(cu_q, b)
        q_len = xs.load_scalar(cu_q, b + 1) - q_start
        k_start = xs.load_scalar(cu_k, b)
        k_len = xs.load_scalar(cu_k, b + 1) - k_start
        q_row = q_start * q_cu_rows + h * q_head_rows
        kv_row = k_start * kv_cu_rows + kv_h * kv_head_rows
        rows_left = q_len - m_block
        if rows_left > 0:
            hi = k_len
            if CAUSAL:
                # bottom-right aligned: query i sees keys j <= i + (k_len - q_len)
                hi = xs.maximum(0, xs.minimum(k_len, k_len - rows_left + REPLICAS * BM))
            lo = 0
            if WINDOW:
                # query i sees keys i + k_len - q_len - win_left ..= i + k_len - q_len + win_right:
                # from the block the tile's first row sees first to the last key its last row sees
                lo = xs.maximum(0, k_len - rows_left - win_left) // BN * BN
                hi = xs.maximum(0, xs.minimum(hi, k_len - rows_left + REPLICAS * BM + win_right))
            with q_load:
                qs = q_in.acquire()
                qs.q = xs.load(q, [q_row + m_block + xs.replica_id() * BM, h * q_head_cols], [BM, D + D_PAD])
                q_in.commit()
            with mma:
                qt = q_in.wait()
            with softmax:
                row0 = m_block + xs.replica_id() * BM
                rows = row0 + xs.arange(0, BM)
                # key blocks from mask_from on need the mask (past k_len, or crossing the diagonal)
                mask_from = k_len
                if CAUSAL:
                    mask_from = xs.minimum(k_len, row0 + 1 + k_len - q_len)
                full_from = 0
                if WINDOW:
                    # and the blocks before full_from cross the window's left edge
                    mask_from = xs.minimum(mask_from, row0 + 1 + k_len - q_len + win_right)
                    full_from = row0 + BM + k_len - q_len - win_left
                m_i = xs.full([BM], -INF, xs.float32)
                l_i = xs.zeros([BM], xs.float32)
                o_acc = xs.zeros([BM, D + D_PAD], xs.float32)
            for n in range(lo, hi, BN):
                with load:
                    ks = k_in.acquire()
                    ks.k = xs.load(k, [kv_row + n, kv_h * kv_head_cols], [BN, D + D_PAD])
                    k_in.commit()
                    vs = v_in.acquire()
                    vs.v = xs.load(v, [kv_row + n, kv_h * kv_head_cols], [BN, D + D_PAD])
                    v_in.commit()
                with mma:
                    kt = k_in.wait()
                    s = xs.mma(qt.q, xs.trans(kt.k))
                    s = xs.mma_wait(s, pending=0)
                    k_in.release()
                    so = s_out.acquire()
                    so.s = s
                    s_out.commit()
                with softmax:
                    sc = s_out.wait()
                    # A positive scale (SCALE_POSITIVE, the host's choice) commutes with the row
                    # max: the max of the raw scores is scaled once per row and each score is
                    # scaled inside `x * qk_scale - m`, one fused multiply-add instead of a
                    # multiply and a subtract (on Hopper the d64 softmax is bound by its
                    # instruction count). A zero or negative scale scales every score first.
                    if SCALE_POSITIVE:
                        x = sc.s
                    else:
                        x = sc.s * qk_scale
                    s_out.release()
                    if WINDOW:
                        if n + BN > mask_from or n < full_from:     # an edge block of the window
                            cols = n + xs.arange(0, BN)
                            # bounds as [BM, 1] columns against [1, BN] keys: no [BM, BN] integer tile
                            keep = (cols[None, :] < k_len) & \
                                (cols[None, :] <= rows[:, None] + (k_len - q_len + win_right)) & \
                                (cols[None, :] >= rows[:, None] + (k_len - q_len - win_left))
                            if CAUSAL:
                                keep = keep & (cols[None, :] <= rows[:, None] + (k_len - q_len))
                            x = xs.where(keep, x, -INF)
                    elif n + BN > mask_from:       # a boundary block: mask; the others need none
                        cols = n + xs.arange(0, BN)
                        keep = cols[None, :] < k_len
                        if CAUSAL:
                            keep = keep & (cols[None, :] <= rows[:, None] + (k_len - q_len))
                        x = xs.where(keep, x, -INF)
                    if SCALE_POSITIVE:
                        m_new = xs.maximum(m_i, xs.max(x, 1) * qk_scale)
                    else:
                        m_new = xs.maximum(m_i, xs.max(x, 1))
                    # a row that has seen no key yet keeps its max at -inf: subtract 0 instead,
                    # so exp2 gives 0 for it rather than NaN (NaN inputs still give NaN)
                    m_use = xs.where(m_new == -INF, 0.0, m_new)
                    alpha = xs.exp2(m_i - m_use)
                    if SCALE_POSITIVE:
                        p = xs.exp2(x * qk_scale - m_use[:, None])
                    else:
                        p = xs.exp2(x - m_use[:, None])
                    l_i = l_i * alpha + xs.sum(p, 1)
                    m_i = m_new
                    po = p_in.acquire()
                    po.p = p.to(q.dtype)
                    p_in.commit()
                with mma:
                    pt = p_in.wait()
                    vt = v_in.wait()
                    pv = xs.mma(pt.p, vt.v)
                    pv = xs.mma_wait(pv, pending=0)
                    v_in.release()
                    p_in.release()
                    po2 = pv_out.acquire()
                    po2.pv = pv
                    pv_out.commit()
                with softmax:
                    pvs = pv_out.wait()
                    o_acc = o_acc * alpha[:, None] + pvs.pv
                    pv_out.release()
            with mma:
                q_in.release()
            with softmax:
                # A row that saw no key (a causal row before the first key when q is longer
                # than k, or an empty sequence of keys) has l = 0: its output is 0 and its LSE
                # +inf, as flash-attn returns them (exp(S - LSE) = 0 in a backward). NaN in
                # q, k or v propagates as in SDPA (l is NaN, not 0).
                empty = l_i == 0.0
                l_safe = xs.where(empty, 1.0, l_i)
                # one reciprocal per row, then a multiply per element (on Hopper the compiler
                # already divided once per row; written so, no backend depends on it)
                inv_l = 1.0 / l_safe
                out = xs.where(empty[:, None], 0.0, o_acc * inv_l[:, None])
                xs.store(o, [q_row + row0, h * q_head_cols], out.to(o.dtype),
                         bounds=[q_row + q_len, h * q_head_cols + D])
                lse_row = xs.where(empty, INF, (m_i + xs.log2(l_safe)) * LN2)
                lse_r = b * lse_batch_rows + h
                lse_c = q_start * lse_packed
                xs.store(lse, [lse_r, lse_c + row0], lse_row[None, :], bounds=[lse_r + 1, lse_c + q_len])
