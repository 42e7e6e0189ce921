"""A model-level benchmark: a Llama-style causal LM (random init, no weights or downloads)
trained for a few steps with xsync attention against SDPA, in one process on the same
batches: step time (forward + backward + optimizer), tokens/s, and loss and gradient agreement.

    python benchmarks/model_step.py [--config gqa128,mha64] [--steps N] [--device cuda|cpu]
                                    [--tiny] [--out benchmarks/results]

Configurations (``CONFIGS``): GQA d128 s4096 and MHA d64 s2048, bf16, the shapes of the issue
that asked for it. transformers' ``LlamaForCausalLM`` with ``attn_implementation="xsync"``
(xsync.integrations.transformers) and ``"sdpa"``; without transformers, a plain torch model of
the same shape whose attention is ``xsync.sdpa`` or SDPA (the row says which model ran).
``--tiny`` shrinks every configuration (the CPU smoke run: the emulator is slow). The two
implementations alternate step by step (one warm-up each), and the medians are reported.
Writes model_step.json (and .md) under --out.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

CONFIGS = {
    "gqa128": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, layers=4, seq=4096, batch=1),
    "mha64": dict(hidden=2048, heads=32, kv_heads=32, head_dim=64, layers=4, seq=2048, batch=2),
}
TINY = dict(layers=2, seq=48, batch=1)
VOCAB = 32000


def shrink(cfg: dict) -> dict:
    heads = 2 if cfg["heads"] == cfg["kv_heads"] else 4
    return {**cfg, **TINY, "heads": heads, "kv_heads": 2, "hidden": heads * cfg["head_dim"]}


def hf_model(cfg: dict, impl: str, dtype, device):
    from transformers import LlamaConfig, LlamaForCausalLM

    import xsync.integrations.transformers  # noqa: F401 - registers attn_implementation="xsync"

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=cfg["hidden"], intermediate_size=cfg["hidden"] * 2,
                         num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                         num_key_value_heads=cfg["kv_heads"], head_dim=cfg["head_dim"],
                         max_position_embeddings=cfg["seq"])
    import torch
    torch.manual_seed(0)
    model = LlamaForCausalLM(copy.deepcopy(config)).to(dtype=dtype, device=device)
    model.set_attn_implementation(impl)
    return model, "transformers LlamaForCausalLM"


def plain_model(cfg: dict, impl: str, dtype, device):
    """The same shape without transformers: pre-norm blocks, GQA attention, SwiGLU MLP."""
    import torch
    import xsync
    nn, F = torch.nn, torch.nn.functional
    d, h, kvh, hd = cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]

    def attend(q, k, v):
        if impl == "xsync":
            return xsync.sdpa(q, k, v, is_causal=True, enable_gqa=h != kvh)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=h != kvh)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
            self.qkv = nn.Linear(d, (h + 2 * kvh) * hd, bias=False)
            self.o = nn.Linear(h * hd, d, bias=False)
            self.up = nn.Linear(d, 4 * d, bias=False)
            self.down = nn.Linear(2 * d, d, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).split([h * hd, kvh * hd, kvh * hd], -1)
            q, k, v = (t.view(b, s, -1, hd).transpose(1, 2) for t in (q, k, v))
            x = x + self.o(attend(q, k, v).transpose(1, 2).reshape(b, s, h * hd))
            a, g = self.up(self.n2(x)).chunk(2, -1)
            return x + self.down(F.silu(a) * g)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, d)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["layers"]))
            self.head = nn.Linear(d, VOCAB, bias=False)

        def forward(self, ids):
            x = self.emb(ids)
            for blk in self.blocks:
                x = blk(x)
            return self.head(x)

    torch.manual_seed(0)
    return LM().to(dtype=dtype, device=device), "plain torch LM (transformers not importable)"


def _logits(model, ids):
    out = model(ids)
    return out.logits if hasattr(out, "logits") else out


def train_step(model, opt, ids):
    import torch
    logits = _logits(model, ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    opt.step()
    return loss.item(), grads


def measure(name: str, cfg: dict, steps: int, device: str) -> dict:
    import torch
    dtype = torch.bfloat16
    try:
        import transformers  # noqa: F401
        build = hf_model
    except ImportError:
        build = plain_model
    models = {}
    for impl in ("sdpa", "xsync"):
        model, kind = build(cfg, impl, dtype, device)
        models[impl] = (model, torch.optim.SGD(model.parameters(), lr=1e-3))
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, VOCAB, (cfg["batch"], cfg["seq"] + 1), generator=gen).to(device)
               for _ in range(steps + 1)]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = {impl: [] for impl in models}
    agree = {}
    for i, ids in enumerate(batches):
        results = {}
        for impl, (model, opt) in models.items():     # alternate: drift hits both alike
            sync()
            t0 = time.perf_counter()
            results[impl] = train_step(model, opt, ids)
            sync()
            if i > 0:                                 # step 0 warms up (compiles)
                times[impl].append(time.perf_counter() - t0)
        if i == 0:                                    # same weights, same batch: compare once
            (ls, gs), (lx, gx) = results["sdpa"], results["xsync"]
            rel = max(((gx[n] - gs[n]).norm() / gs[n].norm().clamp_min(1e-12)).item() for n in gs)
            agree = dict(loss_sdpa=ls, loss_xsync=lx, loss_abs_diff=abs(ls - lx), max_rel_grad_diff=rel)
    tokens = cfg["batch"] * cfg["seq"]
    row = dict(config=name, model=kind, device=device, steps=steps, **cfg, **agree)
    for impl, ts in times.items():
        med = statistics.median(ts)
        row[f"{impl}_step_ms"] = med * 1e3
        row[f"{impl}_tokens_per_s"] = tokens / med
    row["speed_vs_sdpa"] = row["sdpa_step_ms"] / row["xsync_step_ms"]
    return row


def table(rows) -> str:
    out = ["| config | model | s | xsync step ms | SDPA step ms | xsync/SDPA speed | loss diff | max rel grad diff |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['config']} | {r['model']} | {r['seq']} | {r['xsync_step_ms']:.1f} | {r['sdpa_step_ms']:.1f} "
                   f"| {r['speed_vs_sdpa']:.3f} | {r['loss_abs_diff']:.1e} | {r['max_rel_grad_diff']:.1e} |")
    return "\n".join(out)


def main(argv=None) -> int:
    import torch
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=",".join(CONFIGS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="shrink every configuration (CPU smoke run)")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = parser.parse_args(argv)
    names = [n for n in args.config.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or args.steps < 1:
        print(f"unknown config(s) {unknown} (valid: {', '.join(CONFIGS)}) or --steps < 1", file=sys.stderr)
        return 2
    if args.device == "cuda":
        from benchmarks._gpu import cuda_missing
        if cuda_missing(__file__):
            return 2
    rows = [measure(n, shrink(CONFIGS[n]) if args.tiny else CONFIGS[n], args.steps, args.device) for n in names]
    meta = dict(torch=torch.__version__, device=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                tiny=args.tiny, date=time.strftime("%Y-%m-%dT%H:%M:%S"))
    os.makedirs(args.out, exist_ok=True)
    stem = "model_step_tiny_cpu" if args.tiny else "model_step"
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    md = f"# model training step, {meta['device']}, torch {meta['torch']}\n\n" + table(rows) + "\n"
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
