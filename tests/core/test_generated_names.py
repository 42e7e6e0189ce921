"""User names never collide with the names the generators write (issue 35).

One template kernel (a copy role feeding a matrix role through a two-field pipe, a loop over a
run-time scalar, a store) is written with neutral names and again with adversarial ones: every
name the CPU, Hopper and Ascend generators write for the neutral kernel, names next to Python's
keywords and builtins, and role names that are no identifiers. The oracle: ``check`` (lowering
and rendering on every backend) and a CPU launch succeed, and each generated source equals the
neutral one up to a one-to-one renaming of its identifiers (a user name spelled like one of the
generator's would map two neutral names onto one); or the frontend refuses the name with a
``KernelSourceError`` that names the line and a fix.
"""
import importlib.util
import io
import itertools
import keyword
import re
import tokenize

import pytest
import torch

from xsync import config
from xsync.backends.spelling import identifiers
from xsync.errors import KernelSourceError

BACKENDS = ("cpu", "nvidia", "ascend")
SLOTS = ("KNAME", "A", "B", "OUT", "N", "BLK", "LOADR", "MMAR", "PIPE", "FA", "FB", "I", "SLOT",
         "GOT", "ACC", "TMP")
ROLE_SLOTS = ("ROLE1", "ROLE2")
TEMPLATE = '''import xsync as xs


@xs.kernel(example=dict(A=xs.bfloat16, B=xs.bfloat16, OUT=xs.float32, BLK=64))
def KNAME(A, B, OUT, N, BLK: xs.constexpr):
    LOADR = xs.role(ROLE1, kind="copy")
    MMAR = xs.role(ROLE2, kind="matrix")
    PIPE = xs.pipe(LOADR, MMAR, stages=2, FA=xs.tile([BLK, BLK], xs.bfloat16),
                   FB=xs.tile([BLK, BLK], xs.bfloat16))
    for I in range(N):
        with LOADR:
            SLOT = PIPE.acquire()
            SLOT.FA = xs.load(A, [I * BLK, 0], [BLK, BLK])
            SLOT.FB = xs.load(B, [0, 0], [BLK, BLK])
            PIPE.commit()
        with MMAR:
            GOT = PIPE.wait()
            ACC = xs.zeros([BLK, BLK], xs.float32)
            ACC = xs.mma(GOT.FA, GOT.FB, ACC)
            ACC = xs.mma_wait(ACC)
            PIPE.release()
            TMP = ACC * 2.0
            xs.store(OUT, [I * BLK, 0], TMP)
'''
NEUTRAL = {s: f"u{i}_{s.lower()}" for i, s in enumerate(SLOTS)} | {"ROLE1": "load", "ROLE2": "mma"}
ODD_ROLES = ["my role", "a-b", "", "x\ny", 'q"""', "it's", "back\\slash", "λ", "agent_load", "1st"]
NEAR_KEYWORDS = ["match", "case", "type", "_", "self", "print", "None_", "async_", "class_", "xs",
                 "kernel", "ag_", "rt_", "torch_", "agent_mma"]


def _make(tmp_path, names: dict, tag: str):
    def spell(m):
        value = names.get(m.group(0), NEUTRAL[m.group(0)])
        return repr(value) if m.group(0) in ROLE_SLOTS else value
    text = re.sub(r"\b(" + "|".join(NEUTRAL) + r")\b", spell, TEMPLATE)
    path = tmp_path / f"names_{tag}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"names_{tag}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, names.get("KNAME", NEUTRAL["KNAME"]))


def _sources(kernel) -> dict:
    out = {}
    for backend in BACKENDS:
        lowered = kernel.lower(backend)
        source = lowered.backend.render_source(lowered.kernel, lowered.placement, lowered.allocation,
                                               config.render_options(lowered.backend))
        compile(source, f"<{backend}: {kernel.__name__}>", "exec")   # valid Python whatever the names
        out[backend] = source
    return out


def _same_up_to_renaming(neutral: str, other: str) -> str:
    """'' when ``other`` is ``neutral`` with its identifiers renamed one-to-one, else why not."""
    a, b = identifiers(neutral), identifiers(other)
    if len(a) != len(b):
        return f"{len(a)} identifiers vs {len(b)}"
    forward, backward = {}, {}
    for x, y in zip(a, b):
        if forward.setdefault(x, y) != y or backward.setdefault(y, x) != x:
            return f"`{y}` stands for both `{backward[y]}` and `{x}`" if backward[y] != x else \
                f"`{x}` is spelled both `{forward[x]}` and `{y}`"
    return ""


