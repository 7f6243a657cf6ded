// RUN: attnres-opt %s --split-input-file --attnres-tile=tile-sizes=40 \
// RUN:   --convert-attnres-to-gpu="keep-host=1" --attnres-bufferize-host --attnres-launch-kernels --canonicalize --cse | FileCheck %s --check-prefix=ONE
// RUN: attnres-opt %s --split-input-file --attnres-tile=tile-sizes=1,40 \
// RUN:   --convert-attnres-to-gpu="keep-host=1" --attnres-bufferize-host --attnres-launch-kernels --canonicalize --cse | FileCheck %s --check-prefix=TWO
// RUN: attnres-opt %s --split-input-file --attnres-split-sources=partitions=2 \
// RUN:   --attnres-tile=tile-sizes=1,40 --convert-attnres-to-gpu="keep-host=1 clusters=1" --attnres-bufferize-host --attnres-launch-kernels \
// RUN:   --canonicalize --cse | FileCheck %s --check-prefix=SPLIT
// RUN: attnres-opt %s --split-input-file --attnres-split-sources=partitions=2 \
// RUN:   --transform-preload-library=transform-library-paths=%S/Inputs/tile-forwards-16.transform.mlir \
// RUN:   --transform-interpreter --convert-attnres-to-gpu="keep-host=1" --attnres-bufferize-host --attnres-launch-kernels --canonicalize --cse \
// RUN:   | FileCheck %s --check-prefix=SCRIPT
// RUN: attnres-opt %s --split-input-file --attnres-tile=tile-sizes=1,40 \
// RUN:   --canonicalize --cse --convert-attnres-to-gpu="keep-host=1" --attnres-bufferize-host --attnres-launch-kernels --canonicalize --cse \
// RUN:   | FileCheck %s --check-prefix=TWO
// A tile of 7 covers a split forward's first token dimension whole (the 4
// rows of @layer's, the 2 queries of @queries' merge): one iteration, whose
// body reads the size of the stacked partials it slices. That read goes
// with the loop, so that the stacking is the merge's alone and the split
// is launched as its kernels.
// RUN: attnres-opt %s --split-input-file --attnres-split-sources=partitions=3 \
// RUN:   --attnres-tile=tile-sizes=7 --convert-attnres-to-gpu="keep-host=1" --attnres-bufferize-host --attnres-launch-kernels \
// RUN:   --canonicalize --cse | FileCheck %s --check-prefix=COVER

// attnres-tile's loops reach the GPU. A forward's or softmax merge's own
// tile loop stays a loop, which bufferization puts on views of the buffers
// and attnres-lower-tiles-to-gpu makes a grid of blocks (lower-tiles.mlir):
// the conversion emits no kernel for it. The tiles of a split forward's
// pieces are launched as blocks of its kernels: the kernels see the token
// dimensions as one row index, so a tile is consecutive rows: a run is the
// last tiled token dimension with the whole ones after it (dim_rows rows)
// cut into tiles of tile_rows rows (the last one shorter); block x takes
// tile x % tiles of run x / tiles and walks it a row group at
// a time (an scf.for ending each step with a barrier).

