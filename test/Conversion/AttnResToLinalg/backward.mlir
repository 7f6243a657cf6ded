// RUN: attnres-opt %s --split-input-file --convert-attnres-to-linalg --canonicalize --cse | FileCheck %s

// The single-pass backward: o_pre comes from the saved operand, so there is
// no mixing pass over the sources; the key-path term of dv is added on the
// last R coordinates; da is reduced over sources and tokens (two reduction
// dimensions, in a fixed loop order); dq = da * g and dg = sum_m da * q.
// CHECK-LABEL: func.func @backward_saved
// CHECK-NOT: attnres.
// CHECK: %[[V:.*]] = tensor.concat dim(0)
// CHECK: %[[KEY:.*]] = tensor.extract_slice %[[V]][0, 0, 48] [2, 8, 16] [1, 1, 1]
// CHECK: %[[DV:.*]] = linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%{{.*}}, %{{.*}} : tensor<1x2x8xf32>, tensor<1x8x64xf32>) outs(%{{.*}} : tensor<2x8x64xf32>)
// CHECK: %[[DVKEY:.*]] = tensor.extract_slice %[[DV]][0, 0, 48] [2, 8, 16] [1, 1, 1]
// CHECK: %[[KEYGRAD:.*]] = linalg.generic {{.*}} outs(%[[DVKEY]] : tensor<2x8x16xf32>)
// CHECK: %[[ALL:.*]] = tensor.insert_slice %[[KEYGRAD]] into %[[DV]][0, 0, 48] [2, 8, 16] [1, 1, 1]
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction", "reduction"]} ins(%{{.*}}, %{{.*}}, %[[KEY]] :
// CHECK: tensor.extract_slice %[[ALL]][0, 0, 0] [1, 8, 64] [1, 1, 1] : tensor<2x8x64xf32> to tensor<8x64xf32>
// CHECK: tensor.extract_slice %[[ALL]][1, 0, 0] [1, 8, 64] [1, 1, 1] : tensor<2x8x64xf32> to tensor<8x64xf32>
func.func @backward_saved(%v0: tensor<8x64xf32>, %v1: tensor<8x64xf32>, %q: tensor<16xf32>,
                          %g: tensor<16xf32>, %do: tensor<8x64xf32>, %lse: tensor<8xf32>,
                          %o: tensor<8x64xf32>)
    -> (tensor<8x64xf32>, tensor<8x64xf32>, tensor<16xf32>, tensor<16xf32>) {
  %dv:2, %dq, %dg = attnres.backward sources(%v0, %v1 : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) key_norm(%g : tensor<16xf32>)
      grad(%do : tensor<8x64xf32>) lse(%lse : tensor<8xf32>) saved(%o : tensor<8x64xf32>)
      -> tensor<8x64xf32>, tensor<8x64xf32>, tensor<16xf32>, tensor<16xf32>
  return %dv#0, %dv#1, %dq, %dg : tensor<8x64xf32>, tensor<8x64xf32>, tensor<16xf32>, tensor<16xf32>
}

// -----

// The recompute backward mixes the sources again (o_pre = sum_l p * v).
// CHECK-LABEL: func.func @backward_recompute
// CHECK: %[[V:.*]] = tensor.collapse_shape
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%{{.*}}, %[[V]] : tensor<1x3x?xf32>, tensor<3x?x32xbf16>) outs(%{{.*}} : tensor<1x?x32xf32>)
// CHECK: arith.truncf %{{.*}} : f32 to bf16
func.func @backward_recompute(%v: tensor<3x2x?x32xbf16>, %q: tensor<32xbf16>,
                              %do: tensor<2x?x32xbf16>, %lse: tensor<2x?xf32>)
    -> tensor<3x2x?x32xbf16> {
  %dv, %dq = attnres.backward packed(%v : tensor<3x2x?x32xbf16>)
      query(%q : tensor<32xbf16>) grad(%do : tensor<2x?x32xbf16>) lse(%lse : tensor<2x?xf32>)
      -> tensor<3x2x?x32xbf16>, tensor<32xbf16>
  return %dv : tensor<3x2x?x32xbf16>
}

// -----

// Through the output norm: dh sums xhat * do over tokens and, for a weight
// shared by the queries, over queries too (two reduction dimensions).
// CHECK-LABEL: func.func @backward_output_norm_shared
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "reduction", "reduction"]} ins(%{{.*}}, %{{.*}}, %{{.*}} : tensor<2x4x16xf32>, tensor<2x4xf32>, tensor<2x4x16xf32>) outs(%{{.*}} : tensor<16xf32>)
func.func @backward_output_norm_shared(%v: tensor<3x4x16xf32>, %q: tensor<2x8xf32>,
                                       %h: tensor<16xf32>, %do: tensor<2x4x16xf32>,
                                       %lse: tensor<2x4xf32>, %o_pre: tensor<2x4x16xf32>)
    -> tensor<16xf32> {
  %dv, %dq, %dh = attnres.backward packed(%v : tensor<3x4x16xf32>)
      query(%q : tensor<2x8xf32>) output_norm(%h : tensor<16xf32>)
      grad(%do : tensor<2x4x16xf32>) lse(%lse : tensor<2x4xf32>) saved(%o_pre : tensor<2x4x16xf32>)
      -> tensor<3x4x16xf32>, tensor<2x8xf32>, tensor<16xf32>
  return %dh : tensor<16xf32>
}

// -----

// residual(...): column d of o_pre reads byte d / 2 of the residual, its
// low or high four bits by the parity of d, and adds n * ulp / 14 to the
// bf16 value before delta is formed.
// CHECK: #[[HALF:.*]] = affine_map<(d0, d1, d2) -> (d0, d1, d2 floordiv 2)>
// CHECK-LABEL: func.func @backward_residual
// CHECK: linalg.generic {indexing_maps = [#{{.*}}, #[[HALF]], #{{.*}}], {{.*}} ins(%{{.*}}, %{{.*}} : tensor<1x?x64xf32>, tensor<1x?x32xi8>)
// CHECK: arith.shrsi %{{.*}}, %{{.*}} : i8
// CHECK: linalg.index 2 : index
// CHECK: arith.remui
// CHECK: arith.sitofp %{{.*}} : i8 to f32
func.func @backward_residual(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                             %q: tensor<16xf32>, %do: tensor<?x64xbf16>,
                             %lse: tensor<?xf32>, %o: tensor<?x64xbf16>,
                             %r: tensor<?x32xi8>) -> tensor<16xf32> {
  %dv:2, %dq = attnres.backward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) grad(%do : tensor<?x64xbf16>)
      lse(%lse : tensor<?xf32>) saved(%o : tensor<?x64xbf16>)
      residual(%r : tensor<?x32xi8>)
      -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xf32>
  return %dq : tensor<16xf32>
}
