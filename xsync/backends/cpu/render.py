"""CPU renderer: protocol IR -> Python source, one function per agent, run as threads.

The generated module is plain Python over torch and ``xsync.backends.cpu.runtime``:
sync verbs become calls on the agent handle (``ag.acquire('tiles', line=31, at={...})``),
tile ops become torch calls, and every sync call carries the kernel's line and loop
iteration so a stall or a leftover can be reported in the user's terms. For the
cooperative scheduler (``XSYNC_CPU_MODE=cooperative``) every sync call is ``yield from``:
the agent functions are generators the runtime interleaves in one thread.
"""
from __future__ import annotations

from xsync.backends.source import Emitter, PythonRenderer, label
from xsync.lowering import ir
from xsync.lowering.placement import Placement
from xsync.lowering.slicing import slice_agent

_RT_OPS = {
    ir.TileOp.CDIV: "cdiv", ir.TileOp.ARANGE: "arange", ir.TileOp.ZEROS: "zeros",
    ir.TileOp.FULL: "full", ir.TileOp.LOAD: "load", ir.TileOp.LOAD_SCALAR: "load_scalar",
    ir.TileOp.TRANS: "trans", ir.TileOp.MAX: "reduce_max", ir.TileOp.SUM: "reduce_sum",
    ir.TileOp.EXP2: "exp2", ir.TileOp.LOG2: "log2", ir.TileOp.WHERE: "where",
    ir.TileOp.MAXIMUM: "maximum", ir.TileOp.MINIMUM: "minimum"
}


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


def function_names(kernel: ir.KernelIR, placement: Placement) -> dict[str, str]:
    """Agent name -> its generated function's name (an identifier whatever the role's name)."""
    taken, out = user_names(kernel), {}
    for agent in placement.agents:
        safe = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in agent.name)
        out[agent.name] = fresh(f"agent_{safe}", taken)
    return out


