"""How the Ascend renderer spells ``xs.store(..., reduce="add")``: a masked relaxed
``tl.atomic_add`` from a vector core, and which vector core adds (a mixin of ``AscendRenderer``:
it reads the renderer's agent, plan, form and output)."""
from __future__ import annotations

from xsync.backends.ascend.addressing import Window
from xsync.backends.ascend.replicas import Core
from xsync.errors import UnsupportedError
from xsync.lowering import ir


class ReduceAddSpelling:
    def atomic_add(self, s: ir.Store, t: str, dtype, w: Window):
        """``reduce="add"``: a masked relaxed ``tl.atomic_add`` (3.2 has no block-pointer atomics)
        over the window ``w`` of the tile (addressing.window)."""
        o = self.out
        guard = self.one_adder(s, t)
        if guard:
            o.line(f"if {guard}:  # both vector cores run this role: one of them adds")
            o.indent()
        value = f"xs_v.to({self.dtype(dtype)})"
        if len(w.sizes) == 1:
            o.line(f"xs_c = ({w.offsets[0]}) + tl.arange(0, xs_v.shape[0])  # line {s.loc.line}: reduce-add into {t}")
            o.line(f"tl.atomic_add({w.base} + xs_c, {value}, mask=xs_c < {w.sizes[0]}, sem=\"relaxed\")")
        else:
            r0, c0 = w.offsets
            o.line(f"xs_r, xs_c = ({r0}) + tl.arange(0, xs_v.shape[0]), ({c0}) + tl.arange(0, xs_v.shape[1])"
                   f"  # line {s.loc.line}: reduce-add into {t}")
            o.line(f"tl.atomic_add({w.base} + xs_r[:, None] * {w.strides[0]} + xs_c[None, :], {value}, "
                   f"mask=(xs_r[:, None] < {w.sizes[0]}) & (xs_c[None, :] < {w.sizes[1]}), sem=\"relaxed\")")
        if guard:
            o.dedent()

    def one_adder(self, s: ir.Store, t: str) -> str:
        """When this core adds ("": always). A vector-only kernel is one vector core a program and
        an ``al.sub_vec_id()`` replica adds its own tile; else both vector cores run the code:
        vector core 0 adds (scope form); the release form cannot tell the cores apart (refused,
        unless the store sits in an arm a constexpr turns off)."""
        if (self.agent_core(self.agent) is not Core.VECTOR or self.agent.memory_pipes
                or self.plan.sub_vec_id or self.dead_arms):
            return ""
        if self.form == "scope":
            return "al.sub_vec_id() == 0"
        raise UnsupportedError(
            f"xs.store(..., reduce=\"add\") into `{t}` in role(s) {', '.join(self.agent.roles)}: in the release "
            f"form (3.2.0) both vector cores run this code, cannot tell themselves apart, and would each add",
            loc=s.loc, objects=(t,) + tuple(self.agent.roles),
            fix="use the scope form (triton-ascend >= 3.2.1, ascend_form=\"scope\"), where vector "
                "core 0 adds; or a kernel without matrix work (vector-only: one vector core a program)")
