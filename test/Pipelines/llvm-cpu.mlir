// RUN: attnres-opt %s --split-input-file --attnres-lower-to-llvm-cpu-pipeline | FileCheck %s
// The executable-reference pipeline leaves only the LLVM dialect, with C
// wrappers for functions that ask for them.

// CHECK-LABEL: llvm.func @forward
// CHECK-NOT: attnres.
// CHECK-NOT: linalg.
// CHECK-NOT: memref.
// CHECK: llvm.intr.exp
// CHECK: llvm.func @_mlir_ciface_forward
func.func @forward(%v: tensor<3x?x64xbf16>, %q: tensor<2x16xbf16>, %h: tensor<2x64xbf16>)
    -> (tensor<2x?x64xbf16>, tensor<2x?xf32>, tensor<2x?x64xbf16>) attributes {llvm.emit_c_interface} {
  %o, %lse, %o_pre = attnres.forward packed(%v : tensor<3x?x64xbf16>)
      query(%q : tensor<2x16xbf16>) output_norm(%h : tensor<2x64xbf16>)
      -> tensor<2x?x64xbf16>, tensor<2x?xf32>, tensor<2x?x64xbf16>
  return %o, %lse, %o_pre : tensor<2x?x64xbf16>, tensor<2x?xf32>, tensor<2x?x64xbf16>
}

// -----

// CHECK-LABEL: llvm.func @backward
// CHECK-NOT: attnres.
// CHECK-NOT: linalg.
func.func @backward(%v0: tensor<?x64xf32>, %v1: tensor<?x64xf32>, %q: tensor<16xf32>,
                    %g: tensor<16xf32>, %do: tensor<?x64xf32>, %lse: tensor<?xf32>)
    -> (tensor<?x64xf32>, tensor<16xf32>) {
  %dv:2, %dq, %dg = attnres.backward sources(%v0, %v1 : tensor<?x64xf32>)
      query(%q : tensor<16xf32>) key_norm(%g : tensor<16xf32>)
      grad(%do : tensor<?x64xf32>) lse(%lse : tensor<?xf32>)
      -> tensor<?x64xf32>, tensor<?x64xf32>, tensor<16xf32>, tensor<16xf32>
  return %dv#1, %dg : tensor<?x64xf32>, tensor<16xf32>
}

// -----

// CHECK-LABEL: llvm.func @partition_reduce
// CHECK-NOT: attnres.
// CHECK-NOT: linalg.
func.func @partition_reduce(%p: tensor<4x?x64xf32>, %l: tensor<4x?xf32>, %s: tensor<9x16xf32>)
    -> (tensor<?x64xbf16>, tensor<?xf32>, tensor<16xf32>) {
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x?x64xf32>
      lse(%l : tensor<4x?xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
  %sum = attnres.partition_reduce sum %s : tensor<9x16xf32> -> tensor<16xf32>
  return %o, %lse, %sum : tensor<?x64xbf16>, tensor<?xf32>, tensor<16xf32>
}
