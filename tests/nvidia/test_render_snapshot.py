"""The Hopper renderer's layout inference, as the rendered source shows it (the byte-for-byte
snapshot of every backend's source is tests/core/test_render_snapshot.py)."""


def _rendered(kernel, blocks):
    from xsync import config
    from xsync.backends.nvidia import NVIDIA
    from xsync.backends.nvidia.render import render

    cx, dtypes = kernel.specialization()
    cx.update(blocks)
    lw = kernel.lower("nvidia", cx, dtypes)
    args = (lw.kernel, lw.placement, lw.allocation)
    return render(*args, config.render_options(NVIDIA))


def test_layouts_are_inferred_once_before_rendering():
    """The consumers' layouts come from the inference: a register A operand held in a variable
    (tests/nvidia/nv_kernels.py's held_operand) takes the wgmma operand layout at its
    definition; in the forward, Q comes from its shared-memory ring, the loop-carried row
    statistics keep the accumulator's row layout, and the header declares exactly the
    inference's constants, in its order."""
    from tests.nvidia.nv_kernels import held_operand
    from xsync.kernels.flash_attn import attention_fwd, ops

    held = _rendered(held_operand, {})
    consumer = held.layouts.agents["consumer"]
    a = consumer.variables["a_tile"]
    assert a.layout == consumer.wants["a_tile"] and a.layout.startswith("gl.DotOperandLayout(operand_index=0")
    assert "a_tile = gl.convert_layout(" in held.source
    result = _rendered(attention_fwd, dict(ops.block_sizes("nvidia"), D=128, CAUSAL=0))
    consumer = result.layouts.agents["consumer"]
    assert "q_tile" not in consumer.variables and "warpgroup_mma(q_in_q.index(qt), " in result.source
    for row in ("m_i", "l_i"):
        assert consumer.variables[row].layout == "gl.SliceLayout(1, ACC_N128)"
    assert consumer.walks >= 2 and result.layouts.agents["load"].walks == 2
    header = result.source[result.source.index("# layouts\n"):].split("\n\n")[0].splitlines()[1:]
    assert header == [f"{c.name} = gl.constexpr({c.ctor})  # {c.note}" for c in result.layouts.constants]
