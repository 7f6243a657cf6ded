// RUN: attnres-opt %s --split-input-file --attnres-split-sources=partitions=3 --canonicalize --cse | FileCheck %s
// RUN: attnres-opt %s --split-input-file --attnres-split-sources=partitions=100 --canonicalize --cse | FileCheck %s --check-prefix=CLAMP
// RUN: attnres-opt %s --split-input-file --attnres-split-sources | FileCheck %s --check-prefix=AUTO
// RUN: attnres-opt %s --split-input-file --attnres-split-sources=partitions=1 | FileCheck %s --check-prefix=ONE
// RUN: attnres-opt %s --split-input-file --attnres-split-sources=num-multiprocessors=0 | FileCheck %s --check-prefix=RUNTIME
// RUN: not attnres-opt %s --attnres-split-sources=partitions=0 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: not attnres-opt %s --attnres-split-sources=num-multiprocessors=-1 2>&1 | FileCheck %s --check-prefix=BAD-SIZE
// BAD-SIZE: attnres-split-sources: num-multiprocessors must be positive, or 0 for a target sized at run time, got -1
// BAD: attnres-split-sources: partitions must be a positive integer or 'auto', got '0'

// Seven listed sources in three partitions of 2, 2 and 3 (partition p holds
// sources [floor(7p / 3), floor(7(p + 1) / 3)), as the GPU kernels split
// them); the partial forwards return FP32 outputs and save only lse; the
// merge returns the forward's output type.
// CHECK-LABEL: func.func @list
// CHECK-SAME: (%[[V0:.*]]: tensor<?x64xbf16>, %[[V1:.*]]: tensor<?x64xbf16>, %[[V2:.*]]: tensor<?x64xbf16>, %[[V3:.*]]: tensor<?x64xbf16>, %[[V4:.*]]: tensor<?x64xbf16>, %[[V5:.*]]: tensor<?x64xbf16>, %[[V6:.*]]: tensor<?x64xbf16>, %[[Q:.*]]: tensor<16xf32>, %[[G:.*]]: tensor<16xf32>)
// CHECK: %[[O0:.*]], %[[L0:.*]] = attnres.forward sources(%[[V0]], %[[V1]] : tensor<?x64xbf16>) query(%[[Q]] : tensor<16xf32>) key_norm(%[[G]] : tensor<16xf32>) save(lse) {scale = 5.000000e-01 : f64} -> tensor<?x64xf32>, tensor<?xf32>
// CHECK: %[[O1:.*]], %[[L1:.*]] = attnres.forward sources(%[[V2]], %[[V3]] : tensor<?x64xbf16>) {{.*}} save(lse) {scale = 5.000000e-01 : f64} -> tensor<?x64xf32>, tensor<?xf32>
// CHECK: %[[O2:.*]], %[[L2:.*]] = attnres.forward sources(%[[V4]], %[[V5]], %[[V6]] : tensor<?x64xbf16>)
// CHECK: %[[P:.*]] = tensor.concat dim(0) {{.*}} -> tensor<3x?x64xf32>
// CHECK: %[[LS:.*]] = tensor.concat dim(0) {{.*}} -> tensor<3x?xf32>
// CHECK: %[[O:.*]], %[[LSE:.*]] = attnres.partition_reduce softmax %[[P]] : tensor<3x?x64xf32> lse(%[[LS]] : tensor<3x?xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
// CHECK: return %[[O]], %[[LSE]]
// CLAMP-LABEL: func.func @list
// CLAMP-COUNT-7: attnres.forward sources(%{{[a-z0-9]+}} : tensor<?x64xbf16>)
// CLAMP: attnres.partition_reduce softmax %{{.*}} : tensor<7x?x64xf32>
// AUTO-LABEL: func.func @list
// AUTO: attnres.forward sources(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : tensor<?x64xbf16>)
// AUTO-NOT: partition_reduce
// One partition asked for: one FP32 partial over all sources and the merge.
// ONE-LABEL: func.func @list
// ONE: attnres.forward sources(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : tensor<?x64xbf16>) {{.*}} save(lse) {{.*}} -> tensor<?x64xf32>, tensor<?xf32>
// ONE: attnres.partition_reduce softmax %{{.*}} : tensor<1x?x64xf32>
func.func @list(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>, %v2: tensor<?x64xbf16>,
                %v3: tensor<?x64xbf16>, %v4: tensor<?x64xbf16>, %v5: tensor<?x64xbf16>,
                %v6: tensor<?x64xbf16>, %q: tensor<16xf32>, %g: tensor<16xf32>)
    -> (tensor<?x64xbf16>, tensor<?xf32>) {
  %o, %lse = attnres.forward sources(%v0, %v1, %v2, %v3, %v4, %v5, %v6 : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) key_norm(%g : tensor<16xf32>) {scale = 0.5 : f64}
      -> tensor<?x64xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x64xbf16>, tensor<?xf32>
}

// -----

