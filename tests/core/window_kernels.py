"""Sliding-window attention adapted from the flagship forward (about 15 changed lines), the
family whose proofs once depended on spelling (issue 34): the window a run-time scalar
(``WINDOW=0``) or any constant, the key range written from the rows left in the tile
(``LENGTHS=0``) or from ``q_len``/``k_len`` (``LENGTHS=1``). ``window_attention`` is correct and
must be proven on every placement; ``window_attention_release_in_edge`` moves ``s_out.release()``
into the edge-block branch (a deadlock once a block lies wholly inside the window) and must be
rejected with a counterexample on every placement."""
import xsync as xs

INF = float("inf")
EXAMPLE = dict(q=xs.bfloat16, k=xs.bfloat16, v=xs.bfloat16, o=xs.bfloat16, cu_q=xs.int32,
               cu_k=xs.int32, tile_order=xs.int32, BM=64, BN=128, D=64, STAGES=2, WINDOW=0, LENGTHS=0)


@xs.kernel(example=EXAMPLE)
def window_attention(q, k, v, o, cu_q, cu_k, tile_order, sm_scale, window, tiles,
                     BM: xs.constexpr, BN: xs.constexpr, D: xs.constexpr, STAGES: xs.constexpr,
                     WINDOW: xs.constexpr, LENGTHS: xs.constexpr):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix", replicas=2)
    softmax = xs.role("softmax", kind="vector", replicas=2)
    k_in = xs.pipe(load, mma, stages=STAGES, k=xs.tile([BN, D], k.dtype))
    v_in = xs.pipe(load, mma, stages=STAGES, v=xs.tile([BN, D], v.dtype))
    s_out = xs.pipe(mma, softmax, stages=2, s=xs.tile([BM, BN], xs.float32))
    p_in = xs.pipe(softmax, mma, stages=2, p=xs.tile([BM, BN], q.dtype))
    pv_out = xs.pipe(mma, softmax, stages=2, pv=xs.tile([BM, D], xs.float32))
    w = window
    if WINDOW:
        w = WINDOW
    for tile in xs.tile_range(tiles, persistent=1):
        m_block = xs.load_scalar(tile_order, tile)
        q_len = xs.load_scalar(cu_q, 1)
        k_len = xs.load_scalar(cu_k, 1)
        rows_left = q_len - m_block
        if rows_left > 0:
            # query i sees keys j with i - w < j - (k_len - q_len) <= i
            if LENGTHS:
                hi = xs.maximum(0, xs.minimum(k_len, m_block + 2 * BM + k_len - q_len))
                lo = xs.maximum(0, m_block + k_len - q_len - w + 1)
            else:
                hi = xs.maximum(0, xs.minimum(k_len, k_len - rows_left + 2 * BM))
                lo = xs.maximum(0, k_len - rows_left - w + 1)
            lo = lo // BN * BN
            with mma:
                qt = xs.load(q, [m_block + xs.replica_id() * BM, 0], [BM, D])
            with softmax:
                row0 = m_block + xs.replica_id() * BM
                rows = row0 + xs.arange(0, BM)
                mask_from = xs.minimum(k_len, row0 + 1 + k_len - q_len)
                full_from = row0 + BM + k_len - q_len - w + 1
                m_i = xs.full([BM], -INF, xs.float32)
                l_i = xs.zeros([BM], xs.float32)
                o_acc = xs.zeros([BM, D], xs.float32)
            for n in range(lo, hi, BN):
                with load:
                    ks = k_in.acquire()
                    ks.k = xs.load(k, [n, 0], [BN, D])
                    k_in.commit()
                    vs = v_in.acquire()
                    vs.v = xs.load(v, [n, 0], [BN, D])
                    v_in.commit()
                with mma:
                    kt = k_in.wait()
                    s = xs.mma(qt, xs.trans(kt.k))
                    s = xs.mma_wait(s, pending=0)
                    k_in.release()
                    so = s_out.acquire()
                    so.s = s
                    s_out.commit()
                with softmax:
                    sc = s_out.wait()
                    x = sc.s * sm_scale
                    s_out.release()
                    if n + BN > mask_from or n < full_from:      # an edge block: mask
                        cols = n + xs.arange(0, BN)
                        d = rows[:, None] + (k_len - q_len) - cols[None, :]
                        x = xs.where((cols[None, :] < k_len) & (d >= 0) & (d < w), x, -INF)
                    m_new = xs.maximum(m_i, xs.max(x, 1))
                    m_use = xs.where(m_new == -INF, 0.0, m_new)
                    alpha = xs.exp2(m_i - m_use)
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
            with softmax:
                l_safe = xs.where(l_i == 0.0, 1.0, l_i)
                xs.store(o, [row0, 0], (o_acc / l_safe[:, None]).to(o.dtype), bounds=[q_len, D])


