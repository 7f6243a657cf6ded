#!/bin/sh
# Builds the keep-host benchmark for L sources of width D (bf16, packed
# [L, N, D], a key norm, R = D, save(o_pre): the spec of the kernel
# bundles kernels.py times): a module with a forward and its backward,
# compiled by attnres-opt's NVVM pipeline with keep-host=1 into a shared
# library, and host_object.c linked against it. Run it on the GPU (no MLIR
# needed there) as OUTPUT TOKENS [ITERATIONS]. Usage:
#   build.sh ATTNRES_OPT LLVM_TOOLS_DIR CC SOURCE_ROOT LIBRARY_DIR OUTPUT CUDA_TOOLKIT L D
set -eu
opt=$1 tools=$2 cc=$3 src=$4 lib=$5 out=$6 cuda=$7 L=$8 D=$9
v="tensor<${L}x?x${D}xbf16>" r="tensor<?x${D}xbf16>" w="tensor<${D}xbf16>"
cat > "$out.in.mlir" <<MLIR
func.func @forward(%v: $v, %q: $w, %g: $w) -> ($r, tensor<?xf32>) {
  %o, %lse = attnres.forward packed(%v : $v) query(%q : $w)
      key_norm(%g : $w) -> $r, tensor<?xf32>
  return %o, %lse : $r, tensor<?xf32>
}
func.func @backward(%v: $v, %q: $w, %g: $w, %do: $r, %lse: tensor<?xf32>,
                    %o: $r) -> ($v, $w, $w) {
  %dv, %dq, %dg = attnres.backward packed(%v : $v) query(%q : $w)
      key_norm(%g : $w) grad(%do : $r) lse(%lse : tensor<?xf32>)
      saved(%o : $r) -> $v, $w, $w
  return %dv, %dq, %dg : $v, $w, $w
}
MLIR
"$opt" "$out.in.mlir" --llvm-request-c-wrappers \
  --attnres-lower-to-nvvm-pipeline="chip=sm_90 keep-host=1 toolkit=$cuda" \
  -o "$out.mlir"
here=$(dirname "$0")
"$tools/mlir-translate" --mlir-to-llvmir "$out.mlir" -o "$out.ll"
"$tools/llc" -O2 -relocation-model=pic -filetype=obj "$out.ll" -o "$out.o"
"$cc" -shared "$out.o" -L"$lib" -lAttnResRuntime \
  -Wl,-soname,"$(basename "$out").so" -o "$out.so"
"$cc" -std=c11 -O2 -I"$src/include" -I"$src/test/Inputs" -DSOURCES="$L" -DWIDTH="$D" \
  "$here/host_object.c" "$out.so" -Wl,-rpath,\$ORIGIN -L"$lib" \
  -lAttnResRuntime -Wl,-rpath,"$lib" -lm -o "$out"
