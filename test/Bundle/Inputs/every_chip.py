"""Compiles a spec for every chip LLVM 22 knows: each must compile (to PTX or
AMD assembly, which needs no toolkit) or be refused before code generation
with a message naming the chip. No chip may end the process (a signal, an
LLVM ERROR) or print IR.

  every_chip.py <attnres-compile> <scratch folder>
"""

import subprocess
import sys

# `llc -march=nvptx64 -mcpu=help` and `llc -march=amdgcn -mcpu=help` of LLVM
# 22, the AMD aliases (bonaire, ...) left out: they are refused by name.
NVIDIA = ("sm_20 sm_21 sm_30 sm_32 sm_35 sm_37 sm_50 sm_52 sm_53 sm_60 sm_61 "
          "sm_62 sm_70 sm_72 sm_75 sm_80 sm_86 sm_87 sm_88 sm_89 sm_90 sm_90a "
          "sm_100 sm_100a sm_100f sm_101 sm_101a sm_101f sm_103 sm_103a "
          "sm_103f sm_110 sm_110a sm_110f sm_120 sm_120a sm_120f sm_121 "
          "sm_121a sm_121f").split()
AMD = ("gfx600 gfx601 gfx602 gfx700 gfx701 gfx702 gfx703 gfx704 gfx705 "
       "gfx801 gfx802 gfx803 gfx805 gfx810 gfx900 gfx902 gfx904 gfx906 "
       "gfx908 gfx909 gfx90a gfx90c gfx942 gfx950 gfx1010 gfx1011 gfx1012 "
       "gfx1013 gfx1030 gfx1031 gfx1032 gfx1033 gfx1034 gfx1035 gfx1036 "
       "gfx1100 gfx1101 gfx1102 gfx1103 gfx1150 gfx1151 gfx1152 gfx1153 "
       "gfx1200 gfx1201 gfx1250 gfx1251 gfx9-generic gfx9-4-generic "
       "gfx10-1-generic gfx10-3-generic gfx11-generic gfx12-generic "
       "bonaire tahiti").split()
SPEC = "train:L=2,D=64,dtype=bf16,key_norm,output_norm"


def main():
    compiler, scratch = sys.argv[1], sys.argv[2]
    failures = []
    compiled = refused = 0
    for chip in NVIDIA + AMD:
        result = subprocess.run(
            [compiler, f"--spec={SPEC}", f"--target={chip}", "--format=isa",
             "-o", f"{scratch}/{chip}", "--quiet"],
            capture_output=True, text=True)
        message = result.stderr.strip()
        if result.returncode == 0:
            compiled += 1
        elif result.returncode == 1 and f"'{chip}'" in message and \
                "LLVM ERROR" not in message and len(message) < 400:
            refused += 1
        else:
            failures.append(f"{chip}: exit {result.returncode}: "
                            f"{message[:300]}")
    print(f"{compiled} chips compile, {refused} are refused")
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
