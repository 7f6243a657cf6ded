// RUN: attnres-opt %s --split-input-file --attnres-tile=tile-sizes=1,16 \
// RUN:   --attnres-split-reduction=blocks=3 --attnres-map-to-blocks | FileCheck %s
// RUN: attnres-opt %s --split-input-file --attnres-map-to-blocks \
// RUN:   | FileCheck %s --check-prefix=ALONE

// attnres-map-to-blocks states, as upstream scf.forall mapping attributes,
// the grid convert-attnres-to-gpu runs the split and tile loops on: a tile
// loop's dimensions linearized onto the blocks, the last fastest; the split
// reduction's loop on blockIdx.x.

// A forward tiled by [1, 16] over its [4, ?] tokens.
// CHECK-LABEL: func.func @tiled_forward
// CHECK: scf.forall (%{{.*}}, %{{.*}}) = (0, 0) to (4, %{{.*}}) step (1, 16)
// CHECK: attnres.forward
// CHECK: } {mapping = [#gpu.block<linear_dim_1>, #gpu.block<linear_dim_0>]}
func.func @tiled_forward(%v0: tensor<4x?x64xbf16>, %v1: tensor<4x?x64xbf16>,
                         %q: tensor<64xf32>) -> tensor<4x?x64xbf16> {
  %o, %lse = attnres.forward sources(%v0, %v1 : tensor<4x?x64xbf16>)
      query(%q : tensor<64xf32>) -> tensor<4x?x64xbf16>, tensor<4x?xf32>
  return %o : tensor<4x?x64xbf16>
}

// -----

// One token dimension, tiled by 1: a loop of one dimension, linear_dim_0.
// CHECK-LABEL: func.func @tiled_merge
// CHECK: scf.forall (%{{.*}}) in (%{{.*}})
// CHECK: attnres.partition_reduce softmax
// CHECK: } {mapping = [#gpu.block<linear_dim_0>]}
func.func @tiled_merge(%p: tensor<3x?x64xf32>, %l: tensor<3x?xf32>)
    -> tensor<?x64xf32> {
  %o, %lse = attnres.partition_reduce softmax %p : tensor<3x?x64xf32>
      lse(%l : tensor<3x?xf32>) -> tensor<?x64xf32>, tensor<?xf32>
  return %o : tensor<?x64xf32>
}

// -----

// The backward split into three blocks of tokens: #gpu.block<x>. The sum
// of its partial gradients after the loop is not tiled.
// CHECK-LABEL: func.func @split_backward
// CHECK: scf.forall (%{{.*}}) in (3)
// CHECK: attnres.backward
// CHECK: } {mapping = [#gpu.block<x>]}
// CHECK: attnres.partition_reduce sum
func.func @split_backward(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                          %q: tensor<16xf32>, %do: tensor<?x64xbf16>,
                          %lse: tensor<?xf32>) -> tensor<16xf32> {
  %dv:2, %dq = attnres.backward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) grad(%do : tensor<?x64xbf16>)
      lse(%lse : tensor<?xf32>)
      -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xf32>
  return %dq : tensor<16xf32>
}

// -----

// Loops mapped already, loops around anything else and loops around more
// than one attnres op are left as they are.
// ALONE-LABEL: func.func @left_alone
// ALONE: } {mapping = [#gpu.thread<x>]}
// ALONE: scf.forall
// ALONE-NOT: mapping
// ALONE: scf.forall
// ALONE-NOT: mapping
// ALONE: return
func.func @left_alone(%p: tensor<3x24x64xf32>, %l: tensor<3x24xf32>,
                      %a: tensor<24xf32>) -> (tensor<24x64xf32>, tensor<24xf32>) {
  %init = tensor.empty() : tensor<24x64xf32>
  %r = scf.forall (%t) = (0) to (24) step (8) shared_outs(%out = %init)
      -> (tensor<24x64xf32>) {
    %ps = tensor.extract_slice %p[0, %t, 0] [3, 8, 64] [1, 1, 1]
        : tensor<3x24x64xf32> to tensor<3x8x64xf32>
    %ls = tensor.extract_slice %l[0, %t] [3, 8] [1, 1]
        : tensor<3x24xf32> to tensor<3x8xf32>
    %o, %lse = attnres.partition_reduce softmax %ps : tensor<3x8x64xf32>
        lse(%ls : tensor<3x8xf32>) -> tensor<8x64xf32>, tensor<8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %o into %out[%t, 0] [8, 64] [1, 1]
          : tensor<8x64xf32> into tensor<24x64xf32>
    }
  } {mapping = [#gpu.thread<x>]}
  %init2 = tensor.empty() : tensor<24xf32>
  %s = scf.forall (%t) = (0) to (24) step (8) shared_outs(%out = %init2)
      -> (tensor<24xf32>) {
    %as = tensor.extract_slice %a[%t] [8] [1] : tensor<24xf32> to tensor<8xf32>
    %twice = arith.addf %as, %as : tensor<8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %twice into %out[%t] [8] [1]
          : tensor<8xf32> into tensor<24xf32>
    }
  }
  %u:2 = scf.forall (%t) = (0) to (24) step (8)
      shared_outs(%out = %init, %out2 = %init) -> (tensor<24x64xf32>, tensor<24x64xf32>) {
    %ps = tensor.extract_slice %p[0, %t, 0] [3, 8, 64] [1, 1, 1]
        : tensor<3x24x64xf32> to tensor<3x8x64xf32>
    %ls = tensor.extract_slice %l[0, %t] [3, 8] [1, 1]
        : tensor<3x24xf32> to tensor<3x8xf32>
    %o, %lse = attnres.partition_reduce softmax %ps : tensor<3x8x64xf32>
        lse(%ls : tensor<3x8xf32>) -> tensor<8x64xf32>, tensor<8xf32>
    %o2, %lse2 = attnres.partition_reduce softmax %ps : tensor<3x8x64xf32>
        lse(%ls : tensor<3x8xf32>) -> tensor<8x64xf32>, tensor<8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %o into %out[%t, 0] [8, 64] [1, 1]
          : tensor<8x64xf32> into tensor<24x64xf32>
      tensor.parallel_insert_slice %o2 into %out2[%t, 0] [8, 64] [1, 1]
          : tensor<8x64xf32> into tensor<24x64xf32>
    }
  }
  return %r, %s : tensor<24x64xf32>, tensor<24xf32>
}
