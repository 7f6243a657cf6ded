// RUN: attnres-opt %s --split-input-file --convert-attnres-to-linalg --canonicalize --cse | FileCheck %s
// RUN: attnres-opt %s --split-input-file --convert-attnres-to-linalg | FileCheck %s --check-prefix=EXACT

// The reference rounds every operation on its own (FloatArithmetic's Exact
// mode): no fused products, e^x and ln x as math.exp and math.log, not the
// kernels' exp2 / log2.
// EXACT-NOT: fastmath
// EXACT-NOT: math.exp2
// EXACT-NOT: math.log2

// A list of sources is concatenated once into [L, N, D]; the key is its last
// R coordinates; the softmax is max-shifted; the mixture accumulates in FP32
// and is truncated to the storage type at the end.
// CHECK-LABEL: func.func @forward_list
// CHECK-NOT: attnres.
// CHECK: %[[V:.*]] = tensor.concat dim(0) %{{.*}}, %{{.*}} : (tensor<1x?x64xbf16>, tensor<1x?x64xbf16>) -> tensor<2x?x64xbf16>
// CHECK: %[[KEY:.*]] = tensor.extract_slice %[[V]][0, 0, 48] [2, %{{.*}}, 16] [1, 1, 1]
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction"]} ins(%[[KEY]]
// CHECK: math.rsqrt
// CHECK: arith.maximumf
// CHECK: math.exp %
// CHECK: math.log %
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%{{.*}}, %[[V]] : tensor<1x2x?xf32>, tensor<2x?x64xbf16>)
// CHECK: arith.truncf %{{.*}} : f32 to bf16
// CHECK: return
func.func @forward_list(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>, %q: tensor<16xf32>)
    -> (tensor<?x64xbf16>, tensor<?xf32>) {
  %o, %lse = attnres.forward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x64xbf16>, tensor<?xf32>
}

// -----

// A packed source with two token dimensions: they are merged into one and
// restored on the results; eps and scale appear as FP32 constants.
// CHECK-LABEL: func.func @forward_packed_two_token_dims
// CHECK-DAG: arith.constant 2.500000e-01 : f32
// CHECK-DAG: arith.constant 1.000000e-03 : f32
// CHECK: tensor.collapse_shape %{{.*}} {{\[\[}}0], [1, 2], [3]] : tensor<3x4x5x32xf32> into tensor<3x20x32xf32>
// CHECK: tensor.expand_shape %{{.*}} {{\[\[}}0], [1, 2], [3]] output_shape [2, 4, 5, 32] : tensor<2x20x32xf32> into tensor<2x4x5x32xf32>
func.func @forward_packed_two_token_dims(%v: tensor<3x4x5x32xf32>, %q: tensor<2x32xf32>)
    -> tensor<2x4x5x32xf32> {
  %o, %lse = attnres.forward packed(%v : tensor<3x4x5x32xf32>)
      query(%q : tensor<2x32xf32>) {eps = 1.0e-3 : f64, scale = 0.25 : f64}
      -> tensor<2x4x5x32xf32>, tensor<2x4x5xf32>
  return %o : tensor<2x4x5x32xf32>
}

// -----

// Two dynamic token dimensions are restored with tensor.reshape: LLVM 22's
// expand-strided-metadata cannot lower an expand_shape that splits one
// dimension into several dynamic ones.
// CHECK-LABEL: func.func @forward_two_dynamic_token_dims
// CHECK: tensor.collapse_shape %{{.*}} {{\[\[}}0], [1, 2], [3]] : tensor<3x?x?x32xf32> into tensor<3x?x32xf32>
// CHECK: tensor.reshape %{{.*}}(%{{.*}}) : (tensor<?x32xf32>, tensor<3xindex>) -> tensor<?x?x32xf32>
func.func @forward_two_dynamic_token_dims(%v: tensor<3x?x?x32xf32>, %q: tensor<32xf32>)
    -> tensor<?x?x32xf32> {
  %o, %lse = attnres.forward packed(%v : tensor<3x?x?x32xf32>)
      query(%q : tensor<32xf32>) -> tensor<?x?x32xf32>, tensor<?x?xf32>
  return %o : tensor<?x?x32xf32>
}

// -----

// The output norm: o = o_pre * rsqrt(mean(o_pre^2) + eps) * h, with o_pre
// returned as well.
// CHECK-LABEL: func.func @forward_output_norm
// CHECK-COUNT-2: math.rsqrt
// CHECK: linalg.generic {{.*}} ins(%[[OPRE:.*]], %[[RHO:.*]], %{{.*}} : tensor<1x8x64xf32>, tensor<1x8xf32>, tensor<64xf32>)
// CHECK: return
func.func @forward_output_norm(%v: tensor<8x64xf32>, %q: tensor<64xf32>, %h: tensor<64xf32>)
    -> (tensor<8x64xf32>, tensor<8x64xf32>) {
  %o, %lse, %o_pre = attnres.forward sources(%v, %v : tensor<8x64xf32>)
      query(%q : tensor<64xf32>) output_norm(%h : tensor<64xf32>)
      -> tensor<8x64xf32>, tensor<8xf32>, tensor<8x64xf32>
  return %o, %o_pre : tensor<8x64xf32>, tensor<8x64xf32>
}

// -----

// save(o_pre_residual): the FP32 mixture's even and odd columns (stride-2
// slices) are rounded to bf16 and encoded against their ulp (2^-e from the
// exponent field, times 14 * 2^7 = 1792 steps), rounded to nearest by adding
// 1.5 * 2^23 (0x4B400000) and keeping the low four bits, and two 4-bit
// residuals are packed into a byte.
// CHECK-LABEL: func.func @forward_residual
// CHECK-DAG: %[[STEPS:.*]] = arith.constant 1.792000e+03 : f32
// CHECK-DAG: %[[ROUND:.*]] = arith.constant 0x4B400000 : f32
// CHECK: %[[EVEN:.*]] = tensor.extract_slice %{{.*}}[0, 0] [%{{.*}}, 32] [1, 2] : tensor<?x64xf32> to tensor<?x32xf32>
// CHECK: %[[ODD:.*]] = tensor.extract_slice %{{.*}}[0, 1] [%{{.*}}, 32] [1, 2] : tensor<?x64xf32> to tensor<?x32xf32>
// CHECK: linalg.generic {{.*}} ins(%[[EVEN]], %[[ODD]] : tensor<?x32xf32>, tensor<?x32xf32>) outs(%{{.*}} : tensor<?x32xi8>)
// CHECK: arith.truncf %{{.*}} : f32 to bf16
// CHECK: arith.andi %{{.*}}, %{{.*}} : i32
// CHECK: arith.mulf %{{.*}}, %[[STEPS]] : f32
// CHECK: arith.addf %{{.*}}, %[[ROUND]] : f32
// CHECK: arith.bitcast %{{.*}} : f32 to i32
// CHECK: arith.trunci %{{.*}} : i32 to i8
// CHECK: arith.shli %{{.*}}, %{{.*}} : i8
// CHECK: arith.ori %{{.*}}, %{{.*}} : i8
func.func @forward_residual(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                            %q: tensor<16xf32>) -> tensor<?x32xi8> {
  %o, %lse, %r = attnres.forward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) save(o_pre_residual)
      -> tensor<?x64xbf16>, tensor<?xf32>, tensor<?x32xi8>
  return %r : tensor<?x32xi8>
}
