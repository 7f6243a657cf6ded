// RUN: attnres-opt %s --split-input-file | attnres-opt --split-input-file | FileCheck %s
// RUN: attnres-opt %s --split-input-file -mlir-print-op-generic | attnres-opt --split-input-file | FileCheck %s
// RUN: attnres-opt %s -emit-bytecode | attnres-opt | FileCheck %s

// CHECK-LABEL: func.func @forward_list
// CHECK: attnres.forward sources(%{{.*}}, %{{.*}}, %{{.*}} : tensor<?x64xbf16>) query(%{{.*}} : tensor<16xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
func.func @forward_list(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                        %v2: tensor<?x64xbf16>, %q: tensor<16xf32>)
    -> (tensor<?x64xbf16>, tensor<?xf32>) {
  %o, %lse = attnres.forward sources(%v0, %v1, %v2 : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x64xbf16>, tensor<?xf32>
}

// -----

// One type per source is accepted and printed back as the shared type.
// CHECK-LABEL: func.func @forward_list_per_source_types
// CHECK: attnres.forward sources(%{{.*}}, %{{.*}} : tensor<8x32xf16>) query
func.func @forward_list_per_source_types(%v0: tensor<8x32xf16>,
                                         %v1: tensor<8x32xf16>,
                                         %q: tensor<32xf16>) -> tensor<8x32xf16> {
  %o, %lse = attnres.forward sources(%v0, %v1 : tensor<8x32xf16>, tensor<8x32xf16>)
      query(%q : tensor<32xf16>) -> tensor<8x32xf16>, tensor<8xf32>
  return %o : tensor<8x32xf16>
}

// -----

// All optional parts, non-default attributes, o_pre saved.
// CHECK-LABEL: func.func @forward_all_options
// CHECK: %{{.*}}, %{{.*}}, %{{.*}} = attnres.forward sources(%{{.*}}, %{{.*}} : tensor<2x?x128xf32>) query(%{{.*}} : tensor<32xbf16>) key_norm(%{{.*}} : tensor<32xf32>) output_norm(%{{.*}} : tensor<128xbf16>) {eps = 1.000000e-03 : f64, scale = 5.000000e-01 : f64} -> tensor<2x?x128xf32>, tensor<2x?xf32>, tensor<2x?x128xf32>
func.func @forward_all_options(%v0: tensor<2x?x128xf32>, %v1: tensor<2x?x128xf32>,
                               %q: tensor<32xbf16>, %g: tensor<32xf32>,
                               %h: tensor<128xbf16>) -> tensor<2x?x128xf32> {
  %o, %lse, %o_pre = attnres.forward sources(%v0, %v1 : tensor<2x?x128xf32>)
      query(%q : tensor<32xbf16>) key_norm(%g : tensor<32xf32>)
      output_norm(%h : tensor<128xbf16>) {eps = 1.0e-3 : f64, scale = 0.5 : f64}
      -> tensor<2x?x128xf32>, tensor<2x?xf32>, tensor<2x?x128xf32>
  return %o_pre : tensor<2x?x128xf32>
}

// -----

// Default attributes are not printed; save(lse) is.
// CHECK-LABEL: func.func @forward_defaults_elided
// CHECK: attnres.forward packed(%{{.*}} : tensor<3x?x?x16xbf16>) query(%{{.*}} : tensor<4x16xbf16>) output_norm(%{{.*}} : tensor<16xbf16>) save(lse) -> tensor<4x?x?x16xbf16>, tensor<4x?x?xf32>
// CHECK-NOT: eps
func.func @forward_defaults_elided(%v: tensor<3x?x?x16xbf16>, %q: tensor<4x16xbf16>,
                                   %h: tensor<16xbf16>) -> tensor<4x?x?x16xbf16> {
  %o, %lse = attnres.forward packed(%v : tensor<3x?x?x16xbf16>)
      query(%q : tensor<4x16xbf16>) output_norm(%h : tensor<16xbf16>)
      save(lse) {eps = 1.0e-6 : f64, scale = 1.0 : f64}
      -> tensor<4x?x?x16xbf16>, tensor<4x?x?xf32>
  return %o : tensor<4x?x?x16xbf16>
}

// -----

// A single token: sources of rank 1, lse of rank 0; 16 queries with a
// per-query output norm; an f32 partial output of bf16 sources.
// CHECK-LABEL: func.func @forward_single_token_sixteen_queries
// CHECK: attnres.forward sources(%{{.*}} : tensor<8xbf16>) query(%{{.*}} : tensor<16x8xf32>) output_norm(%{{.*}} : tensor<16x8xf32>) save(lse) -> tensor<16x8xf32>, tensor<16xf32>
func.func @forward_single_token_sixteen_queries(%v: tensor<8xbf16>,
                                                %q: tensor<16x8xf32>,
                                                %h: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %o, %lse = attnres.forward sources(%v : tensor<8xbf16>)
      query(%q : tensor<16x8xf32>) output_norm(%h : tensor<16x8xf32>) save(lse)
      -> tensor<16x8xf32>, tensor<16xf32>
  return %o : tensor<16x8xf32>
}

// -----

// CHECK-LABEL: func.func @backward_saved
// CHECK: %{{.*}}:2, %{{.*}}, %{{.*}}, %{{.*}} = attnres.backward sources(%{{.*}}, %{{.*}} : tensor<?x64xbf16>) query(%{{.*}} : tensor<16xf32>) key_norm(%{{.*}} : tensor<16xbf16>) output_norm(%{{.*}} : tensor<64xbf16>) grad(%{{.*}} : tensor<?x64xbf16>) lse(%{{.*}} : tensor<?xf32>) saved(%{{.*}} : tensor<?x64xbf16>) {scale = 2.500000e-01 : f64} -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xf32>, tensor<16xbf16>, tensor<64xbf16>
func.func @backward_saved(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                          %q: tensor<16xf32>, %g: tensor<16xbf16>,
                          %h: tensor<64xbf16>, %do: tensor<?x64xbf16>,
                          %lse: tensor<?xf32>, %o_pre: tensor<?x64xbf16>)
    -> tensor<64xbf16> {
  %dv:2, %dq, %dg, %dh = attnres.backward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) key_norm(%g : tensor<16xbf16>)
      output_norm(%h : tensor<64xbf16>) grad(%do : tensor<?x64xbf16>)
      lse(%lse : tensor<?xf32>) saved(%o_pre : tensor<?x64xbf16>)
      {scale = 0.25 : f64}
      -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xf32>, tensor<16xbf16>,
         tensor<64xbf16>
  return %dh : tensor<64xbf16>
}

