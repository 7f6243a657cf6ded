// RUN: attnres-opt %s --split-input-file --attnres-tile=tile-sizes=40 \
// RUN:   --convert-attnres-to-gpu="keep-host=1" --attnres-bufferize-host --attnres-launch-kernels --canonicalize --cse | FileCheck %s --check-prefix=ONE
// RUN: attnres-opt %s --split-input-file --attnres-tile=tile-sizes=1,40 \
// RUN:   --convert-attnres-to-gpu="keep-host=1" --attnres-bufferize-host --attnres-launch-kernels --canonicalize --cse | FileCheck %s --check-prefix=TWO
// RUN: attnres-opt %s --split-input-file --attnres-split-sources=partitions=2 \
// RUN:   --attnres-tile=tile-sizes=1,40 --convert-attnres-to-gpu="keep-host=1 clusters=1" --attnres-bufferize-host --attnres-launch-kernels \
// RUN:   --canonicalize --cse | FileCheck %s --check-prefix=SPLIT --implicit-check-not=gpu.memcpy
// RUN: attnres-opt %s --split-input-file --attnres-split-sources=partitions=2 \
// RUN:   --transform-preload-library=transform-library-paths=%S/Inputs/tile-forwards-16.transform.mlir \
// RUN:   --transform-interpreter --convert-attnres-to-gpu="keep-host=1" --attnres-bufferize-host --attnres-launch-kernels --canonicalize --cse \
// RUN:   | FileCheck %s --check-prefix=SCRIPT
// RUN: attnres-opt %s --split-input-file --attnres-tile=tile-sizes=1,40 \
// RUN:   --canonicalize --cse --convert-attnres-to-gpu="keep-host=1" --attnres-bufferize-host --attnres-launch-kernels --canonicalize --cse \
// RUN:   | FileCheck %s --check-prefix=TWO
// The merges alone tiled (a transform script): the partial forwards are
// launched whole, each writing its slice of the stacks in place, and the
// merge's loop reads them.
// RUN: attnres-opt %s --split-input-file --attnres-split-sources=partitions=2 \
// RUN:   --transform-preload-library=transform-library-paths=%S/Inputs/tile-merges-1-16.transform.mlir \
// RUN:   --transform-interpreter --convert-attnres-to-gpu="keep-host=1" --attnres-bufferize-host --attnres-launch-kernels --canonicalize --cse \
// RUN:   | FileCheck %s --check-prefix=MERGES
// A tile of 7 covers a split forward's first token dimension whole (the 4
// rows of @layer's, the 2 queries of @queries' merge): one iteration, which
// canonicalization folds after bufferization; the pieces still write and
// read the stacks in place.
// RUN: attnres-opt %s --split-input-file --attnres-split-sources=partitions=3 \
// RUN:   --attnres-tile=tile-sizes=7 --convert-attnres-to-gpu="keep-host=1" --attnres-bufferize-host --attnres-launch-kernels \
// RUN:   --canonicalize --cse | FileCheck %s --check-prefix=COVER --implicit-check-not=gpu.memcpy

// attnres-tile's loops reach the GPU. A forward's or softmax merge's own
// tile loop stays a loop, which bufferization puts on views of the buffers
// and attnres-lower-tiles-to-gpu makes a grid of blocks (lower-tiles.mlir):
// the conversion emits no kernel for it. So do the tile loops of a split
// forward's pieces: each partial forward's loop writes its piece of the
// stacks (attnres-bufferize-host allocates the stacked partial outputs and
// lses once and gives each partial its slice, in place of the
// tensor.concat), the merge's loop reads them, and the stacks are freed
// at the end of the function. Nothing is copied (no gpu.memcpy anywhere
// in the SPLIT and COVER outputs): without the in-place stacks,
// bufferization would copy every piece into a concatenation.

