// RUN: attnres-opt %s --split-input-file --convert-attnres-to-linalg --canonicalize --cse | FileCheck %s
// RUN: not attnres-opt %S/../AttnResToGPU/Inputs/sum-on-buffers.mlir --convert-attnres-to-linalg 2>&1 | FileCheck %s --check-prefix=BUFFERS
// BUFFERS: error: convert-attnres-to-linalg lowers the attnres ops on tensors; 'attnres.partition_reduce_into' is an op on buffers, what bufferization makes of one: lower the module before bufferizing it

// The softmax merge: the maximum starts from the sink; an empty partition
// (lse = -inf) has weight 0 and its partial output is never multiplied in;
// with no mass at all the output is 0 and lse is -inf.
// CHECK-LABEL: func.func @softmax_merge
// CHECK-SAME: %[[SINK:[a-z0-9]+]]: tensor<?xf32>)
// CHECK-DAG: %[[NEGINF:.*]] = arith.constant 0xFF800000 : f32
// CHECK: %[[MAX:.*]] = linalg.generic {{.*}} iterator_types = ["parallel", "reduction"]} ins(%{{.*}} : tensor<4x?xf32>) outs(%[[SINK]] : tensor<?xf32>)
// CHECK: arith.cmpf oeq, %{{.*}}, %[[NEGINF]] : f32
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction"]}
// CHECK: %[[CONTRIBUTES:.*]] = arith.cmpf ogt
// CHECK: arith.select %[[CONTRIBUTES]]
// CHECK: arith.select %{{.*}}, %{{.*}}, %[[NEGINF]] : f32
// CHECK: arith.truncf %{{.*}} : f32 to bf16
func.func @softmax_merge(%p: tensor<4x?x64xf32>, %l: tensor<4x?xf32>, %s: tensor<?xf32>)
    -> (tensor<?x64xbf16>, tensor<?xf32>) {
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x?x64xf32>
      lse(%l : tensor<4x?xf32>) sink(%s : tensor<?xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x64xbf16>, tensor<?xf32>
}

// -----

// The sum: one reduction over the partitions, innermost, so the order is
// p = 0, 1, ..., P-1.
// CHECK-LABEL: func.func @sum
// CHECK: linalg.generic {indexing_maps = [#[[READ:.*]], #[[WRITE:.*]]], iterator_types = ["parallel", "parallel", "reduction"]} ins(%{{.*}} : tensor<7x3x5xf32>) outs(%{{.*}} : tensor<3x5xf32>)
func.func @sum(%p: tensor<7x3x5xf32>) -> tensor<3x5xf32> {
  %s = attnres.partition_reduce sum %p : tensor<7x3x5xf32> -> tensor<3x5xf32>
  return %s : tensor<3x5xf32>
}

// -----

// A sum of rank-0 results.
// CHECK-LABEL: func.func @sum_scalar
// CHECK: linalg.generic {{.*}} iterator_types = ["reduction"]} ins(%{{.*}} : tensor<9xf32>) outs(%{{.*}} : tensor<f32>)
func.func @sum_scalar(%p: tensor<9xf32>) -> tensor<f32> {
  %s = attnres.partition_reduce sum %p : tensor<9xf32> -> tensor<f32>
  return %s : tensor<f32>
}
