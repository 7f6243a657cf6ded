// RUN: attnres-opt %s --split-input-file --verify-diagnostics \
// RUN:   --convert-attnres-to-gpu="keep-host=1" | FileCheck %s

// attnres-split-reduction's loops, written out: under keep-host a loop over
// B blocks of tokens whose body is one backward on the tokens of block b
// (min(b * ceil(N / B), N), min(ceil(N / B), N - first) of them), with its
// partial gradients summed after the loop, is launched as the backward
// kernel on B blocks and its finalize.

// Five blocks of ceil(16 / 5) = 4 tokens (the last one empty), written
// with the bounds composed differently from the pass (one affine.apply for
// the chunk, results in the other order).
// CHECK-LABEL: func.func @five_blocks(
// CHECK-NOT: scf.forall
// CHECK: gpu.launch_func  @attnres_kernels::@five_blocks_0_backward blocks in ({{.*}}) threads in ({{.*}}) args({{.*}}, %c5_i64{{.*}} : i64, %{{.*}} : i64)
// CHECK: gpu.launch_func  @attnres_kernels::@five_blocks_0_finalize
// CHECK-NOT: _sum
// CHECK: return
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
  }
  %gq = attnres.partition_reduce sum %r#1 : tensor<5x64xf32> -> tensor<64xf32>
  return %r#0, %gq : tensor<4x16x64xf32>, tensor<64xf32>
}

// -----

// Blocks of ceil(N / 7) tokens in a loop of 8: the last block's tokens
// would be another's, and the kernel's block 7 would cover none.
#first = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 7), s0)>
#count = affine_map<()[s0, s1] -> (s0 ceildiv 7, s0 - s1)>
func.func @wrong_chunk(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>,
                       %do: tensor<?x64xf32>, %lse: tensor<?xf32>)
    -> (tensor<4x?x64xf32>, tensor<64xf32>) {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<4x?x64xf32>
  %dv0 = tensor.empty(%n) : tensor<4x?x64xf32>
  %dq0 = tensor.empty() : tensor<8x64xf32>
  // expected-error @+1 {{convert-attnres-to-gpu: keep-host=1 launches an scf.forall around a backward as the backward kernel's blocks, which needs the form of attnres-split-reduction; here the block's first token is not the rule's (min(b * ceil(N / B), N) and min(ceil(N / B), N - first))}}
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

// Every block's query gradient written to row 0: not the kernel's partial
// rows.
#first = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 7), s0)>
#count = affine_map<()[s0, s1] -> (s0 ceildiv 7, s0 - s1)>
func.func @partial_row(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>,
                       %do: tensor<?x64xf32>, %lse: tensor<?xf32>)
    -> (tensor<4x?x64xf32>, tensor<64xf32>) {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<4x?x64xf32>
  %dv0 = tensor.empty(%n) : tensor<4x?x64xf32>
  %dq0 = tensor.empty() : tensor<7x64xf32>
  // expected-error @+1 {{here result 1 of the backward is not inserted at its block's place}}
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
      tensor.parallel_insert_slice %gq into %dq[0, 0] [1, 64] [1, 1]
          : tensor<64xf32> into tensor<7x64xf32>
    }
  }
  %gq = attnres.partition_reduce sum %r#1 : tensor<7x64xf32> -> tensor<64xf32>
  return %r#0, %gq : tensor<4x?x64xf32>, tensor<64xf32>
}

// -----

// The partial rows returned instead of summed: the kernel keeps them in its
// workspace.
#first = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 7), s0)>
#count = affine_map<()[s0, s1] -> (s0 ceildiv 7, s0 - s1)>
func.func @unsummed(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>,
                    %do: tensor<?x64xf32>, %lse: tensor<?xf32>)
    -> (tensor<4x?x64xf32>, tensor<7x64xf32>) {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<4x?x64xf32>
  %dv0 = tensor.empty(%n) : tensor<4x?x64xf32>
  %dq0 = tensor.empty() : tensor<7x64xf32>
  // expected-error @+1 {{here the partial gradients of result 1 are not summed by one partition_reduce sum}}
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

// A lse not sliced with the other operands: each block would read the
// wrong rows.
#first = affine_map<(d0)[s0] -> (d0 * (s0 ceildiv 7), s0)>
#count = affine_map<()[s0, s1] -> (s0 ceildiv 7, s0 - s1)>
func.func @whole_lse(%v: tensor<4x16x64xf32>, %q: tensor<64xf32>,
                     %do: tensor<16x64xf32>, %lse: tensor<3xf32>)
    -> (tensor<4x16x64xf32>, tensor<64xf32>) {
  %n = arith.constant 16 : index
  %dv0 = tensor.empty() : tensor<4x16x64xf32>
  %dq0 = tensor.empty() : tensor<7x64xf32>
  // expected-error @+1 {{here the backward's lse is not a slice of a tensor defined outside the loop}}
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
