"""Why run.py times a call's first measure twice: a bandwidth-bound kernel
timed right after a float32 reference check runs slower for a while.

Times the forward of one shape (default (10, 32768, 4096), save="lse", as
run.py calls it) four ways, twice each back to back, on fresh inputs:
alone, after a forward+backward, after a forward+backward and run.py's
reference check, and alone again. Prints each as a fraction of the byte
floor measured in the same run. On an H100 (2026-12-06) only the first
timing after the reference was slow: 0.89 of the floor, then 1.02; every
other one 1.01-1.02.

    PYTHONPATH=python ATTNRES_LIBRARY_DIR=build/device/lib \\
    ATTNRES_BUNDLE_DIR=build/device/bundles python3 benchmarks/settle.py
"""
import argparse
import pathlib
import sys

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402
import run  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="10,32768,4096", help="L,N,D")
    parser.add_argument("--save", default="lse", choices=("lse", "o_pre"))
    args = parser.parse_args()
    L, N, D = map(int, args.shape.split(","))
    bandwidth = common.copy_bandwidth()
    floor = common.forward_bytes(L, N, D) / bandwidth * 1e3
    print(f"{torch.cuda.get_device_name()}; copy {bandwidth / 1e12:.3f} TB/s")

    def timed(before):
        inputs = run.input_sets(L, N, D, onorm=False)
        if before != "nothing":
            o, grads = run.forward_backward(inputs[0], args.save)
            torch.cuda.synchronize()
            if before == "reference":
                run.reference_errors(inputs[0], args.save, o, grads)
            del o, grads
        calls = run.forward_calls(inputs, args.save)
        first = floor / common.time_graph(calls)
        second = floor / common.time_graph(calls)
        print(f"  after {before:<26} {first:.3f} then {second:.3f}")
        del inputs
        torch.cuda.empty_cache()

    print(f"forward {(L, N, D)} save={args.save}, fractions of its floor:")
    for before in ("nothing", "a forward+backward", "reference", "nothing"):
        timed(before)


if __name__ == "__main__":
    main()