def _run_cpu(kernel, names, n=3):
    torch.manual_seed(0)
    a, b = torch.randn(64 * n, 64).to(torch.bfloat16), torch.randn(64, 64).to(torch.bfloat16)
    out = torch.zeros(64 * n, 64)
    kernel[(1,)](a, b, out, n, backend="cpu", **{names.get("BLK", NEUTRAL["BLK"]): 64})
    return out


@pytest.fixture(scope="module")
def neutral(tmp_path_factory):
    kernel = _make(tmp_path_factory.mktemp("neutral"), {}, "neutral")
    return _sources(kernel), _run_cpu(kernel, {})


def _generator_names(sources: dict) -> list[str]:
    users = set(NEUTRAL.values())
    return sorted({t.string for s in sources.values()
                   for t in tokenize.generate_tokens(io.StringIO(s).readline)
                   if t.type == tokenize.NAME and t.string not in users and not keyword.iskeyword(t.string)})


def _cases(sources):
    """Adversarial name sets: every generator name, each in some identifier slot (a few per
    kernel), then names next to the keywords, then odd role names."""
    pool = _generator_names(sources) + NEAR_KEYWORDS
    slots = itertools.cycle(SLOTS)
    batch, out = {}, []
    for name in pool:
        slot = next(slots)
        if slot in batch:
            out.append(batch)
            batch = {}
        if name in batch.values():
            continue
        batch[slot] = name
    out.append(batch)
    out += [{"ROLE1": r, "ROLE2": r + "2"} for r in ODD_ROLES]
    out += [{"N": "range"}, {"TMP": "float"}, {"I": "xs_i"}]   # refused: see test_refused_names
    return out


def test_template_has_many_generator_names(neutral):
    # the fuzz below is only as good as the names it tries
    assert len(_generator_names(neutral[0])) > 60


@pytest.fixture(scope="module")
def adversarial(neutral, tmp_path_factory):
    """Each adversarial case: (names, sources per backend or None, refusal or None, failures)."""
    sources, expected = neutral
    tmp, out = tmp_path_factory.mktemp("adversarial"), []
    for i, names in enumerate(_cases(sources)):
        failures = []
        try:
            kernel = _make(tmp, names, f"case{i}")
            got = _sources(kernel)
        except SyntaxError as exc:
            out.append((names, None, None, [f"{names}: generated source does not parse: {exc}"]))
            continue
        except KernelSourceError as exc:   # refused: a name the kernel may not use, said so
            out.append((names, None, exc, []))
            continue
        try:
            if not torch.equal(_run_cpu(kernel, names), expected):
                failures.append(f"{names}: the CPU result differs from the neutral kernel's")
        except Exception as exc:  # noqa: BLE001 - the failure is the finding
            failures.append(f"{names}: CPU launch: {type(exc).__name__}: {exc}")
        out.append((names, got, None, failures))
    return out


def test_adversarial_names_check_and_run(adversarial):
    """check renders valid Python on every backend, the CPU emulator computes the neutral
    kernel's result, and a refused name is refused at its line with a fix."""
    failures = [f for _, _, _, fs in adversarial for f in fs]
    for names, _, refused, _ in adversarial:
        if refused is not None and not (refused.loc and refused.fix
                                        and set(refused.objects) & set(names.values())):
            failures.append(f"{names}: refused without a line, a fix or the name: {refused}")
    assert not failures, "\n".join(failures)
    assert sum(got is not None for _, got, _, _ in adversarial) > len(adversarial) // 2


def test_refused_names(adversarial):
    refused = {n for names, _, exc, _ in adversarial if exc is not None for n in exc.objects}
    # builtins the generated code calls, and the generators' prefix
    assert {"range", "float", "xs_i"} <= refused


@pytest.mark.parametrize("backend", BACKENDS)
def test_generated_source_is_a_renaming(neutral, adversarial, backend):
    """No user name is spelled like a generator name: the source is the neutral one renamed."""
    failures = []
    for names, got, _, _ in adversarial:
        why = _same_up_to_renaming(neutral[0][backend], got[backend]) if got is not None else ""
        if why:
            failures.append(f"{names} on {backend}: {why}")
    assert not failures, "\n".join(failures)
