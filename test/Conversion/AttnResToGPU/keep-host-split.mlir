// RUN: attnres-opt %s --split-input-file --attnres-split-sources=partitions=3 \
// RUN:   --attnres-split-reduction=blocks=7 \
// RUN:   --convert-attnres-to-gpu="keep-host=1 async-copies=1 clusters=1" --attnres-bufferize-host --attnres-launch-kernels | FileCheck %s
// RUN: attnres-opt %s --split-input-file --attnres-split-sources=partitions=3 \
// RUN:   --attnres-split-reduction=blocks=7 --canonicalize --cse \
// RUN:   --convert-attnres-to-gpu="keep-host=1 async-copies=1 clusters=1" --attnres-bufferize-host --attnres-launch-kernels | FileCheck %s
// RUN: not attnres-opt %s --split-input-file --attnres-split-reduction=blocks=7 \
// RUN:   --convert-attnres-to-gpu 2>&1 | FileCheck %s --check-prefix=BUNDLE

// attnres-split-reduction's decomposition reaches the GPU as it is: its
// loop over 7 blocks of tokens stays a loop (attnres-lower-tiles-to-gpu
// makes it a grid of 7 blocks, each the backward's thread code over its
// tokens), writing one row of each partial gradient (query, key norm
// weight) into a [7, R] buffer; the partition_reduce sums after it are
// launched as sum kernels, and the partial rows freed at the end. The
// backward kernel of the whole op (and its finalize) is not emitted.
// CHECK-LABEL: func.func @list(
// CHECK-DAG: %[[DQ:.*]] = gpu.alloc () : memref<7x16xf32>
// CHECK-DAG: %[[DG:.*]] = gpu.alloc () : memref<7x16xf32>
// CHECK: scf.forall (%[[B:.*]]) in (7) {
// CHECK: memref.subview %[[DQ]][%[[B]], 0] [1, 16] [1, 1]
// CHECK: memref.subview %[[DG]][%[[B]], 0] [1, 16] [1, 1]
// CHECK: attnres.backward_into sources(
// CHECK: }
// CHECK: gpu.launch_func  @attnres_kernels::@list_0_sum
// CHECK: gpu.launch_func  @attnres_kernels::@list_1_sum
// CHECK-DAG: gpu.dealloc %[[DQ]]
// CHECK-DAG: gpu.dealloc %[[DG]]
// CHECK: return
// CHECK-NOT: gpu.func @list_0_backward
// The bundle's backward is launched whole, its blocks chosen per call: the
// loop cannot be kept there.
// BUNDLE: error: convert-attnres-to-gpu: a bundle's backward is launched whole by the runtime, which picks its blocks per call (AttnresBackwardArgs.blocks); attnres-split-reduction's loop runs on the GPU with keep-host=1
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

// Two token dimensions: the pass merges them into one for the loop, which
// under keep-host is a view of the same device buffer; the source gradient
// comes back reshaped. Two queries and a per-query output norm: two
// partial gradients of [7, 2, 32] (query, output-norm weight), two sums.
// CHECK-LABEL: func.func @packed_tokens_2d(
// CHECK: memref.collapse_shape %{{.*}} {{\[\[}}0], [1, 2], [3]] : memref<3x4x5x32xbf16> into memref<3x20x32xbf16>
// CHECK: gpu.alloc () : memref<7x2x32xf32>
// CHECK: scf.forall (%{{.*}}) in (7) {
// CHECK: attnres.backward_into packed(
// CHECK: gpu.launch_func  @attnres_kernels::@packed_tokens_2d_0_sum
// CHECK: gpu.launch_func  @attnres_kernels::@packed_tokens_2d_1_sum
// CHECK: memref.expand_shape %{{.*}} {{\[\[}}0], [1, 2], [3]] output_shape [3, 4, 5, 32] : memref<3x20x32xbf16> into memref<3x4x5x32xbf16>
// CHECK: return
func.func @packed_tokens_2d(%v: tensor<3x4x5x32xbf16>, %q: tensor<2x32xbf16>,
                            %h: tensor<2x32xbf16>, %do: tensor<2x4x5x32xbf16>,
                            %lse: tensor<2x4x5xf32>)
    -> (tensor<3x4x5x32xbf16>, tensor<2x32xbf16>, tensor<2x32xbf16>) {
  %dv, %dq, %dh = attnres.backward packed(%v : tensor<3x4x5x32xbf16>)
      query(%q : tensor<2x32xbf16>) output_norm(%h : tensor<2x32xbf16>)
      grad(%do : tensor<2x4x5x32xbf16>) lse(%lse : tensor<2x4x5xf32>)
      -> tensor<3x4x5x32xbf16>, tensor<2x32xbf16>, tensor<2x32xbf16>
  return %dv, %dq, %dh : tensor<3x4x5x32xbf16>, tensor<2x32xbf16>, tensor<2x32xbf16>
}

// -----

