"""The structure rules of issue 33, checked on the syntax trees of ``xsync/`` (no grep).

1. No dynamic import: ``importlib.import_module``, ``__import__``, ``importlib.util.find_spec``
   and ``spec_from_file_location`` take a constant module name, so the import graph shows every
   dispatch (a backend is an object, never a name spliced into a module path). The calls that
   must load something named at run time are listed in ``DYNAMIC_IMPORTS`` with the reason.
2. The environment is read in ``xsync/config.py`` only (``os.environ``, ``os.getenv``,
   ``os.putenv``/``unsetenv``, ``from os import environ``).
3. No text comparison of the IR vocabularies outside the frontend's parser
   (``xsync/lowering/frontend.py``): ``==``, ``!=``, ``in``, ``not in``, ``is``, ``is not``
   or a ``match`` case between a field named ``verb``, ``op`` or ``kind`` and a string
   constant (or a tuple, list or set of them). Compare members: ``s.verb is Verb.WAIT``.
   - ``.verb``: any string (a sync verb is a ``Verb``; there is no other text to compare).
   - ``.op``: a ``TileOp`` or ``Verb`` name; the operator strings of ``BinOp``/``Compare``/
     ``UnaryOp``/``BoolOp`` (``"+"``, ``"<"``, ``"and"``) are not a vocabulary and may stay.
   - ``.kind``: a ``ParamKind``, ``RoleKind`` or ``Verb`` name (a trace op's kind is a verb),
     except the fields listed in ``NOT_VOCABULARY`` (another thing whose spellings overlap).
4. No module over ``MAX_MODULE_LINES`` lines and no function over ``MAX_FUNCTION_LINES``
   (``def`` line to last line, nested functions counted on their own), except ``TOO_LONG``
   (each entry says why it must stay whole; the closing note of issue 33 repeats it).

Each test fails with every violation of its rule, grouped by file, as ``path:line``.
"""
from __future__ import annotations

import ast
import os
from collections import defaultdict

import pytest

from xsync.lowering.ir import ParamKind, RoleKind, TileOp, Verb

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = "xsync"

MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 120

# (file, enclosing function) -> why the call loads a module or file named at run time
DYNAMIC_IMPORTS = {
    ("xsync/cli.py", "load_kernel"):
        "`xsync check|lower MODULE:KERNEL`: the user's module or .py file named on the command line",
    ("xsync/cli.py", "cmd_bench"):
        "`xsync bench NAME`: the checkout's benchmark script benchmarks/NAME.py, loaded from its file",
    ("xsync/backends/nvidia/modules.py", "load_module"):
        "the generated Gluon module, written to the source cache and loaded from its file",
    ("xsync/backends/ascend/__init__.py", "CompiledAscend.jit_function"):
        "the generated triton-ascend module, loaded from its file",
    ("xsync/backends/ascend/simulator.py", "Simulation.__init__"):
        "the generated triton-ascend module of one simulated core, loaded from its file",
    ("xsync/_source_kernels.py", "_SourceKernelsFinder.find_spec"):
        "a checkout's xsync.kernels is its kernels/ folder (docs/design.md)",
    ("xsync/_source_kernels.py", "_TopLevelAliasFinder.find_spec"):
        "a checkout's top-level kernels.<m> is the module xsync.kernels.<m> (docs/design.md)",
    ("xsync/_source_kernels.py", "_AliasLoader.create_module"):
        "a checkout's top-level kernels.<m> is the module xsync.kernels.<m> (docs/design.md)",
}
IMPORT_CALLS = {"import_module", "__import__", "find_spec", "spec_from_file_location"}

ENVIRONMENT_READERS = {"xsync/config.py"}
ENVIRONMENT_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}

