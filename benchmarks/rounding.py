#!/usr/bin/env python3
"""How far a bf16 stack's gradients are from float32 on its own: the
model of benchmarks/model.py (layer i: a D x D linear layer after the
residual stream, or after AttnRes over the embedding and every earlier
output), run once in bf16 and once in float32 from the same bf16 values,
compared as model.py compares (relative Frobenius, the largest of each kind
of gradient). The plain residual stream has no AttnRes at all, and the
PyTorch ops compute AttnRes in float32 and round its output to bf16 once:
what they show is the rounding of the bf16 linear layers and residual
adds, which bounds how close any bf16 AttnRes's gradients can come to
float32 in such a stack. Runs on the CPU (no GPU needed) or on CUDA.

  python3 benchmarks/rounding.py [--shape L N D] [--device cpu|cuda]
"""

import argparse
import pathlib
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
from attnres.reference import attnres_reference  # noqa: E402

KINDS = ("embedding", "weights", "queries", "key_norms")


def values(L, N, D, device, seed=0):
    """The stack's bf16 values, as model.Model draws them."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, mean=0.0, std=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * std +
                mean).to(torch.bfloat16)
    embedding = randn(N, D)
    weights = [randn(D, D, std=D ** -0.5) for _ in range(L)]
    queries = [randn(D, std=D ** -0.5) for _ in range(L)]
    key_norms = [randn(D, mean=1.0, std=0.1) for _ in range(L)]
    return [embedding] + weights + queries + key_norms, randn(N, D)


def plain(L, p, grad_out):
    h = p[0]
    for W in p[1:1 + L]:
        h = h + h @ W
    h.backward(grad_out)


def pytorch_ops(L, p, grad_out):
    weights, queries, key_norms = p[1:1 + L], p[1 + L:1 + 2 * L], \
        p[1 + 2 * L:]
    outputs = [p[0]]
    for i in range(L):
        x = attnres_reference(torch.stack(outputs), queries[i],
                              key_norm_weight=key_norms[i])
        outputs.append(x @ weights[i])
    outputs[-1].backward(grad_out)


def gradients(step, L, leaves, grad_out, dtype):
    p = [t.to(dtype, copy=True).requires_grad_() for t in leaves]
    step(L, p, grad_out.to(dtype))
    return [t.grad if t.grad is not None else torch.zeros_like(t)
            for t in p]


def compare(got, expected, L):
    """model.py's compare: the largest relative Frobenius error of each
    kind (a gradient's norm floored at 1 % of its kind's largest)."""
    groups = [(0, 1), (1, 1 + L), (1 + L, 1 + 2 * L), (1 + 2 * L, 1 + 3 * L)]
    result = {}
    for kind, (first, last) in zip(KINDS, groups):
        scale = max(e.double().norm().item() for e in expected[first:last])
        result[kind] = max(
            (g.double() - e.double()).norm().item() /
            max(e.double().norm().item(), 1e-2 * scale, 1e-30)
            for g, e in zip(got[first:last], expected[first:last]))
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=int, nargs=3, default=(16, 256, 1024),
                        metavar=("L", "N", "D"))
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    L, N, D = args.shape
    leaves, grad_out = values(L, N, D, args.device)
    for name, step in (("plain", plain), ("PyTorch ops", pytorch_ops)):
        start = time.time()
        errors = compare(gradients(step, L, leaves, grad_out, torch.bfloat16),
                         gradients(step, L, leaves, grad_out, torch.float32),
                         L)
        shown = KINDS if step is pytorch_ops else KINDS[:2]
        print(f"{(L, N, D)} {name}: bf16 against float32: " + ", ".join(
            f"{kind} {errors[kind]:.1e}" for kind in shown) +
            f" ({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
