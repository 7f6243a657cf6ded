#!/usr/bin/env python3
"""Reads a PTX file and reports, for one kernel, its 128-bit global stores
and how many of them write an address the kernel read with a 128-bit global
load before (a read-modify-write of the same chunk):

    read_modify_write.py KERNEL < file.ptx
"""

import re
import sys


def main():
    kernel = sys.argv[1]
    text = sys.stdin.read()
    start = text.index(f".entry {kernel}(")
    end = text.find("\n.entry ", start + 1)
    body = text[start:end if end >= 0 else len(text)]
    loaded = set()
    stores = rewritten = 0
    for line in body.splitlines():
        load = re.search(r"ld\.global\.v4\.b32\s+\{[^}]*\},\s*\[([^\]]+)\]", line)
        if load:
            loaded.add(load.group(1).replace(" ", ""))
        store = re.search(r"st\.global\.v4\.b32\s+\[([^\]]+)\]", line)
        if store:
            stores += 1
            rewritten += store.group(1).replace(" ", "") in loaded
    print(f"{kernel}: {stores} 128-bit stores, {rewritten} of them to an "
          f"address loaded before")


if __name__ == "__main__":
    main()
