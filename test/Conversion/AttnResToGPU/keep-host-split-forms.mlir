// RUN: attnres-opt %s --split-input-file --verify-diagnostics \
// RUN:   --convert-attnres-to-gpu="keep-host=1" --attnres-bufferize-host \
// RUN:   --attnres-launch-kernels --attnres-lower-tiles-to-gpu | FileCheck %s

// The split passes' output, written out by hand. Under keep-host a loop
// whose body is one backward on slices of tokens, each of its results
// inserted whole (the source gradients at the slice's tokens, the partial
// gradients at a row of their own), is lowered as it is: a grid of one
// block an iteration, each the backward's thread code over its tokens,
// writing its rows of the partial gradients, which the sums after the loop
// add (sum kernels). Any bounds the loop computes are its own; what the
// kernels need is refused with the reason (a mapping other than to
// blocks, tiles sharing a row). P forwards over consecutive partitions of
// the sources, merged by a softmax partition_reduce, run as the forward
// split over P partitions; other forms are refused.

// Five blocks of ceil(16 / 5) = 4 tokens (the last one empty), written
// with the bounds composed differently from the pass (one affine.apply for
// the chunk, results in the other order), mapped to the blocks as
// attnres-map-to-blocks maps it.
// CHECK-LABEL: func.func @five_blocks(
// CHECK: %[[DQ:.*]] = gpu.alloc () : memref<5x64xf32>
// CHECK-NOT: scf.forall
// CHECK: gpu.launch blocks
// CHECK: gpu.launch_func  @attnres_kernels::@five_blocks_0_sum
// CHECK: gpu.dealloc %[[DQ]]
// CHECK: return
// CHECK-NOT: gpu.func @five_blocks_0_backward
#chunk = affine_map<()[s0] -> (s0 ceildiv 5)>
#first = affine_map<(d0)[s0, s1] -> (s1, d0 * s0)>
#count = affine_map<()[s0, s1, s2] -> (s1 - s2, s0)>
func.func @five_blocks(%v: tensor<4x16x64xf32>, %q: tensor<64xf32>,
                       %do: tensor<16x64xf32>, %lse: tensor<16xf32>)
    -> (tensor<4x16x64xf32>, tensor<64xf32>) {
  %n = arith.constant 16 : index
  %dv0 = tensor.empty() : tensor<4x16x64xf32>
  %dq0 = tensor.empty() : tensor<5x64xf32>
  %r:2 = scf.forall (%b) in (5) shared_outs(%dv = %dv0, %dq = %dq0)
      -> (tensor<4x16x64xf32>, tensor<5x64xf32>) {
    %chunk = affine.apply #chunk()[%n]
    %first = affine.min #first(%b)[%chunk, %n]
    %count = affine.min #count()[%chunk, %n, %first]
    %vs = tensor.extract_slice %v[0, %first, 0] [4, %count, 64] [1, 1, 1]
        : tensor<4x16x64xf32> to tensor<4x?x64xf32>
    %dos = tensor.extract_slice %do[%first, 0] [%count, 64] [1, 1]
        : tensor<16x64xf32> to tensor<?x64xf32>
    %ls = tensor.extract_slice %lse[%first] [%count] [1]
        : tensor<16xf32> to tensor<?xf32>
    %gv, %gq = attnres.backward packed(%vs : tensor<4x?x64xf32>)
        query(%q : tensor<64xf32>) grad(%dos : tensor<?x64xf32>)
        lse(%ls : tensor<?xf32>) -> tensor<4x?x64xf32>, tensor<64xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %gv into %dv[0, %first, 0] [4, %count, 64] [1, 1, 1]
          : tensor<4x?x64xf32> into tensor<4x16x64xf32>
      tensor.parallel_insert_slice %gq into %dq[%b, 0] [1, 64] [1, 1]
          : tensor<64xf32> into tensor<5x64xf32>
    }
  } {mapping = [#gpu.block<x>]}
  %gq = attnres.partition_reduce sum %r#1 : tensor<5x64xf32> -> tensor<64xf32>
  return %r#0, %gq : tensor<4x16x64xf32>, tensor<64xf32>
}

// -----

// The same loop mapped to threads: its blocks of tokens are blocks.
#chunk = affine_map<()[s0] -> (s0 ceildiv 5)>
#first = affine_map<(d0)[s0, s1] -> (s1, d0 * s0)>
#count = affine_map<()[s0, s1, s2] -> (s1 - s2, s0)>
func.func @on_threads(%v: tensor<4x16x64xf32>, %q: tensor<64xf32>,
                       %do: tensor<16x64xf32>, %lse: tensor<16xf32>)
    -> (tensor<4x16x64xf32>, tensor<64xf32>) {
  %n = arith.constant 16 : index
  %dv0 = tensor.empty() : tensor<4x16x64xf32>
  %dq0 = tensor.empty() : tensor<5x64xf32>
  // expected-error @+1 {{attnres-lower-tiles-to-gpu: the loop is mapped to [#gpu.thread<x>], but its iterations run as the blocks of one grid dimension: leave it unmapped or map it to [#gpu.block<linear_dim_0>]}}
  %r:2 = scf.forall (%b) in (5) shared_outs(%dv = %dv0, %dq = %dq0)
      -> (tensor<4x16x64xf32>, tensor<5x64xf32>) {
    %chunk = affine.apply #chunk()[%n]
    %first = affine.min #first(%b)[%chunk, %n]
    %count = affine.min #count()[%chunk, %n, %first]
    %vs = tensor.extract_slice %v[0, %first, 0] [4, %count, 64] [1, 1, 1]
        : tensor<4x16x64xf32> to tensor<4x?x64xf32>
    %dos = tensor.extract_slice %do[%first, 0] [%count, 64] [1, 1]
        : tensor<16x64xf32> to tensor<?x64xf32>
    %ls = tensor.extract_slice %lse[%first] [%count] [1]
        : tensor<16xf32> to tensor<?xf32>
    %gv, %gq = attnres.backward packed(%vs : tensor<4x?x64xf32>)
        query(%q : tensor<64xf32>) grad(%dos : tensor<?x64xf32>)
        lse(%ls : tensor<?xf32>) -> tensor<4x?x64xf32>, tensor<64xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %gv into %dv[0, %first, 0] [4, %count, 64] [1, 1, 1]
          : tensor<4x?x64xf32> into tensor<4x16x64xf32>
      tensor.parallel_insert_slice %gq into %dq[%b, 0] [1, 64] [1, 1]
          : tensor<64xf32> into tensor<5x64xf32>
    }
  } {mapping = [#gpu.thread<x>]}
  %gq = attnres.partition_reduce sum %r#1 : tensor<5x64xf32> -> tensor<64xf32>
  return %r#0, %gq : tensor<4x16x64xf32>, tensor<64xf32>
}

// -----

// Blocks of ceil(N / 7) tokens in a loop of 8 (not the pass's rule): the
// last block's tokens are none, and its rows of the partial gradients
// zero; the loop's own bounds are what its blocks walk.
// CHECK-LABEL: func.func @eight_blocks(
// CHECK: gpu.alloc () : memref<8x64xf32>
// CHECK: gpu.launch blocks
// CHECK: gpu.launch_func  @attnres_kernels::@eight_blocks_0_sum
#first = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 7), s0)>
#count = affine_map<()[s0, s1] -> (s0 ceildiv 7, s0 - s1)>
func.func @eight_blocks(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>,
                       %do: tensor<?x64xf32>, %lse: tensor<?xf32>)
    -> (tensor<4x?x64xf32>, tensor<64xf32>) {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<4x?x64xf32>
  %dv0 = tensor.empty(%n) : tensor<4x?x64xf32>
  %dq0 = tensor.empty() : tensor<8x64xf32>
  %r:2 = scf.forall (%b) in (8) shared_outs(%dv = %dv0, %dq = %dq0)
      -> (tensor<4x?x64xf32>, tensor<8x64xf32>) {
    %first = affine.min #first(%b)[%n]
    %count = affine.min #count()[%n, %first]
    %vs = tensor.extract_slice %v[0, %first, 0] [4, %count, 64] [1, 1, 1]
        : tensor<4x?x64xf32> to tensor<4x?x64xf32>
    %dos = tensor.extract_slice %do[%first, 0] [%count, 64] [1, 1]
        : tensor<?x64xf32> to tensor<?x64xf32>
    %ls = tensor.extract_slice %lse[%first] [%count] [1]
        : tensor<?xf32> to tensor<?xf32>
    %gv, %gq = attnres.backward packed(%vs : tensor<4x?x64xf32>)
        query(%q : tensor<64xf32>) grad(%dos : tensor<?x64xf32>)
        lse(%ls : tensor<?xf32>) -> tensor<4x?x64xf32>, tensor<64xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %gv into %dv[0, %first, 0] [4, %count, 64] [1, 1, 1]
          : tensor<4x?x64xf32> into tensor<4x?x64xf32>
      tensor.parallel_insert_slice %gq into %dq[%b, 0] [1, 64] [1, 1]
          : tensor<64xf32> into tensor<8x64xf32>
    }
  }
  %gq = attnres.partition_reduce sum %r#1 : tensor<8x64xf32> -> tensor<64xf32>
  return %r#0, %gq : tensor<4x?x64xf32>, tensor<64xf32>
}

// -----

// Every block's query gradient written to row 0: the blocks would race
// on it.
#first = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 7), s0)>
#count = affine_map<()[s0, s1] -> (s0 ceildiv 7, s0 - s1)>
func.func @partial_row(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>,
                       %do: tensor<?x64xf32>, %lse: tensor<?xf32>)
    -> (tensor<4x?x64xf32>, tensor<64xf32>) {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<4x?x64xf32>
  %dv0 = tensor.empty(%n) : tensor<4x?x64xf32>
  %dq0 = tensor.empty() : tensor<7x64xf32>
  %r:2 = scf.forall (%b) in (7) shared_outs(%dv = %dv0, %dq = %dq0)
      -> (tensor<4x?x64xf32>, tensor<7x64xf32>) {
    %first = affine.min #first(%b)[%n]
    %count = affine.min #count()[%n, %first]
    %vs = tensor.extract_slice %v[0, %first, 0] [4, %count, 64] [1, 1, 1]
        : tensor<4x?x64xf32> to tensor<4x?x64xf32>
    %dos = tensor.extract_slice %do[%first, 0] [%count, 64] [1, 1]
        : tensor<?x64xf32> to tensor<?x64xf32>
    %ls = tensor.extract_slice %lse[%first] [%count] [1]
        : tensor<?xf32> to tensor<?xf32>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a backward's tile writes its own row of each partial gradient: the loop must have one dimension, and its index must be the row of the tile's views of them}}
    %gv, %gq = attnres.backward packed(%vs : tensor<4x?x64xf32>)
        query(%q : tensor<64xf32>) grad(%dos : tensor<?x64xf32>)
        lse(%ls : tensor<?xf32>) -> tensor<4x?x64xf32>, tensor<64xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %gv into %dv[0, %first, 0] [4, %count, 64] [1, 1, 1]
          : tensor<4x?x64xf32> into tensor<4x?x64xf32>
      tensor.parallel_insert_slice %gq into %dq[0, 0] [1, 64] [1, 1]
          : tensor<64xf32> into tensor<7x64xf32>
    }
  }
  %gq = attnres.partition_reduce sum %r#1 : tensor<7x64xf32> -> tensor<64xf32>
  return %r#0, %gq : tensor<4x?x64xf32>, tensor<64xf32>
}

