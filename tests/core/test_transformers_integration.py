"""attn_implementation="xsync" (xsync.integrations.transformers, issue 37) on a tiny randomly
initialised Llama (GQA, head dim 64, two layers; no downloads), run from the source checkout
(the repository root on sys.path: the `kernels` name handoff, xsync/_source_kernels.py):
logits and gradients against attn_implementation="sdpa", and the masks it refuses."""
import copy
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
xt = pytest.importorskip("xsync.integrations.transformers")

from xsync.errors import UnsupportedError  # noqa: E402

HERE = os.path.abspath(__file__)


def tiny_llama(impl, config):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(copy.deepcopy(config)).to(torch.bfloat16)
    model.set_attn_implementation(impl)
    return model


@pytest.fixture(scope="module")
def config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                       max_position_embeddings=128)


def test_llama_logits_and_gradients_match_sdpa(config):
    ref, ours = tiny_llama("sdpa", config), tiny_llama("xsync", config)
    assert ours.config._attn_implementation == "xsync"
    calls = []
    original = xt.attention_forward

    def counting(*args, **kw):
        calls.append(1)
        return original(*args, **kw)
    transformers.AttentionInterface.register("xsync", counting)
    try:
        ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(1))
        lr, lo = ref(ids).logits, ours(ids).logits
    finally:
        xt.register()
    assert len(calls) == 2          # one per layer: the xsync kernels ran
    torch.testing.assert_close(lo.float(), lr.float(), atol=3e-2, rtol=3e-2)
    lr.float().square().mean().backward()
    lo.float().square().mean().backward()
    for (name, pr), (_, po) in zip(ref.named_parameters(), ours.named_parameters()):
        err = (po.grad.float() - pr.grad.float()).norm() / pr.grad.float().norm().clamp_min(1e-12)
        assert err < 3e-2, f"{name}: relative gradient error {err:.3g}"


def test_padding_mask_is_refused(config):
    model = tiny_llama("xsync", config)
    ids = torch.randint(0, 128, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :3] = 0                                   # left padding
    with pytest.raises(UnsupportedError) as err:
        model(ids, attention_mask=mask)
    assert "attention_mask" in err.value.objects and "padding" in err.value.what and err.value.fix
    assert err.value.loc is not None


def test_mask_recognition():
    """The masks transformers builds for unpadded batches are taken as what they are."""
    q_len, k_len = 4, 9
    i, j = torch.arange(q_len)[:, None], torch.arange(k_len)[None, :]
    causal = j <= i + k_len - q_len
    assert xt._mask_kind(causal[None, None], q_len, k_len) == (True, -1)
    assert xt._mask_kind(torch.ones(1, 1, q_len, k_len, dtype=torch.bool), q_len, k_len) == (False, -1)
    band = causal & (j > i + k_len - q_len - 3)                   # each row: itself and 2 before
    assert xt._mask_kind(band[None, None], q_len, k_len) == (True, 2)
    with pytest.raises(UnsupportedError, match="neither causal"):
        xt._mask_kind((j <= i)[None, None], q_len, k_len)          # top-left with Sq != Sk
    with pytest.raises(UnsupportedError, match="additive bias"):
        xt._mask_kind(torch.zeros(1, 1, q_len, k_len), q_len, k_len)


def test_sliding_window_model_matches_sdpa():
    """A Mistral-style model (sliding_window=8, 24 tokens): its banded causal mask runs as
    window_size=(7, 0); logits and gradients as with sdpa."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=128, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                           max_position_embeddings=128, sliding_window=8)
    models = []
    for impl in ("sdpa", "xsync"):
        torch.manual_seed(0)
        m = MistralForCausalLM(copy.deepcopy(config)).to(torch.bfloat16)
        m.set_attn_implementation(impl)
        models.append(m)
    ids = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(2))
    lr, lo = (m(ids).logits for m in models)
    torch.testing.assert_close(lo.float(), lr.float(), atol=3e-2, rtol=3e-2)
    lr.float().square().mean().backward()
    lo.float().square().mean().backward()
    for (name, pr), (_, po) in zip(*(m.named_parameters() for m in models)):
        err = (po.grad.float() - pr.grad.float()).norm() / pr.grad.float().norm().clamp_min(1e-12)
        assert err < 3e-2, f"{name}: relative gradient error {err:.3g}"
