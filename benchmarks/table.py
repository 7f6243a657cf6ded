#!/usr/bin/env python3
"""Prints the results of a run.py JSON file as the Markdown table of
docs/Performance.md: fraction of the floor per measure (milliseconds in
brackets) and the worst relative error of the shape and variant.

  python3 benchmarks/table.py docs/performance/h200.json
"""

import argparse
import json
import pathlib
import sys

MEASURES = ("forward", "backward", "fwd_bwd_graph", "fwd_bwd_eager")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=pathlib.Path)
    args = parser.parse_args()
    run = json.loads(args.json.read_text())
    cells, order = {}, []
    for r in run["records"]:
        if r.get("measure") not in MEASURES:
            continue
        key = (r["L"], r["N"], r["D"], r["variant"])
        if key not in cells:
            order.append(key)
        cells.setdefault(key, {})[r["measure"]] = \
            f"{r['fraction']:.2f} ({r['ms']:.3f})"
    worst = {}
    for check in run.get("checks", []):
        name, error = max(check["errors"].items(), key=lambda kv: kv[1])
        worst[(check["L"], check["N"], check["D"], check["variant"])] = \
            f"{error:.1e} ({name})"
    print("| L | N | D | variant | forward | backward | fwd+bwd graph | "
          "fwd+bwd eager | worst error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in order:
        row = [str(x) for x in key] + [cells[key].get(m, "") for m in MEASURES]
        row.append(worst.get(key, ""))
        print("| " + " | ".join(row) + " |")
    for r in run["records"]:
        if "us" in r:
            print(f"\n{r['measure']} L={r['L']}: {r['us']:.1f} us", end="")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
