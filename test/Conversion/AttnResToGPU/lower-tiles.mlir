// RUN: attnres-opt %s --split-input-file --verify-diagnostics \
// RUN:   --attnres-lower-tiles-to-gpu --canonicalize --cse \
// RUN:   | FileCheck %s --implicit-check-not=scf.forall \
// RUN:       --implicit-check-not=attnres.forward_into \
// RUN:       --implicit-check-not=attnres.partition_reduce_into
// RUN: attnres-opt %s --split-input-file --verify-diagnostics \
// RUN:   --attnres-lower-tiles-to-gpu --gpu-kernel-outlining --canonicalize \
// RUN:   --cse 2>/dev/null | FileCheck %s --check-prefix=OUTLINED

// attnres-lower-tiles-to-gpu: a forward's tile loop on views of buffers
// (what attnres-bufferize-host makes of attnres-tile's loop) becomes a
// gpu.launch of one block a tile: its block the forward kernel's (128
// threads: rows of 64 floats on 16 lanes, 8 rows a block), the tile's op
// the kernel's thread code over the tile's rows [first, first + count) of
// the whole buffers, whose addresses (and the table of source rows) the
// host code before the launch computes and checks. A grid of no tiles, or
// a misaligned buffer, launches nothing.

// CHECK-LABEL: func.func @dynamic_tiles(
// CHECK-SAME: %[[V:[^:]*]]: memref<2x?x64xf32>, %[[Q:[^:]*]]: memref<64xf32>, %[[O:[^:]*]]: memref<?x64xf32>, %[[LSE:[^:]*]]: memref<?xf32>)
// CHECK: %[[N:.*]] = memref.dim %[[V]], %c1 : memref<2x?x64xf32>
// CHECK: %[[TILES:.*]] = affine.apply #{{.*}}()[%[[N]]]
// CHECK: %[[N64:.*]] = arith.index_cast %[[N]] : index to i64
// The table of the two source rows, checked.
// CHECK: memref.extract_aligned_pointer_as_index %[[V]]
// CHECK: %[[TABLE:.*]] = gpu.alloc  () : memref<2xi64>
// CHECK: gpu.memcpy  %[[TABLE]]
// CHECK: memref.extract_aligned_pointer_as_index %[[O]]
// CHECK: memref.extract_aligned_pointer_as_index %[[LSE]]
// CHECK: %[[ANY:.*]] = arith.cmpi sgt, %[[TILES]], %c0 : index
// CHECK: %[[GO:.*]] = arith.andi %{{.*}}, %[[ANY]] : i1
// CHECK: scf.if %[[GO]] {
// CHECK: gpu.launch blocks(%[[BX:[^,]*]], %{{.*}}, %{{.*}}) in (%{{.*}} = %[[TILES]], %{{.*}} = %c1, %{{.*}} = %c1) threads(%{{.*}}, %{{.*}}, %{{.*}}) in (%{{.*}} = %c128, %{{.*}} = %c1, %{{.*}} = %c1) dynamic_shared_memory_size %{{.*}} {
// The tile: rows [bx * 10, bx * 10 + min(10, N - bx * 10)).
// CHECK: %[[START:.*]] = affine.apply #{{.*}}()[%[[BX]]]
// CHECK: %[[SIZE:.*]] = affine.min #{{.*}}()[%[[N]], %[[BX]]]
// CHECK: %[[ROWS:.*]] = arith.maxsi %[[SIZE]], %c0 : index
// CHECK: %[[FIRST:.*]] = arith.index_cast %[[START]] : index to i64
// CHECK: %[[COUNT:.*]] = arith.index_cast %[[ROWS]] : index to i64
// 8 rows a step, each valid within the tile and the tokens.
// CHECK: %[[STEPS:.*]] = arith.ceildivui %[[COUNT]], %c8_i64 : i64
// CHECK: scf.for %[[STEP:.*]] = %c0_i64 to %[[STEPS]] step %c1_i64 : i64 {
// CHECK: %[[OFFSET:.*]] = arith.addi %{{.*}}, %{{.*}} : i64
// CHECK: arith.cmpi slt, %[[OFFSET]], %[[COUNT]] : i64
// CHECK: %[[ROW:.*]] = arith.addi %[[FIRST]], %[[OFFSET]] : i64
// CHECK: arith.cmpi slt, %[[ROW]], %[[N64]] : i64
// CHECK: gpu.barrier
// CHECK: gpu.terminator
// CHECK: gpu.dealloc  %[[TABLE]]
// The kernel outlined: the host's values (addresses, sizes) are its
// arguments.
// OUTLINED-LABEL: func.func @dynamic_tiles(
// OUTLINED: gpu.launch_func  @dynamic_tiles_kernel::@dynamic_tiles_kernel blocks in (%{{.*}}, %c1, %c1) threads in (%c128, %c1, %c1) dynamic_shared_memory_size %{{.*}} args(
// OUTLINED: gpu.func @dynamic_tiles_kernel({{(%[a-z0-9]+: (index|i64)(, )?)+}}) kernel attributes {known_block_size = array<i32: 128, 1, 1>}
// OUTLINED: gpu.return
#size = affine_map<(d0)[s0] -> (10, s0 - d0)>
func.func @dynamic_tiles(%v: memref<2x?x64xf32>, %q: memref<64xf32>,
                         %o: memref<?x64xf32>, %lse: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %v, %c1 : memref<2x?x64xf32>
  scf.forall (%t) = (0) to (%n) step (10) {
    %size = affine.min #size(%t)[%n]
    %vs = memref.subview %v[0, %t, 0] [2, %size, 64] [1, 1, 1]
        : memref<2x?x64xf32> to memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xf32> to memref<?x64xf32, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    attnres.forward_into packed(%vs : memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>)
        query(%q : memref<64xf32>)
        outs(%os, %ls : memref<?x64xf32, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return
}

// -----

// transform.structured.tile_using_forall's loop: over tile numbers, more
// of them than tiles (the tiles past the tokens are empty: no rows, the
// size clamped at 0); two token dimensions [B, S] tiled by (1, 16): rows
// first = b * S + s, count = min(16, S - s); two queries (o and lse views
// of [2, B, S, ...] buffers: the thread code addresses query m's rows of
// the whole buffers at m * B * S).
// CHECK-LABEL: func.func @tile_numbers(
// CHECK-SAME: %[[V:[^:]*]]: memref<2x3x?x64xbf16>
// CHECK: %[[S:.*]] = memref.dim %[[V]], %c2 : memref<2x3x?x64xbf16>
// CHECK: gpu.launch blocks(%[[BX:[^,]*]], %{{.*}}, %{{.*}}) in (%{{.*}} = %{{.*}}, %{{.*}} = %c1, %{{.*}} = %c1)
// CHECK: %[[I:.*]] = arith.remsi %[[BX]], %[[TILES:.*]] : index
// CHECK: %[[B:.*]] = arith.divsi %[[BX]], %[[TILES]] : index
// CHECK: %[[T:.*]] = affine.apply #{{.*}}()[%[[I]]]
// CHECK: %[[SIZE:.*]] = affine.min #{{.*}}()[%[[S]], %[[I]]]
// CHECK: %[[BS:.*]] = arith.muli %[[B]], %[[S]] : index
// CHECK: arith.addi %[[BS]], %[[T]] : index
// CHECK: arith.maxsi %[[SIZE]], %c0 : index
// CHECK: gpu.terminator
#count = affine_map<()[s0] -> (s0 ceildiv 8)>
#first = affine_map<(d0) -> (d0 * 16)>
#rest = affine_map<(d0)[s0] -> (-d0 + s0, 16)>
func.func @tile_numbers(%v: memref<2x3x?x64xbf16>, %q: memref<2x64xbf16>,
                        %o: memref<2x3x?x64xbf16>, %lse: memref<2x3x?xf32>) {
  %c2 = arith.constant 2 : index
  %s = memref.dim %v, %c2 : memref<2x3x?x64xbf16>
  %tiles = affine.apply #count()[%s]
  scf.forall (%b, %i) in (3, %tiles) {
    %t = affine.apply #first(%i)
    %size = affine.min #rest(%t)[%s]
    %vs = memref.subview %v[0, %b, %t, 0] [2, 1, %size, 64] [1, 1, 1, 1]
        : memref<2x3x?x64xbf16> to memref<2x1x?x64xbf16, strided<[?, ?, 64, 1], offset: ?>>
    %os = memref.subview %o[0, %b, %t, 0] [2, 1, %size, 64] [1, 1, 1, 1]
        : memref<2x3x?x64xbf16> to memref<2x1x?x64xbf16, strided<[?, ?, 64, 1], offset: ?>>
    %ls = memref.subview %lse[0, %b, %t] [2, 1, %size] [1, 1, 1]
        : memref<2x3x?xf32> to memref<2x1x?xf32, strided<[?, ?, 1], offset: ?>>
    attnres.forward_into packed(%vs : memref<2x1x?x64xbf16, strided<[?, ?, 64, 1], offset: ?>>)
        query(%q : memref<2x64xbf16>)
        outs(%os, %ls : memref<2x1x?x64xbf16, strided<[?, ?, 64, 1], offset: ?>>,
                        memref<2x1x?xf32, strided<[?, ?, 1], offset: ?>>)
  }
  return
}

// -----

// A tile must be consecutive rows: [B, S] tiled by (2, 16) is not.
#rest = affine_map<(d0)[s0] -> (-d0 + s0, 16)>
func.func @not_consecutive(%v: memref<2x4x?x64xbf16>, %q: memref<64xbf16>,
                           %o: memref<4x?x64xbf16>, %lse: memref<4x?xf32>) {
  %c2 = arith.constant 2 : index
  %s = memref.dim %v, %c2 : memref<2x4x?x64xbf16>
  scf.forall (%b, %t) = (0, 0) to (4, %s) step (2, 16) {
    %size = affine.min #rest(%t)[%s]
    %vs = memref.subview %v[0, %b, %t, 0] [2, 2, %size, 64] [1, 1, 1, 1]
        : memref<2x4x?x64xbf16> to memref<2x2x?x64xbf16, strided<[?, ?, 64, 1], offset: ?>>
    %os = memref.subview %o[%b, %t, 0] [2, %size, 64] [1, 1, 1]
        : memref<4x?x64xbf16> to memref<2x?x64xbf16, strided<[?, 64, 1], offset: ?>>
    %ls = memref.subview %lse[%b, %t] [2, %size] [1, 1]
        : memref<4x?xf32> to memref<2x?xf32, strided<[?, 1], offset: ?>>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: token dimension 0 must be tiled by 1, as the tile cuts a later one}}
    attnres.forward_into packed(%vs : memref<2x2x?x64xbf16, strided<[?, ?, 64, 1], offset: ?>>)
        query(%q : memref<64xbf16>)
        outs(%os, %ls : memref<2x?x64xbf16, strided<[?, 64, 1], offset: ?>>,
                        memref<2x?xf32, strided<[?, 1], offset: ?>>)
  }
  return
}