// -----

// Seven blocks writing rows of an eight-row tensor, the caller's: the sum
// adds the eighth row as the caller gave it (the IR's meaning, lowered).
// CHECK-LABEL: func.func @extra_row(
// CHECK: gpu.launch blocks
// CHECK: gpu.launch_func  @attnres_kernels::@extra_row_0_sum
#first = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 7), s0)>
#count = affine_map<()[s0, s1] -> (s0 ceildiv 7, s0 - s1)>
func.func @extra_row(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>,
                     %do: tensor<?x64xf32>, %lse: tensor<?xf32>,
                     %dq0: tensor<8x64xf32>)
    -> (tensor<4x?x64xf32>, tensor<64xf32>) {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<4x?x64xf32>
  %dv0 = tensor.empty(%n) : tensor<4x?x64xf32>
  %r:2 = scf.forall (%b) in (7) shared_outs(%dv = %dv0, %dq = %dq0)
      -> (tensor<4x?x64xf32>, tensor<8x64xf32>) {
    %first = affine.min #first(%b)[%n]
    %count = affine.min #count()[%n, %first]
    %vs = tensor.extract_slice %v[0, %first, 0] [4, %count, 64] [1, 1, 1]
        : tensor<4x?x64xf32> to tensor<4x?x64xf32>
    %dos = tensor.extract_slice %do[%first, 0] [%count, 64] [1, 1]
        : tensor<?x64xf32> to tensor<?x64xf32>
    %ls = tensor.extract_slice %lse[%first] [%count] [1]
        : tensor<?xf32> to tensor<?xf32>
    %gv, %gq = attnres.backward packed(%vs : tensor<4x?x64xf32>)
        query(%q : tensor<64xf32>) grad(%dos : tensor<?x64xf32>)
        lse(%ls : tensor<?xf32>) -> tensor<4x?x64xf32>, tensor<64xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %gv into %dv[0, %first, 0] [4, %count, 64] [1, 1, 1]
          : tensor<4x?x64xf32> into tensor<4x?x64xf32>
      tensor.parallel_insert_slice %gq into %dq[%b, 0] [1, 64] [1, 1]
          : tensor<64xf32> into tensor<8x64xf32>
    }
  }
  %gq = attnres.partition_reduce sum %r#1 : tensor<8x64xf32> -> tensor<64xf32>
  return %r#0, %gq : tensor<4x?x64xf32>, tensor<64xf32>
}

