#!/usr/bin/env python3
"""Compiles the kernel bundles benchmarks/run.py needs (where the compiler
is) into a folder for ATTNRES_BUNDLE_DIR on the GPU machine:

  PYTHONPATH=python python3 benchmarks/prebuild.py build/device/torch-bundles

--kernel-options compiles them with other choices of the lowering (to time
a variant through the PyTorch op); --match keeps the keys containing a
string.
"""

import argparse
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
import common  # noqa: E402
import attnres  # noqa: E402
from attnres.kernels import bundle_name  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=pathlib.Path)
    parser.add_argument("--target", default="sm_90")
    parser.add_argument("--kernel-options", default="")
    parser.add_argument("--match", default="")
    args = parser.parse_args()
    keys = [k for k in common.benchmark_keys() if args.match in k]
    for key in keys:
        folder = args.output / args.target / bundle_name(key)
        attnres.compile(key, target=args.target, output=folder,
                        kernel_options=args.kernel_options)
    print(f"{len(keys)} bundles for {args.target} in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
