#!/usr/bin/env python3
"""Compiles the bundles benchmarks/kernels.py times: for every shape of
common.SHAPES a bf16 `train` bundle (forward + backward, packed sources,
R = D, M = 1) with the compiler's default kernel options, and with --sweep
also one per combination of the options that set the lanes of a row, the
batch of sources, prefetching and unrolling. Variants that spill registers
(ptxas -v on their PTX) are left out. Writes <out>/index.json.

Run here (where LLVM/MLIR is); the folder then travels to the GPU machine.

  python3 benchmarks/make_kernel_bundles.py --compiler build/bin/attnres-compile \\
      --out build/device/kernels [--sweep]
"""

import argparse
import concurrent.futures
import itertools
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common  # noqa: E402


def sweep_options(L, D):
    """Kernel options worth timing for a row of D bf16 elements: the lanes
    of a row (four or two 16-byte vectors a lane), the batch of sources and
    prefetching, for the forward and the backward separately."""
    vectors = D // 8
    lanes = [t for t in (vectors // 4, vectors // 2) if 32 <= t <= 1024]
    options = []
    for kernel, batches in (("forward", (2, 4)), ("backward", (1, 2, 4))):
        for lanes_, batch, prefetch in itertools.product(lanes, batches,
                                                          (0, 1)):
            options.append(f"{kernel}-threads-per-row={lanes_} "
                           f"{kernel}-source-batch={batch} "
                           f"{kernel}-prefetch={prefetch}")
    return options


def spills(compiler, spec, options, scratch):
    """Bytes of spill stores ptxas reports for the PTX of a variant."""
    ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    if not os.path.exists(ptxas):
        return 0
    folder = scratch / re.sub(r"[^A-Za-z0-9]+", "_", spec + options)
    result = subprocess.run([compiler, f"--spec={spec}", "--format=isa",
                             f"--kernel-options={options}", "-o",
                             str(folder), "--quiet"], capture_output=True,
                            text=True)
    if result.returncode:
        return None
    ptx = next(folder.glob("*.ptx"))
    report = subprocess.run([ptxas, "-arch=sm_90", "-v", str(ptx), "-o",
                             os.devnull], capture_output=True, text=True)
    shutil.rmtree(folder, ignore_errors=True)
    # The streaming kernels only: the options do not change the others.
    total, kernel = 0, ""
    for line in report.stderr.splitlines():
        name = re.search(r"entry function '(\w+)'", line)
        if name:
            kernel = name.group(1)
        spilled = re.search(r"(\d+) bytes spill stores", line)
        if spilled and re.search(r"_(forward|forward_partial|backward)$",
                                 kernel):
            total += int(spilled.group(1))
    return total


def build(compiler, out, scratch, entry):
    spec = f"train:L={entry['shape'][0]},D={entry['shape'][2]},dtype=bf16," \
           f"packed,save={entry['save']}" + \
        (",key_norm" if entry.get("key_norm") else "")
    if entry["options"]:
        spilled = spills(compiler, spec, entry["options"], scratch)
        if spilled is None or spilled > 0:
            return None
    result = subprocess.run(
        [compiler, f"--spec={spec}", "--target=sm_90", "-o",
         str(out / entry["bundle"]), "--quiet",
         f"--kernel-options={entry['options']}"],
        capture_output=True, text=True)
    if result.returncode:
        print(f"FAIL {spec} {entry['options']}: {result.stderr.strip()}")
        return None
    return entry


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compiler", required=True)
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--shapes", default="",
                        help="these shapes instead of common.SHAPES (any, "
                             "a decode-sized N included), L,N,D;L,N,D...")
    parser.add_argument("--options", default="",
                        help="kernel option sets to time next to the "
                             "defaults (and the --sweep grid), separated by "
                             "';'")
    parser.add_argument("--save", default="o_pre",
                        choices=["o_pre", "o_pre_residual"],
                        help="what the forward saves (o_pre_residual: what "
                             "attnres.attnres keeps for bf16)")
    parser.add_argument("--key-norm", action="store_true",
                        help="with a key norm weight (as attnres.attnres "
                             "always compiles)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()

    # One bundle per (L, D, options); shapes that differ only in N share it.
    bundles, entries = {}, []
    shapes = common.SHAPES
    if args.shapes:
        try:
            shapes = [tuple(int(x) for x in s.split(","))
                      for s in args.shapes.split(";")]
        except ValueError:
            shapes = []
        if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
            parser.error(f"--shapes takes L,N,D;L,N,D... (positive "
                         f"integers), got {args.shapes!r}")
    for L, N, D in shapes:
        variants = [""] + (sweep_options(L, D) if args.sweep else [])
        variants += [o.strip() for o in args.options.split(";") if o.strip()]
        for i, options in enumerate(variants):
            name = f"L{L}_D{D}_{i}"
            entry = dict(shape=[L, N, D], options=options, bundle=name,
                         save=args.save, key_norm=args.key_norm)
            bundles[name] = entry
            entries.append(dict(entry))
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = args.out / ".scratch"
    scratch.mkdir(exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        built = {e["bundle"] for e in pool.map(
            lambda e: build(args.compiler, args.out, scratch, e),
            bundles.values()) if e is not None}
    shutil.rmtree(scratch, ignore_errors=True)
    entries = [e for e in entries if e["bundle"] in built]
    (args.out / "index.json").write_text(json.dumps(entries, indent=1))
    print(f"{len(built)} of {len(bundles)} bundles into {args.out} "
          f"({len(entries)} entries)")


if __name__ == "__main__":
    main()
