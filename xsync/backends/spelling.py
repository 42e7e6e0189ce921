"""Names in generated source: the kernel's own and the generator's, never the same spelling.

Every renderer writes two kinds of identifiers: the kernel's (parameters, constexprs, locals,
loop variables, slots, the kernel's name) and its own (module aliases such as ``gl`` or ``tl``,
helper parameters, layout constants, ``<tensor>_desc``, ``<pipe>_acquired``, ``<name>_r<k>``
...). The CPU renderer spells its few names apart from the kernel's with :func:`fresh`. The
Hopper and Ascend generators write many, some built from the kernel's names, so they settle it
the other way round (:class:`Spelling`): a first render spells every kernel name as a probe
(``xs_`` is reserved for generated code, so a probe is no name of either kind); every other
identifier of that text is the generator's; a kernel name the generator also writes is then
spelled apart (``gl`` -> ``gl_``) in the real render. A kernel that meets none of the
generator's names is spelled exactly as written.
"""
from __future__ import annotations

import io
import keyword
import tokenize

from xsync.lowering import ir


def user_names(kernel: ir.KernelIR) -> set[str]:
    """Every identifier the kernel's own code binds or reads (the generator's names avoid them)."""
    names = {p.name for p in kernel.params} | {n for n, _ in kernel.constexprs}
    for s in ir.walk(kernel.all_statements()):
        names.update(getattr(s, "targets", None) or ())
        for attr in ("var", "target", "slot"):
            if isinstance(getattr(s, attr, None), str):
                names.add(getattr(s, attr))
        for attr in ("value", "cond", "start", "stop", "step", "guard"):
            e = getattr(s, attr, None)
            if e is not None and not isinstance(e, (str, int)):
                names |= ir.expr_names(e)
        for e in (getattr(s, "offsets", None) or ()) + (getattr(s, "bounds", None) or ()):
            names |= ir.expr_names(e)
    return names


def fresh(base: str, taken: set[str]) -> str:
    """``base``, or ``base_``, ``base__``, ... : the first spelling no name in ``taken`` has."""
    while base in taken:
        base += "_"
    taken.add(base)
    return base


def identifiers(source: str) -> list[str]:
    """The names a module binds or reads where the kernel's names live, in order of appearance: not attributes
    (``gl.dtype``), keyword arguments (``mask=``), keywords, the words of import lines (an
    import binds a name the module also reads, or one no kernel name can shadow: the kernel's
    names live in functions), nor the parameters and locals of the generator's helper functions
    (``def xs_...``: their own scope, which no kernel name enters)."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type not in (tokenize.COMMENT, tokenize.NL)]
    out, depth, importing, level, helper = [], 0, False, 0, False
    for i, t in enumerate(tokens):
        level += (t.type == tokenize.INDENT) - (t.type == tokenize.DEDENT)
        if t.type == tokenize.OP:
            depth += (t.string in "([{") - (t.string in ")]}")
        starts = i == 0 or tokens[i - 1].type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
        if starts and level == 0:
            helper = t.string == "def" and tokens[i + 1].string.startswith("xs_")
        importing = (importing and t.type != tokenize.NEWLINE) or (starts and t.string in ("import", "from"))
        if importing or helper or t.type != tokenize.NAME or keyword.iskeyword(t.string):
            continue
        after_dot = i > 0 and tokens[i - 1].string == "."
        kwarg = depth > 0 and i + 1 < len(tokens) and tokens[i + 1].string == "="
        if not (after_dot or kwarg):
            out.append(t.string)
    return out


class Spelling:
    """How a renderer spells the kernel's names: ``spelling(name)``. Names the generator builds
    (``<tensor>_desc``, a pass's variables) are not the kernel's and pass through as they are."""

    def __init__(self, kernel: ir.KernelIR, renames: dict[str, str] | None = None):
        self.kernel = kernel
        self.renames = dict(renames or {})

    def __call__(self, name: str) -> str:
        return self.renames.get(name, name)

    @staticmethod
    def names_of(kernel: ir.KernelIR) -> set[str]:
        return user_names(kernel) | {kernel.name}

    @classmethod
    def probe(cls, kernel: ir.KernelIR) -> "Spelling":
        """Every kernel name spelled as a probe no generator name can be (the reserved prefix)."""
        return cls(kernel, {n: f"xs_probe_{i}_" for i, n in enumerate(sorted(cls.names_of(kernel)))})

    def settle(self, probe_source: str) -> "Spelling":
        """From the source rendered with :meth:`probe`: the kernel's names that the generator
        also writes, each spelled apart from every name of either kind."""
        ours = set(identifiers(probe_source)) - set(self.renames.values())
        users = self.names_of(self.kernel)
        taken = ours | users
        return Spelling(self.kernel, {n: fresh(n, taken) for n in sorted(users & ours)})

    @property
    def identity(self) -> bool:
        return not self.renames