PARSER = {"xsync/lowering/frontend.py"}
_VERBS = {str(m) for m in Verb}
VOCABULARY = {   # field name -> the strings that are names of a typed vocabulary (None: any string)
    "verb": None,
    "op": {str(m) for m in TileOp} | _VERBS,
    "kind": {str(m) for m in ParamKind} | {str(m) for m in RoleKind} | _VERBS,
}
# Fields named like a vocabulary that hold another kind of thing, whose spellings overlap one:
# file -> {compared expression: (the strings it may be compared with, why)}
NOT_VOCABULARY: dict = {}

# "path" or "path:Qualified.function" -> why it must stay whole
TOO_LONG: dict[str, str] = {}


def _modules():
    """(relative path, source text, tree) of every module under xsync/."""
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, PACKAGE)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
                yield rel, text, ast.parse(text, filename=rel)


def _scoped(tree):
    """Every node with the qualified name of the function (or class) that encloses it."""
    out = []

    def visit(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{scope}.{child.name}" if scope else child.name
                out.append((child, scope))
                visit(child, inner)
            else:
                out.append((child, scope))
                visit(child, scope)

    visit(tree, "")
    return out


def _report(title: str, violations: dict[str, list[str]]) -> str:
    n = sum(len(v) for v in violations.values())
    lines = [f"{title}: {n} violation{'s' * (n != 1)} in {len(violations)} file{'s' * (len(violations) != 1)}"]
    for path in sorted(violations):
        lines.append(f"  {path}")
        lines.extend(f"    {v}" for v in violations[path])
    return "\n".join(lines)


def _constant_names(tree) -> set[str]:
    """Module-level names bound once to a string constant (``_NAME = "xsync.kernels"``)."""
    return {t.id for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str) for t in node.targets if isinstance(t, ast.Name)}


def _fail_on(found, message: str) -> None:
    """Fail with ``message`` alone (no traceback: the message lists every violation)."""
    if found:
        pytest.fail(message, pytrace=False)


def _call_name(func) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def test_no_dynamic_imports():
    violations, used = defaultdict(list), set()
    for rel, text, tree in _modules():
        constants = _constant_names(tree)
        for node, scope in _scoped(tree):
            if not isinstance(node, ast.Call) or _call_name(node.func) not in IMPORT_CALLS:
                continue
            first = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "name"), None)
            if isinstance(first, ast.Constant) and isinstance(first.value, str) or \
                    isinstance(first, ast.Name) and first.id in constants:
                continue
            if (rel, scope) in DYNAMIC_IMPORTS:
                used.add((rel, scope))
                continue
            violations[rel].append(f"{rel}:{node.lineno} in {scope or '<module>'}: "
                                   f"{ast.get_source_segment(text, node)}")
    stale = sorted(f"{p} {s}" for p, s in set(DYNAMIC_IMPORTS) - used)
    _fail_on(violations, _report("imports of a module named at run time (a constant name, or an entry "
                                 "in DYNAMIC_IMPORTS with the reason)", violations))
    _fail_on(stale, "DYNAMIC_IMPORTS entries that match no call any more (remove them):\n  " + "\n  ".join(stale))


def test_environment_is_read_only_in_config():
    violations = defaultdict(list)
    for rel, text, tree in _modules():
        if rel in ENVIRONMENT_READERS:
            continue
        os_names = {"os"} | {a.asname for n in ast.walk(tree) if isinstance(n, ast.Import)
                             for a in n.names if a.name == "os" and a.asname}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT_NAMES \
                    and isinstance(node.value, ast.Name) and node.value.id in os_names:
                violations[rel].append(f"{rel}:{node.lineno}: {ast.get_source_segment(text, node)}")
            elif isinstance(node, ast.ImportFrom) and node.module == "os" \
                    and any(a.name in ENVIRONMENT_NAMES for a in node.names):
                violations[rel].append(f"{rel}:{node.lineno}: {ast.get_source_segment(text, node)}")
    _fail_on(violations, _report("the environment read outside xsync/config.py (build an option there)",
                                 violations))


