// RUN: attnres-opt %s --split-input-file --verify-diagnostics \
// RUN:   --convert-attnres-to-gpu="keep-host=1" --attnres-bufferize-host --attnres-launch-kernels \
// RUN:   --attnres-lower-tiles-to-gpu --canonicalize | FileCheck %s

// The loops of attnres-tile and transform.structured.tile_using_forall
// written out by hand, each around one softmax merge that writes only its
// output: the lse dropped, as canonicalization drops an unused result of
// the loop. The conversion gives such a loop back a shared output for
// each dropped result (a device buffer written at the tile's place and
// freed unread), so that it runs like a loop that writes every result:
// attnres-lower-tiles-to-gpu makes it a grid of one block a tile, each the
// merge's thread code over its rows (lower-tiles.mlir). What the kernels
// cannot take is refused with the reason: tiles that are not consecutive
// rows, tiles sliced or written at other places than the partials', a
// mapping other than the grid's (lower-tiles), a sum tiled, a loop that
// does not write its op's results, a body holding other ops (the
// conversion).

// Three tiles of 8 of 24 rows (static: the size is the constant 8), the
// merge's unused lse dropped from the loop; mapped to #gpu.block<x>, which
// for a loop of one dimension is the grid attnres-map-to-blocks states.
// CHECK-LABEL: func.func @static_tiles(
// CHECK: %[[LSE:.*]] = gpu.alloc () : memref<24xf32>
// CHECK-NOT: scf.forall
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}} = %c3{{.*}}, {{.*}} = %c1{{.*}}, {{.*}} = %c1{{.*}})
// CHECK: gpu.dealloc %[[LSE]] : memref<24xf32>
// CHECK-NOT: gpu.launch_func
// CHECK: return
func.func @static_tiles(%p: tensor<3x24x64xf32>, %l: tensor<3x24xf32>)
    -> tensor<24x64xbf16> {
  %init = tensor.empty() : tensor<24x64xbf16>
  %r = scf.forall (%t) = (0) to (24) step (8) shared_outs(%out = %init)
      -> (tensor<24x64xbf16>) {
    %ps = tensor.extract_slice %p[0, %t, 0] [3, 8, 64] [1, 1, 1]
        : tensor<3x24x64xf32> to tensor<3x8x64xf32>
    %ls = tensor.extract_slice %l[0, %t] [3, 8] [1, 1]
        : tensor<3x24xf32> to tensor<3x8xf32>
    %o, %lse = attnres.partition_reduce softmax %ps : tensor<3x8x64xf32>
        lse(%ls : tensor<3x8xf32>) -> tensor<8x64xbf16>, tensor<8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %o into %out[%t, 0] [8, 64] [1, 1]
          : tensor<8x64xbf16> into tensor<24x64xbf16>
    }
  } {mapping = [#gpu.block<x>]}
  return %r : tensor<24x64xbf16>
}

// -----

// attnres-tile's loop over a two-query forward, canonicalized: its lse
// dropped. It gets a [2, N] buffer back (sized as the output was made),
// written by the tiles and freed unread.
// CHECK-LABEL: func.func @queries(
// CHECK: %[[N:.*]] = memref.dim
// CHECK: %[[O:.*]] = gpu.alloc (%[[N]]) : memref<2x?x64xbf16>
// CHECK: %[[LSE:.*]] = gpu.alloc (%[[N]]) : memref<2x?xf32>
// CHECK-NOT: scf.forall
// CHECK: gpu.launch blocks(
// CHECK: gpu.dealloc %[[LSE]] : memref<2x?xf32>
// CHECK-NOT: gpu.launch_func
// CHECK: return %[[O]]
#tile = affine_map<(d0)[s0] -> (-d0 + s0, 16)>
func.func @queries(%v: tensor<4x?x64xbf16>, %q: tensor<2x64xbf16>)
    -> tensor<2x?x64xbf16> {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<4x?x64xbf16>
  %init = tensor.empty(%n) : tensor<2x?x64xbf16>
  %r = scf.forall (%t) = (0) to (%n) step (16) shared_outs(%out = %init)
      -> (tensor<2x?x64xbf16>) {
    %size = affine.min #tile(%t)[%n]
    %vs = tensor.extract_slice %v[0, %t, 0] [4, %size, 64] [1, 1, 1]
        : tensor<4x?x64xbf16> to tensor<4x?x64xbf16>
    %o, %lse = attnres.forward packed(%vs : tensor<4x?x64xbf16>)
        query(%q : tensor<2x64xbf16>) save(lse)
        -> tensor<2x?x64xbf16>, tensor<2x?xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %o into %out[0, %t, 0] [2, %size, 64] [1, 1, 1]
          : tensor<2x?x64xbf16> into tensor<2x?x64xbf16>
    }
  }
  return %r : tensor<2x?x64xbf16>
}

