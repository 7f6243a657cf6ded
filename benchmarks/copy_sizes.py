#!/usr/bin/env python3
"""How close a plain device-to-device copy of each benchmark shape's bytes
comes to the byte floor: the ceiling that launch latency and the fill and
drain of a short kernel leave to any kernel moving that many bytes.

For every shape of common.SHAPES, a copy that reads half of the forward's
(and then the backward's) floor bytes and writes the other half, replayed
from a CUDA graph with inputs rotated exactly as run.py and kernels.py do,
is timed against the large copy of the same run, twice: as the copy the
driver does (`copy_`, a memcpy node of the graph) and as a kernel
(`torch.mul(x, 1, out=y)` on float32, PyTorch's vectorized elementwise
kernel):

  python3 benchmarks/copy_sizes.py [--shapes "L,N,D;..."]
"""

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common  # noqa: E402


def copy_fraction(total_bytes, bandwidth, kernel):
    half = total_bytes // 8  # float32 elements
    copies = common.copies_for(total_bytes)
    pairs = [(torch.zeros(half, device="cuda"),
              torch.empty(half, device="cuda")) for _ in range(copies)]

    def copy(s, d):
        if kernel:
            torch.mul(s, 1.0, out=d)
        else:
            d.copy_(s)
    ms = common.time_graph([lambda s=s, d=d: copy(s, d) for s, d in pairs])
    floor_ms = 2 * 4 * half / bandwidth * 1e3
    del pairs
    torch.cuda.empty_cache()
    return ms, floor_ms / ms


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="",
                        help="L,N,D;L,N,D... (default: common.SHAPES)")
    args = parser.parse_args()
    shapes = common.SHAPES
    if args.shapes:
        shapes = [tuple(int(x) for x in s.split(","))
                  for s in args.shapes.split(";")]
    bandwidth = common.copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e12:.3f} TB/s")
    print(f"{'L,N,D':>16} {'copy':>7} {'forward bytes':>14} {'ms':>8} "
          f"{'fraction':>8} {'backward bytes':>15} {'ms':>8} {'fraction':>8}")
    for L, N, D in shapes:
        fwd = common.forward_bytes(L, N, D)
        bwd = common.backward_bytes(L, N, D)
        for kernel in (False, True):
            fms, ffrac = copy_fraction(fwd, bandwidth, kernel)
            bms, bfrac = copy_fraction(bwd, bandwidth, kernel)
            print(f"{f'{L},{N},{D}':>16} {'kernel' if kernel else 'memcpy':>7}"
                  f" {fwd:>14} {fms:>8.4f} {ffrac:>8.3f} {bwd:>15} {bms:>8.4f}"
                  f" {bfrac:>8.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