// Eight queries with a per-query output norm on rows of 64: a loop like
// the others, whose tiles write a row of [8, 64] of each partial gradient
// (their row groups add their shares in two rounds; lower-tiles.mlir).
// CHECK-LABEL: func.func @many_queries(
// CHECK-DAG: %[[DQ:.*]] = gpu.alloc () : memref<7x8x64xf32>
// CHECK-DAG: %[[DH:.*]] = gpu.alloc () : memref<7x8x64xf32>
// CHECK: scf.forall (%[[B:.*]]) in (7) {
// CHECK: memref.subview %[[DQ]][%[[B]], 0, 0] [1, 8, 64] [1, 1, 1]
// CHECK: memref.subview %[[DH]][%[[B]], 0, 0] [1, 8, 64] [1, 1, 1]
// CHECK: attnres.backward_into packed(
// CHECK: gpu.launch_func  @attnres_kernels::@many_queries_0_sum
// CHECK: gpu.launch_func  @attnres_kernels::@many_queries_1_sum
// CHECK: return
// CHECK-NOT: gpu.func @many_queries_0_backward
func.func @many_queries(%v: tensor<4x?x64xbf16>, %q: tensor<8x64xbf16>,
                        %h: tensor<8x64xbf16>, %do: tensor<8x?x64xbf16>,
                        %lse: tensor<8x?xf32>)
    -> (tensor<4x?x64xbf16>, tensor<8x64xbf16>, tensor<8x64xbf16>) {
  %dv, %dq, %dh = attnres.backward packed(%v : tensor<4x?x64xbf16>)
      query(%q : tensor<8x64xbf16>) output_norm(%h : tensor<8x64xbf16>)
      grad(%do : tensor<8x?x64xbf16>) lse(%lse : tensor<8x?xf32>)
      -> tensor<4x?x64xbf16>, tensor<8x64xbf16>, tensor<8x64xbf16>
  return %dv, %dq, %dh : tensor<4x?x64xbf16>, tensor<8x64xbf16>, tensor<8x64xbf16>
}

// -----

// attnres-split-sources' decomposition reaches the GPU: its 3 partial
// forwards (sources [0, 2), [2, 5), [5, 8)) and their merge run as the
// forward split over 3 partitions, whose blocks of row p walk partial
// forward p's sources: clustered (3 blocks a cluster) where the clusters
// fit, else the partial kernel and the merge, which applies the output norm
// and writes o_pre. No occupancy query: the count is the IR's.
// CHECK-LABEL: func.func @decode(
// CHECK-NOT: tensor.concat
// CHECK-NOT: attnresGpuResidentBlocks
// CHECK: func.call @attnresGpuClusterCapacity(%{{.*}}, %c128_i64{{.*}}, %c3_i64{{.*}})
// CHECK: gpu.launch_func  @attnres_kernels::@decode_0_forward_cluster
// CHECK: gpu.launch_func  @attnres_kernels::@decode_0_forward_partial {{.*}} %c3_i64{{.*}} : i64)
// CHECK: gpu.launch_func  @attnres_kernels::@decode_0_merge
// CHECK-NOT: partition_reduce
// CHECK: return
func.func @decode(%v: tensor<8x?x4096xbf16>, %q: tensor<4096xbf16>,
                  %h: tensor<4096xbf16>)
    -> (tensor<?x4096xbf16>, tensor<?xf32>, tensor<?x4096xbf16>) {
  %o, %lse, %o_pre = attnres.forward packed(%v : tensor<8x?x4096xbf16>)
      query(%q : tensor<4096xbf16>) output_norm(%h : tensor<4096xbf16>)
      -> tensor<?x4096xbf16>, tensor<?xf32>, tensor<?x4096xbf16>
  return %o, %lse, %o_pre : tensor<?x4096xbf16>, tensor<?xf32>, tensor<?x4096xbf16>
}

// -----

// Listed sources, 2, 2 and 3 of them: the partial kernel on 3 partitions
// and the merge (rows of 64 take no clusters).
// CHECK-LABEL: func.func @listed(
// CHECK-NOT: tensor.concat
// CHECK: gpu.launch_func  @attnres_kernels::@listed_0_forward_partial {{.*}} %c3_i64{{.*}} : i64)
// CHECK: gpu.launch_func  @attnres_kernels::@listed_0_merge
// CHECK: return
func.func @listed(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>, %v2: tensor<?x64xbf16>,
                  %v3: tensor<?x64xbf16>, %v4: tensor<?x64xbf16>, %v5: tensor<?x64xbf16>,
                  %v6: tensor<?x64xbf16>, %q: tensor<64xbf16>, %g: tensor<64xbf16>)
    -> (tensor<?x64xbf16>, tensor<?xf32>) {
  %o, %lse = attnres.forward sources(%v0, %v1, %v2, %v3, %v4, %v5, %v6 : tensor<?x64xbf16>)
      query(%q : tensor<64xbf16>) key_norm(%g : tensor<64xbf16>) {scale = 0.5 : f64}
      -> tensor<?x64xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x64xbf16>, tensor<?xf32>
}

// -----

// save(o_pre_residual) over two queries: the merge returns o_pre and the
// residual of its rounding, and so does the forward launched in its place
// (its kernels write them).
// CHECK-LABEL: func.func @residual(
// CHECK-NOT: tensor.concat
// CHECK: gpu.launch_func  @attnres_kernels::@residual_0_forward_partial {{.*}} %c3_i64{{.*}} : i64)
// CHECK: gpu.launch_func  @attnres_kernels::@residual_0_merge
// CHECK: return {{.*}} : memref<2x?x64xbf16>, memref<2x?x32xi8>
func.func @residual(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                    %v2: tensor<?x64xbf16>, %q: tensor<2x64xbf16>,
                    %h: tensor<64xbf16>)
    -> (tensor<2x?x64xbf16>, tensor<2x?x32xi8>) {
  %o, %lse, %o_pre, %r = attnres.forward sources(%v0, %v1, %v2 : tensor<?x64xbf16>)
      query(%q : tensor<2x64xbf16>) output_norm(%h : tensor<64xbf16>) save(o_pre_residual)
      -> tensor<2x?x64xbf16>, tensor<2x?xf32>, tensor<2x?x64xbf16>, tensor<2x?x32xi8>
  return %o_pre, %r : tensor<2x?x64xbf16>, tensor<2x?x32xi8>
}
