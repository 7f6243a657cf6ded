#!/usr/bin/env python3
"""Compares two run.py results shape by shape, as fractions of each run's
own byte floor (so that the copy bandwidth each run measured cancels):

  python3 benchmarks/compare.py docs/performance/h200.json new.json

prints every measure that changed by more than --tolerance (default 3 %),
the median change, and exits 1 if any measure is slower by more than the
tolerance, is not a number, or is missing from the second file. The
host-bound eager measure is left out unless --eager is given: at small
shapes it times Python and the launch queue, not kernels.
"""

import argparse
import json
import pathlib
import statistics
import sys

KERNEL_MEASURES = ("forward", "backward", "backward_accumulate",
                   "fwd_bwd_graph")


def fractions(path, measures):
    data = json.loads(pathlib.Path(path).read_text())
    return data, {(r["L"], r["N"], r["D"], r["variant"], r["measure"]):
                  r["fraction"] for r in data["records"]
                  if r["measure"] in measures}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=pathlib.Path)
    parser.add_argument("after", type=pathlib.Path)
    parser.add_argument("--tolerance", type=float, default=0.03,
                        help="relative change reported and failed on")
    parser.add_argument("--eager", action="store_true",
                        help="compare fwd_bwd_eager too")
    args = parser.parse_args()
    measures = KERNEL_MEASURES + (("fwd_bwd_eager",) if args.eager else ())
    before_data, before = fractions(args.before, measures)
    after_data, after = fractions(args.after, measures)
    common = sorted(before.keys() & after.keys())
    if not common:
        print("compare: no measure in both files")
        return 2
    print(f"copy {before_data['copy_tbps']:.3f} -> "
          f"{after_data['copy_tbps']:.3f} TB/s; "
          f"{len(common)} measures in both")
    tolerance = f"{args.tolerance * 100:g}%"
    changes = []
    slower = 0
    for key in common:
        change = after[key] / before[key] - 1
        changes.append(change)
        if not abs(change) <= args.tolerance:
            # NaN is slower too: it compares false either way.
            slower += not change >= -args.tolerance
            L, N, D, variant, measure = key
            print(f"  ({L}, {N}, {D}) {variant:12} {measure:14} "
                  f"{before[key]:.3f} -> {after[key]:.3f} ({change:+.1%})")
    missing = sorted(before.keys() - after.keys())
    for L, N, D, variant, measure in missing:
        print(f"  ({L}, {N}, {D}) {variant:12} {measure:14} missing")
    print(f"median change {statistics.median(changes):+.2%}; "
          f"{slower} slower by more than {tolerance}"
          + (f"; {len(missing)} missing" if missing else ""))
    return 1 if slower or missing else 0


if __name__ == "__main__":
    sys.exit(main())
