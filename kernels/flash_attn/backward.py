"""Flash-attention backward: three kernels, each a single source for Hopper, Ascend and the CPU.

Deterministic (no atomics: the portable API has none, and a fixed summation order gives the
same gradients run after run). P is recomputed from Q, K and the forward's log-sum-exp.

1. ``attention_bwd_preprocess``: delta_i = sum_d dO_id * O_id - dLSE_i per query row (dLSE is
   the gradient reaching the LSE output; zero when only O is used). One vector role:

       grad (vector, 2 replicas): load O, dO rows -> row sums -> delta

2. ``attention_bwd_dkdv``: one tile = one (sequence, kv head) pair and REPLICAS*BM keys; it loops over
   the query heads of the kv head's group and, per head, over the query blocks that see its keys,
   so dK and dV are summed over the group inside one program (GQA/MQA without atomics):

       load (copy) ──q_in (Q and dO of BN query rows)──▶ mma (matrix, 2 replicas)
       kv_load (copy, 2 replicas) ──kv_in (the replica's K and V rows, paired)──▶ mma
       mma ──sdp (Sᵀ = K Qᵀ, dPᵀ = V dOᵀ)──▶ grad (vector, 2 replicas)
       grad ──pds (Pᵀ, dSᵀ)──▶ mma:  dV += Pᵀ dO,  dK += dSᵀ Q   (fp32 accumulators in mma)

   With FUSED_DQ=1 (grad.py's fused path) mma also computes this step's dQ share, dS K over
   its keys ([BN, D] fp32), and hands it back through a third pipe; grad reduce-adds it into
   the fp32 ``dq_acc`` (zeroed before the launch, converted after it), so no dQ kernel runs.
   The add is a vector role's (Ascend adds to GM from its vector cores), and keys past the
   sequence are masked (their K rows belong to no key of this sequence):

       mma ──dq_out (dS K)──▶ grad:  xs.store(dq_acc, ..., reduce="add")

   Replica r of mma/grad owns keys [n_block + r*BM, n_block + (r+1)*BM); query blocks are
   broadcast to both. Scores are computed transposed (keys on rows), so Pᵀ and dSᵀ are the
   A operands of the accumulating products as they stand, and the per-query LSE and delta are
   [1, BN] rows read straight from their tensors.

3. ``attention_bwd_dq``: one tile = one (sequence, head) pair and REPLICAS*BM query rows, as the
   forward; it loops over the key blocks its rows see:

       load (copy) ──k_in, v_in──▶ mma (matrix, REPLICAS: 2, Ascend d128 4 sub-tiles)
       q_load (copy, 2 replicas) ──q_in (the replica's Q and dO rows, paired)──▶ mma
       mma ──sdp (S = Q Kᵀ, dP = dO Vᵀ)──▶ grad (vector, 2 replicas)
       grad ──ds_in (dS)──▶ mma:  dQ += dS K   (fp32 accumulator in mma; the K slot is held
                                               until this product is done)

In both gradient kernels the grad role computes P = exp2(S * scale * log2 e - LSE * log2 e)
and dS = P * (dP - delta) * scale (the softmax scale is folded into dS before its 16-bit
cast, so no accumulator is rescaled), and masks only the boundary blocks: keys past the
sequence, queries past it, and under a causal mask (bottom-right aligned, as the forward:
query i sees keys j <= i + k_len - q_len) the blocks that cross the diagonal. Fully masked
blocks are never visited: the loop bounds (unannotated, so every agent runs the same trip
counts) start the dK/dV query loop at the first query block that sees the tile's first key and
stop the dQ key loop after the last key the tile's last row sees. A row whose LSE is +inf
(it saw no key) gets P = 0, so all its gradients are 0, never NaN. With a sliding window
(WINDOW=1, window.py; extents ``win_left``/``win_right`` at run time) both ends are bounded: the
dK/dV query loop runs over the query blocks that see any of the tile's keys, the dQ key loop
over the key blocks any of the tile's rows sees, and blocks crossing an edge of the window are
masked (the fused dQ share too: it is dS K of the masked P).

Placement does the rest, as for the forward: on Hopper mma and grad share a consumer warpgroup
per replica (sdp/pds/ds_in are register hand-offs; every Q/dO and K/V tile arrives by TMA in
shared memory, the tile's own rows too: kv_in and q_in are held for the whole tile, so the
wgmmas read them there and no register holds them beside the fp32 accumulators), on Ascend load and mma sit on the cube and grad on the two vector cores (sdp, pds and
ds_in cross cores through GM workspace slots and flags), on the CPU every role replica is a
thread.

Layouts are the forward's (see kernel.py): a head's rows start at ``cu[b] * cu_rows +
h * head_rows`` and its columns at ``h * head_cols``; LSE and delta live at row
``b * lse_batch_rows + h``, column ``cu_q[b] * lse_packed + i``. dQ has q's layout, dK and dV
k's. Rows past a sequence's end are never written (varlen callers zero-fill).
"""
import xsync as xs

