// RUN: attnres-opt %s --split-input-file --verify-diagnostics --attnres-bufferize-host | FileCheck %s
// attnres-bufferize-host: the kept functions on device buffers. Arguments
// and results become plain memrefs, each attnres op its op on buffers
// writing into a gpu.alloc'ed buffer, reshapes views of the same buffer (no
// copy), and the op's attributes (the kernels convert-attnres-to-gpu names)
// stay.

// CHECK-LABEL: func.func @tokens_2d(
// CHECK-SAME: %[[V:.*]]: memref<3x4x5x32xbf16>, %[[Q:.*]]: memref<32xbf16>) -> memref<4x5x32xbf16>
// CHECK-NOT: memref.copy
// CHECK-NOT: gpu.memcpy
// CHECK: %[[FLAT:.*]] = memref.collapse_shape %[[V]] {{\[\[}}0], [1, 2], [3]] : memref<3x4x5x32xbf16> into memref<3x20x32xbf16>
// CHECK: %[[O:.*]] = gpu.alloc  () : memref<20x32xbf16>
// CHECK: %[[LSE:.*]] = gpu.alloc  () : memref<20xf32>
// CHECK: attnres.forward_into packed(%[[FLAT]] : memref<3x20x32xbf16>) query(%[[Q]] : memref<32xbf16>) save(lse) outs(%[[O]], %[[LSE]] : memref<20x32xbf16>, memref<20xf32>) {attnres.launch = {forward = "k"}}
// CHECK: %[[OUT:.*]] = memref.expand_shape %[[O]] {{\[\[}}0, 1], [2]] output_shape [4, 5, 32] : memref<20x32xbf16> into memref<4x5x32xbf16>
// CHECK: return %[[OUT]]
func.func @tokens_2d(%v: tensor<3x4x5x32xbf16>, %q: tensor<32xbf16>)
    -> tensor<4x5x32xbf16> {
  %flat = tensor.collapse_shape %v [[0], [1, 2], [3]]
      : tensor<3x4x5x32xbf16> into tensor<3x20x32xbf16>
  %o, %lse = attnres.forward packed(%flat : tensor<3x20x32xbf16>)
      query(%q : tensor<32xbf16>) save(lse) {attnres.launch = {forward = "k"}}
      -> tensor<20x32xbf16>, tensor<20xf32>
  %out = tensor.expand_shape %o [[0, 1], [2]] output_shape [4, 5, 32]
      : tensor<20x32xbf16> into tensor<4x5x32xbf16>
  return %out : tensor<4x5x32xbf16>
}

// -----

// Device memory only: an op that would touch it on the host is refused, as
// by convert-attnres-to-gpu (the pass may be run on its own).
func.func @empty() -> tensor<8x64xf32> {
  // expected-error @+1 {{attnres-bufferize-host: keep-host=1 keeps every tensor in device memory, which only attnres ops, tensor.dim and reshapes may use; 'tensor.empty' is none of them (keep-host=0 compiles the attnres ops alone)}}
  %e = tensor.empty() : tensor<8x64xf32>
  return %e : tensor<8x64xf32>
}
