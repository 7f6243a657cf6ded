#!/usr/bin/env python3
"""The forward's rate against where its sources lie in device memory.

The same call (L list sources [N, D] of bf16, a key norm, a 1-D query,
save="o_pre", no autograd) is replayed from a CUDA graph with its sources
laid out four ways:

  separate    each source its own allocation, made one after another (with
              the float32 temporaries of torch.randn between them)
  packed      the sources are the rows of one [L, N, D] buffer
  staggered   one buffer, each source starting one row plus 64 elements
              further than a packed one would
  shuffled    the packed buffer's rows in a random order

and the fraction of the forward's byte floor ((L + 1) N D elt, at the copy
bandwidth of the same run) is printed for each, twice (two passes over
every layout), so that a layout effect can be told from noise.

  ATTNRES_BUNDLE_DIR=DIR PYTHONPATH=python python3 benchmarks/placement.py \\
      --shapes "48,8192,4096;63,2048,4096"

The bundles are those of benchmarks/model.py's --prebuild (layer i's read
of i sources, D = 4096: L up to 64).
"""

import argparse
import pathlib
import sys

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
import common  # noqa: E402
import attnres  # noqa: E402

LAYOUTS = ("separate", "packed", "staggered", "shuffled")


def sources(layout, L, N, D, gen):
    def randn(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").bfloat16()
    if layout == "separate":
        return [randn(N, D) for _ in range(L)]
    if layout == "staggered":
        stride = N * D + D + 64
        flat = randn(L * stride)
        return [flat[j * stride:j * stride + N * D].view(N, D)
                for j in range(L)]
    rows = list(randn(L, N, D).unbind(0))
    if layout == "shuffled":
        order = torch.randperm(L, generator=torch.Generator().manual_seed(0))
        rows = [rows[j] for j in order.tolist()]
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="48,8192,4096;63,2048,4096",
                        help="L,N,D;...")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split(","))
              for s in args.shapes.split(";")]
    bandwidth = common.copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}; copy {bandwidth / 1e12:.3f} "
          f"TB/s; fraction of the forward's floor, two passes (ms)")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for L, N, D in shapes:
        query = (torch.randn(D, generator=gen, device="cuda") *
                 D ** -0.5).bfloat16()
        key_norm = (1 + 0.1 * torch.randn(D, generator=gen, device="cuda")
                    ).bfloat16()
        floor_ms = common.forward_bytes(L, N, D) / bandwidth * 1e3
        times = {layout: [] for layout in LAYOUTS}
        for _ in range(2):
            for layout in LAYOUTS:
                rows = sources(layout, L, N, D, gen)

                def call():
                    with torch.no_grad():
                        attnres.attnres(rows, query, key_norm_weight=key_norm,
                                        eps=common.EPS, scale=common.SCALE,
                                        save="o_pre")
                times[layout].append(common.time_graph([call], repeats=10))
                del rows
                torch.cuda.empty_cache()
        for layout in LAYOUTS:
            print(f"{str((L, N, D)):>18} {layout:>10} " + " ".join(
                f"{floor_ms / ms:.3f}" for ms in times[layout]) +
                f"  ({min(times[layout]):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