def _strings(node) -> list[str] | None:
    """The string constants ``node`` is (a constant, or a tuple/list/set of them), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts:
        values = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return values if len(values) == len(node.elts) else None
    return None


def _vocabulary_text(field: str, values: list[str]) -> bool:
    names = VOCABULARY[field]
    return names is None or any(v in names for v in values)


def _field(node) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) and node.attr in VOCABULARY else None


def test_no_text_comparison_of_verbs_ops_and_kinds():
    violations, used = defaultdict(list), set()

    def text_of_vocabulary(rel, text, field_node, values) -> bool:
        f = _field(field_node)
        if not f or not values or not _vocabulary_text(f, values):
            return False
        expr = ast.get_source_segment(text, field_node)
        allowed = NOT_VOCABULARY.get(rel, {}).get(expr)
        if allowed and set(values) <= allowed[0]:
            used.add((rel, expr))
            return False
        return True

    for rel, text, tree in _modules():
        if rel in PARSER:
            continue
        for node in ast.walk(tree):
            hit = None
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                for (a, b), op in zip(zip(operands, operands[1:]), node.ops):
                    if isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)) and (
                            text_of_vocabulary(rel, text, a, _strings(b))
                            or text_of_vocabulary(rel, text, b, _strings(a))):
                        hit = node
            elif isinstance(node, ast.Match):
                for case in node.cases:
                    for p in ast.walk(case.pattern):
                        if isinstance(p, ast.MatchValue) and text_of_vocabulary(rel, text, node.subject,
                                                                                _strings(p.value)):
                            hit = p
            if hit is not None:
                violations[rel].append((hit.lineno, f"{rel}:{hit.lineno}: {ast.get_source_segment(text, hit)}"))
    violations = {rel: [line for _, line in sorted(v)] for rel, v in violations.items()}
    stale = sorted(f"{rel} {expr}" for rel, exprs in NOT_VOCABULARY.items() for expr in exprs
                   if (rel, expr) not in used)
    _fail_on(violations, _report("verbs, tile ops or kinds compared as text (compare the Verb / TileOp / "
                                 "ParamKind / RoleKind member)", violations))
    _fail_on(stale, "NOT_VOCABULARY entries that match no comparison any more (remove them):\n  "
             + "\n  ".join(stale))


def test_module_and_function_sizes():
    violations, used = defaultdict(list), set()
    for rel, text, tree in _modules():
        n = len(text.splitlines())
        if n > MAX_MODULE_LINES:
            if rel in TOO_LONG:
                used.add(rel)
            else:
                violations[rel].append(f"{rel}: module of {n} lines (> {MAX_MODULE_LINES})")
        for node, scope in _scoped(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            length = node.end_lineno - node.lineno + 1
            name = f"{scope}.{node.name}" if scope else node.name
            if length > MAX_FUNCTION_LINES:
                key = f"{rel}:{name}"
                if key in TOO_LONG:
                    used.add(key)
                else:
                    violations[rel].append(f"{rel}:{node.lineno}: {name} has {length} lines "
                                           f"(> {MAX_FUNCTION_LINES})")
    stale = sorted(set(TOO_LONG) - used)
    _fail_on(violations, _report("modules or functions too long (split them, or name them in TOO_LONG "
                                 "with the reason)", violations))
    _fail_on(stale, "TOO_LONG entries that are not too long any more (remove them):\n  " + "\n  ".join(stale))


def test_the_whole_vocabulary_is_an_attribute_of_xsync():
    """Was: xs.exp, xs.sqrt, xs.cluster, xs.cluster_rank ... were spelled only in kernel source
    (the frontend reads names), so help(xs.exp) and an IDE's completion failed."""
    import xsync
    from xsync import api

    declared = {n for n, v in vars(api).items() if not n.startswith("_") and (
        isinstance(v, api.DType) or (callable(v) and getattr(v, "__module__", "") == "xsync.api"
                                     and not isinstance(v, type)))}
    assert set(api.TILE_OPS) <= declared
    missing = sorted(n for n in declared if getattr(xsync, n, None) is not vars(api)[n])
    assert missing == [], missing
