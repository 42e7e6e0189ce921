"""The types a kernel's signature and tiles name: element types (``xs.float16`` ...) and the
``xs.constexpr`` annotation. Everything that needs them imports this module, not the API."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str
    bits: int

    @property
    def bytes(self) -> int:
        return self.bits // 8

    def __repr__(self) -> str:
        return f"xs.{self.name}"


float16 = DType("float16", 16)
bfloat16 = DType("bfloat16", 16)
float32 = DType("float32", 32)
int32 = DType("int32", 32)
int1 = DType("int1", 8)
DTYPES = {d.name: d for d in (float16, bfloat16, float32, int32, int1)}


class constexpr:  # noqa: N801 - mirrors triton's spelling on purpose
    """Annotation for compile-time parameters (`BM: xs.constexpr`): specialised per value."""
