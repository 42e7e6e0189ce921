"""The Hopper renderer's Gluon source, byte for byte, for every kernel and pass-option
specialization of tests/nvidia/render_snapshot.py: a change to the generated code must be
intended (re-record with ``python -m tests.nvidia.render_snapshot --write`` and say why)."""
import json

from tests.nvidia import render_snapshot


def test_rendered_sources_match_the_golden_hashes():
    with open(render_snapshot.GOLDEN) as f:
        golden = json.load(f)
    got = render_snapshot.snapshot()
    assert len(got) == len(golden) > 80
    assert render_snapshot.compare(got, golden) == []


def test_layouts_are_inferred_once_before_rendering():
    """The attention consumer's layouts come from the inference: Q takes the wgmma operand
    layout at its definition, the loop-carried row statistics keep the accumulator's row
    layout, and the header declares exactly the inference's constants, in its order."""
    from xsync.backends.nvidia import occupancy_defaults, resolve_options
    from xsync.backends.nvidia.render import render
    from xsync.kernels.flash_attn import attention_fwd, ops

    cx, dtypes = attention_fwd.specialization()
    cx.update(ops.block_sizes("nvidia"), D=128, CAUSAL=0)
    lw = attention_fwd.lower("nvidia", cx, dtypes)
    args = (lw.kernel, lw.placement, lw.allocation)
    result = render(*args, occupancy_defaults(*args, resolve_options()))
    consumer = result.layouts.agents["consumer"]
    q = consumer.variables["q_tile"]
    assert q.layout == consumer.wants["q_tile"] and q.layout.startswith("gl.DotOperandLayout(operand_index=0")
    assert "q_tile = gl.convert_layout(" in result.source
    for row in ("m_i", "l_i"):
        assert consumer.variables[row].layout == "gl.SliceLayout(1, ACC_N128)"
    assert consumer.walks >= 2 and result.layouts.agents["producer"].walks == 2
    header = result.source[result.source.index("# layouts\n"):].split("\n\n")[0].splitlines()[1:]
    assert header == [f"{c.name} = gl.constexpr({c.ctor})  # {c.note}" for c in result.layouts.constants]
