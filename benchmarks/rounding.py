#!/usr/bin/env python3
"""How far a bf16 stack's gradients are from float32 on their own:
model.py's Full stack (layer i: a D x D linear layer after the residual
stream, or after AttnRes over the embedding and every earlier output) run
once in bf16 and once in float32 from the same bf16 values, compared as
model.py compares (relative Frobenius, the largest of each kind of
gradient). The plain residual stream has no AttnRes at all, and the
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
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
import model  # noqa: E402
from attnres.reference import attnres_reference  # noqa: E402


def pytorch_ops(m):
    model.list_step(m, lambda sources, query, key_norm_weight:
                    attnres_reference(torch.stack(sources), query,
                                      key_norm_weight=key_norm_weight))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=int, nargs=3, default=(16, 256, 1024),
                        metavar=("L", "N", "D"))
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    L, N, D = args.shape
    m = model.Model(L, N, D, torch.bfloat16, device=args.device)
    f32 = m.converted(torch.float32)
    for name, step in (("plain", model.plain_step),
                       ("PyTorch ops", pytorch_ops)):
        start = time.time()
        errors = model.compare(model.gradients(m, lambda: step(m)),
                               model.gradients(f32, lambda: step(f32)), L)
        # (The plain stream has no queries or key norms.)
        shown = model.KINDS if step is pytorch_ops else model.KINDS[:2]
        print(f"{(L, N, D)} {name}: bf16 against float32: " + ", ".join(
            f"{kind} {errors[kind]:.1e}" for kind in shown) +
            f" ({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
