// RUN: attnres-opt %s --split-input-file --canonicalize | FileCheck %s

// A forward over one source without an output norm returns the source; the
// op stays only while its lse is used.
// CHECK-LABEL: func.func @forward_one_source
// CHECK-SAME: (%[[V:.*]]: tensor<?x64xbf16>, %[[Q:.*]]: tensor<16xf32>)
// CHECK: %{{.*}}, %[[LSE:.*]] = attnres.forward sources(%[[V]] : tensor<?x64xbf16>)
// CHECK: return %[[V]], %[[LSE]]
func.func @forward_one_source(%v: tensor<?x64xbf16>, %q: tensor<16xf32>)
    -> (tensor<?x64xbf16>, tensor<?xf32>) {
  %o, %lse = attnres.forward sources(%v : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x64xbf16>, tensor<?xf32>
}

// -----

// With lse unused the forward disappears.
// CHECK-LABEL: func.func @forward_one_source_output_only
// CHECK-SAME: (%[[V:.*]]: tensor<8x64xf32>
// CHECK-NOT: attnres.forward
// CHECK: return %[[V]]
func.func @forward_one_source_output_only(%v: tensor<8x64xf32>, %q: tensor<64xf32>,
                                          %g: tensor<64xf32>) -> tensor<8x64xf32> {
  %o, %lse = attnres.forward sources(%v : tensor<8x64xf32>)
      query(%q : tensor<64xf32>) key_norm(%g : tensor<64xf32>) {scale = 3.0 : f64}
      -> tensor<8x64xf32>, tensor<8xf32>
  return %o : tensor<8x64xf32>
}

// -----

// A packed source of one, and an FP32 output of bf16 sources.
// CHECK-LABEL: func.func @forward_one_packed_source_f32_output
// CHECK-SAME: (%[[V:.*]]: tensor<1x?x64xbf16>
// CHECK: %[[SLICE:.*]] = tensor.extract_slice %[[V]][0, 0, 0] [1, %{{.*}}, 64] [1, 1, 1] : tensor<1x?x64xbf16> to tensor<?x64xbf16>
// CHECK: %[[EXT:.*]] = arith.extf %[[SLICE]] : tensor<?x64xbf16> to tensor<?x64xf32>
// CHECK-NOT: attnres.forward
// CHECK: return %[[EXT]]
func.func @forward_one_packed_source_f32_output(%v: tensor<1x?x64xbf16>, %q: tensor<16xf32>)
    -> tensor<?x64xf32> {
  %o, %lse = attnres.forward packed(%v : tensor<1x?x64xbf16>)
      query(%q : tensor<16xf32>) -> tensor<?x64xf32>, tensor<?xf32>
  return %o : tensor<?x64xf32>
}

// -----

// Not with an output norm: o is the normalized source.
// CHECK-LABEL: func.func @forward_one_source_output_norm
// CHECK: attnres.forward
func.func @forward_one_source_output_norm(%v: tensor<8x64xf32>, %q: tensor<64xf32>,
                                          %h: tensor<64xf32>) -> tensor<8x64xf32> {
  %o, %lse = attnres.forward sources(%v : tensor<8x64xf32>)
      query(%q : tensor<64xf32>) output_norm(%h : tensor<64xf32>) save(lse)
      -> tensor<8x64xf32>, tensor<8xf32>
  return %o : tensor<8x64xf32>
}

// -----

// Not with two sources.
// CHECK-LABEL: func.func @forward_two_sources
// CHECK: attnres.forward
func.func @forward_two_sources(%v: tensor<8x64xf32>, %q: tensor<64xf32>) -> tensor<8x64xf32> {
  %o, %lse = attnres.forward sources(%v, %v : tensor<8x64xf32>)
      query(%q : tensor<64xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return %o : tensor<8x64xf32>
}

// -----

// Not with several queries.
// CHECK-LABEL: func.func @forward_one_source_two_queries
// CHECK: attnres.forward
func.func @forward_one_source_two_queries(%v: tensor<8x64xf32>, %q: tensor<2x64xf32>)
    -> tensor<2x8x64xf32> {
  %o, %lse = attnres.forward sources(%v : tensor<8x64xf32>)
      query(%q : tensor<2x64xf32>) -> tensor<2x8x64xf32>, tensor<2x8xf32>
  return %o : tensor<2x8x64xf32>
}

// -----

// The backward over one source: dv = do, dq = dg = 0.
// CHECK-LABEL: func.func @backward_one_source
// CHECK-SAME: %{{.*}}: tensor<16xbf16>, %[[DO:[a-z0-9]+]]: tensor<?x64xbf16>, %{{.*}}: tensor<?xf32>)
// CHECK-DAG: %[[ZQ:.*]] = arith.constant dense<0.000000e+00> : tensor<16xf32>
// CHECK-DAG: %[[ZG:.*]] = arith.constant dense<0.000000e+00> : tensor<16xbf16>
// CHECK-NOT: attnres.backward
// CHECK: return %[[DO]], %[[ZQ]], %[[ZG]]
func.func @backward_one_source(%v: tensor<?x64xbf16>, %q: tensor<16xf32>, %g: tensor<16xbf16>,
                               %do: tensor<?x64xbf16>, %lse: tensor<?xf32>)
    -> (tensor<?x64xbf16>, tensor<16xf32>, tensor<16xbf16>) {
  %dv, %dq, %dg = attnres.backward sources(%v : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) key_norm(%g : tensor<16xbf16>)
      grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<?xf32>)
      -> tensor<?x64xbf16>, tensor<16xf32>, tensor<16xbf16>
  return %dv, %dq, %dg : tensor<?x64xbf16>, tensor<16xf32>, tensor<16xbf16>
}

// -----

// With an lse gradient a single source still has gradients in q and its key
// (lse = z): the backward stays.
// CHECK-LABEL: func.func @backward_one_source_lse_gradient
// CHECK: attnres.backward {{.*}} grad_lse(
func.func @backward_one_source_lse_gradient(%v: tensor<?x64xf32>, %q: tensor<16xf32>,
                                            %do: tensor<?x64xf32>, %lse: tensor<?xf32>,
                                            %dlse: tensor<?xf32>)
    -> (tensor<?x64xf32>, tensor<16xf32>) {
  %dv, %dq = attnres.backward sources(%v : tensor<?x64xf32>)
      query(%q : tensor<16xf32>) grad(%do : tensor<?x64xf32>) lse(%lse : tensor<?xf32>)
      grad_lse(%dlse : tensor<?xf32>) -> tensor<?x64xf32>, tensor<16xf32>
  return %dv, %dq : tensor<?x64xf32>, tensor<16xf32>
}

// -----

// An accumulating backward over one source stays: its source gradient is
// added into the one given in place once bufferized, which an add here
// would not be.
// CHECK-LABEL: func.func @backward_one_source_accumulating
// CHECK: attnres.backward {{.*}} accumulate(
func.func @backward_one_source_accumulating(%v: tensor<?x64xf32>, %q: tensor<16xf32>,
                                            %do: tensor<?x64xf32>, %lse: tensor<?xf32>,
                                            %acc: tensor<?x64xf32>)
    -> (tensor<?x64xf32>, tensor<16xf32>) {
  %dv, %dq = attnres.backward sources(%v : tensor<?x64xf32>)
      query(%q : tensor<16xf32>) grad(%do : tensor<?x64xf32>) lse(%lse : tensor<?xf32>)
      accumulate(%acc : tensor<?x64xf32>) -> tensor<?x64xf32>, tensor<16xf32>
  return %dv, %dq : tensor<?x64xf32>, tensor<16xf32>
}

// -----

// Packed, with an f32 gradient of bf16 sources: do is truncated and expanded.
// CHECK-LABEL: func.func @backward_one_packed_source
// CHECK-SAME: %[[DO:[a-z0-9]+]]: tensor<8x64xf32>, %{{.*}}: tensor<8xf32>)
// CHECK: %[[EXP:.*]] = tensor.expand_shape %[[DO]] {{\[\[}}0, 1], [2]] output_shape [1, 8, 64] : tensor<8x64xf32> into tensor<1x8x64xf32>
// CHECK: %[[TR:.*]] = arith.truncf %[[EXP]] : tensor<1x8x64xf32> to tensor<1x8x64xbf16>
// CHECK-NOT: attnres.backward
// CHECK: return %[[TR]]
func.func @backward_one_packed_source(%v: tensor<1x8x64xbf16>, %q: tensor<16xf32>,
                                      %do: tensor<8x64xf32>, %lse: tensor<8xf32>)
    -> tensor<1x8x64xbf16> {
  %dv, %dq = attnres.backward packed(%v : tensor<1x8x64xbf16>)
      query(%q : tensor<16xf32>) grad(%do : tensor<8x64xf32>) lse(%lse : tensor<8xf32>)
      -> tensor<1x8x64xbf16>, tensor<16xf32>
  return %dv : tensor<1x8x64xbf16>
}

// -----

// Not with an output norm.
// CHECK-LABEL: func.func @backward_one_source_output_norm
// CHECK: attnres.backward
func.func @backward_one_source_output_norm(%v: tensor<8x64xf32>, %q: tensor<16xf32>,
                                           %h: tensor<64xf32>, %do: tensor<8x64xf32>,
                                           %lse: tensor<8xf32>) -> tensor<8x64xf32> {
  %dv, %dq, %dh = attnres.backward sources(%v : tensor<8x64xf32>)
      query(%q : tensor<16xf32>) output_norm(%h : tensor<64xf32>)
      grad(%do : tensor<8x64xf32>) lse(%lse : tensor<8xf32>)
      -> tensor<8x64xf32>, tensor<16xf32>, tensor<64xf32>
  return %dv : tensor<8x64xf32>
}

// -----

// A sum of one partition is that partition.
// CHECK-LABEL: func.func @sum_of_one_partition
// CHECK-SAME: (%[[P:.*]]: tensor<1x4x16xf32>)
// CHECK: %[[S:.*]] = tensor.extract_slice %[[P]][0, 0, 0] [1, 4, 16] [1, 1, 1] : tensor<1x4x16xf32> to tensor<4x16xf32>
// CHECK: %[[T:.*]] = arith.truncf %[[S]] : tensor<4x16xf32> to tensor<4x16xbf16>
// CHECK: return %[[T]]
func.func @sum_of_one_partition(%p: tensor<1x4x16xf32>) -> tensor<4x16xbf16> {
  %s = attnres.partition_reduce sum %p : tensor<1x4x16xf32> -> tensor<4x16xbf16>
  return %s : tensor<4x16xbf16>
}

// -----

// CHECK-LABEL: func.func @sum_of_two_partitions
// CHECK: attnres.partition_reduce sum
func.func @sum_of_two_partitions(%p: tensor<2x16xf32>) -> tensor<16xf32> {
  %s = attnres.partition_reduce sum %p : tensor<2x16xf32> -> tensor<16xf32>
  return %s : tensor<16xf32>
}

// -----

// A softmax merge of one partition is not folded: an empty partition
// (lse = -inf) must give 0, not whatever its partial output holds.
// CHECK-LABEL: func.func @softmax_of_one_partition
// CHECK: attnres.partition_reduce softmax
func.func @softmax_of_one_partition(%p: tensor<1x8x64xf32>, %l: tensor<1x8xf32>)
    -> tensor<8x64xf32> {
  %o, %lse = attnres.partition_reduce softmax %p : tensor<1x8x64xf32>
      lse(%l : tensor<1x8xf32>) -> tensor<8x64xf32>, tensor<8xf32>
  return %o : tensor<8x64xf32>
}