// -----

// The partial rows returned instead of summed: the caller gets the
// blocks' rows.
// CHECK-LABEL: func.func @unsummed(
// CHECK: %[[ROWS:.*]] = gpu.alloc () : memref<7x64xf32>
// CHECK: gpu.launch blocks
// CHECK-NOT: gpu.dealloc %[[ROWS]]
// CHECK: return %{{.*}}, %[[ROWS]] :
#first = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 7), s0)>
#count = affine_map<()[s0, s1] -> (s0 ceildiv 7, s0 - s1)>
func.func @unsummed(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>,
                    %do: tensor<?x64xf32>, %lse: tensor<?xf32>)
    -> (tensor<4x?x64xf32>, tensor<7x64xf32>) {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<4x?x64xf32>
  %dv0 = tensor.empty(%n) : tensor<4x?x64xf32>
  %dq0 = tensor.empty() : tensor<7x64xf32>
  %r:2 = scf.forall (%b) in (7) shared_outs(%dv = %dv0, %dq = %dq0)
      -> (tensor<4x?x64xf32>, tensor<7x64xf32>) {
    %first = affine.min #first(%b)[%n]
    %count = affine.min #count()[%n, %first]
    %vs = tensor.extract_slice %v[0, %first, 0] [4, %count, 64] [1, 1, 1]
        : tensor<4x?x64xf32> to tensor<4x?x64xf32>
    %dos = tensor.extract_slice %do[%first, 0] [%count, 64] [1, 1]
        : tensor<?x64xf32> to tensor<?x64xf32>
    %ls = tensor.extract_slice %lse[%first] [%count] [1]
        : tensor<?xf32> to tensor<?xf32>
    %gv, %gq = attnres.backward packed(%vs : tensor<4x?x64xf32>)
        query(%q : tensor<64xf32>) grad(%dos : tensor<?x64xf32>)
        lse(%ls : tensor<?xf32>) -> tensor<4x?x64xf32>, tensor<64xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %gv into %dv[0, %first, 0] [4, %count, 64] [1, 1, 1]
          : tensor<4x?x64xf32> into tensor<4x?x64xf32>
      tensor.parallel_insert_slice %gq into %dq[%b, 0] [1, 64] [1, 1]
          : tensor<64xf32> into tensor<7x64xf32>
    }
  }
  return %r#0, %r#1 : tensor<4x?x64xf32>, tensor<7x64xf32>
}

