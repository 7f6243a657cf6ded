// RUN: attnres-opt %s --split-input-file --attnres-tile=tile-sizes=16 --canonicalize --cse | FileCheck %s
// RUN: attnres-opt %s --split-input-file --attnres-tile=tile-sizes=2,8 --canonicalize --cse | FileCheck %s --check-prefix=TWO
// RUN: not attnres-opt %s --attnres-tile=tile-sizes=-1 2>&1 | FileCheck %s --check-prefix=BAD
// BAD: attnres-tile: tile sizes must be >= 0

// Tokens of a forward tiled by 16 into scf.forall: each tile slices the
// sources and writes its rows of o and lse.
// CHECK-LABEL: func.func @forward
// CHECK: scf.forall (%[[T:.*]]) = (0) to (%{{.*}}) step (16) shared_outs(%[[O:.*]] = %{{.*}}, %[[L:.*]] = %{{.*}}) -> (tensor<2x?x64xbf16>, tensor<2x?xf32>)
// CHECK: %[[S:.*]] = tensor.extract_slice %{{.*}}[0, %[[T]], 0] [3, %{{.*}}, 64] [1, 1, 1] : tensor<3x?x64xbf16> to tensor<3x?x64xbf16>
// CHECK: %[[TO:.*]], %[[TL:.*]] = attnres.forward packed(%[[S]] : tensor<3x?x64xbf16>)
// CHECK: tensor.parallel_insert_slice %[[TO]] into %[[O]][0, %[[T]], 0] [2, %{{.*}}, 64]
// CHECK: tensor.parallel_insert_slice %[[TL]] into %[[L]][0, %[[T]]] [2, %{{.*}}]
// TWO-LABEL: func.func @forward
// TWO: scf.forall (%{{.*}}) = (0) to (%{{.*}}) step (2)
func.func @forward(%v: tensor<3x?x64xbf16>, %q: tensor<2x16xbf16>)
    -> (tensor<2x?x64xbf16>, tensor<2x?xf32>) {
  %o, %lse = attnres.forward packed(%v : tensor<3x?x64xbf16>) query(%q : tensor<2x16xbf16>)
      -> tensor<2x?x64xbf16>, tensor<2x?xf32>
  return %o, %lse : tensor<2x?x64xbf16>, tensor<2x?xf32>
}

// -----

// Two token dimensions tiled by (2, 8); a merge tiles over its rows (never
// over D), and a per-row output-norm weight is sliced with them.
// TWO-LABEL: func.func @merge
// TWO: scf.forall (%[[A:.*]], %[[B:.*]]) = (0, 0) to (4, 24) step (2, 8)
// TWO: tensor.extract_slice %{{.*}}[0, %[[A]], %[[B]], 0] [3, 2, 8, 64] [1, 1, 1, 1] : tensor<3x4x24x64xf32> to tensor<3x2x8x64xf32>
// TWO: tensor.extract_slice %{{.*}}[%[[A]], 0] [2, 64] [1, 1] : tensor<4x64xf32> to tensor<2x64xf32>
// TWO: attnres.partition_reduce softmax %{{.*}} : tensor<3x2x8x64xf32> lse(%{{.*}} : tensor<3x2x8xf32>) output_norm(%{{.*}} : tensor<2x64xf32>) -> tensor<2x8x64xbf16>, tensor<2x8xf32>
// A tile larger than the dimension leaves one tile, which canonicalization
// folds back into a single op.
// CHECK-LABEL: func.func @merge
// CHECK-NOT: scf.forall
// CHECK: attnres.partition_reduce softmax %{{.*}} : tensor<3x?x24x64xf32>
func.func @merge(%p: tensor<3x4x24x64xf32>, %l: tensor<3x4x24xf32>, %h: tensor<4x64xf32>)
    -> tensor<4x24x64xbf16> {
  %o, %lse = attnres.partition_reduce softmax %p : tensor<3x4x24x64xf32>
      lse(%l : tensor<3x4x24xf32>) output_norm(%h : tensor<4x64xf32>)
      -> tensor<4x24x64xbf16>, tensor<4x24xf32>
  return %o : tensor<4x24x64xbf16>
}

// -----

// A backward is left to attnres-split-reduction.
// CHECK-LABEL: func.func @backward
// CHECK-NOT: scf.forall
// CHECK: attnres.backward
func.func @backward(%v: tensor<?x64xf32>, %q: tensor<16xf32>, %do: tensor<?x64xf32>,
                    %lse: tensor<?xf32>) -> tensor<16xf32> {
  %dv:2, %dq = attnres.backward sources(%v, %v : tensor<?x64xf32>) query(%q : tensor<16xf32>)
      grad(%do : tensor<?x64xf32>) lse(%lse : tensor<?xf32>)
      -> tensor<?x64xf32>, tensor<?x64xf32>, tensor<16xf32>
  return %dq : tensor<16xf32>
}

// -----

// A sum partition_reduce adds partial rows elementwise (here the partial
// query gradients of attnres-split-reduction): its dimensions are not
// tokens, and it stays whole.
// CHECK-LABEL: func.func @sum
// CHECK-NOT: scf.forall
// CHECK: attnres.partition_reduce sum
// TWO-LABEL: func.func @sum
// TWO-NOT: scf.forall
func.func @sum(%p: tensor<4x64xf32>) -> tensor<64xf32> {
  %s = attnres.partition_reduce sum %p : tensor<4x64xf32> -> tensor<64xf32>
  return %s : tensor<64xf32>
}
