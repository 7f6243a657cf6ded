#!/bin/sh
# Compiles host-forward.mlir with attnres-opt's NVVM pipeline keeping the
# host function (keep-host=1), translates it with Debian's mlir-translate-22
# and llc-22, and links it with host-forward-main.c against
# libAttnResRuntime. Usage:
#   build-host-forward.sh ATTNRES_OPT TOOLS_DIR CC SOURCE_ROOT LIBRARY_DIR OUTPUT CUDA_TOOLKIT
set -eu
opt=$1 tools=$2 cc=$3 src=$4 lib=$5 out=$6 cuda=$7
here=$(dirname "$0")
"$opt" "$here/host-forward.mlir" \
  --attnres-lower-to-nvvm-pipeline="chip=sm_90 keep-host=1 toolkit=$cuda" \
  -o "$out.mlir"
"$tools/mlir-translate" --mlir-to-llvmir "$out.mlir" -o "$out.ll"
"$tools/llc" -O2 -relocation-model=pic -filetype=obj "$out.ll" -o "$out.o"
# The sanitizer build's library leaves the sanitizer runtime to be preloaded.
"$cc" -std=c11 -O1 -I"$src/include" "$here/host-forward-main.c" "$out.o" \
  -L"$lib" -lAttnResRuntime -Wl,-rpath,"$lib" -Wl,--allow-shlib-undefined \
  -lm -o "$out"