// -----

// A lse cast in the loop: the tile's thread code reads its operands where
// they are, and runs nothing else.
#first = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 7), s0)>
#count = affine_map<()[s0, s1] -> (s0 ceildiv 7, s0 - s1)>
func.func @cast_lse(%v: tensor<4x16x64xf32>, %q: tensor<64xf32>,
                     %do: tensor<16x64xf32>, %lse: tensor<3xf32>)
    -> (tensor<4x16x64xf32>, tensor<64xf32>) {
  %n = arith.constant 16 : index
  %dv0 = tensor.empty() : tensor<4x16x64xf32>
  %dq0 = tensor.empty() : tensor<7x64xf32>
  // expected-error @+1 {{convert-attnres-to-gpu: keep-host=1 runs a loop around a backward (attnres-split-reduction's) as a grid of its tiles; here its body holds 'tensor.cast', which a tile's thread code does not run (only the op, slices of tensors, sizes and index arithmetic)}}
  %r:2 = scf.forall (%b) in (7) shared_outs(%dv = %dv0, %dq = %dq0)
      -> (tensor<4x16x64xf32>, tensor<7x64xf32>) {
    %first = affine.min #first(%b)[%n]
    %count = affine.min #count()[%n, %first]
    %vs = tensor.extract_slice %v[0, %first, 0] [4, %count, 64] [1, 1, 1]
        : tensor<4x16x64xf32> to tensor<4x?x64xf32>
    %dos = tensor.extract_slice %do[%first, 0] [%count, 64] [1, 1]
        : tensor<16x64xf32> to tensor<?x64xf32>
    %ls = tensor.cast %lse : tensor<3xf32> to tensor<?xf32>
    %gv, %gq = attnres.backward packed(%vs : tensor<4x?x64xf32>)
        query(%q : tensor<64xf32>) grad(%dos : tensor<?x64xf32>)
        lse(%ls : tensor<?xf32>) -> tensor<4x?x64xf32>, tensor<64xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %gv into %dv[0, %first, 0] [4, %count, 64] [1, 1, 1]
          : tensor<4x?x64xf32> into tensor<4x16x64xf32>
      tensor.parallel_insert_slice %gq into %dq[%b, 0] [1, 64] [1, 1]
          : tensor<64xf32> into tensor<7x64xf32>
    }
  }
  %gq = attnres.partition_reduce sum %r#1 : tensor<7x64xf32> -> tensor<64xf32>
  return %r#0, %gq : tensor<4x16x64xf32>, tensor<64xf32>
}