// -----

// Two token dimensions tiled by (2, 8): a tile is two runs of 8 rows, not
// consecutive rows.
func.func @not_by_one(%p: tensor<3x4x24x64xf32>, %l: tensor<3x4x24xf32>)
    -> tensor<4x24x64xbf16> {
  %init = tensor.empty() : tensor<4x24x64xbf16>
  %r = scf.forall (%a, %t) = (0, 0) to (4, 24) step (2, 8)
      shared_outs(%out = %init) -> (tensor<4x24x64xbf16>) {
    %ps = tensor.extract_slice %p[0, %a, %t, 0] [3, 2, 8, 64] [1, 1, 1, 1]
        : tensor<3x4x24x64xf32> to tensor<3x2x8x64xf32>
    %ls = tensor.extract_slice %l[0, %a, %t] [3, 2, 8] [1, 1, 1]
        : tensor<3x4x24xf32> to tensor<3x2x8xf32>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: token dimension 0 must be tiled by 1, as the tile cuts a later one}}
    %o, %lse = attnres.partition_reduce softmax %ps : tensor<3x2x8x64xf32>
        lse(%ls : tensor<3x2x8xf32>) -> tensor<2x8x64xbf16>, tensor<2x8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %o into %out[%a, %t, 0] [2, 8, 64] [1, 1, 1]
          : tensor<2x8x64xbf16> into tensor<4x24x64xbf16>
    }
  }
  return %r : tensor<4x24x64xbf16>
}

// -----

// The second token dimension tiled, the first whole: a tile is 4 runs of 8
// rows.
func.func @outer_whole(%p: tensor<3x4x24x64xf32>, %l: tensor<3x4x24xf32>)
    -> tensor<4x24x64xbf16> {
  %init = tensor.empty() : tensor<4x24x64xbf16>
  %r = scf.forall (%t) = (0) to (24) step (8) shared_outs(%out = %init)
      -> (tensor<4x24x64xbf16>) {
    %ps = tensor.extract_slice %p[0, 0, %t, 0] [3, 4, 8, 64] [1, 1, 1, 1]
        : tensor<3x4x24x64xf32> to tensor<3x4x8x64xf32>
    %ls = tensor.extract_slice %l[0, 0, %t] [3, 4, 8] [1, 1, 1]
        : tensor<3x4x24xf32> to tensor<3x4x8xf32>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: token dimension 0 must be tiled by 1, as the tile cuts a later one}}
    %o, %lse = attnres.partition_reduce softmax %ps : tensor<3x4x8x64xf32>
        lse(%ls : tensor<3x4x8xf32>) -> tensor<4x8x64xbf16>, tensor<4x8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %o into %out[0, %t, 0] [4, 8, 64] [1, 1, 1]
          : tensor<4x8x64xbf16> into tensor<4x24x64xbf16>
    }
  }
  return %r : tensor<4x24x64xbf16>
}

// -----

// The partials sliced one row late.
#next = affine_map<(d0) -> (d0 + 1)>
func.func @late_slice(%p: tensor<3x24x64xf32>, %l: tensor<3x24xf32>)
    -> tensor<24x64xbf16> {
  %init = tensor.empty() : tensor<24x64xbf16>
  %r = scf.forall (%t) = (0) to (24) step (8) shared_outs(%out = %init)
      -> (tensor<24x64xbf16>) {
    %at = affine.apply #next(%t)
    %ps = tensor.extract_slice %p[0, %at, 0] [3, 8, 64] [1, 1, 1]
        : tensor<3x24x64xf32> to tensor<3x8x64xf32>
    %ls = tensor.extract_slice %l[0, %t] [3, 8] [1, 1]
        : tensor<3x24xf32> to tensor<3x8xf32>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: the partial lses must be the same tile of tokens as the partials (token dimension 0)}}
    %o, %lse = attnres.partition_reduce softmax %ps : tensor<3x8x64xf32>
        lse(%ls : tensor<3x8xf32>) -> tensor<8x64xbf16>, tensor<8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %o into %out[%t, 0] [8, 64] [1, 1]
          : tensor<8x64xbf16> into tensor<24x64xbf16>
    }
  }
  return %r : tensor<24x64xbf16>
}

