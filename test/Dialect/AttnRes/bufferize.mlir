// RUN: attnres-opt %s --split-input-file --one-shot-bufferize="bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map" | FileCheck %s
// RUN: attnres-opt %s --split-input-file --one-shot-bufferize="bufferize-function-boundaries" | FileCheck %s --check-prefix=STRIDED
// Upstream one-shot bufferization turns each attnres op into its op on
// buffers: the operands' buffers read in place, a new buffer a result (sized
// from the operands), the attributes kept.

// CHECK-LABEL: func.func @forward(
// CHECK-SAME: %[[V:.*]]: memref<4x?x256xbf16>, %[[Q:.*]]: memref<256xbf16>) -> (memref<?x256xbf16>, memref<?xf32>)
// CHECK: %[[N:.*]] = memref.dim %[[V]], %c1
// CHECK: %[[O:.*]] = memref.alloc(%[[N]]) {{.*}} : memref<?x256xbf16>
// CHECK: %[[LSE:.*]] = memref.alloc(%[[N]]) {{.*}} : memref<?xf32>
// CHECK: attnres.forward_into packed(%[[V]] : memref<4x?x256xbf16>) query(%[[Q]] : memref<256xbf16>) save(lse) outs(%[[O]], %[[LSE]] : memref<?x256xbf16>, memref<?xf32>) {eps = 1.000000e-05 : f64, kept = "attribute"}
// CHECK: return %[[O]], %[[LSE]]
// A strided view (a function argument of any layout) is copied into a
// dense buffer first.
// STRIDED-LABEL: func.func @forward(
// STRIDED: memref.copy %{{.*}}, %[[DENSE:.*]] : memref<4x?x256xbf16, strided<[?, ?, ?], offset: ?>> to memref<4x?x256xbf16>
// STRIDED: attnres.forward_into packed(%[[DENSE]] : memref<4x?x256xbf16>)
func.func @forward(%v: tensor<4x?x256xbf16>, %q: tensor<256xbf16>)
    -> (tensor<?x256xbf16>, tensor<?xf32>) {
  %o, %lse = attnres.forward packed(%v : tensor<4x?x256xbf16>)
      query(%q : tensor<256xbf16>) save(lse)
      {eps = 1.0e-05 : f64, kept = "attribute"}
      -> tensor<?x256xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x256xbf16>, tensor<?xf32>
}

// -----

// Two token dimensions, several queries, o_pre and its residual saved.
// CHECK-LABEL: func.func @forward_saving_residual(
// CHECK-SAME: %[[A:.*]]: memref<?x?x64xbf16>, %[[B:.*]]: memref<?x?x64xbf16>
// CHECK-DAG: %[[T0:.*]] = memref.dim %[[A]], %c0
// CHECK-DAG: %[[T1:.*]] = memref.dim %[[A]], %c1
// CHECK: memref.alloc(%[[T0]], %[[T1]]) {{.*}} : memref<2x?x?x64xbf16>
// CHECK: memref.alloc(%[[T0]], %[[T1]]) {{.*}} : memref<2x?x?xf32>
// CHECK: memref.alloc(%[[T0]], %[[T1]]) {{.*}} : memref<2x?x?x64xbf16>
// CHECK: memref.alloc(%[[T0]], %[[T1]]) {{.*}} : memref<2x?x?x32xi8>
// CHECK: attnres.forward_into sources(%[[A]], %[[B]] : memref<?x?x64xbf16>) query({{.*}}) output_norm({{.*}}) save(o_pre_residual) outs({{.*}} : memref<2x?x?x64xbf16>, memref<2x?x?xf32>, memref<2x?x?x64xbf16>, memref<2x?x?x32xi8>)
func.func @forward_saving_residual(%a: tensor<?x?x64xbf16>, %b: tensor<?x?x64xbf16>,
                                   %q: tensor<2x64xf32>, %h: tensor<2x64xf32>)
    -> (tensor<2x?x?x64xbf16>, tensor<2x?x?xf32>, tensor<2x?x?x64xbf16>,
        tensor<2x?x?x32xi8>) {
  %o, %lse, %o_pre, %r = attnres.forward sources(%a, %b : tensor<?x?x64xbf16>)
      query(%q : tensor<2x64xf32>) output_norm(%h : tensor<2x64xf32>)
      save(o_pre_residual)
      -> tensor<2x?x?x64xbf16>, tensor<2x?x?xf32>, tensor<2x?x?x64xbf16>,
         tensor<2x?x?x32xi8>
  return %o, %lse, %o_pre, %r : tensor<2x?x?x64xbf16>, tensor<2x?x?xf32>,
      tensor<2x?x?x64xbf16>, tensor<2x?x?x32xi8>
}

// -----