// ONE-LABEL: func.func @rows(
// ONE: scf.forall (%{{.*}}) = (0) to (%{{.*}}) step (40) {
// ONE: attnres.forward_into packed(%{{.*}} : memref<3x?x256xbf16, strided<[?, 256, 1], offset: ?>>) query(%arg1 : memref<256xbf16>) outs(%{{.*}}, %{{.*}} : memref<?x256xbf16, strided<[256, 1], offset: ?>>, memref<?xf32, strided<[1], offset: ?>>)
// ONE-NOT: attnres.launch
// ONE-NOT: gpu.func
// TWO-LABEL: func.func @rows(
// TWO: scf.forall (%{{.*}}) in (%{{.*}}) {
// TWO-NOT: gpu.func
// The partial forwards of packed sources (views of the sources' buffer:
// partition 0's first source, partition 1's two) tiled by a transform
// script's tile_using_forall (over ceil(N / 16) tile numbers), each loop
// writing its piece of the stack; the merge, untiled, is launched whole
// over the stacks.
// SCRIPT-LABEL: func.func @rows(
// SCRIPT: %[[N:.*]] = memref.dim %arg0, %c1 : memref<3x?x256xbf16>
// SCRIPT: %[[V0:.*]] = memref.subview %arg0[0, 0, 0] [1, %[[N]], 256] [1, 1, 1] : memref<3x?x256xbf16> to memref<1x?x256xbf16, strided<[?, 256, 1]>>
// SCRIPT: %[[OS:.*]] = gpu.alloc  (%[[N]]) : memref<2x?x256xf32>
// SCRIPT: %[[LS:.*]] = gpu.alloc  (%[[N]]) : memref<2x?xf32>
// SCRIPT: %[[O0:.*]] = memref.subview %[[OS]][0, 0, 0] [1, %[[N]], 256] [1, 1, 1] : memref<2x?x256xf32> to memref<?x256xf32, strided<[256, 1]>>
// SCRIPT: scf.forall
// SCRIPT: memref.subview %[[V0]][0, %{{.*}}, 0]
// SCRIPT: memref.subview %[[O0]][%{{.*}}, 0]
// SCRIPT: attnres.forward_into packed(
// SCRIPT: %[[V1:.*]] = memref.subview %arg0[1, 0, 0] [2, %[[N]], 256] [1, 1, 1] : memref<3x?x256xbf16> to memref<2x?x256xbf16, strided<[?, 256, 1], offset: ?>>
// SCRIPT: %[[O1:.*]] = memref.subview %[[OS]][1, 0, 0] [1, %[[N]], 256] [1, 1, 1] : memref<2x?x256xf32> to memref<?x256xf32, strided<[256, 1], offset: ?>>
// SCRIPT: scf.forall
// SCRIPT: memref.subview %[[V1]][0, %{{.*}}, 0]
// SCRIPT: memref.subview %[[O1]][%{{.*}}, 0]
// SCRIPT: attnres.forward_into packed(
// SCRIPT-NOT: tensor.extract_slice
// SCRIPT: gpu.launch_func  @attnres_kernels::@rows_0_merge
// SCRIPT: gpu.dealloc  %[[OS]]
// SCRIPT: gpu.dealloc  %[[LS]]
func.func @rows(%v: tensor<3x?x256xbf16>, %q: tensor<256xbf16>)
    -> (tensor<?x256xbf16>, tensor<?xf32>) {
  %o, %lse = attnres.forward packed(%v : tensor<3x?x256xbf16>)
      query(%q : tensor<256xbf16>) -> tensor<?x256xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x256xbf16>, tensor<?xf32>
}

// -----