// -----

// The recompute backward (no saved output) of a packed, multi-query forward.
// CHECK-LABEL: func.func @backward_recompute_packed
// CHECK: %{{.*}}, %{{.*}} = attnres.backward packed(%{{.*}} : tensor<4x?x32xf16>) query(%{{.*}} : tensor<2x8xf16>) grad(%{{.*}} : tensor<2x?x32xf16>) lse(%{{.*}} : tensor<2x?xf32>) -> tensor<4x?x32xf16>, tensor<2x8xf16>
func.func @backward_recompute_packed(%v: tensor<4x?x32xf16>, %q: tensor<2x8xf16>,
                                     %do: tensor<2x?x32xf16>, %lse: tensor<2x?xf32>)
    -> tensor<4x?x32xf16> {
  %dv, %dq = attnres.backward packed(%v : tensor<4x?x32xf16>)
      query(%q : tensor<2x8xf16>) grad(%do : tensor<2x?x32xf16>)
      lse(%lse : tensor<2x?xf32>) -> tensor<4x?x32xf16>, tensor<2x8xf16>
  return %dv : tensor<4x?x32xf16>
}

// -----

// CHECK-LABEL: func.func @partition_reduce_softmax
// CHECK: attnres.partition_reduce softmax %{{.*}} : tensor<4x?x64xf32> lse(%{{.*}} : tensor<4x?xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
// CHECK: attnres.partition_reduce softmax %{{.*}} : tensor<4x?x64xf32> lse(%{{.*}} : tensor<4x?xf32>) sink(%{{.*}} : tensor<?xf32>) -> tensor<?x64xf32>, tensor<?xf32>
func.func @partition_reduce_softmax(%o: tensor<4x?x64xf32>, %lse: tensor<4x?xf32>,
                                    %sink: tensor<?xf32>)
    -> (tensor<?x64xbf16>, tensor<?x64xf32>) {
  %a, %la = attnres.partition_reduce softmax %o : tensor<4x?x64xf32>
      lse(%lse : tensor<4x?xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
  %b, %lb = attnres.partition_reduce softmax %o : tensor<4x?x64xf32>
      lse(%lse : tensor<4x?xf32>) sink(%sink : tensor<?xf32>)
      -> tensor<?x64xf32>, tensor<?xf32>
  return %a, %b : tensor<?x64xbf16>, tensor<?x64xf32>
}

// -----

// CHECK-LABEL: func.func @partition_reduce_sum
// CHECK: attnres.partition_reduce sum %{{.*}} : tensor<257x4x16xf32> -> tensor<4x16xbf16>
// CHECK: attnres.partition_reduce sum %{{.*}} : tensor<3xf32> -> tensor<f32>
func.func @partition_reduce_sum(%p: tensor<257x4x16xf32>, %s: tensor<3xf32>)
    -> (tensor<4x16xbf16>, tensor<f32>) {
  %a = attnres.partition_reduce sum %p : tensor<257x4x16xf32> -> tensor<4x16xbf16>
  %b = attnres.partition_reduce sum %s : tensor<3xf32> -> tensor<f32>
  return %a, %b : tensor<4x16xbf16>, tensor<f32>
}

// -----

// A merge with the output norm of a split forward and its saved o_pre; FP32
// partial gradients of a backward over one block of tokens.
// CHECK-LABEL: func.func @partition_reduce_output_norm
// CHECK: attnres.partition_reduce softmax %{{.*}} : tensor<3x4x?x64xf32> lse(%{{.*}} : tensor<3x4x?xf32>) output_norm(%{{.*}} : tensor<4x64xbf16>) {eps = 1.000000e-05 : f64} -> tensor<4x?x64xbf16>, tensor<4x?xf32>, tensor<4x?x64xbf16>
// CHECK: attnres.backward sources(%{{.*}} : tensor<?x64xbf16>) query(%{{.*}} : tensor<16xbf16>) grad(%{{.*}} : tensor<?x64xbf16>) lse(%{{.*}} : tensor<?xf32>) -> tensor<?x64xbf16>, tensor<16xf32>
func.func @partition_reduce_output_norm(%p: tensor<3x4x?x64xf32>, %l: tensor<3x4x?xf32>,
                                        %h: tensor<4x64xbf16>, %v: tensor<?x64xbf16>,
                                        %q: tensor<16xbf16>, %do: tensor<?x64xbf16>,
                                        %lse: tensor<?xf32>) -> tensor<16xf32> {
  %o, %m, %o_pre = attnres.partition_reduce softmax %p : tensor<3x4x?x64xf32>
      lse(%l : tensor<3x4x?xf32>) output_norm(%h : tensor<4x64xbf16>) {eps = 1.0e-5 : f64}
      -> tensor<4x?x64xbf16>, tensor<4x?xf32>, tensor<4x?x64xbf16>
  %dv, %dq = attnres.backward sources(%v : tensor<?x64xbf16>) query(%q : tensor<16xbf16>)
      grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<?xf32>) -> tensor<?x64xbf16>, tensor<16xf32>
  return %dq : tensor<16xf32>
}

