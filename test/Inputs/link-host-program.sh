#!/bin/sh
# Turns host code already lowered to the LLVM dialect (OUTPUT.mlir) into a
# program: mlir-translate-22 and llc-22 make an object of it, which is
# linked with a C main against libAttnResRuntime (its mgpu* functions).
# With "shared" last, the object becomes a shared library of its own,
# OUTPUT.so (the host functions and their embedded kernel binary), which
# the program links against, as an application embedding it would.
# Usage:
#   link-host-program.sh TOOLS_DIR CC SOURCE_ROOT LIBRARY_DIR MAIN_C OUTPUT [shared]
set -eu
tools=$1 cc=$2 src=$3 lib=$4 main=$5 out=$6 kind=${7:-object}
"$tools/mlir-translate" --mlir-to-llvmir "$out.mlir" -o "$out.ll"
"$tools/llc" -O2 -relocation-model=pic -filetype=obj "$out.ll" -o "$out.o"
# The sanitizer build's library leaves the sanitizer runtime to be preloaded.
runtime="-L$lib -lAttnResRuntime -Wl,-rpath,$lib -Wl,--allow-shlib-undefined"
if [ "$kind" = shared ]; then
  # Found next to the program wherever both are copied.
  # shellcheck disable=SC2086
  "$cc" -shared "$out.o" $runtime -Wl,-soname,"$(basename "$out").so" \
    -o "$out.so"
  host="$out.so -Wl,-rpath,\$ORIGIN"
else
  host="$out.o"
fi
# shellcheck disable=SC2086
"$cc" -std=c11 -O1 -I"$src/include" -I"$src/test/Inputs" "$main" $host $runtime -lm -o "$out"