// Packed sources are sliced; with several queries and an output norm, the
// norm (and the saved o_pre) move to the merge.
// CHECK-LABEL: func.func @packed_multi_query_output_norm
// CHECK-SAME: (%[[V:.*]]: tensor<4x8x32xf32>, %[[Q:.*]]: tensor<2x8xf32>, %[[H:.*]]: tensor<2x32xf32>)
// CHECK: %[[S0:.*]] = tensor.extract_slice %[[V]][0, 0, 0] [1, 8, 32] [1, 1, 1]
// CHECK: attnres.forward packed(%[[S0]] : tensor<1x8x32xf32>) query(%[[Q]] : tensor<2x8xf32>) save(lse) {eps = 1.000000e-03 : f64} -> tensor<2x8x32xf32>, tensor<2x8xf32>
// CHECK: %[[S1:.*]] = tensor.extract_slice %[[V]][1, 0, 0] [1, 8, 32] [1, 1, 1]
// CHECK: %[[S2:.*]] = tensor.extract_slice %[[V]][2, 0, 0] [2, 8, 32] [1, 1, 1]
// CHECK: attnres.partition_reduce softmax %{{.*}} : tensor<3x2x8x32xf32> lse(%{{.*}} : tensor<3x2x8xf32>) output_norm(%[[H]] : tensor<2x32xf32>) {eps = 1.000000e-03 : f64} -> tensor<2x8x32xf32>, tensor<2x8xf32>, tensor<2x8x32xf32>
// AUTO-LABEL: func.func @packed_multi_query_output_norm
// AUTO-NOT: partition_reduce
func.func @packed_multi_query_output_norm(%v: tensor<4x8x32xf32>, %q: tensor<2x8xf32>,
                                          %h: tensor<2x32xf32>)
    -> (tensor<2x8x32xf32>, tensor<2x8xf32>, tensor<2x8x32xf32>) {
  %o, %lse, %o_pre = attnres.forward packed(%v : tensor<4x8x32xf32>)
      query(%q : tensor<2x8xf32>) output_norm(%h : tensor<2x32xf32>) {eps = 1.0e-3 : f64}
      -> tensor<2x8x32xf32>, tensor<2x8xf32>, tensor<2x8x32xf32>
  return %o, %lse, %o_pre : tensor<2x8x32xf32>, tensor<2x8xf32>, tensor<2x8x32xf32>
}

// -----

// One source is left alone.
// CHECK-LABEL: func.func @one_source
// CHECK-NOT: partition_reduce
func.func @one_source(%v: tensor<8x32xf32>, %q: tensor<8xf32>) -> tensor<8xf32> {
  %o, %lse = attnres.forward sources(%v : tensor<8x32xf32>) query(%q : tensor<8xf32>)
      -> tensor<8x32xf32>, tensor<8xf32>
  return %lse : tensor<8xf32>
}

// -----

// auto: 2 tokens of 64 bf16 sources of width 4096 (decoding) leave an H200
// idle; the rule gives min(floor(264 / 2), 64 / 4, 64 * 4096 * 2 / 32768) = 16
// partitions of 4 sources.
// CHECK-LABEL: func.func @decode
// AUTO-LABEL: func.func @decode
// AUTO-COUNT-16: attnres.forward packed(%{{.*}} : tensor<4x2x4096xbf16>)
// AUTO: attnres.partition_reduce softmax %{{.*}} : tensor<16x2x4096xf32>
// With the target's size left to run time (num-multiprocessors=0, as the
// GPU pipelines run the pass) auto leaves it whole: the launch splits it.
// RUNTIME-LABEL: func.func @decode
// RUNTIME-NEXT: attnres.forward packed(%{{.*}} : tensor<64x2x4096xbf16>)
// RUNTIME-NOT: partition_reduce
// RUNTIME: return
func.func @decode(%v: tensor<64x2x4096xbf16>, %q: tensor<4096xbf16>) -> tensor<2x4096xbf16> {
  %o, %lse = attnres.forward packed(%v : tensor<64x2x4096xbf16>) query(%q : tensor<4096xbf16>)
      -> tensor<2x4096xbf16>, tensor<2xf32>
  return %o : tensor<2x4096xbf16>
}

// -----

// auto: 8192 tokens fill the GPU without a split.
// CHECK-LABEL: func.func @prefill
// AUTO-LABEL: func.func @prefill
// AUTO-NOT: partition_reduce
func.func @prefill(%v: tensor<64x8192x512xbf16>, %q: tensor<512xbf16>) -> tensor<8192x512xbf16> {
  %o, %lse = attnres.forward packed(%v : tensor<64x8192x512xbf16>) query(%q : tensor<512xbf16>)
      -> tensor<8192x512xbf16>, tensor<8192xf32>
  return %o : tensor<8192x512xbf16>
}

// -----

// save(o_pre_residual): the partials save nothing; the merge returns the
// residual of the merged o_pre.
// CHECK-LABEL: func.func @residual
// CHECK-COUNT-3: attnres.forward sources({{.*}}) query(%{{.*}} : tensor<16xf32>) save(lse) -> tensor<?x64xf32>, tensor<?xf32>
// CHECK: attnres.partition_reduce softmax %{{.*}} : tensor<3x?x64xf32> lse(%{{.*}} : tensor<3x?xf32>) output_norm(%{{.*}} : tensor<64xf32>) -> tensor<?x64xbf16>, tensor<?xf32>, tensor<?x64xbf16>, tensor<?x32xi8>
// AUTO-LABEL: func.func @residual
func.func @residual(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                    %v2: tensor<?x64xbf16>, %q: tensor<16xf32>,
                    %h: tensor<64xf32>)
    -> (tensor<?x64xbf16>, tensor<?x32xi8>) {
  %o, %lse, %o_pre, %r = attnres.forward sources(%v0, %v1, %v2 : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) output_norm(%h : tensor<64xf32>) save(o_pre_residual)
      -> tensor<?x64xbf16>, tensor<?xf32>, tensor<?x64xbf16>, tensor<?x32xi8>
  return %o_pre, %r : tensor<?x64xbf16>, tensor<?x32xi8>
}

