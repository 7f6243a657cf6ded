#!/usr/bin/env python3
"""Compiles the kernel bundles benchmarks/run.py needs (where the compiler
is) into a folder for ATTNRES_BUNDLE_DIR on the GPU machine:

  PYTHONPATH=python python3 benchmarks/prebuild.py build/device/torch-bundles
"""

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
import common  # noqa: E402
from attnres.kernels import prebuild  # noqa: E402


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    target = "sm_90"
    folders = prebuild(common.benchmark_keys(), target, sys.argv[1])
    print(f"{len(folders)} bundles for {target} in {sys.argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