// ONE-LABEL: func.func @rows(
// ONE: scf.forall (%{{.*}}) = (0) to (%{{.*}}) step (40) {
// ONE: attnres.forward_into packed(%{{.*}} : memref<3x?x256xbf16, strided<[?, 256, 1], offset: ?>>) query(%arg1 : memref<256xbf16>) outs(%{{.*}}, %{{.*}} : memref<?x256xbf16, strided<[256, 1], offset: ?>>, memref<?xf32, strided<[1], offset: ?>>)
// ONE-NOT: attnres.launch
// ONE-NOT: gpu.func
// TWO-LABEL: func.func @rows(
// TWO: scf.forall (%{{.*}}) in (%{{.*}}) {
// TWO-NOT: gpu.func
// The partial forwards of packed sources (slices of the sources' buffer)
// tiled by a transform script's tile_using_forall (over ceil(N / 16) tile
// numbers): nothing of its loops or of the slices stays on the host.
// SCRIPT-LABEL: func.func @rows(
// SCRIPT-NOT: scf.forall
// SCRIPT-NOT: tensor.extract_slice
// SCRIPT: gpu.launch_func  @attnres_kernels::@rows_0_forward_partial {{.*}} %c2_i64 : i64, %c16_i64 : i64, %{{.*}} : i64)
// SCRIPT: gpu.launch_func  @attnres_kernels::@rows_0_merge
// SCRIPT: , tile_dims = 1 : i64, tile_tokens = 16 : i64
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
// SPLIT-NOT: scf.forall
// SPLIT: %[[S:.*]] = memref.dim %arg0, %c1 : memref<4x?x1024xbf16>
// SPLIT: %[[TILES:.*]] = arith.ceildivui %[[S]], %c40 : index
// SPLIT: %[[RUNS:.*]] = arith.divui
// SPLIT: %[[BLOCKS:.*]] = arith.muli %[[TILES]], %[[RUNS]] : index
// SPLIT: gpu.launch_func  @attnres_kernels::@layer_0_forward_partial blocks in (%[[BLOCKS]], %c2, %c1) {{.*}} %c2_i64 : i64, %c40_i64 : i64, %{{.*}} : i64)
// SPLIT: gpu.launch_func  @attnres_kernels::@layer_0_merge blocks in (%[[BLOCKS]], %c1, %c1) {{.*}} %c2_i64 : i64, %c40_i64 : i64, %{{.*}} : i64)
// SPLIT: merge_tile_dims = 2 : i64, merge_tile_tokens = 40 : i64
// SPLIT-SAME: , tile_dims = 2 : i64, tile_tokens = 40 : i64
// SPLIT-NOT: forward_cluster
// COVER-LABEL: func.func @layer(
// COVER: gpu.launch_func  @attnres_kernels::@layer_0_forward_partial blocks in (%{{.*}}, %c2, %c1)
// COVER: gpu.launch_func  @attnres_kernels::@layer_0_merge
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
// SPLIT-NOT: scf.forall
// SPLIT: %[[N:.*]] = memref.dim %arg0, %c1 : memref<4x?x128xbf16>
// SPLIT: %[[NONZERO:.*]] = arith.maxui %[[N]], %c1 : index
// SPLIT: %[[TILES:.*]] = arith.ceildivui %[[N]], %c40 : index
// SPLIT: %[[RUNS:.*]] = arith.divui %{{.*}}, %[[NONZERO]] : index
// SPLIT: %[[BLOCKS:.*]] = arith.muli %[[TILES]], %[[RUNS]] : index
// SPLIT: gpu.launch_func  @attnres_kernels::@queries_0_forward_partial {{.*}} %c2_i64 : i64, %c1_i64 : i64, %{{.*}} : i64)
// SPLIT: gpu.launch_func  @attnres_kernels::@queries_0_merge blocks in (%[[BLOCKS]], %c1, %c1) {{.*}} %c2_i64 : i64, %c40_i64 : i64, %{{.*}} : i64)
// SPLIT: merge_tile_dims = 2 : i64, merge_tile_tokens = 40 : i64
// SPLIT-SAME: , tile_dims = 1 : i64, tile_tokens = 1 : i64
// COVER-LABEL: func.func @queries(
// COVER: gpu.launch_func  @attnres_kernels::@queries_0_forward_partial blocks in (%{{.*}}, %c3, %c1)
// COVER: gpu.launch_func  @attnres_kernels::@queries_0_merge
func.func @queries(%v: tensor<4x?x128xbf16>, %q: tensor<2x128xbf16>)
    -> (tensor<2x?x128xbf16>, tensor<2x?xf32>) {
  %o, %lse = attnres.forward packed(%v : tensor<4x?x128xbf16>)
      query(%q : tensor<2x128xbf16>) -> tensor<2x?x128xbf16>, tensor<2x?xf32>
  return %o, %lse : tensor<2x?x128xbf16>, tensor<2x?xf32>
}
