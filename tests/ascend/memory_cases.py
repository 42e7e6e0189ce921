"""A corpus for the Ascend memory model: row kernels on one vector core at growing tiles
(RMSNorm, softmax, an elementwise chain, a carried column loop). The HIVM compiler's verdict
(fits / "ub overflow") is the oracle of tests/ascend/test_ascend_memory.py."""
import xsync as xs

ROW = dict(x=xs.float32, w=xs.float32, y=xs.float32, BM=16, BN=1024)


@xs.kernel(example=ROW)
def rmsnorm(x, w, y, M, N, eps, BM: xs.constexpr, BN: xs.constexpr):
    vec = xs.role("vec", kind="vector")
    with vec:
        row = xs.program_id(0) * BM
        t = xs.load(x, [row, 0], [BM, BN])
        ms = xs.sum(t * t, 1) / N
        g = xs.load(w, [0, 0], [1, BN])
        xs.store(y, [row, 0], t / (ms[:, None] + eps) * g)


@xs.kernel(example=ROW)
def softmax(x, w, y, M, N, eps, BM: xs.constexpr, BN: xs.constexpr):
    vec = xs.role("vec", kind="vector")
    with vec:
        row = xs.program_id(0) * BM
        t = xs.load(x, [row, 0], [BM, BN])
        p = xs.exp2(t - xs.max(t, 1)[:, None])
        xs.store(y, [row, 0], p / xs.sum(p, 1)[:, None])


@xs.kernel(example=ROW)
def chain(x, w, y, M, N, eps, BM: xs.constexpr, BN: xs.constexpr):
    vec = xs.role("vec", kind="vector")
    with vec:
        row = xs.program_id(0) * BM
        a = xs.load(x, [row, 0], [BM, BN])
        b = xs.load(w, [row, 0], [BM, BN])
        c = xs.maximum(a * b + a, b - 1.0)
        xs.store(y, [row, 0], xs.exp2(c * 0.5) + a)


@xs.kernel(example=ROW)
def column_loop(x, w, y, M, N, eps, BM: xs.constexpr, BN: xs.constexpr):
    vec = xs.role("vec", kind="vector")
    with vec:
        row = xs.program_id(0) * BM
        acc = xs.zeros([BM, BN], xs.float32)
        for j in range(0, N, BN):
            t = xs.load(x, [row, j], [BM, BN])
            acc = acc + t * t
        xs.store(y, [row, 0], acc)
