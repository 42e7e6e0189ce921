"""Kernels of the elementwise-math vocabulary (xs.sqrt, rsqrt, exp, log, tanh, erf, sigmoid, abs,
pow / ``**``, casts), shared by the core, nvidia and ascend matrices
(tests/*/test_elementwise_math*.py): a GEMM with a bias + GELU epilogue, an RMSNorm through
rsqrt and one kernel that uses every function."""
import xsync as xs

GEMM_GELU = dict(a=xs.bfloat16, b=xs.bfloat16, bias=xs.float32, c=xs.bfloat16, BM=64, BN=64, BK=32,
                 STAGES=2, TANH=0)
RMSNORM = dict(x=xs.bfloat16, w=xs.float32, y=xs.bfloat16, BM=16, BN=64, STAGES=2)
EVERY = dict(x=xs.float32, y=xs.float32, BM=16, BN=32)


@xs.kernel(example=GEMM_GELU)
def gemm_bias_gelu(a, b, bias, c, M, N, K, BM: xs.constexpr, BN: xs.constexpr, BK: xs.constexpr,
                   STAGES: xs.constexpr, TANH: xs.constexpr):
    """C = gelu(A @ B + bias) in bf16, one program per [BM, BN] tile; the GELU is the exact
    (erf) form, or with TANH the tanh approximation. ``bias`` is a [1, N] row."""
    load = xs.role("load", kind="copy")
    mma = xs.role("mma", kind="matrix")
    tiles = xs.pipe(load, mma, stages=STAGES,
                    a=xs.tile([BM, BK], a.dtype), b=xs.tile([BK, BN], b.dtype))
    tiles_n = xs.cdiv(N, BN)
    off_m = xs.program_id(0) // tiles_n * BM
    off_n = xs.program_id(0) % tiles_n * BN
    with mma:
        acc = xs.zeros([BM, BN], xs.float32)
    for k in range(0, K, BK):
        with load:
            slot = tiles.acquire()
            slot.a = xs.load(a, [off_m, k], [BM, BK])
            slot.b = xs.load(b, [k, off_n], [BK, BN])
            tiles.commit()
        with mma:
            ab = tiles.wait()
            acc = xs.mma(ab.a, ab.b, acc)
            acc = xs.mma_wait(acc, pending=0)
            tiles.release()
    with mma:
        h = acc + xs.load(bias, [0, off_n], [1, BN])
        if TANH:
            g = 0.5 * h * (1.0 + xs.tanh(0.7978845608028654 * (h + 0.044715 * h ** 3)))
        else:
            g = 0.5 * h * (1.0 + xs.erf(h * 0.7071067811865476))
        xs.store(c, [off_m, off_n], g.to(xs.bfloat16))


@xs.kernel(example=RMSNORM)
def rmsnorm_rsqrt(x, w, y, M, N, blocks, BM: xs.constexpr, BN: xs.constexpr, STAGES: xs.constexpr):
    """y = x * rsqrt(mean(x^2) + 1e-6) * w over rows of N <= BN columns (bf16 in and out, fp32
    math); program p normalizes row blocks p * blocks ... p * blocks + blocks - 1."""
    load = xs.role("load", kind="copy")
    norm = xs.role("norm", kind="vector")
    rows = xs.pipe(load, norm, stages=STAGES, x=xs.tile([BM, BN], xs.bfloat16))
    with norm:
        wt = xs.load(w, [0, 0], [1, BN])
    for i in range(blocks):
        row = (xs.program_id(0) * blocks + i) * BM
        with load:
            s = rows.acquire()
            s.x = xs.load(x, [row, 0], [BM, BN])
            rows.commit()
        with norm:
            got = rows.wait()
            v = got.x.to(xs.float32)
            rows.release()
            r = xs.rsqrt(xs.sum(v * v, 1) / N + 1.0e-6)
            xs.store(y, [row, 0], (v * r[:, None] * wt).to(xs.bfloat16))


@xs.kernel(example=EVERY)
def every_function(x, y, BM: xs.constexpr, BN: xs.constexpr):
    """y = a sum of every math function of the vocabulary over x (x > 0 where needed), one
    program per [BM, BN] row block, no pipes: the vector role loads, computes and stores."""
    work = xs.role("work", kind="vector")
    row = xs.program_id(0) * BM
    with work:
        v = xs.load(x, [row, 0], [BM, BN])
        p = xs.abs(v) + 0.5
        t = xs.sqrt(p) + xs.rsqrt(p) + xs.exp(-p) + xs.log(p) + xs.tanh(v) + xs.erf(v)
        t = t + xs.sigmoid(v) + xs.pow(p, 0.5) + v ** 2 + p ** -1 + xs.abs(v.to(xs.bfloat16)).to(xs.float32)
        xs.store(y, [row, 0], t)


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BM=16, BN=32))
def cast_chain(x, y, BM: xs.constexpr, BN: xs.constexpr):
    """y = x through every cast pair the epilogues use: fp32 -> bf16 -> fp16 -> fp32, fp32 ->
    int32 -> fp32 (truncation toward zero) and a comparison's int1 -> fp32."""
    work = xs.role("work", kind="vector")
    row = xs.program_id(0) * BM
    with work:
        v = xs.load(x, [row, 0], [BM, BN])
        a = v.to(xs.bfloat16).to(xs.float16).to(xs.float32)
        b = v.to(xs.int32).to(xs.float32) + (v > 0.0).to(xs.float32) + v.to(xs.float16).to(xs.bfloat16).to(xs.float32)
        xs.store(y, [row, 0], a + b)
