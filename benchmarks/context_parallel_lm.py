"""A model-level example of context parallelism: a small causal LM (rotary embeddings, GQA, one
xsync attention call per layer) trained over W ranks with xsync.distributed.ring_attention, each
rank holding its zig-zag part of the sequence; checked against the same model on the whole sequence
in one process (loss and every parameter's gradient).

    python benchmarks/context_parallel_lm.py --world 2 --seq 64 --steps 2          (CPU, gloo)
    torchrun --nproc-per-node 8 benchmarks/context_parallel_lm.py --seq 65536 --dim 1024 --heads 8

What context parallelism asks of a model, all visible below: token ids, labels and rotary positions
are sharded with the attention's layout (xsync.distributed.shard / positions); the loss is summed
over local tokens and all-reduced; parameters are replicated, so their gradients are all-reduced
(SUM) across the ranks after backward.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _model(args):
    import torch
    from torch import nn

    class Layer(nn.Module):
        def __init__(self, d, h, hkv):
            super().__init__()
            self.h, self.hkv, self.hd = h, hkv, d // h
            self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.q = nn.Linear(d, d, bias=False)
            self.kv = nn.Linear(d, 2 * hkv * self.hd, bias=False)
            self.o = nn.Linear(d, d, bias=False)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x, cos, sin, attend):
            b, n, d = x.shape
            y = self.n1(x)
            q = self.q(y).view(b, n, self.h, self.hd).transpose(1, 2)
            k, v = self.kv(y).view(b, n, 2, self.hkv, self.hd).permute(2, 0, 3, 1, 4)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            o = attend(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16))
            x = x + self.o(o.float().transpose(1, 2).reshape(b, n, d))
            return x + self.mlp(self.n2(x))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(args.vocab, args.dim)
            self.layers = nn.ModuleList(Layer(args.dim, args.heads, args.kv_heads) for _ in range(args.layers))
            self.head = nn.Linear(args.dim, args.vocab, bias=False)

        def forward(self, tokens, pos, attend):
            half = args.dim // args.heads // 2
            freq = 10000.0 ** (-torch.arange(half, device=tokens.device) / half)
            ang = pos[:, None].float() * freq[None]
            cos, sin = ang.cos(), ang.sin()
            x = self.emb(tokens)
            for layer in self.layers:
                x = layer(x, cos, sin, attend)
            return self.head(x)

    torch.manual_seed(0)
    return LM()


def _rope(x, cos, sin):
    import torch

    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def _loss_and_grads(model, tokens, labels, pos, attend, total):
    import torch.nn.functional as F

    model.zero_grad()
    logits = model(tokens, pos, attend)
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum") / total
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _rank(rank, world, args, init):
    import torch
    import torch.distributed as dist

    import xsync.distributed as xd
    from xsync.kernels.flash_attn import attention

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl", init_method=init, rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=300))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if torch.cuda.is_available() \
        else torch.device("cpu")
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, args.vocab, (1, args.seq), generator=gen)
    labels = torch.cat([tokens[:, 1:], torch.full((1, 1), -100)], dim=1)       # next token; the last has none
    total = args.seq - 1
    model = _model(args).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def ring(q, k, v):
        return xd.ring_attention(q, k, v, causal=True)[0]

    mine = [xd.shard(t, rank, world, dim=1).to(device) for t in (tokens, labels)]
    pos = xd.positions(args.seq, rank, world, device=device)
    for step in range(args.steps):
        t0 = time.perf_counter()
        loss, _ = _loss_and_grads(model, mine[0], mine[1], pos, ring, total)
        dist.all_reduce(loss)
        for p in model.parameters():
            dist.all_reduce(p.grad)
        took = time.perf_counter() - t0
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        if args.check:
            # the same model on the whole sequence, in this process (overwrites .grad)
            ref_loss, ref = _loss_and_grads(model, tokens.to(device), labels.to(device),
                                            torch.arange(args.seq, device=device),
                                            lambda q, k, v: attention(q, k, v, causal=True)[0], total)
            worst = max((grads[n] - ref[n]).norm().item() / max(ref[n].norm().item(), 1e-12) for n in ref)
            if rank == 0:
                print(f"step {step}: loss {loss.item():.6f} (one process: {ref_loss.item():.6f}), worst relative "
                      f"gradient difference {worst:.2e}, {args.seq / world / took:.0f} tokens/s per rank "
                      f"({took * 1e3:.0f} ms forward+backward+all-reduce)", flush=True)
        for n, p in model.named_parameters():
            p.grad = grads[n]
        opt.step()
    dist.barrier()
    dist.destroy_process_group()


def _spawned(rank, world, args, init):
    _rank(rank, world, args, init)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2, help="ranks to spawn (ignored under torchrun)")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=2, help="query heads (head dim = dim / heads: 64 or 128)")
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the one-process reference")
    args = p.parse_args(argv if argv is not None else sys.argv[1:])
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:      # torchrun
        _rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, "env://")
        return 0
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_spawned, args=(args.world, args, f"file://{tmp}/rendezvous"), nprocs=args.world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
