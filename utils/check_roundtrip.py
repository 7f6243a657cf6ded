#!/usr/bin/env python3
"""Checks that MLIR snippets round-trip through attnres-opt unchanged.

Each argument is a `.mlir` file (one snippet), a Markdown file (every
```mlir block is a snippet) or a folder (its .mlir and .md files). A snippet
round-trips when

  * attnres-opt parses and verifies it,
  * printing, re-parsing and printing again gives the same text, and
  * the generic form, re-parsed, prints the same text as well.

Prints one line per failure and a summary `round-tripped N snippets from M
files`; exits 1 on any failure or when no snippet was found at all.
"""

import argparse
import pathlib
import re
import subprocess
import sys

FENCE = re.compile(r"^```mlir[ \t]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def snippets_of(path: pathlib.Path):
    text = path.read_text()
    if path.suffix == ".md":
        for index, match in enumerate(FENCE.finditer(text)):
            yield f"{path}#{index}", match.group(1)
    else:
        yield str(path), text


def run_opt(opt, text, *flags):
    result = subprocess.run([opt, *flags, "-"], input=text, text=True,
                            capture_output=True)
    if result.returncode != 0:
        raise RuntimeError(result.stderr.strip())
    return result.stdout


def check(opt, name, text):
    printed = run_opt(opt, text)
    reprinted = run_opt(opt, printed)
    if printed != reprinted:
        return "printing is not stable (print -> parse -> print differs)"
    generic = run_opt(opt, text, "-mlir-print-op-generic")
    if run_opt(opt, generic) != printed:
        return "the generic form does not print back to the custom form"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opt", required=True, help="path to attnres-opt")
    parser.add_argument("paths", nargs="+", type=pathlib.Path)
    args = parser.parse_args()

    files = []
    for path in args.paths:
        if path.is_dir():
            files += sorted(p for p in path.iterdir()
                            if p.suffix in (".mlir", ".md"))
        else:
            files.append(path)

    count, failures = 0, 0
    for path in files:
        for name, text in snippets_of(path):
            count += 1
            try:
                problem = check(args.opt, name, text)
            except RuntimeError as error:
                problem = f"attnres-opt failed: {error}"
            if problem:
                failures += 1
                print(f"FAIL {name}: {problem}")
    print(f"round-tripped {count - failures} of {count} snippets "
          f"from {len(files)} files")
    return 1 if failures or count == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
