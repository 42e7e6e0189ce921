"""``xsync check --backend X`` reports everything lowering would refuse (issue 34): over the
verifier's corpus, a sample of generated protocols (tests/core/protogen.py) and every library
kernel at its example specialization, on every lowering target, check exits 0 exactly where
lowering and the backend's render step (pure text, no toolchain) succeed."""
import contextlib
import io
import random
import tempfile

import pytest

import xsync as xs

from tests.core import corpus, protogen
from tests.snapshot.render import _library
from xsync import backends as registry
from xsync import cli, config
from xsync.compiler import Kernel
from xsync.errors import XSyncError

TARGETS = ("cpu", "nvidia", "ascend")
PROTOGEN_SAMPLE = 24


def _kernels():
    examples, gvars, avariants = _library()
    out = [(f"corpus-{n}", k) for n, k in sorted(vars(corpus).items()) if isinstance(k, Kernel)]
    out += [(f"example-{k.fn.__name__}", k) for k in examples]
    out += [(f"example-{n}", k) for n, k in gvars] + [(f"variant-{n}", k) for n, k in avariants]
    return out


def _lowers(kernel, backend) -> str:
    """'ok', the class of what lowering raises, or 'render: <class>' where lowering passes and
    the render step refuses (the kernel's own options)."""
    try:
        lowered = kernel.lower(backend, check=True)
    except XSyncError as err:
        return type(err).__name__
    try:
        with config.kernel_scope(kernel.options):
            options = config.render_options(backend)
        backend.render_source(lowered.kernel, lowered.placement, lowered.allocation, options)
        return "ok"
    except XSyncError as err:
        return f"render: {type(err).__name__}"


def _check(kernel, backend) -> tuple[int, str]:
    constexprs, dtypes = kernel.specialization()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        return cli.check_kernel(kernel, constexprs, dtypes, [backend]), out.getvalue()


def _compare(kernels) -> list[tuple]:
    """(name, target, lowering's outcome, check's exit code, check's output) of every case."""
    out = []
    for name, kernel in kernels:
        for target in TARGETS:
            backend = registry.get(target)
            out.append((name, target, _lowers(kernel, backend), *_check(kernel, backend)))
    return out


def _disagreements(results) -> list[str]:
    return [f"{name}@{target}: lower+render {lowered}, check exits {code}"
            for name, target, lowered, code, _ in results if (lowered == "ok") != (code == 0)]


@pytest.fixture(scope="module")
def library_and_corpus():
    return _compare(_kernels())


def test_check_agrees_with_lower_on_the_corpus_and_the_library(library_and_corpus):
    assert _disagreements(library_and_corpus) == []


def test_check_agrees_with_lower_on_generated_protocols():
    seeds = random.Random(34).sample(range(2000), PROTOGEN_SAMPLE)
    with tempfile.TemporaryDirectory(prefix="xsync-protos-") as directory:
        module = protogen.load([protogen.generate(s) for s in seeds], directory)
        kernels = [(f"gen_{s}", getattr(module, f"gen_{s}")) for s in seeds if hasattr(module, f"gen_{s}")]
        assert len(kernels) >= PROTOGEN_SAMPLE // 2
        assert _disagreements(_compare(kernels)) == []


def test_check_reports_render_time_refusals(library_and_corpus):
    """Ascend refuses, when it renders, a kernel that synchronizes cube and vector cores with no
    matrix work: check says so with the renderer's message (before, check said OK and
    `xsync lower` failed)."""
    refused = [(name, out) for name, target, lowered, code, out in library_and_corpus
               if lowered.startswith("render: ")]
    assert refused, "no corpus or library kernel is refused at a render step"
    for name, out in refused:
        assert "REJECTED:" in out, (name, out)


@xs.kernel(example=dict(x=xs.float32, y=xs.float32, BLOCK=64, STAGES=2, DT=xs.float32))
def square_rows(x, y, n, BLOCK: xs.constexpr, STAGES: xs.constexpr, DT: xs.constexpr):
    make = xs.role("make", kind="vector", placement="own")
    mma = xs.role("mma", kind="matrix")
    ring = xs.pipe(make, mma, stages=STAGES, t=xs.tile([BLOCK, BLOCK], DT))
    for i in range(n):
        with make:
            o = ring.acquire()
            o.t = (xs.load(x, [i * BLOCK, 0], [BLOCK, BLOCK]) * 2.0).to(DT)
            ring.commit()
        with mma:
            u = ring.wait()
            acc = xs.mma(u.t, xs.trans(u.t))
            acc = xs.mma_wait(acc, pending=0)
            ring.release(u)
            xs.store(y, [i * BLOCK, 0], acc)


def _check_dtype(dtype, target):
    constexprs, dtypes = square_rows.specialization()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        return cli.check_kernel(square_rows, dict(constexprs, DT=dtype), dtypes, [registry.get(target)]), \
            out.getvalue()


def test_check_refuses_an_mma_the_hopper_lowering_cannot_multiply():
    """Was: check said OK for float32 wgmma operands, and Triton then aborted in NVGPUToLLVM
    ('WGMMA type or shape is not supported'): the accumulator layout's instruction is K=16."""
    code, out = _check_dtype(xs.float32, "nvidia")
    assert code == 1 and "REJECTED: BackendError" in out, out
    assert "xs.mma's A operand is float32" in out and ".to(xs.bfloat16)" in out
    for target in TARGETS:
        assert _check_dtype(xs.bfloat16, target)[0] == 0, target
    assert _check_dtype(xs.float32, "cpu")[0] == 0
