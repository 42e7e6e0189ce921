"""Run the broken GEMM in hang debug mode and print what xsync reports, as JSON.

Used by test_gpu.py in a subprocess: the debug trap leaves the CUDA context unusable.
"""
import json
import os
import sys
import time

os.environ["XSYNC_DEBUG_HANG"] = "1"
os.environ["XSYNC_VERIFY"] = "0"
os.environ.setdefault("XSYNC_HANG_TIMEOUT_MS", "1000")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from tests.nvidia.nv_kernels import gemm_extra_wait  # noqa: E402
from xsync.errors import StallError  # noqa: E402

M = N = 256
K = 192
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
c = torch.zeros(M, N, device="cuda", dtype=torch.float32)
t0 = time.monotonic()
report = {"raised": None, "message": "", "objects": []}
try:
    gemm_extra_wait[(2, 2)](a, b, c, M, N, K, BM=128, BN=128, BK=64, STAGES=2, backend="nvidia")
    torch.cuda.synchronize()
except StallError as exc:
    report.update(raised="StallError", message=str(exc), objects=list(exc.objects),
                  line=exc.loc.line if exc.loc else None)
except Exception as exc:  # noqa: BLE001
    report.update(raised=type(exc).__name__, message=str(exc))
report["seconds"] = time.monotonic() - t0
print("HANG_REPORT " + json.dumps(report))
