#!/bin/sh
# Compiles host-forward.mlir with attnres-opt's NVVM pipeline keeping the
# host function (keep-host=1) and links it with host-forward-main.c against
# libAttnResRuntime (test/Inputs/link-host-program.sh). OPTIONS are more
# options of the pipeline (token tiles, say). Usage:
#   build-host-forward.sh ATTNRES_OPT TOOLS_DIR CC SOURCE_ROOT LIBRARY_DIR OUTPUT CUDA_TOOLKIT [OPTIONS]
set -eu
opt=$1 tools=$2 cc=$3 src=$4 lib=$5 out=$6 cuda=$7 options=${8:-}
here=$(dirname "$0")
"$opt" "$here/host-forward.mlir" \
  --attnres-lower-to-nvvm-pipeline="chip=sm_90 keep-host=1 toolkit=$cuda $options" \
  -o "$out.mlir"
sh "$here/../../../Inputs/link-host-program.sh" "$tools" "$cc" "$src" "$lib" \
  "$here/host-forward-main.c" "$out"
