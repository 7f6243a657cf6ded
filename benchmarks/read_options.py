#!/usr/bin/env python3
"""A residual-history read's kernels under kernel-option variants.

For each variant (a string of convert-attnres-to-gpu options, as
`attnres-compile --kernel-options` takes them; "" is the defaults) and each
read of `count` rows of [N, D] bf16 with a key norm (model.py's reads:
save o_pre), times the read's forward and its accumulating backward (with
the finalize) in microseconds a launch, each captured in a CUDA graph and
replayed (common.time_graph): at decode-sized N the launches are short and
their gaps matter, as in a step replayed from a graph. Optionally also the
forward split over P partitions and the backward over P partitions (the
runtime's counts overridden), with the variant's kernels.

  python3 benchmarks/read_options.py --prebuild DIR [options]   (compiles)
  ATTNRES_BUNDLE_DIR=DIR python3 benchmarks/read_options.py [options]

Options: --shape N,D (16,256), --counts 8,32,64, --variants "a;b;..."
(default: the defaults alone), --forward-partitions 2,4,8,
--backward-partitions 4,8,16. docs/gpu-runs/2026-12-07-small-rows-h100.txt
has what it measured of the forward's source batch.
"""

import argparse
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402
from attnres import _checks  # noqa: E402

BF16 = "torch.bfloat16"


def integers(text):
    return [int(x) for x in text.split(",") if x]


def call_of(count, N, D):
    """The checked call of a read of `count` rows (no PyTorch needed)."""
    shape = _checks.TensorShape
    return _checks.check_attnres(shape((count, N, D), BF16), shape((D,), BF16),
                                 shape((D,), BF16), None, common.EPS,
                                 common.SCALE, "o_pre")


def keys(counts, N, D, variants):
    """(key, kernel options) of every bundle the runs need: each read's
    forward with its writing backward, and its accumulating backward."""
    result = []
    for count in counts:
        call = call_of(count, N, D)
        for variant in variants:
            result += [(call.spec(), variant),
                       (call.spec(accumulate=True), variant)]
    return result


def microseconds(launch, copies=16):
    return common.time_graph([launch] * copies) * 1e3


def run(args, counts, N, D, variants):
    import torch
    from attnres import ops
    device = torch.device("cuda", torch.cuda.current_device())
    rows = torch.randn(max(counts), N, D, device=device).bfloat16()
    grads = torch.zeros_like(rows)
    query = (0.1 * torch.randn(D, device=device)).bfloat16()
    key_norm = (1 + 0.1 * torch.randn(D, device=device)).bfloat16()
    grad_o = torch.randn(N, D, device=device).bfloat16()
    table, grad_table = ops._packed_table(rows), ops._packed_table(grads)
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; "
          f"(N, D) = {(N, D)}; us a launch from a CUDA graph")
    for variant in variants:
        for count in counts:
            call = call_of(count, N, D)
            plan = ops._Plan(call, device, variant)
            accumulating = ops._BackwardLaunch(
                ops._runtime(call.spec(accumulate=True), device, variant), N)

            def forward():
                return ops._launch_forward_from(plan, table, torch.bfloat16,
                                                query, key_norm, None)
            o, lse, _, residual = forward()

            def backward():
                ops._launch_backward_into(
                    plan, accumulating, table, grad_table, torch.bfloat16,
                    query, key_norm, None, grad_o, lse, o, residual)
            cells = [f"forward {microseconds(forward):6.2f} (P = "
                     f"{plan.partitions})",
                     f"backward {microseconds(backward):6.2f} "
                     f"({accumulating.blocks} x {accumulating.partitions})"]
            forward_op = plan.runtime.op("forward")
            for P in args.forward_partitions:
                if P <= count:
                    plan.partitions = P
                    plan.forward_workspace = \
                        plan.runtime.forward_workspace_size(forward_op, N, P)
                    plan.forward_workspaces = {}
                    cells.append(f"forward P={P} "
                                 f"{microseconds(forward):6.2f}")
            backward_op = accumulating.runtime.op("backward")
            for P in args.backward_partitions:
                if P <= count:
                    accumulating.partitions = P
                    accumulating.workspace = \
                        accumulating.runtime.backward_workspace_size(
                            backward_op, N, accumulating.blocks, P)
                    accumulating.workspaces = {}
                    cells.append(f"backward P={P} "
                                 f"{microseconds(backward):6.2f}")
            print(f"{variant or '(defaults)'} | L={count}: " +
                  ", ".join(cells), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_prebuild_arguments(parser, "the variants' bundles")
    parser.add_argument("--shape", type=integers, default=[16, 256],
                        help="N,D")
    parser.add_argument("--counts", type=integers, default=[8, 32, 64],
                        help="rows a read reads, comma-separated")
    parser.add_argument("--variants", default="",
                        help="kernel-option strings separated by ';' (an "
                        "empty one is the defaults)")
    parser.add_argument("--forward-partitions", type=integers, default=[])
    parser.add_argument("--backward-partitions", type=integers, default=[])
    parser.add_argument("--list", action="store_true",
                        help="print the bundles the runs need and exit")
    args = parser.parse_args()
    if len(args.shape) != 2 or min(args.shape) < 1:
        parser.error(f"--shape takes N,D: two positive integers, got "
                     f"{args.shape}")
    if not args.counts or min(args.counts) < 1:
        parser.error("--counts takes positive integers")
    (N, D), counts = args.shape, args.counts
    variants = args.variants.split(";")
    if args.list:
        for key, options in keys(counts, N, D, variants):
            print(f"{key} [{options}]")
        return 0
    if args.prebuild:
        common.prebuild(args, keys(counts, N, D, variants))
        return 0
    run(args, counts, N, D, variants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
