// RUN: attnres-opt %s --split-input-file --verify-diagnostics \
// RUN:   --convert-attnres-to-gpu="keep-host=1" --attnres-bufferize-host --attnres-launch-kernels | FileCheck %s

// The loops of attnres-tile and transform.structured.tile_using_forall
// written out by hand. Under keep-host a loop whose body is one softmax
// merge on a tile of tokens that writes only its output (the lse dropped,
// as canonicalization drops an unused result of the loop), the first r
// token dimensions tiled, all but the last by 1, the others whole (each
// tile [t, t + min(T, N - t)), the loop over t by T or over tile numbers
// by 1), is launched with one block per tile of the merge kernel; the form
// is checked against the op's TilingInterface. Other forms are refused
// with the reason. (A forward's or merge's own tile loop that writes every
// result runs as a grid of its own: lower-tiles.mlir.)

// Three tiles of 8 of 24 rows (static: the size is the constant 8), the
// merge's unused lse dropped from the loop; mapped to #gpu.block<x>, which
// for a loop of one dimension is the grid attnres-map-to-blocks states.
// CHECK-LABEL: func.func @static_tiles(
// CHECK-NOT: scf.forall
// CHECK: gpu.launch_func  @attnres_kernels::@static_tiles_0_merge
// CHECK: tile_dims = 1 : i64, tile_tokens = 8 : i64
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

// Two token dimensions tiled by (2, 8): a tile is two runs of 8 rows, not
// consecutive rows.
func.func @not_by_one(%p: tensor<3x4x24x64xf32>, %l: tensor<3x4x24xf32>)
    -> tensor<4x24x64xbf16> {
  %init = tensor.empty() : tensor<4x24x64xbf16>
  // expected-error @+1 {{convert-attnres-to-gpu: keep-host=1 launches an scf.forall around a forward or merge as blocks of its kernels that each take one tile of tokens, which needs the form of attnres-tile; here token dimension 0 is tiled by 2: a tile is consecutive tokens only where every tiled dimension but the last is tiled by 1}}
  %r = scf.forall (%a, %t) = (0, 0) to (4, 24) step (2, 8)
      shared_outs(%out = %init) -> (tensor<4x24x64xbf16>) {
    %ps = tensor.extract_slice %p[0, %a, %t, 0] [3, 2, 8, 64] [1, 1, 1, 1]
        : tensor<3x4x24x64xf32> to tensor<3x2x8x64xf32>
    %ls = tensor.extract_slice %l[0, %a, %t] [3, 2, 8] [1, 1, 1]
        : tensor<3x4x24xf32> to tensor<3x2x8xf32>
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
  // expected-error @+1 {{here loop dimension 0 does not run over token dimension 0 (a tile takes the first token dimensions, all but the last by 1, and the others whole)}}
  %r = scf.forall (%t) = (0) to (24) step (8) shared_outs(%out = %init)
      -> (tensor<4x24x64xbf16>) {
    %ps = tensor.extract_slice %p[0, 0, %t, 0] [3, 4, 8, 64] [1, 1, 1, 1]
        : tensor<3x4x24x64xf32> to tensor<3x4x8x64xf32>
    %ls = tensor.extract_slice %l[0, 0, %t] [3, 4, 8] [1, 1, 1]
        : tensor<3x4x24xf32> to tensor<3x4x8xf32>
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
  // expected-error @+1 {{here operand 0 of the tiled op is not the slice of the loop's tile (tokens [t, t + min(step, N - t)) of each tiled dimension, the others whole)}}
  %r = scf.forall (%t) = (0) to (24) step (8) shared_outs(%out = %init)
      -> (tensor<24x64xbf16>) {
    %at = affine.apply #next(%t)
    %ps = tensor.extract_slice %p[0, %at, 0] [3, 8, 64] [1, 1, 1]
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
  return %r : tensor<24x64xbf16>
}

// -----

// The tile's rows inserted at row 0 of every tile.
func.func @wrong_insert(%p: tensor<3x24x64xf32>, %l: tensor<3x24xf32>)
    -> tensor<24x64xbf16> {
  %c0 = arith.constant 0 : index
  %init = tensor.empty() : tensor<24x64xbf16>
  // expected-error @+1 {{here result 0 of the tiled op is not inserted at its tile}}
  %r = scf.forall (%t) = (0) to (24) step (8) shared_outs(%out = %init)
      -> (tensor<24x64xbf16>) {
    %ps = tensor.extract_slice %p[0, %t, 0] [3, 8, 64] [1, 1, 1]
        : tensor<3x24x64xf32> to tensor<3x8x64xf32>
    %ls = tensor.extract_slice %l[0, %t] [3, 8] [1, 1]
        : tensor<3x24xf32> to tensor<3x8xf32>
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
  // expected-error @+1 {{here the tiled op is a sum partition_reduce (its kernel has no token tiles)}}
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
  // expected-error @+1 {{here the loop is mapped to [#gpu.block<y>], but its iterations run as the blocks of one grid dimension: leave it unmapped or map it to [#gpu.block<linear_dim_0>]}}
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
  // expected-error @+1 {{here the loop is mapped to [#gpu.block<linear_dim_0>, #gpu.block<linear_dim_1>], but its iterations run as the blocks of one grid dimension: leave it unmapped or map it to [#gpu.block<linear_dim_1>, #gpu.block<linear_dim_0>]}}
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
// CHECK-NOT: scf.forall
// CHECK: gpu.launch_func  @attnres_kernels::@linear_0_merge
// CHECK: tile_dims = 2 : i64, tile_tokens = 8 : i64
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
  // expected-error @+1 {{here a shared output of the loop is not written}}
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
  // expected-error @+1 {{here an operand of the tiled op is not a slice of a tensor defined outside the loop}}
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
  // expected-error @+1 {{here the loop's body does more than one attnres op ('attnres.partition_reduce')}}
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