// -----

// The residual of a 16-bit o_pre: the last forward result, the backward's
// residual(...) operand, the merge's last result.
// CHECK-LABEL: func.func @o_pre_residual
// CHECK: attnres.forward sources(%{{.*}}, %{{.*}} : tensor<?x64xbf16>) query(%{{.*}} : tensor<2x16xf32>) output_norm(%{{.*}} : tensor<64xf32>) save(o_pre_residual) -> tensor<2x?x64xbf16>, tensor<2x?xf32>, tensor<2x?x64xbf16>, tensor<2x?x32xi8>
// CHECK: attnres.backward sources(%{{.*}}, %{{.*}} : tensor<?x64xbf16>) query(%{{.*}} : tensor<2x16xf32>) output_norm(%{{.*}} : tensor<64xf32>) grad(%{{.*}} : tensor<2x?x64xbf16>) lse(%{{.*}} : tensor<2x?xf32>) saved(%{{.*}} : tensor<2x?x64xbf16>) residual(%{{.*}} : tensor<2x?x32xi8>) -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<2x16xf32>, tensor<64xf32>
// CHECK: attnres.partition_reduce softmax %{{.*}} : tensor<3x?x64xf32> lse(%{{.*}} : tensor<3x?xf32>) -> tensor<?x64xf16>, tensor<?xf32>, tensor<?x32xi8>
func.func @o_pre_residual(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                          %q: tensor<2x16xf32>, %h: tensor<64xf32>,
                          %do: tensor<2x?x64xbf16>, %p: tensor<3x?x64xf32>,
                          %l: tensor<3x?xf32>)
    -> (tensor<2x16xf32>, tensor<?x32xi8>) {
  %o, %lse, %o_pre, %r = attnres.forward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<2x16xf32>) output_norm(%h : tensor<64xf32>)
      save(o_pre_residual)
      -> tensor<2x?x64xbf16>, tensor<2x?xf32>, tensor<2x?x64xbf16>, tensor<2x?x32xi8>
  %dv:2, %dq, %dh = attnres.backward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<2x16xf32>) output_norm(%h : tensor<64xf32>)
      grad(%do : tensor<2x?x64xbf16>) lse(%lse : tensor<2x?xf32>)
      saved(%o_pre : tensor<2x?x64xbf16>) residual(%r : tensor<2x?x32xi8>)
      -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<2x16xf32>, tensor<64xf32>
  %m, %ml, %mr = attnres.partition_reduce softmax %p : tensor<3x?x64xf32>
      lse(%l : tensor<3x?xf32>) -> tensor<?x64xf16>, tensor<?xf32>, tensor<?x32xi8>
  return %dq, %mr : tensor<2x16xf32>, tensor<?x32xi8>
}