class CpuRenderer(PythonRenderer):
    def __init__(self, kernel: ir.KernelIR, placement: Placement, skeleton=None,
                 cooperative: bool = False):
        from xsync.lowering.protocol import derive

        self.kernel = kernel
        self.placement = placement
        self.skeleton = skeleton or derive(kernel, placement)
        # the generator's own names, spelled apart from every name of the kernel's
        taken = user_names(kernel) | {"range", "float"}
        self.rt, self.ag, self.torch = (fresh(n, taken) for n in ("rt", "ag", "torch"))
        self.functions = function_names(kernel, placement)
        self.verb_prefix = f"yield from {self.ag}." if cooperative else f"{self.ag}."
        self.cooperative = cooperative
        self.out = Emitter()
        self.loop_vars: list[str] = []
        # (generated line, kernel line) where each statement starts, and the loop variables
        # (generated name -> kernel name): the watchdog says where a running agent is
        self.line_map: list[tuple[int, int]] = []
        self.loop_names: dict[str, str] = {}

    # ------------------------------------------------------------ expressions
    def dtype(self, d) -> str:
        return f"{self.torch}.{d.name}" if d.name != "int1" else f"{self.torch}.bool"

    def attr(self, e: ir.Attr) -> str:
        return f"{self.expr(e.value, 99)}[{e.attr!r}]"

    def call(self, e: ir.Call) -> str:
        if e.op is ir.TileOp.PROGRAM_ID:
            return f"{self.ag}.program_id({self.args(e)})"
        if e.op is ir.TileOp.NUM_PROGRAMS:
            return f"{self.ag}.num_programs({self.args(e)})"
        if e.op is ir.TileOp.REPLICA_ID:
            return f"{self.ag}.replica"
        if e.op is ir.TileOp.MMA:
            slots = sorted({x.value.id for operand in e.args[:2] for x in ir.subexprs(operand)
                            if isinstance(x, ir.Attr) and isinstance(x.value, ir.Name)})
            reads = f", reads=({''.join(s + ', ' for s in slots)})" if slots else ""
            return f"{self.ag}.mma({self.args(e)}{reads})"
        if e.op is ir.TileOp.MMA_WAIT:
            return f"{self.ag}.mma_wait({self.args(e)})"
        return f"{self.rt}.{_RT_OPS[e.op]}({self.args(e)})"

    # ------------------------------------------------------------ statements
    def render(self) -> str:
        k, o = self.kernel, self.out
        o.line(f"# Generated by xsync: kernel '{k.name}' ({k.file}) on the CPU emulator.")
        o.line("# One function per agent; each agent instance runs it "
               + ("as a generator (cooperative scheduler)." if self.cooperative else "in its own thread."))
        o.line("import torch" if self.torch == "torch" else f"import torch as {self.torch}")
        o.line(f"from xsync.backends.cpu import runtime as {self.rt}")
        o.line()
        for name, value in k.constexprs:
            o.line(f"{name} = {self.const(value)}  # constexpr")
        params = ", ".join(p.name for p in k.params if p.kind is not ir.ParamKind.CONSTEXPR)
        for agent in self.placement.agents:
            o.line()
            o.line()
            o.line(f"def {self.functions[agent.name]}({self.ag}, {params}):")
            o.indent()
            o.line(f'"""{agent.hardware}: roles {", ".join(label(r) for r in agent.roles)}."""')
            self.agent = agent
            self.block(slice_agent(k.body, agent.roles))
            if self.cooperative:
                o.line("return")
                o.line("yield  # a generator even without sync verbs")
            o.dedent()
        return o.source()

    def at(self) -> str:
        return "{" + ", ".join(f"{v!r}: {v}" for v in self.loop_vars) + "}"

    def block(self, stmts):
        if not stmts:
            self.out.line("pass")
        for s in stmts:
            self.stmt(s)

    def loop_body(self, stmts):
        self.out.line(f"{self.ag}.tick()")      # stops a computing agent once the program failed
        self.block(stmts)

    def stmt(self, s):
        o = self.out
        self.line_map.append((len(o.lines) + 1, s.loc.line))
        if isinstance(s, ir.Assign):
            lhs = ", ".join(s.targets)
            o.line(f"{lhs} = {self.expr(s.value)}")
        elif isinstance(s, ir.SlotWrite):
            o.line(f"{s.slot}[{s.field!r}] = {self.expr(s.value)}")
        elif isinstance(s, ir.Store):
            offs = ", ".join(self.expr(x) for x in s.offsets)
            bounds = ""
            if s.bounds:
                bounds = f", bounds=[{', '.join(self.expr(x) for x in s.bounds)}]"
            if s.reduce is None:
                o.line(f"{self.rt}.store({s.tensor}, [{offs}], {self.expr(s.value)}{bounds})")
            elif s.deterministic:   # queued by the agent, added at the program's end in a fixed order
                o.line(f"{self.ag}.store_add_ordered({s.tensor}, [{offs}], {self.expr(s.value)}{bounds})")
            else:
                o.line(f"{self.rt}.store_add({s.tensor}, [{offs}], {self.expr(s.value)}{bounds})")
        elif isinstance(s, ir.RoleBlock):
            o.line(f"# role '{label(s.role)}' (line {s.loc.line})")
            self.block(s.body)
        elif isinstance(s, ir.For):
            self.loop_names[self.name(s.var)] = s.var
            self.loop_vars.append(s.var)
            self.emit_for(s, self.loop_body)
            self.loop_vars.pop()
        elif isinstance(s, ir.If):
            self.emit_if(s, self.block)
        elif isinstance(s, ir.SyncOp):
            self.sync(s)
        else:
            raise TypeError(f"cannot render {s!r}")

    def sync(self, s: ir.SyncOp):
        o, line, ag = self.out, s.loc.line, self.verb_prefix
        obj = self.kernel.sync_object(s.obj)
        bind = f"{s.target} = " if s.target else ""
        where = f"line={line}, at={self.at()}"
        if isinstance(obj, ir.Pipe):
            o.line(f"{bind}{ag}{s.verb}({s.obj!r}, {where})")
        elif isinstance(obj, ir.Event):
            verb = "signal" if s.verb is ir.Verb.SIGNAL else "wait_event"
            o.line(f"{ag}{verb}({s.obj!r}, {where})")
        else:
            point = self.skeleton.renders(self.agent.name, s)
            if point is None:
                o.line(f"pass  # {s.obj}.{s.verb}(): met once for this agent at line "
                       f"{self.skeleton.point(self.agent.name, s).at.loc.line}")
                return
            o.line(f"{ag}{'sync' if point.waits else 'arrive'}({s.obj!r}, {where})")


def render(kernel: ir.KernelIR, placement: Placement, skeleton=None, cooperative: bool = False) -> str:
    return CpuRenderer(kernel, placement, skeleton, cooperative).render()


def render_mapped(kernel: ir.KernelIR, placement: Placement, skeleton=None, cooperative: bool = False):
    """(source, line map, loop names): the source and what the watchdog needs to name the
    kernel line and loop iteration of a generated line."""
    renderer = CpuRenderer(kernel, placement, skeleton, cooperative)
    source = renderer.render()
    return source, tuple(renderer.line_map), dict(renderer.loop_names)