// -----

// The tile's rows inserted at row 0 of every tile.
func.func @wrong_insert(%p: tensor<3x24x64xf32>, %l: tensor<3x24xf32>)
    -> tensor<24x64xbf16> {
  %c0 = arith.constant 0 : index
  %init = tensor.empty() : tensor<24x64xbf16>
  %r = scf.forall (%t) = (0) to (24) step (8) shared_outs(%out = %init)
      -> (tensor<24x64xbf16>) {
    %ps = tensor.extract_slice %p[0, %t, 0] [3, 8, 64] [1, 1, 1]
        : tensor<3x24x64xf32> to tensor<3x8x64xf32>
    %ls = tensor.extract_slice %l[0, %t] [3, 8] [1, 1]
        : tensor<3x24xf32> to tensor<3x8xf32>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: o must be the same tile of tokens as the partials (token dimension 0)}}
    %o, %lse = attnres.partition_reduce softmax %ps : tensor<3x8x64xf32>
        lse(%ls : tensor<3x8xf32>) -> tensor<8x64xbf16>, tensor<8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %o into %out[%c0, 0] [8, 64] [1, 1]
          : tensor<8x64xbf16> into tensor<24x64xbf16>
    }
  }
  return %r : tensor<24x64xbf16>
}

// -----

// A sum's dimensions are not tokens: its kernel has no tiles.
func.func @sum(%p: tensor<3x24xf32>) -> tensor<24xf32> {
  %init = tensor.empty() : tensor<24xf32>
  // expected-error @+1 {{convert-attnres-to-gpu: keep-host=1 runs a loop around a forward or merge (attnres-tile's) as a grid of its tiles; here the tiled op is a sum partition_reduce (its dimensions are not tokens: it is launched whole)}}
  %r = scf.forall (%t) = (0) to (24) step (8) shared_outs(%out = %init)
      -> (tensor<24xf32>) {
    %ps = tensor.extract_slice %p[0, %t] [3, 8] [1, 1]
        : tensor<3x24xf32> to tensor<3x8xf32>
    %s = attnres.partition_reduce sum %ps : tensor<3x8xf32> -> tensor<8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %s into %out[%t] [8] [1]
          : tensor<8xf32> into tensor<24xf32>
    }
  }
  return %r : tensor<24xf32>
}

// -----