// [4, S] tokens tiled by (1, 40), and by 40 (all four rows of the first
// token dimension at once: one tile, whose loop canonicalization folds):
// the forward on views.
// TWO-LABEL: func.func @layer(
// TWO: scf.forall (%{{.*}}, %{{.*}}) = (0, 0) to (4, %{{.*}}) step (1, 40) {
// TWO: attnres.forward_into sources(%{{.*}}, %{{.*}} : memref<1x?x1024xbf16, strided<[?, 1024, 1], offset: ?>>)
// ONE-LABEL: func.func @layer(
// ONE: attnres.forward_into sources(%{{.*}}, %{{.*}} : memref<?x?x1024xbf16, strided<[?, 1024, 1], offset: ?>>)
// ONE-NOT: gpu.func
// SPLIT-LABEL: func.func @layer(
// SPLIT: %[[N:.*]] = memref.dim %arg0, %c1 : memref<4x?x1024xbf16>
// SPLIT: %[[OS:.*]] = gpu.alloc  (%[[N]]) : memref<2x4x?x1024xf32>
// SPLIT: %[[LS:.*]] = gpu.alloc  (%[[N]]) : memref<2x4x?xf32>
// SPLIT: %[[O0:.*]] = memref.subview %[[OS]][0, 0, 0, 0] [1, 4, %[[N]], 1024] [1, 1, 1, 1] : memref<2x4x?x1024xf32> to memref<4x?x1024xf32, strided<[?, 1024, 1]>>
// SPLIT: %[[L0:.*]] = memref.subview %[[LS]][0, 0, 0] [1, 4, %[[N]]] [1, 1, 1]
// SPLIT: scf.forall (%[[B:.*]], %[[T:.*]]) = (0, 0) to (4, %[[N]]) step (1, 40) {
// SPLIT: %[[ROWS:.*]] = affine.min
// SPLIT: %[[OT:.*]] = memref.subview %[[O0]][%[[B]], %[[T]], 0] [1, %[[ROWS]], 1024]
// SPLIT: %[[LT:.*]] = memref.subview %[[L0]][%[[B]], %[[T]]] [1, %[[ROWS]]]
// SPLIT: attnres.forward_into sources(%{{.*}}) query(%arg2 : memref<1024xbf16>) save(lse) outs(%[[OT]], %[[LT]] :
// SPLIT: %[[O1:.*]] = memref.subview %[[OS]][1, 0, 0, 0] [1, 4, %[[N]], 1024] [1, 1, 1, 1] : memref<2x4x?x1024xf32> to memref<4x?x1024xf32, strided<[?, 1024, 1], offset: ?>>
// SPLIT: scf.forall
// SPLIT: memref.subview %[[O1]][
// SPLIT: attnres.forward_into sources(
// SPLIT: scf.forall (%[[B:.*]], %[[T:.*]]) = (0, 0) to (4, %[[N]]) step (1, 40) {
// SPLIT: %[[PT:.*]] = memref.subview %[[OS]][0, %[[B]], %[[T]], 0] [2, 1, %{{.*}}, 1024]
// SPLIT: %[[PL:.*]] = memref.subview %[[LS]][0, %[[B]], %[[T]]] [2, 1, %{{.*}}]
// SPLIT: attnres.partition_reduce_into softmax %[[PT]] : {{.*}} lse(%[[PL]] :
// SPLIT: gpu.dealloc  %[[OS]]
// SPLIT: gpu.dealloc  %[[LS]]
// SPLIT-NOT: attnres_kernels
// MERGES-LABEL: func.func @layer(
// MERGES: %[[OS:.*]] = gpu.alloc  (%{{.*}}) : memref<2x4x?x1024xf32>
// MERGES: %[[O0:.*]] = memref.subview %[[OS]][0, 0, 0, 0] [1, 4, %{{.*}}, 1024]
// MERGES: memref.extract_aligned_pointer_as_index %[[O0]]
// MERGES: gpu.launch_func  @attnres_kernels::@layer_0_forward
// MERGES: %[[O1:.*]] = memref.subview %[[OS]][1, 0, 0, 0] [1, 4, %{{.*}}, 1024]
// MERGES: %[[BASE:.*]] = memref.extract_aligned_pointer_as_index %[[O1]]
// MERGES: %{{.*}}, %[[OFFSET:.*]], %{{.*}}:3, %{{.*}}:3 = memref.extract_strided_metadata %[[O1]]
// MERGES: gpu.launch_func  @attnres_kernels::@layer_1_forward
// MERGES: scf.forall (%{{.*}}, %{{.*}}) in (4, %{{.*}}) {
// MERGES: memref.subview %[[OS]][0,
// MERGES: attnres.partition_reduce_into softmax
// MERGES: gpu.dealloc  %[[OS]]
// COVER-LABEL: func.func @layer(
// COVER: gpu.alloc  (%{{.*}}) : memref<2x4x?x1024xf32>
// COVER-COUNT-2: attnres.forward_into sources(
// COVER: attnres.partition_reduce_into softmax
func.func @layer(%v: tensor<4x?x1024xbf16>, %w: tensor<4x?x1024xbf16>,
                 %q: tensor<1024xbf16>, %h: tensor<1024xbf16>)
    -> (tensor<4x?x1024xbf16>, tensor<4x?xf32>, tensor<4x?x1024xbf16>) {
  %o, %lse, %o_pre = attnres.forward sources(%v, %w : tensor<4x?x1024xbf16>)
      query(%q : tensor<1024xbf16>) output_norm(%h : tensor<1024xbf16>)
      -> tensor<4x?x1024xbf16>, tensor<4x?xf32>, tensor<4x?x1024xbf16>
  return %o, %lse, %o_pre : tensor<4x?x1024xbf16>, tensor<4x?xf32>, tensor<4x?x1024xbf16>
}

