#!/usr/bin/env python3
"""Trains a small Transformer with Full Attention Residuals for 50 steps
twice from the same initialization and data: once with the compiled op
(attnres.attnres), once with the plain-PyTorch AttnRes
(attnres.reference.attnres_reference), and compares the loss curves.

The model: 4 layers of (attention, MLP) sublayers, D = 256, bf16 compute
with FP32 master weights. Every sublayer reads its input through AttnRes
over all earlier outputs (the embedding and every earlier sublayer's
output), with a learned query (zero-initialized: uniform mixing at the
start), a key norm, and the sublayer's pre-norm fused as the output norm;
the LM head reads a final AttnRes.

bf16 noise: a third run uses the plain-PyTorch AttnRes accumulating in
float64 instead of float32, a change only in rounding; how far its curve
drifts from the float32 one measures what rounding alone does over 50
steps. The compiled op passes when its curve stays within 3x that drift
(or 0.02, whichever is larger) of the plain-PyTorch curve.
"""

import argparse
import json
import math
import statistics
import pathlib
import sys
import time

import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "python"))

import attnres  # noqa: E402
from attnres.reference import attnres_reference  # noqa: E402

VOCAB, D, HEADS, LAYERS, SEQ, BATCH, STEPS = 512, 256, 4, 4, 128, 16, 50


def attnres_float64(sources, query, **kwargs):
    return attnres_reference([s.double() for s in sources], query.double(),
                             **{k: (v.double() if torch.is_tensor(v) else v)
                                for k, v in kwargs.items()}).to(
                                    sources[0].dtype)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D)
        self.sublayers = 2 * LAYERS
        count = self.sublayers + 1
        self.queries = torch.nn.Parameter(torch.zeros(count, D))
        self.key_norms = torch.nn.Parameter(torch.ones(count, D))
        self.pre_norms = torch.nn.Parameter(torch.ones(count, D))
        self.qkv = torch.nn.ModuleList(
            torch.nn.Linear(D, 3 * D, bias=False) for _ in range(LAYERS))
        self.proj = torch.nn.ModuleList(
            torch.nn.Linear(D, D, bias=False) for _ in range(LAYERS))
        self.up = torch.nn.ModuleList(
            torch.nn.Linear(D, 4 * D, bias=False) for _ in range(LAYERS))
        self.down = torch.nn.ModuleList(
            torch.nn.Linear(4 * D, D, bias=False) for _ in range(LAYERS))
        self.head = torch.nn.Linear(D, VOCAB, bias=False)

    def mix(self, op, sources, index):
        bf = torch.bfloat16
        return op(sources, self.queries[index].to(bf),
                  key_norm_weight=self.key_norms[index].to(bf),
                  output_norm_weight=self.pre_norms[index].to(bf))

    def forward(self, tokens, op):
        B, T = tokens.shape
        sources = [self.embed(tokens).to(torch.bfloat16)]
        for layer in range(LAYERS):
            x = self.mix(op, sources, 2 * layer)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                q, k, v = self.qkv[layer](x).chunk(3, dim=-1)
                q, k, v = (t.reshape(B, T, HEADS, D // HEADS).transpose(1, 2)
                           for t in (q, k, v))
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                y = self.proj[layer](y.transpose(1, 2).reshape(B, T, D))
            sources.append(y.to(torch.bfloat16))
            x = self.mix(op, sources, 2 * layer + 1)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = self.down[layer](F.gelu(self.up[layer](x)))
            sources.append(y.to(torch.bfloat16))
        x = self.mix(op, sources, self.sublayers)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return self.head(x).float()


def batches(device):
    """A fixed random bigram chain: learnable structure, same for all runs."""
    gen = torch.Generator().manual_seed(1234)
    logits = torch.randn(VOCAB, VOCAB, generator=gen) * 3
    chain = torch.softmax(logits, -1)
    data = []
    for _ in range(STEPS):
        tokens = torch.empty(BATCH, SEQ + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(VOCAB, (BATCH,), generator=gen)
        for t in range(SEQ):
            tokens[:, t + 1] = torch.multinomial(chain[tokens[:, t]], 1,
                                                 generator=gen)[:, 0]
        data.append(tokens.to(device))
    return data


def train(op, data, device):
    torch.manual_seed(0)
    model = Model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3,
                                  weight_decay=0.0)
    losses, times = [], []
    for tokens in data:
        start = time.perf_counter()
        logits = model(tokens[:, :-1], op)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB),
                               tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # synchronizes: the step is done
        times.append(time.perf_counter() - start)
    # The median step after the first ten: no first-call loading or
    # autotuning in it.
    return losses, statistics.median(times[10:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    device = "cuda"
    data = batches(device)
    compiled, t_compiled = train(attnres.attnres, data, device)
    plain, t_plain = train(attnres_reference, data, device)
    plain64, _ = train(attnres_float64, data, device)
    difference = max(abs(a - b) for a, b in zip(compiled, plain))
    noise = max(abs(a - b) for a, b in zip(plain64, plain))
    bound = max(3 * noise, 0.02)
    print("step  compiled-op  plain-pytorch  plain-f64-accum")
    for step in list(range(0, STEPS, 5)) + [STEPS - 1]:
        print(f"{step:4d}  {compiled[step]:11.4f}  {plain[step]:13.4f}  "
              f"{plain64[step]:15.4f}")
    ok = difference <= bound and all(map(math.isfinite, compiled))
    print(f"\nmax |compiled - plain| = {difference:.4f}; rounding noise "
          f"max |plain f64 - plain f32| = {noise:.4f}; bound {bound:.4f}: "
          f"{'PASS' if ok else 'FAIL'}")
    print(f"loss {compiled[0]:.3f} -> {compiled[-1]:.3f} (compiled), "
          f"{plain[0]:.3f} -> {plain[-1]:.3f} (plain); median step "
          f"{t_compiled * 1e3:.1f} ms (compiled op) vs {t_plain * 1e3:.1f} ms "
          f"(plain PyTorch)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "train_compare.json").write_text(json.dumps(dict(
            compiled=compiled, plain=plain, plain_float64=plain64,
            difference=difference, noise=noise, ok=ok,
            step_seconds=dict(compiled=t_compiled, plain=t_plain)),
            indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