// -----

// A lse not sliced with the other operands: each block would read the
// wrong rows. (The unused tensor.empty is erased: it has nothing to run.)
#first = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 7), s0)>
#count = affine_map<()[s0, s1] -> (s0 ceildiv 7, s0 - s1)>
func.func @whole_lse(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>,
                     %do: tensor<?x64xf32>, %lse: tensor<?xf32>)
    -> (tensor<4x?x64xf32>, tensor<64xf32>) {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<4x?x64xf32>
  %dv0 = tensor.empty(%n) : tensor<4x?x64xf32>
  %dq0 = tensor.empty() : tensor<7x64xf32>
  %r:2 = scf.forall (%b) in (7) shared_outs(%dv = %dv0, %dq = %dq0)
      -> (tensor<4x?x64xf32>, tensor<7x64xf32>) {
    %first = affine.min #first(%b)[%n]
    %count = affine.min #count()[%n, %first]
    %unused = tensor.empty(%count) : tensor<?x64xf32>
    %vs = tensor.extract_slice %v[0, %first, 0] [4, %count, 64] [1, 1, 1]
        : tensor<4x?x64xf32> to tensor<4x?x64xf32>
    %dos = tensor.extract_slice %do[%first, 0] [%count, 64] [1, 1]
        : tensor<?x64xf32> to tensor<?x64xf32>
    // expected-error @+1 {{attnres-lower-tiles-to-gpu: a tile must be consecutive rows of its buffers: lse must be views (memref.subview) of the function's buffers, a tile each}}
    %gv, %gq = attnres.backward packed(%vs : tensor<4x?x64xf32>)
        query(%q : tensor<64xf32>) grad(%dos : tensor<?x64xf32>)
        lse(%lse : tensor<?xf32>) -> tensor<4x?x64xf32>, tensor<64xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %gv into %dv[0, %first, 0] [4, %count, 64] [1, 1, 1]
          : tensor<4x?x64xf32> into tensor<4x?x64xf32>
      tensor.parallel_insert_slice %gq into %dq[%b, 0] [1, 64] [1, 1]
          : tensor<64xf32> into tensor<7x64xf32>
    }
  }
  %gq = attnres.partition_reduce sum %r#1 : tensor<7x64xf32> -> tensor<64xf32>
  return %r#0, %gq : tensor<4x?x64xf32>, tensor<64xf32>
}