// -----

// Every tile reading all the sources but writing its own rows.
#size = affine_map<(d0)[s0] -> (10, s0 - d0)>
func.func @whole_sources(%v: memref<2x?x64xf32>, %q: memref<64xf32>,
                         %o: memref<?x64xf32>, %lse: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %v, %c1 : memref<2x?x64xf32>
  scf.forall (%t) = (0) to (%n) step (10) {
    %size = affine.min #size(%t)[%n]
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xf32> to memref<?x64xf32, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: the sources must be views (memref.subview) of the function's buffers, a tile each}}
    attnres.forward_into packed(%v : memref<2x?x64xf32>)
        query(%q : memref<64xf32>)
        outs(%os, %ls : memref<?x64xf32, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return
}

// -----

// Every other row.
#size = affine_map<(d0)[s0] -> (10, s0 - d0)>
func.func @strided_rows(%v: memref<2x?x64xf32>, %q: memref<64xf32>,
                        %o: memref<?x64xf32>, %lse: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %v, %c1 : memref<2x?x64xf32>
  scf.forall (%t) = (0) to (%n) step (10) {
    %size = affine.min #size(%t)[%n]
    %vs = memref.subview %v[0, %t, 0] [2, %size, 64] [1, 2, 1]
        : memref<2x?x64xf32> to memref<2x?x64xf32, strided<[?, 128, 1], offset: ?>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xf32> to memref<?x64xf32, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: the sources must be views with unit strides}}
    attnres.forward_into packed(%vs : memref<2x?x64xf32, strided<[?, 128, 1], offset: ?>>)
        query(%q : memref<64xf32>)
        outs(%os, %ls : memref<?x64xf32, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return
}

// -----

// o of other tokens than the sources'.
#size = affine_map<(d0)[s0] -> (10, s0 - d0)>
func.func @shifted_output(%v: memref<2x?x64xf32>, %q: memref<64xf32>,
                          %o: memref<?x64xf32>, %lse: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %v, %c1 : memref<2x?x64xf32>
  scf.forall (%t) = (0) to (%n) step (10) {
    %size = affine.min #size(%t)[%n]
    %vs = memref.subview %v[0, %t, 0] [2, %size, 64] [1, 1, 1]
        : memref<2x?x64xf32> to memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %os = memref.subview %o[0, 0] [%size, 64] [1, 1]
        : memref<?x64xf32> to memref<?x64xf32, strided<[64, 1]>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: o must be the same tile of tokens as the sources (token dimension 0)}}
    attnres.forward_into packed(%vs : memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>)
        query(%q : memref<64xf32>)
        outs(%os, %ls : memref<?x64xf32, strided<[64, 1]>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return
}

// -----

// The body runs on the device: a copy there is refused.
#size = affine_map<(d0)[s0] -> (10, s0 - d0)>
func.func @copy_in_body(%v: memref<2x?x64xf32>, %q: memref<64xf32>,
                        %o: memref<?x64xf32>, %lse: memref<?xf32>,
                        %tmp: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %v, %c1 : memref<2x?x64xf32>
  scf.forall (%t) = (0) to (%n) step (10) {
    %size = affine.min #size(%t)[%n]
    %vs = memref.subview %v[0, %t, 0] [2, %size, 64] [1, 1, 1]
        : memref<2x?x64xf32> to memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xf32> to memref<?x64xf32, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    attnres.forward_into packed(%vs : memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>)
        query(%q : memref<64xf32>)
        outs(%os, %ls : memref<?x64xf32, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile loop runs on the device as a grid of blocks; its body may hold one attnres.forward_into, backward_into or softmax attnres.partition_reduce_into, views of buffers and index arithmetic; 'memref.copy' is none of them}}
    memref.copy %ls, %tmp : memref<?xf32, strided<[1], offset: ?>> to memref<?xf32>
  }
  return
}

// -----

// Listed sources, o_pre and its residual: every tiled buffer at the same
// rows, the query and the norm weight whole.
// CHECK-LABEL: func.func @listed(
// CHECK: gpu.launch
// CHECK: gpu.terminator
#size = affine_map<(d0)[s0] -> (32, s0 - d0)>
func.func @listed(%a: memref<?x64xbf16>, %b: memref<?x64xbf16>,
                  %q: memref<64xbf16>, %h: memref<64xbf16>,
                  %o: memref<?x64xbf16>, %lse: memref<?xf32>,
                  %o_pre: memref<?x64xbf16>, %r: memref<?x32xi8>) {
  %c0 = arith.constant 0 : index
  %n = memref.dim %a, %c0 : memref<?x64xbf16>
  scf.forall (%t) = (0) to (%n) step (32) {
    %size = affine.min #size(%t)[%n]
    %as = memref.subview %a[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xbf16> to memref<?x64xbf16, strided<[64, 1], offset: ?>>
    %bs = memref.subview %b[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xbf16> to memref<?x64xbf16, strided<[64, 1], offset: ?>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xbf16> to memref<?x64xbf16, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    %ps = memref.subview %o_pre[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xbf16> to memref<?x64xbf16, strided<[64, 1], offset: ?>>
    %rs = memref.subview %r[%t, 0] [%size, 32] [1, 1]
        : memref<?x32xi8> to memref<?x32xi8, strided<[32, 1], offset: ?>>
    attnres.forward_into sources(%as, %bs : memref<?x64xbf16, strided<[64, 1], offset: ?>>)
        query(%q : memref<64xbf16>) output_norm(%h : memref<64xbf16>)
        save(o_pre_residual)
        outs(%os, %ls, %ps, %rs : memref<?x64xbf16, strided<[64, 1], offset: ?>>,
             memref<?xf32, strided<[1], offset: ?>>,
             memref<?x64xbf16, strided<[64, 1], offset: ?>>,
             memref<?x32xi8, strided<[32, 1], offset: ?>>)
  }
  return
}

// -----

// The whole buffers' token counts must be the sources': checked before the
// launch where only the run time knows them (a refusal skips the launch),
// refused here where they are static.
// CHECK-LABEL: func.func @two_counts(
// CHECK-SAME: %[[V:[^:]*]]: memref<2x?x64xf32>, %{{[^:]*}}: memref<64xf32>, %[[O:[^:]*]]: memref<?x64xf32>
// CHECK-DAG: %[[NO:.*]] = memref.dim %[[O]], %c0 : memref<?x64xf32>
// CHECK-DAG: %[[NV:.*]] = memref.dim %[[V]], %c1 : memref<2x?x64xf32>
// CHECK: %[[SAME:.*]] = arith.cmpi eq, %[[NO]], %[[NV]] : index
// CHECK: %[[DIFFER:.*]] = arith.cmpi ne, %[[NO]], %[[NV]] : index
// CHECK: scf.if %[[DIFFER]] {
// CHECK: func.call @attnresGpuRefuseLaunch
// CHECK: gpu.launch
#size = affine_map<(d0)[s0] -> (10, s0 - d0)>
func.func @two_counts(%v: memref<2x?x64xf32>, %q: memref<64xf32>,
                      %o: memref<?x64xf32>, %lse: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %v, %c1 : memref<2x?x64xf32>
  scf.forall (%t) = (0) to (%n) step (10) {
    %size = affine.min #size(%t)[%n]
    %vs = memref.subview %v[0, %t, 0] [2, %size, 64] [1, 1, 1]
        : memref<2x?x64xf32> to memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xf32> to memref<?x64xf32, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    attnres.forward_into packed(%vs : memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>)
        query(%q : memref<64xf32>)
        outs(%os, %ls : memref<?x64xf32, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return
}

// -----

#size = affine_map<(d0) -> (10, 40 - d0)>
func.func @static_counts(%v: memref<2x40x64xf32>, %q: memref<64xf32>,
                         %o: memref<50x64xf32>, %lse: memref<40xf32>) {
  scf.forall (%t) = (0) to (40) step (10) {
    %size = affine.min #size(%t)
    %vs = memref.subview %v[0, %t, 0] [2, %size, 64] [1, 1, 1]
        : memref<2x40x64xf32> to memref<2x?x64xf32, strided<[2560, 64, 1], offset: ?>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<50x64xf32> to memref<?x64xf32, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<40xf32> to memref<?xf32, strided<[1], offset: ?>>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: the buffer of o has 50 tokens in token dimension 0, the sources' 40}}
    attnres.forward_into packed(%vs : memref<2x?x64xf32, strided<[2560, 64, 1], offset: ?>>)
        query(%q : memref<64xf32>)
        outs(%os, %ls : memref<?x64xf32, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return
}

// -----

// The query is read from its buffer's first element: a view of one at an
// offset is refused.
#size = affine_map<(d0)[s0] -> (10, s0 - d0)>
func.func @query_at_an_offset(%v: memref<2x?x64xf32>,
                              %q: memref<64xf32, strided<[1], offset: ?>>,
                              %o: memref<?x64xf32>, %lse: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %v, %c1 : memref<2x?x64xf32>
  scf.forall (%t) = (0) to (%n) step (10) {
    %size = affine.min #size(%t)[%n]
    %vs = memref.subview %v[0, %t, 0] [2, %size, 64] [1, 1, 1]
        : memref<2x?x64xf32> to memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xf32> to memref<?x64xf32, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: the query and the norm weights must be whole buffers, dense from their start (an identity layout), the same for every tile}}
    attnres.forward_into packed(%vs : memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>)
        query(%q : memref<64xf32, strided<[1], offset: ?>>)
        outs(%os, %ls : memref<?x64xf32, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return
}

// -----

// Views of a view: the thread code addresses the whole buffer's rows.
#size = affine_map<(d0)[s0] -> (10, s0 - d0)>
func.func @view_of_a_view(%v: memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>,
                          %q: memref<64xf32>, %o: memref<?x64xf32>,
                          %lse: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %v, %c1 : memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>
  scf.forall (%t) = (0) to (%n) step (10) {
    %size = affine.min #size(%t)[%n]
    %vs = memref.subview %v[0, %t, 0] [2, %size, 64] [1, 1, 1]
        : memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>> to memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xf32> to memref<?x64xf32, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: the sources must be views of buffers whose elements lie one after the other (an identity layout, or consecutive rows of such a buffer), not of 'memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>'}}
    attnres.forward_into packed(%vs : memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>)
        query(%q : memref<64xf32>)
        outs(%os, %ls : memref<?x64xf32, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return
}

// -----

// A softmax merge's tile loop the same way: its block the merge kernel's
// (128 threads: rows of 64 floats on 8 lanes, 16 rows a block), the tile
// rows [t, t + min(32, N - t)) of the whole buffers, partition p's partial
// lse and row of a row at p * N + row.
// CHECK-LABEL: func.func @merge_tiles(
// CHECK-SAME: %[[P:[^:]*]]: memref<3x?x64xf32>, %[[PL:[^:]*]]: memref<3x?xf32>, %[[SINK:[^:]*]]: memref<?xf32>
// CHECK: %[[N:.*]] = memref.dim %[[P]], %c1 : memref<3x?x64xf32>
// CHECK: %[[TILES:.*]] = affine.apply #{{.*}}()[%[[N]]]
// The whole buffers' token counts must be the partials'.
// CHECK: %[[NL:.*]] = memref.dim %[[PL]], %c1 : memref<3x?xf32>
// CHECK: arith.cmpi ne, %[[NL]], %[[N]] : index
// CHECK: %[[N64:.*]] = arith.index_cast %[[N]] : index to i64
// CHECK: %[[PADDR:.*]] = memref.extract_aligned_pointer_as_index %[[P]]
// CHECK: %[[P64:.*]] = arith.index_cast %[[PADDR]] : index to i64
// CHECK: %[[PLADDR:.*]] = memref.extract_aligned_pointer_as_index %[[PL]]
// CHECK: %[[PL64:.*]] = arith.index_cast %[[PLADDR]] : index to i64
// CHECK: %[[SADDR:.*]] = memref.extract_aligned_pointer_as_index %[[SINK]]
// CHECK: %[[S64:.*]] = arith.index_cast %[[SADDR]] : index to i64
// A lane reads 8 floats of a partial row at once: 32 bytes.
// CHECK: arith.remui %[[P64]], %c32_i64 : i64
// CHECK: gpu.launch blocks(%{{.*}}, %{{.*}}, %{{.*}}) in (%{{.*}} = %[[TILES]], %{{.*}} = %c1, %{{.*}} = %c1) threads(%{{.*}}, %{{.*}}, %{{.*}}) in (%{{.*}} = %c128, %{{.*}} = %c1, %{{.*}} = %c1)
// CHECK: %[[PLP:.*]] = llvm.inttoptr %[[PL64]] : i64 to !llvm.ptr<1>
// CHECK: %[[SP:.*]] = llvm.inttoptr %[[S64]] : i64 to !llvm.ptr<1>
// CHECK: scf.for
// CHECK: %[[ROW:.*]] = arith.minsi %{{.*}}, %{{.*}} : i64
// CHECK: llvm.getelementptr %[[SP]][%[[ROW]]]
// CHECK: llvm.getelementptr %[[PLP]][%[[ROW]]]
// CHECK: %[[AT1:.*]] = arith.addi %[[N64]], %[[ROW]] : i64
// CHECK: llvm.getelementptr %[[PLP]][%[[AT1]]]
// CHECK: %[[N2:.*]] = arith.muli %[[N64]], %c2_i64 : i64
// CHECK: %[[AT2:.*]] = arith.addi %[[N2]], %[[ROW]] : i64
// CHECK: llvm.getelementptr %[[PLP]][%[[AT2]]]
// CHECK: gpu.terminator
// OUTLINED-LABEL: func.func @merge_tiles(
// OUTLINED: gpu.launch_func  @merge_tiles_kernel::@merge_tiles_kernel blocks in (%{{.*}}, %c1, %c1) threads in (%c128, %c1, %c1)
// OUTLINED: gpu.func @merge_tiles_kernel(
#size = affine_map<(d0)[s0] -> (32, s0 - d0)>
func.func @merge_tiles(%p: memref<3x?x64xf32>, %pl: memref<3x?xf32>,
                       %sink: memref<?xf32>, %o: memref<?x64xbf16>,
                       %lse: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %p, %c1 : memref<3x?x64xf32>
  scf.forall (%t) = (0) to (%n) step (32) {
    %size = affine.min #size(%t)[%n]
    %ps = memref.subview %p[0, %t, 0] [3, %size, 64] [1, 1, 1]
        : memref<3x?x64xf32> to memref<3x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %pls = memref.subview %pl[0, %t] [3, %size] [1, 1]
        : memref<3x?xf32> to memref<3x?xf32, strided<[?, 1], offset: ?>>
    %ss = memref.subview %sink[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xbf16> to memref<?x64xbf16, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    attnres.partition_reduce_into softmax %ps : memref<3x?x64xf32, strided<[?, 64, 1], offset: ?>>
        lse(%pls : memref<3x?xf32, strided<[?, 1], offset: ?>>)
        sink(%ss : memref<?xf32, strided<[1], offset: ?>>)
        outs(%os, %ls : memref<?x64xbf16, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return
}

// -----

// A merge of the user's own with a weight a row group ([2, 64] over
// [2, N, 64] rows, the form a two-query forward's merge has), tiled by
// (1, 16): the tile's weight is its group's row, a view of the whole
// weight at the tile's first token offset; the thread code reads row r's
// weight at row r / (2N / 2) of the whole one.
// CHECK-LABEL: func.func @merge_queries(
// CHECK: %[[ROWS:.*]] = arith.index_cast %{{.*}} : index to i64
// CHECK: %[[PER:.*]] = arith.divui %[[ROWS]], %c2_i64 : i64
// CHECK: gpu.launch
// CHECK: scf.for
// CHECK: %[[ROW:.*]] = arith.minsi %{{.*}}, %{{.*}} : i64
// CHECK: arith.divui %[[ROW]], %[[PER]] : i64
// CHECK: gpu.terminator
// OUTLINED-LABEL: func.func @merge_queries(
// OUTLINED: gpu.launch_func  @merge_queries_kernel::@merge_queries_kernel
#rest = affine_map<(d0)[s0] -> (16, s0 - d0)>
func.func @merge_queries(%p: memref<4x2x?x64xf32>, %pl: memref<4x2x?xf32>,
                         %h: memref<2x64xf32>, %o: memref<2x?x64xbf16>,
                         %lse: memref<2x?xf32>) {
  %c2 = arith.constant 2 : index
  %n = memref.dim %p, %c2 : memref<4x2x?x64xf32>
  scf.forall (%k, %t) = (0, 0) to (2, %n) step (1, 16) {
    %size = affine.min #rest(%t)[%n]
    %ps = memref.subview %p[0, %k, %t, 0] [4, 1, %size, 64] [1, 1, 1, 1]
        : memref<4x2x?x64xf32> to memref<4x1x?x64xf32, strided<[?, ?, 64, 1], offset: ?>>
    %pls = memref.subview %pl[0, %k, %t] [4, 1, %size] [1, 1, 1]
        : memref<4x2x?xf32> to memref<4x1x?xf32, strided<[?, ?, 1], offset: ?>>
    %hs = memref.subview %h[%k, 0] [1, 64] [1, 1]
        : memref<2x64xf32> to memref<1x64xf32, strided<[64, 1], offset: ?>>
    %os = memref.subview %o[%k, %t, 0] [1, %size, 64] [1, 1, 1]
        : memref<2x?x64xbf16> to memref<1x?x64xbf16, strided<[?, 64, 1], offset: ?>>
    %ls = memref.subview %lse[%k, %t] [1, %size] [1, 1]
        : memref<2x?xf32> to memref<1x?xf32, strided<[?, 1], offset: ?>>
    attnres.partition_reduce_into softmax %ps : memref<4x1x?x64xf32, strided<[?, ?, 64, 1], offset: ?>>
        lse(%pls : memref<4x1x?xf32, strided<[?, ?, 1], offset: ?>>)
        output_norm(%hs : memref<1x64xf32, strided<[64, 1], offset: ?>>)
        outs(%os, %ls : memref<1x?x64xbf16, strided<[?, 64, 1], offset: ?>>,
                        memref<1x?xf32, strided<[?, 1], offset: ?>>)
  }
  return
}

// -----

// The weight of the next query: not the tile's.
#rest = affine_map<(d0)[s0] -> (16, s0 - d0)>
#next = affine_map<(d0) -> (d0 + 1)>
func.func @merge_other_weight(%p: memref<4x2x?x64xf32>, %pl: memref<4x2x?xf32>,
                              %h: memref<3x64xf32>, %o: memref<2x?x64xbf16>,
                              %lse: memref<2x?xf32>) {
  %c2 = arith.constant 2 : index
  %n = memref.dim %p, %c2 : memref<4x2x?x64xf32>
  scf.forall (%k, %t) = (0, 0) to (2, %n) step (1, 16) {
    %size = affine.min #rest(%t)[%n]
    %k1 = affine.apply #next(%k)
    %ps = memref.subview %p[0, %k, %t, 0] [4, 1, %size, 64] [1, 1, 1, 1]
        : memref<4x2x?x64xf32> to memref<4x1x?x64xf32, strided<[?, ?, 64, 1], offset: ?>>
    %pls = memref.subview %pl[0, %k, %t] [4, 1, %size] [1, 1, 1]
        : memref<4x2x?xf32> to memref<4x1x?xf32, strided<[?, ?, 1], offset: ?>>
    %hs = memref.subview %h[%k1, 0] [1, 64] [1, 1]
        : memref<3x64xf32> to memref<1x64xf32, strided<[64, 1], offset: ?>>
    %os = memref.subview %o[%k, %t, 0] [1, %size, 64] [1, 1, 1]
        : memref<2x?x64xbf16> to memref<1x?x64xbf16, strided<[?, 64, 1], offset: ?>>
    %ls = memref.subview %lse[%k, %t] [1, %size] [1, 1]
        : memref<2x?xf32> to memref<1x?xf32, strided<[?, 1], offset: ?>>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: the output norm weight must be the same tile of tokens as the partials (token dimension 0)}}
    attnres.partition_reduce_into softmax %ps : memref<4x1x?x64xf32, strided<[?, ?, 64, 1], offset: ?>>
        lse(%pls : memref<4x1x?xf32, strided<[?, ?, 1], offset: ?>>)
        output_norm(%hs : memref<1x64xf32, strided<[64, 1], offset: ?>>)
        outs(%os, %ls : memref<1x?x64xbf16, strided<[?, 64, 1], offset: ?>>,
                        memref<1x?xf32, strided<[?, 1], offset: ?>>)
  }
  return
}

// -----

// The partial lses of 50 tokens, the partials of 40.
#size = affine_map<(d0) -> (8, 40 - d0)>
func.func @merge_static_counts(%p: memref<3x40x64xf32>, %pl: memref<3x50xf32>,
                               %o: memref<40x64xbf16>, %lse: memref<40xf32>) {
  scf.forall (%t) = (0) to (40) step (8) {
    %size = affine.min #size(%t)
    %ps = memref.subview %p[0, %t, 0] [3, %size, 64] [1, 1, 1]
        : memref<3x40x64xf32> to memref<3x?x64xf32, strided<[2560, 64, 1], offset: ?>>
    %pls = memref.subview %pl[0, %t] [3, %size] [1, 1]
        : memref<3x50xf32> to memref<3x?xf32, strided<[50, 1], offset: ?>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<40x64xbf16> to memref<?x64xbf16, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<40xf32> to memref<?xf32, strided<[1], offset: ?>>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: the buffer of the partial lses has 50 tokens in token dimension 0, the partials' 40}}
    attnres.partition_reduce_into softmax %ps : memref<3x?x64xf32, strided<[2560, 64, 1], offset: ?>>
        lse(%pls : memref<3x?xf32, strided<[50, 1], offset: ?>>)
        outs(%os, %ls : memref<?x64xbf16, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return
}

// -----

// A [D] weight is read whole from its first element: a view of one is
// refused.
#size = affine_map<(d0)[s0] -> (32, s0 - d0)>
func.func @merge_weight_view(%p: memref<3x?x64xf32>, %pl: memref<3x?xf32>,
                             %h: memref<128xf32>, %o: memref<?x64xbf16>,
                             %lse: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %p, %c1 : memref<3x?x64xf32>
  scf.forall (%t) = (0) to (%n) step (32) {
    %size = affine.min #size(%t)[%n]
    %ps = memref.subview %p[0, %t, 0] [3, %size, 64] [1, 1, 1]
        : memref<3x?x64xf32> to memref<3x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %pls = memref.subview %pl[0, %t] [3, %size] [1, 1]
        : memref<3x?xf32> to memref<3x?xf32, strided<[?, 1], offset: ?>>
    %hs = memref.subview %h[64] [64] [1]
        : memref<128xf32> to memref<64xf32, strided<[1], offset: 64>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xbf16> to memref<?x64xbf16, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: a [D] output norm weight must be a whole buffer, dense from its start (an identity layout), the same for every tile}}
    attnres.partition_reduce_into softmax %ps : memref<3x?x64xf32, strided<[?, 64, 1], offset: ?>>
        lse(%pls : memref<3x?xf32, strided<[?, 1], offset: ?>>)
        output_norm(%hs : memref<64xf32, strided<[1], offset: 64>>)
        outs(%os, %ls : memref<?x64xbf16, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return
}

// -----

// The sink of the next tile.
#size = affine_map<(d0)[s0] -> (32, s0 - d0)>
#next = affine_map<(d0) -> (d0 + 32)>
func.func @merge_other_sink(%p: memref<3x?x64xf32>, %pl: memref<3x?xf32>,
                            %sink: memref<?xf32>, %o: memref<?x64xbf16>,
                            %lse: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %p, %c1 : memref<3x?x64xf32>
  scf.forall (%t) = (0) to (%n) step (32) {
    %size = affine.min #size(%t)[%n]
    %t1 = affine.apply #next(%t)
    %ps = memref.subview %p[0, %t, 0] [3, %size, 64] [1, 1, 1]
        : memref<3x?x64xf32> to memref<3x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %pls = memref.subview %pl[0, %t] [3, %size] [1, 1]
        : memref<3x?xf32> to memref<3x?xf32, strided<[?, 1], offset: ?>>
    %ss = memref.subview %sink[%t1] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xbf16> to memref<?x64xbf16, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: the sink must be the same tile of tokens as the partials (token dimension 0)}}
    attnres.partition_reduce_into softmax %ps : memref<3x?x64xf32, strided<[?, 64, 1], offset: ?>>
        lse(%pls : memref<3x?xf32, strided<[?, 1], offset: ?>>)
        sink(%ss : memref<?xf32, strided<[1], offset: ?>>)
        outs(%os, %ls : memref<?x64xbf16, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return
}

// -----

// Outputs allocated with the partials' token count (as bufferization
// allocates a tile loop's outputs) need no check before the launch; the
// caller's partial lses do.
// CHECK: @attnres_refusal_{{[0-9]+}}("the buffer of the partial lses (token dimension 0) must have as many tokens as the partials' for kernel merge_allocated_kernel; the launch was skipped
// CHECK-NOT: the buffer of o
// CHECK-NOT: the buffer of lse
// CHECK-LABEL: func.func @merge_allocated(
// CHECK: gpu.launch
// CHECK: gpu.terminator
#size = affine_map<(d0)[s0] -> (32, s0 - d0)>
func.func @merge_allocated(%p: memref<3x?x64xf32>, %pl: memref<3x?xf32>)
    -> (memref<?x64xbf16>, memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %p, %c1 : memref<3x?x64xf32>
  %o = gpu.alloc (%n) : memref<?x64xbf16>
  %lse = gpu.alloc (%n) : memref<?xf32>
  scf.forall (%t) = (0) to (%n) step (32) {
    %size = affine.min #size(%t)[%n]
    %ps = memref.subview %p[0, %t, 0] [3, %size, 64] [1, 1, 1]
        : memref<3x?x64xf32> to memref<3x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %pls = memref.subview %pl[0, %t] [3, %size] [1, 1]
        : memref<3x?xf32> to memref<3x?xf32, strided<[?, 1], offset: ?>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xbf16> to memref<?x64xbf16, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    attnres.partition_reduce_into softmax %ps : memref<3x?x64xf32, strided<[?, 64, 1], offset: ?>>
        lse(%pls : memref<3x?xf32, strided<[?, 1], offset: ?>>)
        outs(%os, %ls : memref<?x64xbf16, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return %o, %lse : memref<?x64xbf16>, memref<?xf32>
}

// -----

// The iterations run as the blocks of one grid dimension: a loop mapped to
// threads asks for something else.
#size = affine_map<(d0)[s0] -> (8, s0 - d0)>
func.func @mapped_to_threads(%v: memref<2x?x64xbf16>, %q: memref<64xbf16>,
                             %o: memref<?x64xbf16>, %lse: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %v, %c1 : memref<2x?x64xbf16>
  // expected-error @+1 {{attnres-lower-tiles-to-gpu: the loop is mapped to [#gpu.thread<x>], but its iterations run as the blocks of one grid dimension: leave it unmapped or map it to [#gpu.block<linear_dim_0>]}}
  scf.forall (%t) = (0) to (%n) step (8) {
    %size = affine.min #size(%t)[%n]
    %vs = memref.subview %v[0, %t, 0] [2, %size, 64] [1, 1, 1]
        : memref<2x?x64xbf16> to memref<2x?x64xbf16, strided<[?, 64, 1], offset: ?>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xbf16> to memref<?x64xbf16, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    attnres.forward_into packed(%vs : memref<2x?x64xbf16, strided<[?, 64, 1], offset: ?>>)
        query(%q : memref<64xbf16>)
        outs(%os, %ls : memref<?x64xbf16, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  } {mapping = [#gpu.thread<x>]}
  return
}

// -----

// A split forward's piece: its loop reads a partition of packed sources
// and writes its slices of the stacks the merge reads, views of consecutive
// rows made before the loop. The whole buffers are those views: the host
// addresses each from its first element, its allocation's address plus its
// offset in elements times their bytes (2 for bf16, 4 for f32).
// CHECK-LABEL: func.func @stack_piece(
// CHECK: %[[PART:.*]] = memref.subview %arg0[3, 0, 0] [2, %{{.*}}, 64] [1, 1, 1]
// CHECK: %[[O1:.*]] = memref.subview %arg2[1, 0, 0] [1, %{{.*}}, 64] [1, 1, 1]
// CHECK: %[[L1:.*]] = memref.subview %arg3[1, 0] [1, %{{.*}}] [1, 1]
// CHECK: %[[BASE:.*]] = memref.extract_aligned_pointer_as_index %[[PART]]
// CHECK: %{{.*}}, %[[OFFSET:.*]], %{{.*}}:3, %{{.*}}:3 = memref.extract_strided_metadata %[[PART]]
// CHECK: %[[BYTES:.*]] = arith.muli %[[OFFSET]], %c2 : index
// CHECK: arith.addi %[[BASE]], %[[BYTES]] : index
// CHECK: %[[OBASE:.*]] = memref.extract_aligned_pointer_as_index %[[O1]]
// CHECK: %{{.*}}, %[[OOFFSET:.*]], %{{.*}}:2, %{{.*}}:2 = memref.extract_strided_metadata %[[O1]]
// CHECK: %[[OBYTES:.*]] = arith.muli %[[OOFFSET]], %c4 : index
// CHECK: arith.addi %[[OBASE]], %[[OBYTES]] : index
// CHECK: memref.extract_strided_metadata %[[L1]]
// CHECK: gpu.launch
// CHECK: gpu.terminator
#size = affine_map<(d0)[s0] -> (32, s0 - d0)>
func.func @stack_piece(%v: memref<5x?x64xbf16>, %q: memref<64xbf16>,
                       %os: memref<2x?x64xf32>, %ls: memref<2x?xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %v, %c1 : memref<5x?x64xbf16>
  %part = memref.subview %v[3, 0, 0] [2, %n, 64] [1, 1, 1]
      : memref<5x?x64xbf16> to memref<2x?x64xbf16, strided<[?, 64, 1], offset: ?>>
  %o1 = memref.subview %os[1, 0, 0] [1, %n, 64] [1, 1, 1]
      : memref<2x?x64xf32> to memref<?x64xf32, strided<[64, 1], offset: ?>>
  %l1 = memref.subview %ls[1, 0] [1, %n] [1, 1]
      : memref<2x?xf32> to memref<?xf32, strided<[1], offset: ?>>
  scf.forall (%t) = (0) to (%n) step (32) {
    %size = affine.min #size(%t)[%n]
    %vs = memref.subview %part[0, %t, 0] [2, %size, 64] [1, 1, 1]
        : memref<2x?x64xbf16, strided<[?, 64, 1], offset: ?>> to memref<2x?x64xbf16, strided<[?, 64, 1], offset: ?>>
    %ot = memref.subview %o1[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xf32, strided<[64, 1], offset: ?>> to memref<?x64xf32, strided<[64, 1], offset: ?>>
    %lt = memref.subview %l1[%t] [%size] [1]
        : memref<?xf32, strided<[1], offset: ?>> to memref<?xf32, strided<[1], offset: ?>>
    attnres.forward_into packed(%vs : memref<2x?x64xbf16, strided<[?, 64, 1], offset: ?>>)
        query(%q : memref<64xbf16>) save(lse)
        outs(%ot, %lt : memref<?x64xf32, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return
}

// -----

// A view before the loop whose rows are not consecutive (the first 16
// tokens of each source) is no buffer the kernel can address from its
// first element.
#size = affine_map<(d0)[s0] -> (8, s0 - d0)>
func.func @gapped_view(%v: memref<2x?x64xbf16>, %q: memref<64xbf16>,
                       %o: memref<16x64xbf16>, %lse: memref<16xf32>) {
  %c16 = arith.constant 16 : index
  %first = memref.subview %v[0, 0, 0] [2, 16, 64] [1, 1, 1]
      : memref<2x?x64xbf16> to memref<2x16x64xbf16, strided<[?, 64, 1]>>
  scf.forall (%t) = (0) to (%c16) step (8) {
    %size = affine.min #size(%t)[%c16]
    %vs = memref.subview %first[0, %t, 0] [2, %size, 64] [1, 1, 1]
        : memref<2x16x64xbf16, strided<[?, 64, 1]>> to memref<2x?x64xbf16, strided<[?, 64, 1], offset: ?>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<16x64xbf16> to memref<?x64xbf16, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<16xf32> to memref<?xf32, strided<[1], offset: ?>>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: the sources must be views of buffers whose elements lie one after the other (an identity layout, or consecutive rows of such a buffer), not of 'memref<2x16x64xbf16, strided<[?, 64, 1]>>'}}
    attnres.forward_into packed(%vs : memref<2x?x64xbf16, strided<[?, 64, 1], offset: ?>>)
        query(%q : memref<64xbf16>)
        outs(%os, %ls : memref<?x64xbf16, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return
}

// RUN: not attnres-opt %s --split-input-file --attnres-lower-tiles-to-gpu=forward-staged-batches=2 2>&1 | FileCheck %s --check-prefix=NO-ASYNC
// NO-ASYNC: attnres-lower-tiles-to-gpu: staged batches need asynchronous copies (async-copies=1: NVIDIA sm_80 and later)
// RUN: not attnres-opt %s --split-input-file --attnres-lower-tiles-to-gpu=subgroup-size=48 2>&1 | FileCheck %s --check-prefix=SUBGROUP
// SUBGROUP: attnres-lower-tiles-to-gpu: subgroup-size must be a power of two no larger than max-block-threads
// RUN: not attnres-opt %s --split-input-file --attnres-lower-tiles-to-gpu=forward-prefetch=2 2>&1 | FileCheck %s --check-prefix=PREFETCH
// PREFETCH: attnres-lower-tiles-to-gpu: forward-prefetch must be -1 (chosen), 0 or 1
// RUN: not attnres-opt %s --split-input-file --attnres-lower-tiles-to-gpu=merge-loads-in-flight=-1 2>&1 | FileCheck %s --check-prefix=LOADS
// LOADS: attnres-lower-tiles-to-gpu: merge-loads-in-flight must be >= 0
// RUN: not attnres-opt %s --split-input-file --attnres-lower-tiles-to-gpu=backward-source-batch=-1 2>&1 | FileCheck %s --check-prefix=BACKWARD-BATCH
// BACKWARD-BATCH: attnres-lower-tiles-to-gpu: backward-source-batch and backward-threads-per-row must be >= 0
// RUN: not attnres-opt %s --split-input-file --attnres-lower-tiles-to-gpu=backward-prefetch=3 2>&1 | FileCheck %s --check-prefix=BACKWARD-PREFETCH
// BACKWARD-PREFETCH: attnres-lower-tiles-to-gpu: backward-prefetch must be -1 (chosen), 0 or 1
// RUN: not attnres-opt %s --split-input-file --attnres-lower-tiles-to-gpu=backward-staged-batches=9 2>&1 | FileCheck %s --check-prefix=BACKWARD-STAGED
// BACKWARD-STAGED: attnres-lower-tiles-to-gpu: backward-staged-batches must be in [-1, 8]
// RUN: not attnres-opt %s --split-input-file --attnres-lower-tiles-to-gpu=backward-staged-batches=2 2>&1 | FileCheck %s --check-prefix=NO-ASYNC

// -----

// attnres-split-reduction's loop on buffers: block b a backward over its
// tokens, writing their rows of the source gradients and row b of each
// partial gradient. A grid of the loop's 7 blocks; the source rows and
// their gradients' rows two tables; the thread code walks every source of
// the tile's rows and ends with the tile's query and key norm gradients:
// the key is the last 16 of 64 coordinates, so each is stored element by
// element at (row b * 16 + key coordinate).
// CHECK-LABEL: func.func @backward_rows(
// CHECK-SAME: %[[DQ:[^:]*]]: memref<7x16xf32>, %[[DG:[^:]*]]: memref<7x16xf32>)
// The partial gradients addressed from their first rows.
// CHECK: memref.subview %[[DQ]][0, 0] [1, 16] [1, 1]
// CHECK: memref.subview %[[DG]][0, 0] [1, 16] [1, 1]
// CHECK-COUNT-2: gpu.alloc  () : memref<2xi64>
// CHECK: gpu.launch blocks(%[[BX:[^,]*]], %{{.*}}, %{{.*}}) in (%{{.*}} = %c7, %{{.*}} = %c1, %{{.*}} = %c1)
// CHECK: %[[ROW:.*]] = arith.index_cast %[[BX]] : index to i64
// CHECK: scf.for
// CHECK: arith.muli %[[ROW]], %c16_i64 : i64
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 4 : i64} : f32, !llvm.ptr<1>
// CHECK: gpu.terminator
// OUTLINED-LABEL: func.func @backward_rows(
// OUTLINED: gpu.launch_func  @backward_rows_kernel::@backward_rows_kernel blocks in (%c7, %c1, %c1)
#first = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 7), s0)>
#count = affine_map<()[s0, s1] -> (s0 ceildiv 7, s0 - s1)>
func.func @backward_rows(%v: memref<2x?x64xf32>, %q: memref<16xf32>,
                         %g: memref<16xf32>, %do: memref<?x64xf32>,
                         %lse: memref<?xf32>, %dv: memref<2x?x64xf32>,
                         %dq: memref<7x16xf32>, %dg: memref<7x16xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %v, %c1 : memref<2x?x64xf32>
  scf.forall (%b) in (7) {
    %first = affine.min #first(%b)[%n]
    %count = affine.min #count()[%n, %first]
    %vs = memref.subview %v[0, %first, 0] [2, %count, 64] [1, 1, 1]
        : memref<2x?x64xf32> to memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %dos = memref.subview %do[%first, 0] [%count, 64] [1, 1]
        : memref<?x64xf32> to memref<?x64xf32, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%first] [%count] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    %dvs = memref.subview %dv[0, %first, 0] [2, %count, 64] [1, 1, 1]
        : memref<2x?x64xf32> to memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %dqs = memref.subview %dq[%b, 0] [1, 16] [1, 1]
        : memref<7x16xf32> to memref<16xf32, strided<[1], offset: ?>>
    %dgs = memref.subview %dg[%b, 0] [1, 16] [1, 1]
        : memref<7x16xf32> to memref<16xf32, strided<[1], offset: ?>>
    attnres.backward_into packed(%vs : memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>)
        query(%q : memref<16xf32>) key_norm(%g : memref<16xf32>)
        grad(%dos : memref<?x64xf32, strided<[64, 1], offset: ?>>)
        lse(%ls : memref<?xf32, strided<[1], offset: ?>>)
        outs(%dvs, %dqs, %dgs : memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>,
             memref<16xf32, strided<[1], offset: ?>>, memref<16xf32, strided<[1], offset: ?>>)
  }
  return
}

// -----

// A query gradient written into rows 1-2 of four of a block's: not the
// block's whole row.
#first = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 7), s0)>
#count = affine_map<()[s0, s1] -> (s0 ceildiv 7, s0 - s1)>
func.func @backward_two_rows(%v: memref<2x?x64xf32>, %q: memref<2x64xf32>,
                             %do: memref<2x?x64xf32>, %lse: memref<2x?xf32>,
                             %dv: memref<2x?x64xf32>, %dq: memref<7x4x64xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %v, %c1 : memref<2x?x64xf32>
  scf.forall (%b) in (7) {
    %first = affine.min #first(%b)[%n]
    %count = affine.min #count()[%n, %first]
    %vs = memref.subview %v[0, %first, 0] [2, %count, 64] [1, 1, 1]
        : memref<2x?x64xf32> to memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %dos = memref.subview %do[0, %first, 0] [2, %count, 64] [1, 1, 1]
        : memref<2x?x64xf32> to memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %ls = memref.subview %lse[0, %first] [2, %count] [1, 1]
        : memref<2x?xf32> to memref<2x?xf32, strided<[?, 1], offset: ?>>
    %dvs = memref.subview %dv[0, %first, 0] [2, %count, 64] [1, 1, 1]
        : memref<2x?x64xf32> to memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %dqs = memref.subview %dq[%b, 1, 0] [1, 2, 64] [1, 1, 1]
        : memref<7x4x64xf32> to memref<2x64xf32, strided<[64, 1], offset: ?>>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: the query gradient must be one row of a dense buffer of the function (a memref.subview of its [1, ...] slice, whole in every other dimension, unit strides), the tile's own}}
    attnres.backward_into packed(%vs : memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>)
        query(%q : memref<2x64xf32>)
        grad(%dos : memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>)
        lse(%ls : memref<2x?xf32, strided<[?, 1], offset: ?>>)
        outs(%dvs, %dqs : memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>,
             memref<2x64xf32, strided<[64, 1], offset: ?>>)
  }
  return
}

// -----

// Eight blocks writing rows of a seven-row buffer.
#first = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 8), s0)>
#count = affine_map<()[s0, s1] -> (s0 ceildiv 8, s0 - s1)>
func.func @backward_past_rows(%v: memref<2x?x64xf32>, %q: memref<64xf32>,
                              %do: memref<?x64xf32>, %lse: memref<?xf32>,
                              %dv: memref<2x?x64xf32>, %dq: memref<7x64xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %v, %c1 : memref<2x?x64xf32>
  scf.forall (%b) in (8) {
    %first = affine.min #first(%b)[%n]
    %count = affine.min #count()[%n, %first]
    %vs = memref.subview %v[0, %first, 0] [2, %count, 64] [1, 1, 1]
        : memref<2x?x64xf32> to memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %dos = memref.subview %do[%first, 0] [%count, 64] [1, 1]
        : memref<?x64xf32> to memref<?x64xf32, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%first] [%count] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    %dvs = memref.subview %dv[0, %first, 0] [2, %count, 64] [1, 1, 1]
        : memref<2x?x64xf32> to memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %dqs = memref.subview %dq[%b, 0] [1, 64] [1, 1]
        : memref<7x64xf32> to memref<64xf32, strided<[1], offset: ?>>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: the loop's indices run up to 8 (exclusive), past the 7 rows of a partial gradient's buffer}}
    attnres.backward_into packed(%vs : memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>)
        query(%q : memref<64xf32>)
        grad(%dos : memref<?x64xf32, strided<[64, 1], offset: ?>>)
        lse(%ls : memref<?xf32, strided<[1], offset: ?>>)
        outs(%dvs, %dqs : memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>,
             memref<64xf32, strided<[1], offset: ?>>)
  }
  return
}

// -----

// Eight queries with a per-query output norm on rows of 64: the 16 row
// groups of a block (8 lanes a row) add their 16 vectors a thread of the
// partial gradients (8 of dq, 8 of dh) in two rounds of 8, 30 KiB of
// workgroup memory (15 groups x 8 vectors x 8 lanes x 8 floats), as all 16
// at once would take more than the 32 KiB the thread code allows itself.
// CHECK-LABEL: func.func @backward_many_queries(
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}} = %c5, {{.*}} = %c1, {{.*}} = %c1) threads({{.*}}) in ({{.*}} = %c128, {{.*}} = %c1, {{.*}} = %c1) dynamic_shared_memory_size %c30720_i32
// CHECK: memref.view {{.*}} to memref<7680xf32, #gpu.address_space<workgroup>>
// CHECK-COUNT-8: vector.store {{.*}} : memref<7680xf32, #gpu.address_space<workgroup>>, vector<8xf32>
// CHECK-NOT: vector.store {{.*}}#gpu.address_space<workgroup>
// CHECK: gpu.barrier
// CHECK: vector.load {{.*}} : memref<7680xf32, #gpu.address_space<workgroup>>, vector<8xf32>
// CHECK: gpu.barrier
// CHECK-COUNT-8: vector.store {{.*}} : memref<7680xf32, #gpu.address_space<workgroup>>, vector<8xf32>
// CHECK-NOT: vector.store {{.*}}#gpu.address_space<workgroup>
// CHECK: gpu.barrier
// CHECK: vector.load {{.*}} : memref<7680xf32, #gpu.address_space<workgroup>>, vector<8xf32>
// CHECK-NOT: gpu.barrier
// CHECK: return
#first = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 5), s0)>
#count = affine_map<()[s0, s1] -> (s0 ceildiv 5, s0 - s1)>
func.func @backward_many_queries(%v: memref<4x?x64xbf16>, %q: memref<8x64xbf16>,
                                 %h: memref<8x64xbf16>, %do: memref<8x?x64xbf16>,
                                 %lse: memref<8x?xf32>, %dv: memref<4x?x64xbf16>,
                                 %dq: memref<5x8x64xf32>, %dh: memref<5x8x64xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %v, %c1 : memref<4x?x64xbf16>
  scf.forall (%b) in (5) {
    %first = affine.min #first(%b)[%n]
    %count = affine.min #count()[%n, %first]
    %vs = memref.subview %v[0, %first, 0] [4, %count, 64] [1, 1, 1]
        : memref<4x?x64xbf16> to memref<4x?x64xbf16, strided<[?, 64, 1], offset: ?>>
    %dos = memref.subview %do[0, %first, 0] [8, %count, 64] [1, 1, 1]
        : memref<8x?x64xbf16> to memref<8x?x64xbf16, strided<[?, 64, 1], offset: ?>>
    %ls = memref.subview %lse[0, %first] [8, %count] [1, 1]
        : memref<8x?xf32> to memref<8x?xf32, strided<[?, 1], offset: ?>>
    %dvs = memref.subview %dv[0, %first, 0] [4, %count, 64] [1, 1, 1]
        : memref<4x?x64xbf16> to memref<4x?x64xbf16, strided<[?, 64, 1], offset: ?>>
    %dqs = memref.subview %dq[%b, 0, 0] [1, 8, 64] [1, 1, 1]
        : memref<5x8x64xf32> to memref<8x64xf32, strided<[64, 1], offset: ?>>
    %dhs = memref.subview %dh[%b, 0, 0] [1, 8, 64] [1, 1, 1]
        : memref<5x8x64xf32> to memref<8x64xf32, strided<[64, 1], offset: ?>>
    attnres.backward_into packed(%vs : memref<4x?x64xbf16, strided<[?, 64, 1], offset: ?>>)
        query(%q : memref<8x64xbf16>) output_norm(%h : memref<8x64xbf16>)
        grad(%dos : memref<8x?x64xbf16, strided<[?, 64, 1], offset: ?>>)
        lse(%ls : memref<8x?xf32, strided<[?, 1], offset: ?>>)
        outs(%dvs, %dqs, %dhs : memref<4x?x64xbf16, strided<[?, 64, 1], offset: ?>>,
             memref<8x64xf32, strided<[64, 1], offset: ?>>, memref<8x64xf32, strided<[64, 1], offset: ?>>)
  }
  return
}