// A loop mapped to a grid dimension other than the one its tiles run on.
func.func @mapped(%p: tensor<3x24x64xf32>, %l: tensor<3x24xf32>)
    -> tensor<24x64xbf16> {
  %init = tensor.empty() : tensor<24x64xbf16>
  // expected-error @+1 {{attnres-lower-tiles-to-gpu: the loop is mapped to [#gpu.block<y>], but its iterations run as the blocks of one grid dimension: leave it unmapped or map it to [#gpu.block<linear_dim_0>]}}
  %r = scf.forall (%t) = (0) to (24) step (8) shared_outs(%out = %init)
      -> (tensor<24x64xbf16>) {
    %ps = tensor.extract_slice %p[0, %t, 0] [3, 8, 64] [1, 1, 1]
        : tensor<3x24x64xf32> to tensor<3x8x64xf32>
    %ls = tensor.extract_slice %l[0, %t] [3, 8] [1, 1]
        : tensor<3x24xf32> to tensor<3x8xf32>
    %o, %lse = attnres.partition_reduce softmax %ps : tensor<3x8x64xf32>
        lse(%ls : tensor<3x8xf32>) -> tensor<8x64xbf16>, tensor<8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %o into %out[%t, 0] [8, 64] [1, 1]
          : tensor<8x64xbf16> into tensor<24x64xbf16>
    }
  } {mapping = [#gpu.block<y>]}
  return %r : tensor<24x64xbf16>
}

// -----

// Two loop dimensions mapped in the other order: the kernels take the tiles
// of a run as consecutive blocks, the last loop dimension fastest.
func.func @swapped(%p: tensor<3x4x24x64xf32>, %l: tensor<3x4x24xf32>)
    -> tensor<4x24x64xf32> {
  %init = tensor.empty() : tensor<4x24x64xf32>
  // expected-error @+1 {{attnres-lower-tiles-to-gpu: the loop is mapped to [#gpu.block<linear_dim_0>, #gpu.block<linear_dim_1>], but its iterations run as the blocks of one grid dimension: leave it unmapped or map it to [#gpu.block<linear_dim_1>, #gpu.block<linear_dim_0>]}}
  %r = scf.forall (%b, %t) = (0, 0) to (4, 24) step (1, 8)
      shared_outs(%out = %init) -> (tensor<4x24x64xf32>) {
    %ps = tensor.extract_slice %p[0, %b, %t, 0] [3, 1, 8, 64] [1, 1, 1, 1]
        : tensor<3x4x24x64xf32> to tensor<3x1x8x64xf32>
    %ls = tensor.extract_slice %l[0, %b, %t] [3, 1, 8] [1, 1, 1]
        : tensor<3x4x24xf32> to tensor<3x1x8xf32>
    %o, %lse = attnres.partition_reduce softmax %ps : tensor<3x1x8x64xf32>
        lse(%ls : tensor<3x1x8xf32>) -> tensor<1x8x64xf32>, tensor<1x8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %o into %out[%b, %t, 0] [1, 8, 64] [1, 1, 1]
          : tensor<1x8x64xf32> into tensor<4x24x64xf32>
    }
  } {mapping = [#gpu.block<linear_dim_0>, #gpu.block<linear_dim_1>]}
  return %r : tensor<4x24x64xf32>
}

// -----

// The same loop mapped as attnres-map-to-blocks maps it.
// CHECK-LABEL: func.func @linear(
// CHECK: %[[LSE:.*]] = gpu.alloc () : memref<4x24xf32>
// CHECK-NOT: scf.forall
// CHECK: gpu.launch blocks(
// CHECK: gpu.dealloc %[[LSE]] : memref<4x24xf32>
// CHECK-NOT: gpu.launch_func
// CHECK: return
func.func @linear(%p: tensor<3x4x24x64xf32>, %l: tensor<3x4x24xf32>)
    -> tensor<4x24x64xf32> {
  %init = tensor.empty() : tensor<4x24x64xf32>
  %r = scf.forall (%b, %t) = (0, 0) to (4, 24) step (1, 8)
      shared_outs(%out = %init) -> (tensor<4x24x64xf32>) {
    %ps = tensor.extract_slice %p[0, %b, %t, 0] [3, 1, 8, 64] [1, 1, 1, 1]
        : tensor<3x4x24x64xf32> to tensor<3x1x8x64xf32>
    %ls = tensor.extract_slice %l[0, %b, %t] [3, 1, 8] [1, 1, 1]
        : tensor<3x4x24xf32> to tensor<3x1x8xf32>
    %o, %lse = attnres.partition_reduce softmax %ps : tensor<3x1x8x64xf32>
        lse(%ls : tensor<3x1x8xf32>) -> tensor<1x8x64xf32>, tensor<1x8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %o into %out[%b, %t, 0] [1, 8, 64] [1, 1, 1]
          : tensor<1x8x64xf32> into tensor<4x24x64xf32>
    }
  } {mapping = [#gpu.block<linear_dim_1>, #gpu.block<linear_dim_0>]}
  return %r : tensor<4x24x64xf32>
}

// -----

// A shared output the loop never writes.
func.func @unwritten(%p: tensor<3x24x64xf32>, %l: tensor<3x24xf32>)
    -> (tensor<24x64xbf16>, tensor<24xf32>) {
  %init = tensor.empty() : tensor<24x64xbf16>
  %lse0 = tensor.empty() : tensor<24xf32>
  // expected-error @+1 {{convert-attnres-to-gpu: keep-host=1 runs a loop around a forward or merge (attnres-tile's) as a grid of its tiles; here the loop's outputs are not its op's results, each written once}}
  %r:2 = scf.forall (%t) = (0) to (24) step (8)
      shared_outs(%out = %init, %lout = %lse0) -> (tensor<24x64xbf16>, tensor<24xf32>) {
    %ps = tensor.extract_slice %p[0, %t, 0] [3, 8, 64] [1, 1, 1]
        : tensor<3x24x64xf32> to tensor<3x8x64xf32>
    %ls = tensor.extract_slice %l[0, %t] [3, 8] [1, 1]
        : tensor<3x24xf32> to tensor<3x8xf32>
    %o, %lse = attnres.partition_reduce softmax %ps : tensor<3x8x64xf32>
        lse(%ls : tensor<3x8xf32>) -> tensor<8x64xbf16>, tensor<8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %o into %out[%t, 0] [8, 64] [1, 1]
          : tensor<8x64xbf16> into tensor<24x64xbf16>
    }
  }
  return %r#0, %r#1 : tensor<24x64xbf16>, tensor<24xf32>
}

// -----

// The partials computed in the loop rather than sliced.
func.func @not_a_slice(%p: tensor<3x24x64xf32>, %l: tensor<3x24xf32>)
    -> tensor<24x64xbf16> {
  %init = tensor.empty() : tensor<24x64xbf16>
  // expected-error @+1 {{convert-attnres-to-gpu: keep-host=1 runs a loop around a forward or merge (attnres-tile's) as a grid of its tiles; here its body holds 'tensor.empty', which a tile's thread code does not run (only the op, slices of tensors, sizes and index arithmetic)}}
  %r = scf.forall (%t) = (0) to (24) step (8) shared_outs(%out = %init)
      -> (tensor<24x64xbf16>) {
    %ps = tensor.empty() : tensor<3x8x64xf32>
    %ls = tensor.extract_slice %l[0, %t] [3, 8] [1, 1]
        : tensor<3x24xf32> to tensor<3x8xf32>
    %o, %lse = attnres.partition_reduce softmax %ps : tensor<3x8x64xf32>
        lse(%ls : tensor<3x8xf32>) -> tensor<8x64xbf16>, tensor<8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %o into %out[%t, 0] [8, 64] [1, 1]
          : tensor<8x64xbf16> into tensor<24x64xbf16>
    }
  }
  return %r : tensor<24x64xbf16>
}

// -----

// Two merges in one tile loop.
func.func @two_ops(%p: tensor<3x24x64xf32>, %l: tensor<3x24xf32>)
    -> tensor<24x64xbf16> {
  %init = tensor.empty() : tensor<24x64xbf16>
  // expected-error @+1 {{convert-attnres-to-gpu: keep-host=1 runs a loop around a forward or merge (attnres-tile's) as a grid of its tiles; here its body holds 'attnres.partition_reduce', which a tile's thread code does not run (only the op, slices of tensors, sizes and index arithmetic)}}
  %r = scf.forall (%t) = (0) to (24) step (8) shared_outs(%out = %init)
      -> (tensor<24x64xbf16>) {
    %ps = tensor.extract_slice %p[0, %t, 0] [3, 8, 64] [1, 1, 1]
        : tensor<3x24x64xf32> to tensor<3x8x64xf32>
    %ls = tensor.extract_slice %l[0, %t] [3, 8] [1, 1]
        : tensor<3x24xf32> to tensor<3x8xf32>
    %o, %lse = attnres.partition_reduce softmax %ps : tensor<3x8x64xf32>
        lse(%ls : tensor<3x8xf32>) -> tensor<8x64xbf16>, tensor<8xf32>
    %o2, %lse2 = attnres.partition_reduce softmax %ps : tensor<3x8x64xf32>
        lse(%ls : tensor<3x8xf32>) -> tensor<8x64xbf16>, tensor<8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %o into %out[%t, 0] [8, 64] [1, 1]
          : tensor<8x64xbf16> into tensor<24x64xbf16>
    }
  }
  return %r : tensor<24x64xbf16>
}