// -----

// The backward of a partial result whose lse is used: grad_lse(...) comes
// after the saved operands.
// CHECK-LABEL: func.func @lse_gradient
// CHECK: attnres.backward sources(%{{.*}}, %{{.*}} : tensor<?x64xbf16>) query(%{{.*}} : tensor<2x16xf32>) grad(%{{.*}} : tensor<2x?x64xf32>) lse(%{{.*}} : tensor<2x?xf32>) saved(%{{.*}} : tensor<2x?x64xf32>) grad_lse(%{{.*}} : tensor<2x?xf32>) -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<2x16xf32>
func.func @lse_gradient(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                        %q: tensor<2x16xf32>, %do: tensor<2x?x64xf32>,
                        %dlse: tensor<2x?xf32>) -> tensor<2x16xf32> {
  %o, %lse = attnres.forward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<2x16xf32>) -> tensor<2x?x64xf32>, tensor<2x?xf32>
  %dv:2, %dq = attnres.backward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<2x16xf32>) grad(%do : tensor<2x?x64xf32>)
      lse(%lse : tensor<2x?xf32>) saved(%o : tensor<2x?x64xf32>)
      grad_lse(%dlse : tensor<2x?xf32>)
      -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<2x16xf32>
  return %dq : tensor<2x16xf32>
}

// -----

// An accumulating backward: the source gradients are the given ones plus
// this op's (one per source operand, typed as the source gradients).
// CHECK-LABEL: func.func @accumulating_list
// CHECK: attnres.backward sources(%{{.*}}, %{{.*}} : tensor<?x64xbf16>) query(%{{.*}} : tensor<16xf32>) grad(%{{.*}} : tensor<?x64xbf16>) lse(%{{.*}} : tensor<?xf32>) saved(%{{.*}} : tensor<?x64xbf16>) accumulate(%{{.*}}, %{{.*}} : tensor<?x64xbf16>, tensor<?x64xbf16>) -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xf32>
func.func @accumulating_list(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                             %q: tensor<16xf32>, %do: tensor<?x64xbf16>,
                             %lse: tensor<?xf32>, %o: tensor<?x64xbf16>,
                             %g0: tensor<?x64xbf16>, %g1: tensor<?x64xbf16>)
    -> (tensor<?x64xbf16>, tensor<?x64xbf16>) {
  %dv:2, %dq = attnres.backward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) grad(%do : tensor<?x64xbf16>)
      lse(%lse : tensor<?xf32>) saved(%o : tensor<?x64xbf16>)
      accumulate(%g0, %g1 : tensor<?x64xbf16>, tensor<?x64xbf16>)
      -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xf32>
  return %dv#0, %dv#1 : tensor<?x64xbf16>, tensor<?x64xbf16>
}

// -----

// Packed: one accumulated gradient for the packed sources, after grad_lse.
// CHECK-LABEL: func.func @accumulating_packed
// CHECK: attnres.backward packed(%{{.*}} : tensor<3x?x64xbf16>) query(%{{.*}} : tensor<2x16xf32>) grad(%{{.*}} : tensor<2x?x64xf32>) lse(%{{.*}} : tensor<2x?xf32>) grad_lse(%{{.*}} : tensor<2x?xf32>) accumulate(%{{.*}} : tensor<3x?x64xbf16>) -> tensor<3x?x64xbf16>, tensor<2x16xf32>
func.func @accumulating_packed(%v: tensor<3x?x64xbf16>, %q: tensor<2x16xf32>,
                               %do: tensor<2x?x64xf32>, %lse: tensor<2x?xf32>,
                               %dlse: tensor<2x?xf32>, %g: tensor<3x?x64xbf16>)
    -> tensor<3x?x64xbf16> {
  %dv, %dq = attnres.backward packed(%v : tensor<3x?x64xbf16>)
      query(%q : tensor<2x16xf32>) grad(%do : tensor<2x?x64xf32>)
      lse(%lse : tensor<2x?xf32>) grad_lse(%dlse : tensor<2x?xf32>)
      accumulate(%g : tensor<3x?x64xbf16>)
      -> tensor<3x?x64xbf16>, tensor<2x16xf32>
  return %dv : tensor<3x?x64xbf16>
}