// -----

// The query gradient never written out: the tile's thread code writes
// every result of the backward.
#first = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 7), s0)>
#count = affine_map<()[s0, s1] -> (s0 ceildiv 7, s0 - s1)>
func.func @dropped_result(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>,
                          %do: tensor<?x64xf32>, %lse: tensor<?xf32>)
    -> tensor<4x?x64xf32> {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<4x?x64xf32>
  %dv0 = tensor.empty(%n) : tensor<4x?x64xf32>
  // expected-error @+1 {{convert-attnres-to-gpu: keep-host=1 runs a loop around a backward (attnres-split-reduction's) as a grid of its tiles; here the loop's outputs are not its op's results, each written once}}
  %r = scf.forall (%b) in (7) shared_outs(%dv = %dv0) -> (tensor<4x?x64xf32>) {
    %first = affine.min #first(%b)[%n]
    %count = affine.min #count()[%n, %first]
    %vs = tensor.extract_slice %v[0, %first, 0] [4, %count, 64] [1, 1, 1]
        : tensor<4x?x64xf32> to tensor<4x?x64xf32>
    %dos = tensor.extract_slice %do[%first, 0] [%count, 64] [1, 1]
        : tensor<?x64xf32> to tensor<?x64xf32>
    %ls = tensor.extract_slice %lse[%first] [%count] [1]
        : tensor<?xf32> to tensor<?xf32>
    %gv, %gq = attnres.backward packed(%vs : tensor<4x?x64xf32>)
        query(%q : tensor<64xf32>) grad(%dos : tensor<?x64xf32>)
        lse(%ls : tensor<?xf32>) -> tensor<4x?x64xf32>, tensor<64xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %gv into %dv[0, %first, 0] [4, %count, 64] [1, 1, 1]
          : tensor<4x?x64xf32> into tensor<4x?x64xf32>
    }
  }
  return %r : tensor<4x?x64xf32>
}

// -----