@xs.kernel(example=EXAMPLE)
def window_attention_release_in_edge(q, k, v, o, cu_q, cu_k, tile_order, sm_scale, window, tiles,
                                     BM: xs.constexpr, BN: xs.constexpr, D: xs.constexpr,
                                     STAGES: xs.constexpr, WINDOW: xs.constexpr, LENGTHS: xs.constexpr):
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix", replicas=2)
    softmax = xs.role("softmax", kind="vector", replicas=2)
    k_in = xs.pipe(load, mma, stages=STAGES, k=xs.tile([BN, D], k.dtype))
    v_in = xs.pipe(load, mma, stages=STAGES, v=xs.tile([BN, D], v.dtype))
    s_out = xs.pipe(mma, softmax, stages=2, s=xs.tile([BM, BN], xs.float32))
    p_in = xs.pipe(softmax, mma, stages=2, p=xs.tile([BM, BN], q.dtype))
    pv_out = xs.pipe(mma, softmax, stages=2, pv=xs.tile([BM, D], xs.float32))
    w = window
    if WINDOW:
        w = WINDOW
    for tile in xs.tile_range(tiles, persistent=1):
        m_block = xs.load_scalar(tile_order, tile)
        q_len = xs.load_scalar(cu_q, 1)
        k_len = xs.load_scalar(cu_k, 1)
        rows_left = q_len - m_block
        if rows_left > 0:
            if LENGTHS:
                hi = xs.maximum(0, xs.minimum(k_len, m_block + 2 * BM + k_len - q_len))
                lo = xs.maximum(0, m_block + k_len - q_len - w + 1)
            else:
                hi = xs.maximum(0, xs.minimum(k_len, k_len - rows_left + 2 * BM))
                lo = xs.maximum(0, k_len - rows_left - w + 1)
            lo = lo // BN * BN
            with mma:
                qt = xs.load(q, [m_block + xs.replica_id() * BM, 0], [BM, D])
            with softmax:
                row0 = m_block + xs.replica_id() * BM
                rows = row0 + xs.arange(0, BM)
                mask_from = xs.minimum(k_len, row0 + 1 + k_len - q_len)
                full_from = row0 + BM + k_len - q_len - w + 1
                m_i = xs.full([BM], -INF, xs.float32)
                l_i = xs.zeros([BM], xs.float32)
                o_acc = xs.zeros([BM, D], xs.float32)
            for n in range(lo, hi, BN):
                with load:
                    ks = k_in.acquire()
                    ks.k = xs.load(k, [n, 0], [BN, D])
                    k_in.commit()
                    vs = v_in.acquire()
                    vs.v = xs.load(v, [n, 0], [BN, D])
                    v_in.commit()
                with mma:
                    kt = k_in.wait()
                    s = xs.mma(qt, xs.trans(kt.k))
                    s = xs.mma_wait(s, pending=0)
                    k_in.release()
                    so = s_out.acquire()
                    so.s = s
                    s_out.commit()
                with softmax:
                    sc = s_out.wait()
                    x = sc.s * sm_scale
                    if n + BN > mask_from or n < full_from:
                        cols = n + xs.arange(0, BN)
                        d = rows[:, None] + (k_len - q_len) - cols[None, :]
                        x = xs.where((cols[None, :] < k_len) & (d >= 0) & (d < w), x, -INF)
                        s_out.release()  # BUG: a block wholly inside the window never releases
                    m_new = xs.maximum(m_i, xs.max(x, 1))
                    m_use = xs.where(m_new == -INF, 0.0, m_new)
                    alpha = xs.exp2(m_i - m_use)
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
            with softmax:
                l_safe = xs.where(l_i == 0.0, 1.0, l_i)
                xs.store(o, [row0, 0], (o_acc / l_safe[:, None]).to(o.dtype), bounds=[q_len, D])