LOG2E = 1.4426950408889634


def _trace_args(settings):
    """Small dK/dV launch for `xsync trace`: one sequence, a group of two query heads on one
    kv head, 2*BM keys (one program) against 3*BN queries."""
    import math

    import torch

    cx = dict(BM=16, BN=32, D=64, CAUSAL=0, STAGES=2)
    cx.update({k: v for k, v in settings.items() if k in cx})
    sq, sk, d, hq = 3 * cx["BN"], 2 * cx["BM"], cx["D"], 2
    q, do = torch.randn(hq * sq, d).bfloat16(), torch.randn(hq * sq, d).bfloat16()
    k, v = torch.randn(sk, d).bfloat16(), torch.randn(sk, d).bfloat16()
    lse = torch.full((hq, sq), 8.0)
    delta = torch.randn(hq, sq)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    cu_q = torch.tensor([0, sq], dtype=torch.int32)
    cu_k = torch.tensor([0, sk], dtype=torch.int32)
    layout = (hq, sq, 0, 1, sk, 0, hq, 0)
    args = (q, k, v, do, lse, delta, dk, dv, cu_q, cu_k, 1.0 / math.sqrt(d), hq, hq, 1, sk, *layout)
    return (1,), args, cx


# Hopper: no ping-pong turns between the two consumer warpgroups of dK/dV and dQ. With the
# turn barriers the verifier cannot finish dK/dV's protocol inside its step budget (20M steps,
# 33 s, not proven); without them each kernel is proven for every trip count in about 2 s.
# Users may still ask for turns with xsync.options(nv_pingpong=...).
NO_PINGPONG = {"nv_pingpong": "0"}


@xs.kernel(example=dict(o=xs.bfloat16, do=xs.bfloat16, dlse=xs.float32, delta=xs.float32,
                        cu_q=xs.int32, BM=64, D=128))
def attention_bwd_preprocess(o, do, dlse, delta, cu_q, heads, batch, max_q,
                             q_cu_rows, q_head_rows, q_head_cols, lse_batch_rows, lse_packed,
                             BM: xs.constexpr, D: xs.constexpr, PERSISTENT: xs.constexpr = 1, D_PAD: xs.constexpr = 0):
    grad = xs.role("grad", kind="vector", replicas=2)

    # Persistent tiles as in the forward: (sequence, head) pairs x blocks of 2*BM rows.
    pairs = batch * heads
    row_blocks = xs.cdiv(max_q, 2 * BM)
    for tile in xs.tile_range(row_blocks * pairs, persistent=PERSISTENT):
        b = tile % pairs // heads
        h = tile % pairs % heads
        m_block = tile // pairs * (2 * BM)
        q_start = xs.load_scalar(cu_q, b)
        q_len = xs.load_scalar(cu_q, b + 1) - q_start
        if m_block < q_len:
            with grad:
                row0 = m_block + xs.replica_id() * BM
                q_row = q_start * q_cu_rows + h * q_head_rows
                ot = xs.load(o, [q_row + row0, h * q_head_cols], [BM, D + D_PAD])
                dot = xs.load(do, [q_row + row0, h * q_head_cols], [BM, D + D_PAD])
                lse_r = b * lse_batch_rows + h
                lse_c = q_start * lse_packed
                dl = xs.load(dlse, [lse_r, lse_c + row0], [1, BM])
                rowsum = xs.sum(ot.to(xs.float32) * dot.to(xs.float32), 1)
                xs.store(delta, [lse_r, lse_c + row0], rowsum[None, :] - dl,
                         bounds=[lse_r + 1, lse_c + q_len])