// CHECK-LABEL: func.func @backward(
// CHECK: attnres.backward_into packed(%{{.*}} : memref<2x?x64xbf16>) query(%{{.*}} : memref<16xf32>) key_norm(%{{.*}} : memref<16xf32>) grad(%{{.*}} : memref<?x64xbf16>) lse(%{{.*}} : memref<?xf32>) saved(%{{.*}} : memref<?x64xbf16>) outs(%{{.*}}, %{{.*}}, %{{.*}} : memref<2x?x64xbf16>, memref<16xf32>, memref<16xf32>)
func.func @backward(%v: tensor<2x?x64xbf16>, %q: tensor<16xf32>,
                    %g: tensor<16xf32>, %do: tensor<?x64xbf16>,
                    %lse: tensor<?xf32>, %o: tensor<?x64xbf16>)
    -> (tensor<2x?x64xbf16>, tensor<16xf32>, tensor<16xf32>) {
  %dv, %dq, %dg = attnres.backward packed(%v : tensor<2x?x64xbf16>)
      query(%q : tensor<16xf32>) key_norm(%g : tensor<16xf32>)
      grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<?xf32>)
      saved(%o : tensor<?x64xbf16>)
      -> tensor<2x?x64xbf16>, tensor<16xf32>, tensor<16xf32>
  return %dv, %dq, %dg : tensor<2x?x64xbf16>, tensor<16xf32>, tensor<16xf32>
}

// -----

// The merge of a split forward reads the partial results it follows in
// place.
// CHECK-LABEL: func.func @merge(
// CHECK: attnres.partition_reduce_into softmax %{{.*}} : memref<4x?x64xf32> lse(%{{.*}} : memref<4x?xf32>) sink(%{{.*}} : memref<?xf32>) outs(%{{.*}}, %{{.*}} : memref<?x64xbf16>, memref<?xf32>)
// CHECK-LABEL: func.func @sum(
// CHECK: %[[S:.*]] = memref.alloc() {{.*}} : memref<16xbf16>
// CHECK: attnres.partition_reduce_into sum %{{.*}} : memref<7x16xf32> outs(%[[S]] : memref<16xbf16>)
func.func @merge(%p: tensor<4x?x64xf32>, %lp: tensor<4x?xf32>, %s: tensor<?xf32>)
    -> (tensor<?x64xbf16>, tensor<?xf32>) {
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x?x64xf32>
      lse(%lp : tensor<4x?xf32>) sink(%s : tensor<?xf32>)
      -> tensor<?x64xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x64xbf16>, tensor<?xf32>
}

func.func @sum(%p: tensor<7x16xf32>) -> tensor<16xbf16> {
  %s = attnres.partition_reduce sum %p : tensor<7x16xf32> -> tensor<16xbf16>
  return %s : tensor<16xbf16>
}

// -----

// A result carried out of a branch keeps the dense buffer the op writes:
// no cast, no copy.
// CHECK-LABEL: func.func @branch(
// CHECK-NOT: memref.copy
// CHECK-NOT: memref.cast
// CHECK: scf.if %{{.*}} -> (memref<16xf32>) {
// CHECK: %[[S:.*]] = memref.alloc() {{.*}} : memref<16xf32>
// CHECK: attnres.partition_reduce_into sum %{{.*}} : memref<7x16xf32> outs(%[[S]] : memref<16xf32>)
// CHECK: scf.yield %[[S]] : memref<16xf32>
func.func @branch(%c: i1, %p: tensor<7x16xf32>, %s: tensor<16xf32>)
    -> tensor<16xf32> {
  %r = scf.if %c -> tensor<16xf32> {
    %x = attnres.partition_reduce sum %p : tensor<7x16xf32> -> tensor<16xf32>
    scf.yield %x : tensor<16xf32>
  } else {
    scf.yield %s : tensor<16xf32>
  }
  return %r : tensor<16xf32>
}

// -----

// An accumulating backward writes its source gradients into the buffers of
// the gradients it accumulates into (in place: no allocation for them), and
// reads them (`accumulate`); the query's gradient gets a new buffer.
// CHECK-LABEL: func.func @accumulating(
// CHECK-SAME: %[[V:.*]]: memref<2x?x64xbf16>, {{.*}}, %[[G:.*]]: memref<2x?x64xbf16>)
// CHECK-NOT: memref.alloc({{.*}}) {{.*}} : memref<2x?x64xbf16>
// CHECK: %[[DQ:.*]] = memref.alloc() {{.*}} : memref<16xf32>
// CHECK: attnres.backward_into packed(%[[V]] : memref<2x?x64xbf16>) query(%{{.*}} : memref<16xf32>) grad(%{{.*}} : memref<?x64xbf16>) lse(%{{.*}} : memref<?xf32>) saved(%{{.*}} : memref<?x64xbf16>) accumulate outs(%[[G]], %[[DQ]] : memref<2x?x64xbf16>, memref<16xf32>)
// CHECK: return %[[G]], %[[DQ]]
func.func @accumulating(%v: tensor<2x?x64xbf16>, %q: tensor<16xf32>,
                        %do: tensor<?x64xbf16>, %lse: tensor<?xf32>,
                        %o: tensor<?x64xbf16>,
                        %g: tensor<2x?x64xbf16> {bufferization.writable = true})
    -> (tensor<2x?x64xbf16>, tensor<16xf32>) {
  %dv, %dq = attnres.backward packed(%v : tensor<2x?x64xbf16>)
      query(%q : tensor<16xf32>) grad(%do : tensor<?x64xbf16>)
      lse(%lse : tensor<?xf32>) saved(%o : tensor<?x64xbf16>)
      accumulate(%g : tensor<2x?x64xbf16>)
      -> tensor<2x?x64xbf16>, tensor<16xf32>
  return %dv, %dq : tensor<2x?x64xbf16>, tensor<16xf32>
}
