"""`xsync demo`: the main job. Runs the example kernels and the flash-attention kernel on
the default backend (XSYNC_BACKEND, else auto: Hopper GPU, Ascend NPU, CPU emulator),
checks each against torch, and prints the protocol of the attention kernel and a short
report. Exit status 1 if any result is off."""
from __future__ import annotations

import math
import time

import torch


def _row(name, shape, err, tol, seconds):
    ok = err <= tol
    return ok, f"  {name:<22} {shape:<34} max|err| {err:9.2e}  (tol {tol:.0e})  {seconds:6.2f}s  " \
               f"{'OK' if ok else 'MISMATCH'}"


def _cdiv(a, b):
    return -(-a // b)


def run_gemm(dev):
    from xsync.kernels.gemm import gemm

    M, N, K = 200, 136, 320
    a, b = torch.randn(M, K, device=dev).bfloat16(), torch.randn(K, N, device=dev).bfloat16()
    c = torch.zeros(M, N, device=dev)
    big = dev != "cpu"
    BM, BN, BK = (128, 128, 64) if big else (32, 32, 32)
    t = time.perf_counter()
    gemm[(_cdiv(M, BM), _cdiv(N, BN))](a, b, c, M, N, K, BM=BM, BN=BN, BK=BK, STAGES=3)
    _sync(dev)
    err = (c - a.float() @ b.float()).abs().max().item()
    return _row("gemm (3 stages)", f"{M}x{N}x{K} bf16", err, 1e-2, time.perf_counter() - t)


def run_gemm_softmax(dev):
    from xsync.kernels.gemm_softmax import gemm_softmax

    M, N, K, TILES = 96, 200, 128, 2
    BM, BN = (64, 64)
    a, b = torch.randn(M, K, device=dev).bfloat16(), torch.randn(K, N, device=dev).bfloat16()
    out = torch.zeros(M, N, device=dev)
    t = time.perf_counter()
    gemm_softmax[(_cdiv(M, BM), _cdiv(N, BN * TILES))](a, b, out, M, N, K, BM=BM, BN=BN, BK=64,
                                                       STAGES=2, TILES=TILES)
    _sync(dev)
    ref = torch.cat([torch.softmax(x, 1) for x in (a.float() @ b.float()).split(BN, 1)], 1)
    err = (out - ref).abs().max().item()
    return _row("gemm+softmax (2 repl.)", f"{M}x{N}x{K} bf16", err, 1e-4, time.perf_counter() - t)


def _reference(q, k, v, causal, scale):
    qf, kf, vf = q.double().cpu(), k.double().cpu(), v.double().cpu()
    group = q.shape[1] // k.shape[1]
    kf, vf = kf.repeat_interleave(group, 1), vf.repeat_interleave(group, 1)
    s = qf @ kf.transpose(-1, -2) * scale
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    return torch.softmax(s, -1) @ vf


def run_attention(dev, B, H, HKV, S, D, causal):
    from xsync.kernels.flash_attn import attention

    q = torch.randn(B, H, S, D, device=dev).bfloat16()
    k = torch.randn(B, HKV, S, D, device=dev).bfloat16()
    v = torch.randn(B, HKV, S, D, device=dev).bfloat16()
    t = time.perf_counter()
    o, _ = attention(q, k, v, causal=causal)
    _sync(dev)
    seconds = time.perf_counter() - t
    err = (o.double().cpu() - _reference(q, k, v, causal, 1 / math.sqrt(D))).abs().max().item()
    name = f"attention{' causal' if causal else ''}{' GQA' if HKV != H else ''}"
    return _row(name, f"B{B} H{H}/{HKV} S{S} D{D} bf16", err, 2e-2, seconds)


def run_varlen(dev):
    from xsync.kernels.flash_attn import attention_varlen

    lens = [7, 64, 33, 120]
    H, HKV, D = 4, 2, 64
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    q = torch.randn(sum(lens), H, D, device=dev).bfloat16()
    k = torch.randn(sum(lens), HKV, D, device=dev).bfloat16()
    v = torch.randn(sum(lens), HKV, D, device=dev).bfloat16()
    t = time.perf_counter()
    o, _ = attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    _sync(dev)
    seconds = time.perf_counter() - t
    err = 0.0
    for b in range(len(lens)):
        sl = slice(int(cu[b]), int(cu[b + 1]))
        ref = _reference(q[sl].transpose(0, 1)[None], k[sl].transpose(0, 1)[None],
                         v[sl].transpose(0, 1)[None], True, 1 / math.sqrt(D))
        err = max(err, (o[sl].transpose(0, 1)[None].double().cpu() - ref).abs().max().item())
    return _row("attention varlen causal", f"lens {lens} H{H}/{HKV} D{D}", err, 2e-2, seconds)


def _sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def main(args=None) -> int:
    from xsync.kernels.flash_attn.kernel import attention_fwd
    from xsync.backends import select

    backend = select()
    dev = backend.device
    torch.manual_seed(0)
    print(f"xsync demo — backend: {backend.name} (XSYNC_BACKEND={backend.name!r} to force; cpu, nvidia, ascend)")
    lowered = attention_fwd.lower(backend)
    print(f"\nflash-attention protocol ({attention_fwd.fn.__code__.co_filename}):")
    print(lowered.kernel.describe())
    print("agents on this backend:")
    for a in lowered.placement.agents:
        print(f"  {a.name:<10} {a.replicas} x {a.hardware}: roles {', '.join(a.roles)}")
    print(lowered.allocation.table())
    print(lowered.report.summary())
    print("\nresults vs torch:")
    small = backend.cpu_emulator
    results = [run_gemm(dev), run_gemm_softmax(dev),
               run_attention(dev, 2, 4, 4, 77 if small else 1000, 64, False),
               run_attention(dev, 1, 4, 2, 96 if small else 2048, 128, True),
               run_varlen(dev)]
    for _, line in results:
        print(line)
    bad = sum(not ok for ok, _ in results)
    print(f"\n{len(results) - bad} of {len(results)} kernels match torch on the {backend.name} backend.")
    return 1 if bad else 0