@xs.kernel(example=dict(q=xs.bfloat16, k=xs.bfloat16, v=xs.bfloat16, do=xs.bfloat16,
                        lse=xs.float32, delta=xs.float32, dk=xs.bfloat16, dv=xs.bfloat16, dq_acc=xs.float32,
                        cu_q=xs.int32, cu_k=xs.int32,
                        BM=64, BN=64, D=128, CAUSAL=1, STAGES=2), trace=_trace_args,
           options=NO_PINGPONG)
def attention_bwd_dkdv(q, k, v, do, lse, delta, dk, dv, cu_q, cu_k, sm_scale, heads, group, batch,
                       max_k, q_cu_rows, q_head_rows, q_head_cols, kv_cu_rows, kv_head_rows,
                       kv_head_cols, lse_batch_rows, lse_packed,
                       BM: xs.constexpr, BN: xs.constexpr, D: xs.constexpr, CAUSAL: xs.constexpr,
                       STAGES: xs.constexpr, PERSISTENT: xs.constexpr = 1,
                       FUSED_DQ: xs.constexpr = 0, D_PAD: xs.constexpr = 0, dq_acc=None,
                       WINDOW: xs.constexpr = 0, win_left=0, win_right=0, REPLICAS: xs.constexpr = 2):
    load = xs.role("load", kind="copy")
    kv_load = xs.role("kv_load", kind="copy", replicas=REPLICAS)
    mma = xs.role("mma", kind="matrix", replicas=REPLICAS)
    grad = xs.role("grad", kind="vector", replicas=REPLICAS)
    q_in = xs.pipe(load, mma, stages=STAGES, q=xs.tile([BN, D + D_PAD], q.dtype), do=xs.tile([BN, D + D_PAD], do.dtype))
    # the tile's K and V rows, replica r's from kv_load replica r (a paired pipe), held by mma
    # for the whole tile: wgmma A operands in shared memory, not registers beside dK and dV
    kv_in = xs.pipe(kv_load, mma, stages=1, k=xs.tile([BM, D + D_PAD], k.dtype), v=xs.tile([BM, D + D_PAD], v.dtype))
    sdp = xs.pipe(mma, grad, stages=2, s=xs.tile([BM, BN], xs.float32), dp=xs.tile([BM, BN], xs.float32))
    pds = xs.pipe(grad, mma, stages=2, p=xs.tile([BM, BN], q.dtype), ds=xs.tile([BM, BN], q.dtype))
    # FUSED_DQ: this replica's share of dQ for the step's query rows (dS K over its BM keys),
    # back to the grad replica, which reduce-adds it into fp32 dq_acc (a vector role: Ascend
    # adds from its vector cores only)
    dq_out = xs.pipe(mma, grad, stages=2, dq=xs.tile([BN, D + D_PAD], xs.float32))

    # Persistent tiles: (sequence, kv head) pairs x blocks of 2*BM keys, numbered from the first
    # key block (under a causal mask the first keys are seen by the most queries: longest first).
    kv_heads = heads // group
    pairs = batch * kv_heads
    col_blocks = xs.cdiv(max_k, xs.num_replicas(mma) * BM)
    qk_scale = sm_scale * LOG2E
    for tile in xs.tile_range(col_blocks * pairs, persistent=PERSISTENT):
        b = tile % pairs // kv_heads
        kv_h = tile % pairs % kv_heads
        n_block = tile // pairs * (xs.num_replicas(mma) * BM)
        q_start = xs.load_scalar(cu_q, b)
        q_len = xs.load_scalar(cu_q, b + 1) - q_start
        k_start = xs.load_scalar(cu_k, b)
        k_len = xs.load_scalar(cu_k, b + 1) - k_start
        kv_row = k_start * kv_cu_rows + kv_h * kv_head_rows
        if n_block < k_len:
            lo = 0
            if CAUSAL:
                # the first query block that sees key n_block (query i sees j <= i + k_len - q_len)
                lo = xs.maximum(0, n_block - (k_len - q_len)) // BN * BN
            q_hi = q_len
            if WINDOW:
                # key j is seen by queries j - (k_len - q_len) - win_right ..= j - (k_len - q_len) + win_left
                lo = xs.maximum(lo, n_block - (k_len - q_len) - win_right) // BN * BN
                q_hi = xs.maximum(0, xs.minimum(q_len, n_block + xs.num_replicas(mma) * BM - (k_len - q_len) + win_left))
            with kv_load:
                kvs = kv_in.acquire()
                kvs.k = xs.load(k, [kv_row + n_block + xs.replica_id() * BM, kv_h * kv_head_cols], [BM, D + D_PAD])
                kvs.v = xs.load(v, [kv_row + n_block + xs.replica_id() * BM, kv_h * kv_head_cols], [BM, D + D_PAD])
                kv_in.commit()
            with mma:
                key0 = n_block + xs.replica_id() * BM
                kvt = kv_in.wait()
                dk_acc = xs.zeros([BM, D + D_PAD], xs.float32)
                dv_acc = xs.zeros([BM, D + D_PAD], xs.float32)
            with grad:
                keys = n_block + xs.replica_id() * BM + xs.arange(0, BM)
                # query blocks starting before mask_until cross the diagonal of these keys
                mask_until = 0
                if CAUSAL:
                    mask_until = n_block + (xs.replica_id() + 1) * BM - 1 - (k_len - q_len)
                # query blocks ending past q_end cross the end of the sequence (or the window's
                # left edge, seen from the keys)
                q_end = q_len
                if WINDOW:
                    # key j is seen by queries i with j - hi_d <= i <= j - lo_d (the window's offsets
                    # from the diagonal, computed once: fewer live scalars beside dK and dV)
                    lo_d = k_len - q_len - win_left
                    hi_d = k_len - q_len + win_right
                    mask_until = n_block + (xs.replica_id() + 1) * BM - 1 - hi_d
                    q_end = xs.minimum(q_len, n_block + xs.replica_id() * BM + 1 - lo_d)
                # FUSED_DQ: keys past the sequence must not add to dQ (their K rows are another
                # sequence's, or zeros); dK and dV need no such mask (their rows are not stored)
                keys_end = 0
                if FUSED_DQ:
                    keys_end = n_block + (xs.replica_id() + 1) * BM
            # every query head that shares this kv head, then every query block that sees
            # these keys: dK and dV are summed over the group in a fixed order
            for g in range(0, group):
                h = kv_h * group + g
                q_row = q_start * q_cu_rows + h * q_head_rows
                lse_r = b * lse_batch_rows + h
                lse_c = q_start * lse_packed
                for m in range(lo, q_hi, BN):
                    with load:
                        qo = q_in.acquire()
                        qo.q = xs.load(q, [q_row + m, h * q_head_cols], [BN, D + D_PAD])
                        qo.do = xs.load(do, [q_row + m, h * q_head_cols], [BN, D + D_PAD])
                        q_in.commit()
                    with mma:
                        qt = q_in.wait()
                        st = xs.mma(kvt.k, xs.trans(qt.q))
                        st = xs.mma_wait(st, pending=0)
                        dpt = xs.mma(kvt.v, xs.trans(qt.do))
                        dpt = xs.mma_wait(dpt, pending=0)
                        so = sdp.acquire()
                        so.s = st
                        so.dp = dpt
                        sdp.commit()
                    with grad:
                        sc = sdp.wait()
                        lse_t = xs.load(lse, [lse_r, lse_c + m], [1, BN])
                        delta_t = xs.load(delta, [lse_r, lse_c + m], [1, BN])
                        p = xs.exp2(sc.s * qk_scale - lse_t * LOG2E)
                        if m + BN > q_end or m < mask_until or keys_end > k_len:   # a boundary: mask
                            cols = m + xs.arange(0, BN)
                            keep = cols[None, :] < q_len
                            if CAUSAL:
                                keep = keep & (keys[:, None] <= cols[None, :] + (k_len - q_len))
                            if WINDOW:
                                keep = keep & (keys[:, None] <= cols[None, :] + hi_d) & (keys[:, None] >= cols[None, :] + lo_d)
                            if FUSED_DQ:
                                keep = keep & (keys[:, None] < k_len)
                            p = xs.where(keep, p, 0.0)
                        ds = p * (sc.dp - delta_t) * sm_scale
                        sdp.release()
                        po = pds.acquire()
                        po.p = p.to(q.dtype)
                        po.ds = ds.to(q.dtype)
                        pds.commit()
                    with mma:
                        pt = pds.wait()
                        dv_acc = xs.mma(pt.p, qt.do, dv_acc)
                        dv_acc = xs.mma_wait(dv_acc, pending=0)
                        dk_acc = xs.mma(pt.ds, qt.q, dk_acc)
                        dk_acc = xs.mma_wait(dk_acc, pending=0)
                        if FUSED_DQ:
                            dq_part = xs.mma(xs.trans(pt.ds), kvt.k)
                            dq_part = xs.mma_wait(dq_part, pending=0)
                            dqo = dq_out.acquire()
                            dqo.dq = dq_part
                            dq_out.commit()
                        pds.release()
                        q_in.release()
                    if FUSED_DQ:
                        with grad:
                            dqi = dq_out.wait()
                            xs.store(dq_acc, [q_row + m, h * q_head_cols], dqi.dq, reduce="add",
                                     bounds=[q_row + q_len, h * q_head_cols + D])
                            dq_out.release()
            with mma:
                kv_in.release()
                xs.store(dk, [kv_row + key0, kv_h * kv_head_cols], dk_acc.to(dk.dtype),
                         bounds=[kv_row + k_len, kv_h * kv_head_cols + D])
                xs.store(dv, [kv_row + key0, kv_h * kv_head_cols], dv_acc.to(dv.dtype),
                         bounds=[kv_row + k_len, kv_h * kv_head_cols + D])