// The loop inside another: only a function's own loops run as grids.
#first = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 7), s0)>
#count = affine_map<()[s0, s1] -> (s0 ceildiv 7, s0 - s1)>
func.func @nested(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>,
                  %do: tensor<?x64xf32>, %lse: tensor<?xf32>, %run: i1)
    -> (tensor<4x?x64xf32>, tensor<7x64xf32>) {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<4x?x64xf32>
  %dv0 = tensor.empty(%n) : tensor<4x?x64xf32>
  %dq0 = tensor.empty() : tensor<7x64xf32>
  %out:2 = scf.if %run -> (tensor<4x?x64xf32>, tensor<7x64xf32>) {
    // expected-error @+1 {{convert-attnres-to-gpu: keep-host=1 runs a loop around a backward (attnres-split-reduction's) as a grid of its tiles; here the loop is not at the top level of a function}}
    %r:2 = scf.forall (%b) in (7) shared_outs(%dv = %dv0, %dq = %dq0)
        -> (tensor<4x?x64xf32>, tensor<7x64xf32>) {
      %first = affine.min #first(%b)[%n]
      %count = affine.min #count()[%n, %first]
      %vs = tensor.extract_slice %v[0, %first, 0] [4, %count, 64] [1, 1, 1]
          : tensor<4x?x64xf32> to tensor<4x?x64xf32>
      %dos = tensor.extract_slice %do[%first, 0] [%count, 64] [1, 1]
          : tensor<?x64xf32> to tensor<?x64xf32>
      %ls = tensor.extract_slice %lse[%first] [%count] [1]
          : tensor<?xf32> to tensor<?xf32>
      %gv, %gq = attnres.backward packed(%vs : tensor<4x?x64xf32>)
          query(%q : tensor<64xf32>) grad(%dos : tensor<?x64xf32>)
          lse(%ls : tensor<?xf32>) -> tensor<4x?x64xf32>, tensor<64xf32>
      scf.forall.in_parallel {
        tensor.parallel_insert_slice %gv into %dv[0, %first, 0] [4, %count, 64] [1, 1, 1]
            : tensor<4x?x64xf32> into tensor<4x?x64xf32>
        tensor.parallel_insert_slice %gq into %dq[%b, 0] [1, 64] [1, 1]
            : tensor<64xf32> into tensor<7x64xf32>
      }
    }
    scf.yield %r#0, %r#1 : tensor<4x?x64xf32>, tensor<7x64xf32>
  } else {
    scf.yield %dv0, %dq0 : tensor<4x?x64xf32>, tensor<7x64xf32>
  }
  return %out#0, %out#1 : tensor<4x?x64xf32>, tensor<7x64xf32>
}

// -----

