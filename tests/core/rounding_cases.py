"""fp32 values whose bf16/fp16 truncation and round-to-nearest-even differ, and a kernel that
casts them: by a store into a narrower tensor and by an explicit ``.to``."""
import torch

import xsync as xs

BM, BN = 16, 16


@xs.kernel(example=dict(x=xs.float32, y=xs.bfloat16, z=xs.float32, h=xs.float16, BM=BM, BN=BN))
def cast_tile(x, y, z, h, BM: xs.constexpr, BN: xs.constexpr):
    vec = xs.role("vec", kind="vector")
    with vec:
        t = xs.load(x, [0, 0], [BM, BN])
        xs.store(y, [0, 0], t)                     # fp32 -> bf16 by the store
        xs.store(z, [0, 0], t.to(xs.bfloat16))     # fp32 -> bf16 -> fp32
        xs.store(h, [0, 0], t)                     # fp32 -> fp16 by the store


def _f32(bits: int) -> float:
    return torch.tensor([bits], dtype=torch.int64).to(torch.int32).view(torch.float32).item()


def inputs() -> torch.Tensor:
    """A [BM, BN] fp32 tile: every pattern and its negative, then random values."""
    u = 2.0 ** -7   # the bf16 ulp at 1
    patterns = [
        1 + u / 2 + u / 4,          # above half an ulp: rounds up, truncation keeps 1
        1 + u / 2,                  # a tie, even lsb: stays 1
        1 + u + u / 2,              # a tie, odd lsb: rounds up to 1 + 2u
        1 + u + u / 2 + 2 ** -20,   # just above a tie
        1 + u / 2 - 2 ** -20,       # just below a tie
        3.0 + 3 * 2 ** -7,          # odd lsb, above half
        2 ** -126 * (1 + u / 2 + u / 4),     # smallest normals
        _f32(0x00018000),           # a subnormal tie with an odd lsb
        _f32(0x00008001),           # a subnormal above half
        _f32(0x7F7FFFFF),           # fp32 max: bf16 overflows to inf
        _f32(0x7F7F8000),           # a tie at bf16 max with an odd lsb: to inf
        _f32(0x7F7F7FFF),           # just below that tie: bf16 max
        65519.0, 65520.0, 70000.0,  # fp16 max region: 65520 is the tie that rounds to inf
        1 + 2 ** -11,               # an fp16 tie (ulp 2^-10 at 1), even lsb
        1 + 3 * 2 ** -11,           # an fp16 tie, odd lsb
        0.0, float("inf"), float("nan"),
    ]
    values = patterns + [-v for v in patterns]
    torch.manual_seed(0)
    rest = torch.randn(BM * BN - len(values)) * torch.exp2(torch.randint(-20, 20, (BM * BN - len(values),)).float())
    return torch.cat([torch.tensor(values, dtype=torch.float32), rest]).view(BM, BN)


def run(kernel_launch=None):
    """Launch ``cast_tile`` on the current backend; returns (x, y, z, h)."""
    x = inputs()
    y = torch.zeros(BM, BN, dtype=torch.bfloat16)
    z = torch.zeros(BM, BN)
    h = torch.zeros(BM, BN, dtype=torch.float16)
    cast_tile[(1,)](x, y, z, h, BM=BM, BN=BN)
    return x, y, z, h


def assert_same_bits(got: torch.Tensor, want: torch.Tensor):
    """Bit-identical, except that any NaN matches any NaN (payloads may differ)."""
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), "NaN positions differ"
    width = {2: torch.int16, 4: torch.int32}[want.element_size()]
    g, w = got[~nan].view(width), want[~nan].view(width)
    bad = (g != w).nonzero().flatten()
    assert bad.numel() == 0, (f"{bad.numel()} values differ, e.g. {got[~nan][bad[:4]].tolist()} "
                              f"instead of {want[~nan][bad[:4]].tolist()}")


def check(x, y, z, h):
    assert_same_bits(y, x.to(torch.bfloat16))
    assert_same_bits(z, x.to(torch.bfloat16).float())
    assert_same_bits(h, x.to(torch.float16))
