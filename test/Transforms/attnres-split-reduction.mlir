// RUN: attnres-opt %s --split-input-file --attnres-split-reduction=blocks=7 --canonicalize --cse | FileCheck %s
// RUN: attnres-opt %s --split-input-file --attnres-split-reduction | FileCheck %s --check-prefix=AUTO
// RUN: attnres-opt %s --split-input-file --attnres-split-reduction=num-multiprocessors=0 | FileCheck %s --check-prefix=RUNTIME
// RUN: not attnres-opt %s --attnres-split-reduction=blocks=many 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: not attnres-opt %s --attnres-split-reduction=num-multiprocessors=-2 2>&1 | FileCheck %s --check-prefix=BAD-SIZE
// BAD-SIZE: attnres-split-reduction: num-multiprocessors must be positive, or 0 for a target sized at run time, got -2
// BAD: attnres-split-reduction: blocks must be a positive integer or 'auto', got 'many'

// Seven blocks of ceil(N / 7) tokens, the last ones possibly empty: each
// block writes the source gradients of its tokens and one FP32 row of
// partial query / weight gradients; a sum partition_reduce per gradient adds
// the rows in order.
// CHECK-DAG: #[[OFFSET:.*]] = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 7), s0)>
// CHECK-DAG: #[[SIZE:.*]] = affine_map<()[s0, s1] -> (s0 ceildiv 7, s0 - s1)>
// CHECK-LABEL: func.func @list
// CHECK: %[[N:.*]] = tensor.dim
// CHECK: %[[R:.*]]:4 = scf.forall (%[[B:.*]]) in (7) shared_outs(%[[DV0:.*]] = %{{.*}}, %[[DV1:.*]] = %{{.*}}, %[[PQ:.*]] = %{{.*}}, %[[PG:.*]] = %{{.*}}) -> (tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<7x16xf32>, tensor<7x16xf32>)
// CHECK: %[[OFF:.*]] = affine.min #[[OFFSET]](%[[B]])[%[[N]]]
// CHECK: %[[LEN:.*]] = affine.min #[[SIZE]]()[%[[N]], %[[OFF]]]
// CHECK: %{{.*}}, %[[DQ:[a-z_0-9]+]], %[[DG:[a-z_0-9]+]] = attnres.backward {{.*}} -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xf32>, tensor<16xf32>
// CHECK: scf.forall.in_parallel
// CHECK: tensor.parallel_insert_slice %{{.*}} into %[[DV0]][%[[OFF]], 0] [%[[LEN]], 64]
// CHECK: tensor.parallel_insert_slice %{{.*}} into %[[DV1]][%[[OFF]], 0] [%[[LEN]], 64]
// CHECK: tensor.parallel_insert_slice %[[DQ]] into %[[PQ]][%[[B]], 0] [1, 16] [1, 1] : tensor<16xf32> into tensor<7x16xf32>
// CHECK: tensor.parallel_insert_slice %[[DG]] into %[[PG]][%[[B]], 0] [1, 16] [1, 1] : tensor<16xf32> into tensor<7x16xf32>
// CHECK: attnres.partition_reduce sum %[[R]]#2 : tensor<7x16xf32> -> tensor<16xbf16>
// CHECK: attnres.partition_reduce sum %[[R]]#3 : tensor<7x16xf32> -> tensor<16xbf16>
// auto leaves a backward over a dynamic token count whole (the GPU kernels
// size their blocks at run time).
// AUTO-LABEL: func.func @list
// AUTO-NOT: scf.forall
// AUTO: attnres.backward sources
func.func @list(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>, %q: tensor<16xbf16>,
                %g: tensor<16xbf16>, %do: tensor<?x64xbf16>, %lse: tensor<?xf32>,
                %o: tensor<?x64xbf16>)
    -> (tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xbf16>, tensor<16xbf16>) {
  %dv:2, %dq, %dg = attnres.backward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<16xbf16>) key_norm(%g : tensor<16xbf16>)
      grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<?xf32>) saved(%o : tensor<?x64xbf16>)
      -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xbf16>, tensor<16xbf16>
  return %dv#0, %dv#1, %dq, %dg : tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xbf16>, tensor<16xbf16>
}

// -----

// Several token dimensions are merged into one first and restored on the
// source gradients; the per-query output-norm gradient gets [B, M, D]
// partials.
// CHECK-LABEL: func.func @packed_tokens_2d
// CHECK: tensor.collapse_shape %{{.*}} {{\[\[}}0], [1, 2], [3]] : tensor<3x4x5x32xf32> into tensor<3x20x32xf32>
// CHECK: scf.forall (%{{.*}}) in (7) shared_outs({{.*}}) -> (tensor<3x20x32xf32>, tensor<7x2x8xf32>, tensor<7x2x32xf32>)
// CHECK: attnres.partition_reduce sum %{{.*}} : tensor<7x2x8xf32> -> tensor<2x8xf32>
// CHECK: attnres.partition_reduce sum %{{.*}} : tensor<7x2x32xf32> -> tensor<2x32xf32>
// CHECK: tensor.expand_shape %{{.*}} {{\[\[}}0], [1, 2], [3]] output_shape [3, 4, 5, 32] : tensor<3x20x32xf32> into tensor<3x4x5x32xf32>
// AUTO-LABEL: func.func @packed_tokens_2d
// AUTO: scf.forall (%{{.*}}) in (2)
// With the target's size left to run time (num-multiprocessors=0, as the
// GPU pipelines run the pass) auto leaves it whole: the launch sizes it.
// RUNTIME-LABEL: func.func @packed_tokens_2d
// RUNTIME-NOT: scf.forall
// RUNTIME: attnres.backward packed(%{{.*}} : tensor<3x4x5x32xf32>)
// RUNTIME-NOT: partition_reduce
// RUNTIME: return
func.func @packed_tokens_2d(%v: tensor<3x4x5x32xf32>, %q: tensor<2x8xf32>, %h: tensor<2x32xf32>,
                            %do: tensor<2x4x5x32xf32>, %lse: tensor<2x4x5xf32>)
    -> (tensor<3x4x5x32xf32>, tensor<2x8xf32>, tensor<2x32xf32>) {
  %dv, %dq, %dh = attnres.backward packed(%v : tensor<3x4x5x32xf32>)
      query(%q : tensor<2x8xf32>) output_norm(%h : tensor<2x32xf32>)
      grad(%do : tensor<2x4x5x32xf32>) lse(%lse : tensor<2x4x5xf32>)
      -> tensor<3x4x5x32xf32>, tensor<2x8xf32>, tensor<2x32xf32>
  return %dv, %dq, %dh : tensor<3x4x5x32xf32>, tensor<2x8xf32>, tensor<2x32xf32>
}