// attnres-split-sources' partial forwards, written out with partitions of
// 3, 2 and 2 sources: the split kernels' partition p reads sources
// [floor(7p / 3), floor(7(p + 1) / 3)), 2, 2 and 3 of them, so this merge
// is not theirs.
func.func @other_partitions(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                            %v2: tensor<?x64xbf16>, %v3: tensor<?x64xbf16>,
                            %v4: tensor<?x64xbf16>, %v5: tensor<?x64xbf16>,
                            %v6: tensor<?x64xbf16>, %q: tensor<64xbf16>)
    -> (tensor<?x64xbf16>, tensor<?xf32>) {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %v0, %c0 : tensor<?x64xbf16>
  %o0, %l0 = attnres.forward sources(%v0, %v1, %v2 : tensor<?x64xbf16>)
      query(%q : tensor<64xbf16>) save(lse) -> tensor<?x64xf32>, tensor<?xf32>
  %o1, %l1 = attnres.forward sources(%v3, %v4 : tensor<?x64xbf16>)
      query(%q : tensor<64xbf16>) save(lse) -> tensor<?x64xf32>, tensor<?xf32>
  %o2, %l2 = attnres.forward sources(%v5, %v6 : tensor<?x64xbf16>)
      query(%q : tensor<64xbf16>) save(lse) -> tensor<?x64xf32>, tensor<?xf32>
  %e0 = tensor.expand_shape %o0 [[0, 1], [2]] output_shape [1, %n, 64] : tensor<?x64xf32> into tensor<1x?x64xf32>
  %e1 = tensor.expand_shape %o1 [[0, 1], [2]] output_shape [1, %n, 64] : tensor<?x64xf32> into tensor<1x?x64xf32>
  %e2 = tensor.expand_shape %o2 [[0, 1], [2]] output_shape [1, %n, 64] : tensor<?x64xf32> into tensor<1x?x64xf32>
  %p = tensor.concat dim(0) %e0, %e1, %e2 : (tensor<1x?x64xf32>, tensor<1x?x64xf32>, tensor<1x?x64xf32>) -> tensor<3x?x64xf32>
  %f0 = tensor.expand_shape %l0 [[0, 1]] output_shape [1, %n] : tensor<?xf32> into tensor<1x?xf32>
  %f1 = tensor.expand_shape %l1 [[0, 1]] output_shape [1, %n] : tensor<?xf32> into tensor<1x?xf32>
  %f2 = tensor.expand_shape %l2 [[0, 1]] output_shape [1, %n] : tensor<?xf32> into tensor<1x?xf32>
  %l = tensor.concat dim(0) %f0, %f1, %f2 : (tensor<1x?xf32>, tensor<1x?xf32>, tensor<1x?xf32>) -> tensor<3x?xf32>
  // expected-error @+1 {{convert-attnres-to-gpu: keep-host=1 launches partial forwards and their merge as the forward split over sources, which needs the form of attnres-split-sources; here partition 0 holds sources [0, 3), not [floor(p * L / P), floor((p + 1) * L / P))}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<3x?x64xf32>
      lse(%l : tensor<3x?xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x64xbf16>, tensor<?xf32>
}

// -----

// A partial's lse returned as well: the split kernels keep the partial
// results in their workspace (or the cluster), where no caller sees them.
func.func @partial_returned(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                            %q: tensor<64xbf16>)
    -> (tensor<?x64xbf16>, tensor<?xf32>) {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %v0, %c0 : tensor<?x64xbf16>
  %o0, %l0 = attnres.forward sources(%v0 : tensor<?x64xbf16>)
      query(%q : tensor<64xbf16>) save(lse) -> tensor<?x64xf32>, tensor<?xf32>
  %o1, %l1 = attnres.forward sources(%v1 : tensor<?x64xbf16>)
      query(%q : tensor<64xbf16>) save(lse) -> tensor<?x64xf32>, tensor<?xf32>
  %e0 = tensor.expand_shape %o0 [[0, 1], [2]] output_shape [1, %n, 64] : tensor<?x64xf32> into tensor<1x?x64xf32>
  %e1 = tensor.expand_shape %o1 [[0, 1], [2]] output_shape [1, %n, 64] : tensor<?x64xf32> into tensor<1x?x64xf32>
  %p = tensor.concat dim(0) %e0, %e1 : (tensor<1x?x64xf32>, tensor<1x?x64xf32>) -> tensor<2x?x64xf32>
  %f0 = tensor.expand_shape %l0 [[0, 1]] output_shape [1, %n] : tensor<?xf32> into tensor<1x?xf32>
  %f1 = tensor.expand_shape %l1 [[0, 1]] output_shape [1, %n] : tensor<?xf32> into tensor<1x?xf32>
  %l = tensor.concat dim(0) %f0, %f1 : (tensor<1x?xf32>, tensor<1x?xf32>) -> tensor<2x?xf32>
  // expected-error @+1 {{here a partial forward's results are used besides the merge}}
  %o, %lse = attnres.partition_reduce softmax %p : tensor<2x?x64xf32>
      lse(%l : tensor<2x?xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
  return %o, %l1 : tensor<?x64xbf16>, tensor<?xf32>
}
