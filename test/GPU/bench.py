#!/usr/bin/env python3
"""Times the attnres kernels on the shapes of DESIGN.md section 6 as a
fraction of the byte floor, with the copy bandwidth measured in the same run.

  forward floor  (L + 1) * N * D * elt bytes
  backward floor (2L + 2) * N * D * elt bytes   (saved o_pre)

Bundles come from make_bundles.py --bench (specs in BENCH_SPECS). Times are
medians of CUDA-event-timed replays after warm-up; inputs are larger than L2.
"""

import argparse
import json
import math
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import run_cases  # noqa: E402

# (L, N, D) of DESIGN.md section 6, bf16, no weights.
SHAPES = [(10, 32768, 4096), (10, 8192, 4096), (64, 8192, 8192),
          (8, 32768, 2048), (8, 8192, 2048), (64, 128, 4096)]
BENCH_SPECS = {f"b{L}x{D}": f"train:L={L},D={D},dtype=bf16,packed"
               for L, _, D in SHAPES}
SMS = 132


def time_ms(fn, repeats=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth():
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", required=True, type=pathlib.Path)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()

    bandwidth = copy_bandwidth()
    rows = []
    for L, N, D in SHAPES:
        bundle = run_cases.Bundle(args.cases / "bundles" / f"b{L}x{D}", False)
        c = dict(L=L, D=D, R=D, M=1, N=N, dtype="bf16", param_dtype="bf16",
                 key_norm=False, output_norm=False, per_query=False,
                 packed=True, save="o_pre", eps=1e-6, scale=1.0,
                 inputs="normal", seed=1)
        x = run_cases.make_inputs(c, "cuda")
        partitions = max(1, min(math.ceil(2 * SMS / N), L // 4,
                                L * D * 2 // 32768))
        blocks = max(1, min(2 * SMS, math.ceil(N / 16)))
        out = run_cases.run_forward(bundle, c, x, partitions, "cuda")
        saved = {"lse": out["lse"], "saved": out["o"]}
        # Buffers are made once; only the kernel launches are timed.
        fwd_values, fwd_launches, _ = run_cases.prepare_forward(
            bundle, c, x, partitions, "cuda")
        bwd_values, bwd_launches, _ = run_cases.prepare_backward(
            bundle, c, x, saved, blocks, "cuda")
        forward = time_ms(lambda: run_cases.execute(bundle, fwd_values,
                                                    fwd_launches))
        backward = time_ms(lambda: run_cases.execute(bundle, bwd_values,
                                                     bwd_launches))
        elt = 2
        fwd_floor = (L + 1) * N * D * elt / bandwidth * 1e3
        bwd_floor = (2 * L + 2) * N * D * elt / bandwidth * 1e3
        rows.append(dict(L=L, N=N, D=D, P=partitions, B=blocks,
                         forward_ms=forward, forward_floor_ms=fwd_floor,
                         backward_ms=backward, backward_floor_ms=bwd_floor))
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)")
    print(f"{'L':>4} {'N':>6} {'D':>5} {'P':>3} {'fwd ms':>8} "
          f"{'floor/fwd':>9} {'bwd ms':>8} {'floor/bwd':>9}")
    for r in rows:
        print(f"{r['L']:>4} {r['N']:>6} {r['D']:>5} {r['P']:>3} "
              f"{r['forward_ms']:>8.3f} "
              f"{r['forward_floor_ms'] / r['forward_ms']:>9.2f} "
              f"{r['backward_ms']:>8.3f} "
              f"{r['backward_floor_ms'] / r['backward_ms']:>9.2f}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.json").write_text(
            json.dumps(dict(bandwidth=bandwidth, rows=rows), indent=1))


if __name__ == "__main__":
    main()