@xs.kernel(example=dict(q=xs.bfloat16, k=xs.bfloat16, v=xs.bfloat16, do=xs.bfloat16,
                        lse=xs.float32, delta=xs.float32, dq=xs.bfloat16,
                        cu_q=xs.int32, cu_k=xs.int32,
                        BM=64, BN=128, D=128, CAUSAL=1, STAGES=2), options=NO_PINGPONG)
def attention_bwd_dq(q, k, v, do, lse, delta, dq, cu_q, cu_k, sm_scale, heads, group, batch, max_q,
                     q_cu_rows, q_head_rows, q_head_cols, kv_cu_rows, kv_head_rows, kv_head_cols,
                     lse_batch_rows, lse_packed,
                     BM: xs.constexpr, BN: xs.constexpr, D: xs.constexpr, CAUSAL: xs.constexpr,
                     STAGES: xs.constexpr, PERSISTENT: xs.constexpr = 1, D_PAD: xs.constexpr = 0,
                     WINDOW: xs.constexpr = 0, win_left=0, win_right=0, REPLICAS: xs.constexpr = 2):
    load = xs.role("load", kind="copy")
    q_load = xs.role("q_load", kind="copy", replicas=REPLICAS)
    mma = xs.role("mma", kind="matrix", replicas=REPLICAS)
    grad = xs.role("grad", kind="vector", replicas=REPLICAS)
    # the tile's Q and dO rows, paired per replica and held for the whole tile (as kv_in above)
    q_in = xs.pipe(q_load, mma, stages=1, q=xs.tile([BM, D + D_PAD], q.dtype), do=xs.tile([BM, D + D_PAD], do.dtype))
    k_in = xs.pipe(load, mma, stages=STAGES, k=xs.tile([BN, D + D_PAD], k.dtype))
    v_in = xs.pipe(load, mma, stages=STAGES, v=xs.tile([BN, D + D_PAD], v.dtype))
    sdp = xs.pipe(mma, grad, stages=2, s=xs.tile([BM, BN], xs.float32), dp=xs.tile([BM, BN], xs.float32))
    ds_in = xs.pipe(grad, mma, stages=2, ds=xs.tile([BM, BN], q.dtype))

    # Persistent tiles as the forward's: (sequence, head) pairs x 2*BM query rows, numbered
    # from the last row block (under a causal mask the last rows see the most keys).
    pairs = batch * heads
    row_blocks = xs.cdiv(max_q, xs.num_replicas(mma) * BM)
    qk_scale = sm_scale * LOG2E
    for tile in xs.tile_range(row_blocks * pairs, persistent=PERSISTENT):
        b = tile % pairs // heads
        h = tile % pairs % heads
        kv_h = h // group
        m_block = (row_blocks - 1 - tile // pairs) * (xs.num_replicas(mma) * BM)
        q_start = xs.load_scalar(cu_q, b)
        q_len = xs.load_scalar(cu_q, b + 1) - q_start
        k_start = xs.load_scalar(cu_k, b)
        k_len = xs.load_scalar(cu_k, b + 1) - k_start
        q_row = q_start * q_cu_rows + h * q_head_rows
        kv_row = k_start * kv_cu_rows + kv_h * kv_head_rows
        if m_block < q_len:
            hi = k_len
            if CAUSAL:
                # the last key the tile's last row sees, bottom-right aligned
                hi = xs.maximum(0, xs.minimum(k_len, m_block + xs.num_replicas(mma) * BM + k_len - q_len))
            lo = 0
            if WINDOW:
                # the first key the tile's first row sees, the last its last row sees (as the forward)
                lo = xs.maximum(0, m_block + k_len - q_len - win_left) // BN * BN
                hi = xs.maximum(0, xs.minimum(hi, m_block + xs.num_replicas(mma) * BM + k_len - q_len + win_right))
            with q_load:
                qs = q_in.acquire()
                qs.q = xs.load(q, [q_row + m_block + xs.replica_id() * BM, h * q_head_cols], [BM, D + D_PAD])
                qs.do = xs.load(do, [q_row + m_block + xs.replica_id() * BM, h * q_head_cols], [BM, D + D_PAD])
                q_in.commit()
            with mma:
                row0 = m_block + xs.replica_id() * BM
                qt = q_in.wait()
                dq_acc = xs.zeros([BM, D + D_PAD], xs.float32)
            with grad:
                rows = m_block + xs.replica_id() * BM + xs.arange(0, BM)
                # key blocks from mask_from on need the mask (past k_len, or crossing the diagonal)
                mask_from = k_len
                if CAUSAL:
                    mask_from = xs.minimum(k_len, m_block + xs.replica_id() * BM + 1 + k_len - q_len)
                full_from = 0
                if WINDOW:
                    # and the blocks before full_from cross the window's left edge
                    mask_from = xs.minimum(mask_from, m_block + xs.replica_id() * BM + 1 + k_len - q_len + win_right)
                    full_from = m_block + (xs.replica_id() + 1) * BM + k_len - q_len - win_left
                lse_r = b * lse_batch_rows + h
                lse_c = q_start * lse_packed + m_block + xs.replica_id() * BM
                # [1, BM] rows of the LSE and delta tensors as [BM] vectors (a sum over one row)
                lse_i = xs.sum(xs.load(lse, [lse_r, lse_c], [1, BM]), 0) * LOG2E
                delta_i = xs.sum(xs.load(delta, [lse_r, lse_c], [1, BM]), 0)
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
                    vt = v_in.wait()
                    dp = xs.mma(qt.do, xs.trans(vt.v))
                    dp = xs.mma_wait(dp, pending=0)
                    v_in.release()
                    so = sdp.acquire()
                    so.s = s
                    so.dp = dp
                    sdp.commit()
                with grad:
                    sc = sdp.wait()
                    p = xs.exp2(sc.s * qk_scale - lse_i[:, None])
                    if WINDOW:
                        if n + BN > mask_from or n < full_from:     # an edge block of the window
                            cols = n + xs.arange(0, BN)
                            # bounds as [BM, 1] columns against [1, BN] keys: no [BM, BN] integer tile
                            keep = (cols[None, :] < k_len) & \
                                (cols[None, :] <= rows[:, None] + (k_len - q_len + win_right)) & \
                                (cols[None, :] >= rows[:, None] + (k_len - q_len - win_left))
                            if CAUSAL:
                                keep = keep & (cols[None, :] <= rows[:, None] + (k_len - q_len))
                            p = xs.where(keep, p, 0.0)
                    elif n + BN > mask_from:       # a boundary block: mask; the others need none
                        cols = n + xs.arange(0, BN)
                        keep = cols[None, :] < k_len
                        if CAUSAL:
                            keep = keep & (cols[None, :] <= rows[:, None] + (k_len - q_len))
                        p = xs.where(keep, p, 0.0)
                    ds = p * (sc.dp - delta_i[:, None]) * sm_scale
                    sdp.release()
                    dso = ds_in.acquire()
                    dso.ds = ds.to(q.dtype)
                    ds_in.commit()
                with mma:
                    dst = ds_in.wait()
                    dq_acc = xs.mma(dst.ds, kt.k, dq_acc)
                    dq_acc = xs.mma_wait(dq_acc, pending=0)
                    ds_in.release()
                    k_in.release()
            with mma:
                q_in.release()
                xs.store(dq, [q_row + row0, h * q_head_cols], dq_acc.to(dq.dtype),
                         bounds=[q_row + q_len, h * q_head_cols + D])
