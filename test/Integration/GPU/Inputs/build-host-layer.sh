#!/bin/sh
# Compiles the bundled example examples/full_attnres_layer.mlir (a forward
# and its backward) with attnres-opt's NVVM pipeline (for sm_90) or ROCDL
# pipeline keeping the host functions (keep-host=1;
# llvm-request-c-wrappers gives them C interfaces) into a shared library
# with the kernels' binary embedded, and links host-layer-main.c against it
# (test/Inputs/link-host-program.sh). TARGET is the CUDA toolkit folder
# (the NVVM pipeline) or an AMD chip, gfx942 say (the ROCDL pipeline).
# OPTIONS are more options of the pipeline (a fixed decomposition, say);
# PASSES are attnres-opt passes run before it (the split passes, say).
# TOKENS, where given, makes the module's sequence length static (the C
# program's 257). SAVED=recompute drops the backward's saved o_pre (its
# argument stays, unread): the backward recomputes it from the sources.
# Usage:
#   build-host-layer.sh ATTNRES_OPT TOOLS_DIR CC SOURCE_ROOT LIBRARY_DIR OUTPUT TARGET [OPTIONS [PASSES [TOKENS [SAVED]]]]
set -eu
opt=$1 tools=$2 cc=$3 src=$4 lib=$5 out=$6 target=$7 options=${8:-} passes=${9:-} tokens=${10:-} saved=${11:-}
here=$(dirname "$0")
module=$src/examples/full_attnres_layer.mlir
if [ -n "$tokens" ] || [ "$saved" = recompute ]; then
  edit=""
  [ -n "$tokens" ] && edit="s/x?x/x${tokens}x/g;"
  [ "$saved" = recompute ] && edit="$edit/saved(%o_pre : /d;"
  sed "$edit" "$module" > "$out.in.mlir"
  module=$out.in.mlir
fi
case $target in
gfx*) pipeline="--attnres-lower-to-rocdl-pipeline=chip=$target keep-host=1 $options" ;;
*) pipeline="--attnres-lower-to-nvvm-pipeline=chip=sm_90 keep-host=1 toolkit=$target $options" ;;
esac
# shellcheck disable=SC2086 # PASSES are several arguments.
"$opt" "$module" $passes --llvm-request-c-wrappers \
  "$pipeline" -o "$out.mlir"
sh "$here/../../../Inputs/link-host-program.sh" "$tools" "$cc" "$src" "$lib" \
  "$here/host-layer-main.c" "$out" shared