// -----

// The dropped lse typed with a static count where the written output's is
// dynamic (the op allows it): no place to put it back is certain, so the
// loop is refused as it is.
#tile = affine_map<(d0)[s0] -> (-d0 + s0, 8)>
func.func @lse_typed_apart(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>)
    -> tensor<?x64xf32> {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<4x?x64xf32>
  %init = tensor.empty(%n) : tensor<?x64xf32>
  // expected-error @+1 {{convert-attnres-to-gpu: keep-host=1 runs a loop around a forward or merge (attnres-tile's) as a grid of its tiles; here the loop's outputs are not its op's results, each written once}}
  %r = scf.forall (%t) = (0) to (%n) step (8) shared_outs(%out = %init)
      -> (tensor<?x64xf32>) {
    %size = affine.min #tile(%t)[%n]
    %vs = tensor.extract_slice %v[0, %t, 0] [4, %size, 64] [1, 1, 1]
        : tensor<4x?x64xf32> to tensor<4x?x64xf32>
    %o, %lse = attnres.forward packed(%vs : tensor<4x?x64xf32>)
        query(%q : tensor<64xf32>) save(lse) -> tensor<?x64xf32>, tensor<8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %o into %out[%t, 0] [%size, 64] [1, 1]
          : tensor<?x64xf32> into tensor<?x64xf32>
    }
  }
  return %r : tensor<?x64xf32>
}