// -----

// A merge of the user's own, tiled by 40 rows: like a forward's, its own
// tile loop stays a loop on views (lower-tiles.mlir lowers it).
// ONE-LABEL: func.func @merge(
// ONE: scf.forall (%{{.*}}) = (0) to (%{{.*}}) step (40) {
// ONE: attnres.partition_reduce_into softmax %{{.*}} : memref<3x?x64xf32, strided<[?, 64, 1], offset: ?>> lse(%{{.*}} : memref<3x?xf32, strided<[?, 1], offset: ?>>) outs(%{{.*}}, %{{.*}} : memref<?x64xbf16, strided<[64, 1], offset: ?>>, memref<?xf32, strided<[1], offset: ?>>)
// ONE-NOT: attnres.launch
// ONE-NOT: gpu.func
func.func @merge(%p: tensor<3x?x64xf32>, %l: tensor<3x?xf32>)
    -> (tensor<?x64xbf16>, tensor<?xf32>) {
  %o, %lse = attnres.partition_reduce softmax %p : tensor<3x?x64xf32>
      lse(%l : tensor<3x?xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x64xbf16>, tensor<?xf32>
}

// -----

// Two queries: the merge of the split forward has [M, N] rows, the queries
// its first token dimension. Tiled by (1, 40), the partials' tiles are of
// one token (their one token dimension by 1) and the merge's 40 rows of one
// query (2 runs of N rows).
// SPLIT-LABEL: func.func @queries(
// SPLIT: %[[OS:.*]] = gpu.alloc  (%{{.*}}) : memref<2x2x?x128xf32>
// SPLIT: scf.forall (%{{.*}}) in (%{{.*}}) {
// SPLIT: attnres.forward_into packed(%{{.*}}) query(%arg1 : memref<2x128xbf16>) save(lse) outs(%{{.*}}, %{{.*}} : memref<2x1x128xf32, strided<[?, 128, 1], offset: ?>>, memref<2x1xf32, strided<[?, 1], offset: ?>>)
// SPLIT: scf.forall (%{{.*}}) in (%{{.*}}) {
// SPLIT: attnres.forward_into packed(
// SPLIT: scf.forall (%{{.*}}, %{{.*}}) = (0, 0) to (2, %{{.*}}) step (1, 40) {
// SPLIT: memref.subview %[[OS]][0, %{{.*}}, %{{.*}}, 0] [2, 1, %{{.*}}, 128]
// SPLIT: attnres.partition_reduce_into softmax
// COVER-LABEL: func.func @queries(
// COVER: gpu.alloc  (%{{.*}}) : memref<3x2x?x128xf32>
// COVER-COUNT-3: attnres.forward_into packed(
// COVER: attnres.partition_reduce_into softmax
func.func @queries(%v: tensor<4x?x128xbf16>, %q: tensor<2x128xbf16>)
    -> (tensor<2x?x128xbf16>, tensor<2x?xf32>) {
  %o, %lse = attnres.forward packed(%v : tensor<4x?x128xbf16>)
      query(%q : tensor<2x128xbf16>) -> tensor<2x?x128xbf16>, tensor<2x?xf32>
  return %o, %lse : tensor<2x?x128xbf16>, tensor<2x?xf32>
}
