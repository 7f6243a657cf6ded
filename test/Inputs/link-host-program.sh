#!/bin/sh
# Turns host code already lowered to the LLVM dialect (OUTPUT.mlir) into a
# program: mlir-translate-22 and llc-22 make an object of it, which is
# linked with a C main against libAttnResRuntime (its mgpu* functions).
# Usage:
#   link-host-program.sh TOOLS_DIR CC SOURCE_ROOT LIBRARY_DIR MAIN_C OUTPUT
set -eu
tools=$1 cc=$2 src=$3 lib=$4 main=$5 out=$6
"$tools/mlir-translate" --mlir-to-llvmir "$out.mlir" -o "$out.ll"
"$tools/llc" -O2 -relocation-model=pic -filetype=obj "$out.ll" -o "$out.o"
# The sanitizer build's library leaves the sanitizer runtime to be preloaded.
"$cc" -std=c11 -O1 -I"$src/include" "$main" "$out.o" \
  -L"$lib" -lAttnResRuntime -Wl,-rpath,"$lib" -Wl,--allow-shlib-undefined \
  -lm -o "$out"
