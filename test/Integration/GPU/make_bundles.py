#!/usr/bin/env python3
"""Compiles the kernel bundle of every GPU case (test/Integration/GPU/cases.py) with
attnres-compile, into <out>/bundles/<case id>/, and writes <out>/cases.json.

Run here (where LLVM/MLIR is); the folder then travels to the GPU machine,
where run_cases.py loads the bundles.
"""

import argparse
import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import cases as case_matrix  # noqa: E402


def compile_case(compiler, out, case, target):
    folder = out / "bundles" / case["id"]
    command = [compiler, f"--target={target}", "-o", str(folder), "--quiet"]
    if "spec" in case:
        command.append(f"--spec={case['spec']}")
    else:
        folder.mkdir(parents=True, exist_ok=True)
        source = folder / "module.mlir"
        source.write_text(case["module"])
        command.append(str(source))
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        return f"{case['id']}: {result.stderr.strip()}"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compiler", required=True, help="attnres-compile")
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--target", default="sm_90")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--filter", default="", help="case id prefix")
    args = parser.parse_args()

    cases = [c for c in case_matrix.all_cases()
             if c["id"].startswith(args.filter)]
    args.out.mkdir(parents=True, exist_ok=True)
    failures = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for problem in pool.map(
                lambda c: compile_case(args.compiler, args.out, c, args.target),
                cases):
            if problem:
                failures.append(problem)
    (args.out / "cases.json").write_text(json.dumps(cases, indent=1))
    print(f"compiled {len(cases) - len(failures)} of {len(cases)} bundles "
          f"for {args.target} into {args.out}")
    for problem in failures:
        print("FAIL", problem)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