// -----

// The saved o_pre's residual is sliced per token block like the o_pre.
// CHECK-LABEL: func.func @residual
// CHECK: scf.forall (%{{.*}}) in (7)
// CHECK: %[[R:.*]] = tensor.extract_slice %{{.*}}[%{{.*}}, 0] [%{{.*}}, 32] [1, 1] : tensor<?x32xi8> to tensor<?x32xi8>
// CHECK: attnres.backward {{.*}} saved(%{{.*}} : tensor<?x64xbf16>) residual(%[[R]] : tensor<?x32xi8>)
func.func @residual(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>, %q: tensor<16xf32>,
                    %do: tensor<?x64xbf16>, %lse: tensor<?xf32>, %o: tensor<?x64xbf16>,
                    %r: tensor<?x32xi8>) -> tensor<16xf32> {
  %dv:2, %dq = attnres.backward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<?xf32>)
      saved(%o : tensor<?x64xbf16>) residual(%r : tensor<?x32xi8>)
      -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xf32>
  return %dq : tensor<16xf32>
}


// -----

// The lse gradient is sliced per token block like the lse.
// CHECK-LABEL: func.func @lse_gradient
// CHECK-SAME: %[[DLSE:[a-z0-9]+]]: tensor<?xf32>) -> tensor<16xf32>
// CHECK: scf.forall (%{{.*}}) in (7)
// CHECK: %[[DL:.*]] = tensor.extract_slice %[[DLSE]][%{{.*}}] [%{{.*}}] [1] : tensor<?xf32> to tensor<?xf32>
// CHECK: attnres.backward {{.*}} grad_lse(%[[DL]] : tensor<?xf32>)
func.func @lse_gradient(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>, %q: tensor<16xf32>,
                        %do: tensor<?x64xf32>, %lse: tensor<?xf32>, %o: tensor<?x64xf32>,
                        %dlse: tensor<?xf32>) -> tensor<16xf32> {
  %dv:2, %dq = attnres.backward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) grad(%do : tensor<?x64xf32>) lse(%lse : tensor<?xf32>)
      saved(%o : tensor<?x64xf32>) grad_lse(%dlse : tensor<?xf32>)
      -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xf32>
  return %dq : tensor<16xf32>
}

// -----

// An accumulating backward: each block's source gradients start from the
// gradients the op accumulates into (the forall's outputs are those, not
// new tensors) and its tile accumulates into its slice of them, so that
// bufferization keeps them in place; the token dimensions are merged on
// them too.
// CHECK-LABEL: func.func @accumulating(
// CHECK-SAME: %[[ACC:[a-z0-9]+]]: tensor<3x4x5x32xf32>)
// CHECK: %[[FLAT:.*]] = tensor.collapse_shape %[[ACC]] {{\[\[}}0], [1, 2], [3]] : tensor<3x4x5x32xf32> into tensor<3x20x32xf32>
// CHECK: scf.forall (%{{.*}}) in (7) shared_outs(%[[OUT:.*]] = %[[FLAT]], %{{.*}} = %{{.*}}) -> (tensor<3x20x32xf32>, tensor<7x8xf32>)
// CHECK: %[[SLICE:.*]] = tensor.extract_slice %[[OUT]][0, %[[OFF:.*]], 0] [3, %[[LEN:.*]], 32] [1, 1, 1]
// CHECK: attnres.backward {{.*}} accumulate(%[[SLICE]] : tensor<3x?x32xf32>)
// CHECK: tensor.parallel_insert_slice %{{.*}} into %[[OUT]][0, %[[OFF]], 0] [3, %[[LEN]], 32]
// AUTO-LABEL: func.func @accumulating
// AUTO: scf.forall (%{{.*}}) in (2)
func.func @accumulating(%v: tensor<3x4x5x32xf32>, %q: tensor<8xf32>,
                        %do: tensor<4x5x32xf32>, %lse: tensor<4x5xf32>,
                        %acc: tensor<3x4x5x32xf32>)
    -> (tensor<3x4x5x32xf32>, tensor<8xf32>) {
  %dv, %dq = attnres.backward packed(%v : tensor<3x4x5x32xf32>)
      query(%q : tensor<8xf32>) grad(%do : tensor<4x5x32xf32>)
      lse(%lse : tensor<4x5xf32>) accumulate(%acc : tensor<3x4x5x32xf32>)
      -> tensor<3x4x5x32xf32>, tensor<8xf32>
  return %dv, %dq : tensor<3x4x5x32xf32>, tensor<8xf32>
}
