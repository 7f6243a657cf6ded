#!/bin/sh
# Lowers host-lowering.mlir with upstream MLIR (Debian's mlir-opt-22) and
# links it with host-lowering-main.c against libAttnResRuntime
# (test/Inputs/link-host-program.sh). Usage:
#   build-host-lowering.sh TOOLS_DIR CUDA_TOOLKIT CC SOURCE_ROOT LIBRARY_DIR OUTPUT
set -eu
tools=$1 cuda=$2 cc=$3 src=$4 lib=$5 out=$6
here=$(dirname "$0")
# The NVVM target finds ptxas on the PATH.
PATH="$cuda/bin:$PATH"
export PATH
"$tools/mlir-opt" "$here/host-lowering.mlir" --gpu-async-region \
  --gpu-lower-to-nvvm-pipeline="cubin-chip=sm_90 cubin-features=+ptx80 cubin-format=fatbin" \
  -o "$out.mlir"
sh "$here/../../Inputs/link-host-program.sh" "$tools" "$cc" "$src" "$lib" \
  "$here/host-lowering-main.c" "$out"
