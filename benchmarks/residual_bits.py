#!/usr/bin/env python3
"""How many residual bits a 16-bit o_pre needs (docs/Math.md): a float64
model of the single-pass backward on the CPU, given o_pre as bf16 alone,
bf16 plus a residual of 2, 3, 4 or 8 bits, or FP32, against float32
autograd of the reference on the same bf16 inputs. Prints the relative
(Frobenius) error of every gradient, as benchmarks/run.py measures it.

    python3 benchmarks/residual_bits.py --shape 4 4096 1024 --output-norm
"""

import argparse
import math

import torch


def forward(v, q, g, h, eps, scale):
    rho = torch.rsqrt((v * v).mean(-1, keepdim=True) + eps)
    z = scale * (rho * v * g * q).sum(-1)                    # [L, N]
    o = (torch.softmax(z, 0)[..., None] * v).sum(0)
    if h is not None:
        o = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + eps) * h
    return o


def stored_o_pre(o_pre32, bits):
    """o_pre as the backward would read it: bf16, bf16 and a residual of
    `bits` bits (n in [-(2^(bits-1) - 1), 2^(bits-1) - 1] steps of ulp /
    (2^bits - 2)), or FP32 (bits = None)."""
    if bits is None:
        return o_pre32.double()
    rounded = o_pre32.to(torch.bfloat16).float()
    if bits == 0:
        return rounded.double()
    levels = 2 ** (bits - 1) - 1
    ulp = torch.ldexp(torch.ones_like(rounded), torch.frexp(rounded)[1] - 8)
    n = torch.clamp(torch.round((o_pre32 - rounded) / ulp * 2 * levels),
                    -levels, levels)
    return (rounded + n * ulp / (2 * levels)).double()


def backward(v, q, g, h, do, eps, scale, bits):
    """docs/Math.md section 2 in float64, o_pre stored as `bits` says;
    results rounded to bf16 as the kernels store them."""
    rho = torch.rsqrt((v * v).mean(-1) + eps)
    a = g * q
    ell = rho * (v * a).sum(-1)
    p = torch.softmax(scale * ell, 0)
    o_pre = stored_o_pre((p[..., None] * v).sum(0).float(), bits)
    d_pre, dh = do, None
    if h is not None:
        rho_o = torch.rsqrt((o_pre * o_pre).mean(-1, keepdim=True) + eps)
        xhat = o_pre * rho_o
        dh = (xhat * do).sum(0)
        d_pre = rho_o * (h * do - xhat * (xhat * h * do).mean(-1,
                                                               keepdim=True))
    delta = (d_pre * o_pre).sum(-1)
    ds = scale * p * ((v * d_pre).sum(-1) - delta)
    khat = rho[..., None] * v
    D = v.shape[-1]
    dv = p[..., None] * d_pre + (ds * rho)[..., None] * (
        a - khat * (ell / D)[..., None])
    da = (ds[..., None] * khat).sum((0, 1))
    grads = {f"dv{l}": dv[l] for l in range(v.shape[0])}
    grads.update(dq=da * g, dg=da * q)
    if dh is not None:
        grads["dh"] = dh
    return {k: t.to(torch.bfloat16) for k, t in grads.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=int, nargs=3, default=[4, 4096, 1024],
                        metavar=("L", "N", "D"))
    parser.add_argument("--output-norm", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    L, N, D = args.shape
    torch.manual_seed(args.seed)
    bf16, eps, scale = torch.bfloat16, 1e-6, 1.0

    def randn(*shape, mean=0.0, std=1.0):
        return (torch.randn(*shape) * std + mean).to(bf16)

    v = randn(L, N, D)
    q = randn(D, std=2 / math.sqrt(D))
    g = randn(D, mean=1.0, std=0.2)
    h = randn(D, mean=1.0, std=0.2) if args.output_norm else None
    do = randn(N, D)
    leaves = [t.float().requires_grad_() for t in (v, q, g)]
    if h is not None:
        leaves.append(h.float().requires_grad_())
    o = forward(*leaves[:3], leaves[3] if h is not None else None, eps, scale)
    ref = torch.autograd.grad(o, leaves, do.float())
    reference = {f"dv{l}": ref[0][l] for l in range(L)}
    reference.update(dq=ref[1], dg=ref[2])
    if h is not None:
        reference["dh"] = ref[3]
    inputs = [t.double() for t in (v, q, g)]
    hh = h.double() if h is not None else None
    print(f"L={L} N={N} D={D}{' output norm' if h is not None else ''}: "
          "relative error of each gradient")
    for name, bits in [("bf16", 0), ("2 bits", 2), ("3 bits", 3),
                       ("4 bits", 4), ("8 bits", 8), ("fp32", None)]:
        got = backward(*inputs, hh, do.double(), eps, scale, bits)
        errors = {k: (torch.linalg.norm(got[k].float() - r) /
                      torch.linalg.norm(r)).item()
                  for k, r in reference.items()}
        dv = max(e for k, e in errors.items() if k.startswith("dv"))
        rest = " ".join(f"{k} {e:.2e}" for k, e in errors.items()
                        if not k.startswith("dv"))
        worst = max(errors.values())
        print(f"  {name:<7} worst {worst:.2e}  dv {dv:.2e} {rest}")


if __name__ == "__main__":
    main()
