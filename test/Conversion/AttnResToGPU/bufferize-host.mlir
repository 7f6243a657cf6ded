// RUN: attnres-opt %s --split-input-file --verify-diagnostics --attnres-bufferize-host | FileCheck %s
// attnres-bufferize-host: the kept functions on device buffers. Arguments
// and results become plain memrefs, each attnres op its op on buffers
// writing into a gpu.alloc'ed buffer, reshapes views of the same buffer (no
// copy), and the op's attributes (the kernels convert-attnres-to-gpu names)
// stay.

// CHECK-LABEL: func.func @tokens_2d(
// CHECK-SAME: %[[V:.*]]: memref<3x4x5x32xbf16>, %[[Q:.*]]: memref<32xbf16>) -> memref<4x5x32xbf16>
// CHECK-NOT: memref.copy
// CHECK-NOT: gpu.memcpy
// CHECK: %[[FLAT:.*]] = memref.collapse_shape %[[V]] {{\[\[}}0], [1, 2], [3]] : memref<3x4x5x32xbf16> into memref<3x20x32xbf16>
// CHECK: %[[O:.*]] = gpu.alloc  () : memref<20x32xbf16>
// CHECK: %[[LSE:.*]] = gpu.alloc  () : memref<20xf32>
// CHECK: attnres.forward_into packed(%[[FLAT]] : memref<3x20x32xbf16>) query(%[[Q]] : memref<32xbf16>) save(lse) outs(%[[O]], %[[LSE]] : memref<20x32xbf16>, memref<20xf32>) {attnres.launch = {forward = "k"}}
// CHECK: %[[OUT:.*]] = memref.expand_shape %[[O]] {{\[\[}}0, 1], [2]] output_shape [4, 5, 32] : memref<20x32xbf16> into memref<4x5x32xbf16>
// The output is returned (through a view): not freed; the lse is not.
// CHECK-NOT: gpu.dealloc %[[O]]
// CHECK: gpu.dealloc %[[LSE]]
// CHECK-NOT: gpu.dealloc %[[O]]
// CHECK: return %[[OUT]]
func.func @tokens_2d(%v: tensor<3x4x5x32xbf16>, %q: tensor<32xbf16>)
    -> tensor<4x5x32xbf16> {
  %flat = tensor.collapse_shape %v [[0], [1, 2], [3]]
      : tensor<3x4x5x32xbf16> into tensor<3x20x32xbf16>
  %o, %lse = attnres.forward packed(%flat : tensor<3x20x32xbf16>)
      query(%q : tensor<32xbf16>) save(lse) {attnres.launch = {forward = "k"}}
      -> tensor<20x32xbf16>, tensor<20xf32>
  %out = tensor.expand_shape %o [[0, 1], [2]] output_shape [4, 5, 32]
      : tensor<20x32xbf16> into tensor<4x5x32xbf16>
  return %out : tensor<4x5x32xbf16>
}

// -----

// Device memory only: an op that would touch it on the host is refused, as
// by convert-attnres-to-gpu (the pass may be run on its own).
func.func @empty() -> tensor<8x64xf32> {
  // expected-error @+1 {{attnres-bufferize-host: keep-host=1 keeps every tensor in device memory, which only attnres ops, tensor.dim, reshapes, slices of consecutive rows and stacks (a tensor.concat of unit-dimension expansions) may use; 'tensor.empty' is none of them (keep-host=0 compiles the attnres ops alone)}}
  %e = tensor.empty() : tensor<8x64xf32>
  return %e : tensor<8x64xf32>
}

// -----

// A tile loop of a forward (attnres-tile's) stays a loop, on views of the
// buffers: each tile's op reads its slice of the sources in place and
// writes into its tile of the loop's outputs, with no buffer or copy of
// its own.
// CHECK-LABEL: func.func @tiles(
// CHECK-SAME: %[[V:.*]]: memref<3x?x256xbf16>, %[[Q:.*]]: memref<256xbf16>) -> (memref<?x256xbf16>, memref<?xf32>)
// CHECK: %[[O:.*]] = gpu.alloc  (%{{.*}}) : memref<?x256xbf16>
// CHECK: %[[LSE:.*]] = gpu.alloc  (%{{.*}}) : memref<?xf32>
// CHECK: scf.forall (%[[T:.*]]) = (0) to (%{{.*}}) step (40) {
// CHECK-NOT: gpu.alloc
// CHECK-NOT: gpu.memcpy
// CHECK-DAG: %[[SLICE:.*]] = memref.subview %[[V]][0, %[[T]], 0] [3, %[[ROWS:.*]], 256] [1, 1, 1] : memref<3x?x256xbf16> to memref<3x?x256xbf16, strided<[?, 256, 1], offset: ?>>
// CHECK-DAG: %[[OT:.*]] = memref.subview %[[O]][%[[T]], 0] [%[[ROWS]], 256] [1, 1] : memref<?x256xbf16> to memref<?x256xbf16, strided<[256, 1], offset: ?>>
// CHECK-DAG: %[[LSET:.*]] = memref.subview %[[LSE]][%[[T]]] [%[[ROWS]]] [1] : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
// CHECK: attnres.forward_into packed(%[[SLICE]] : {{.*}}) query(%[[Q]] : memref<256xbf16>) save(lse) outs(%[[OT]], %[[LSET]] : memref<?x256xbf16, strided<[256, 1], offset: ?>>, memref<?xf32, strided<[1], offset: ?>>)
// CHECK-NEXT: }
// CHECK: return %[[O]], %[[LSE]]
#tile = affine_map<(d0)[s0] -> (-d0 + s0, 40)>
func.func @tiles(%v: tensor<3x?x256xbf16>, %q: tensor<256xbf16>)
    -> (tensor<?x256xbf16>, tensor<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<3x?x256xbf16>
  %o0 = tensor.empty(%n) : tensor<?x256xbf16>
  %lse0 = tensor.empty(%n) : tensor<?xf32>
  %r:2 = scf.forall (%t) = (0) to (%n) step (40)
      shared_outs(%o = %o0, %lse = %lse0) -> (tensor<?x256xbf16>, tensor<?xf32>) {
    %rows = affine.min #tile(%t)[%n]
    %slice = tensor.extract_slice %v[0, %t, 0] [3, %rows, 256] [1, 1, 1]
        : tensor<3x?x256xbf16> to tensor<3x?x256xbf16>
    %ot, %lset = attnres.forward packed(%slice : tensor<3x?x256xbf16>)
        query(%q : tensor<256xbf16>) save(lse)
        -> tensor<?x256xbf16>, tensor<?xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %ot into %o[%t, 0] [%rows, 256] [1, 1]
          : tensor<?x256xbf16> into tensor<?x256xbf16>
      tensor.parallel_insert_slice %lset into %lse[%t] [%rows] [1]
          : tensor<?xf32> into tensor<?xf32>
    }
  }
  return %r#0, %r#1 : tensor<?x256xbf16>, tensor<?xf32>
}

// -----

// A tile loop's body runs on the device: nothing but the forward, slices
// and index arithmetic.
#tile = affine_map<(d0)[s0] -> (-d0 + s0, 40)>
func.func @tile_with_a_tensor(%v: tensor<3x?x256xbf16>, %q: tensor<256xbf16>)
    -> tensor<?xf32> {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<3x?x256xbf16>
  %o0 = tensor.empty(%n) : tensor<?x256xbf16>
  %lse0 = tensor.empty(%n) : tensor<?xf32>
  %r:2 = scf.forall (%t) = (0) to (%n) step (40)
      shared_outs(%o = %o0, %lse = %lse0) -> (tensor<?x256xbf16>, tensor<?xf32>) {
    %rows = affine.min #tile(%t)[%n]
    %slice = tensor.extract_slice %v[0, %t, 0] [3, %rows, 256] [1, 1, 1]
        : tensor<3x?x256xbf16> to tensor<3x?x256xbf16>
    // expected-error @+1 {{attnres-bufferize-host: keep-host=1 runs a tile loop of a forward, backward or merge as a grid of blocks, whose body may hold one attnres.forward, attnres.backward or softmax attnres.partition_reduce, slices of tensors and index arithmetic; 'tensor.empty' is none of them}}
    %scratch = tensor.empty(%rows) : tensor<?xf32>
    %ot, %lset = attnres.forward packed(%slice : tensor<3x?x256xbf16>)
        query(%q : tensor<256xbf16>) save(lse)
        -> tensor<?x256xbf16>, tensor<?xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %ot into %o[%t, 0] [%rows, 256] [1, 1]
          : tensor<?x256xbf16> into tensor<?x256xbf16>
      tensor.parallel_insert_slice %lset into %lse[%t] [%rows] [1]
          : tensor<?xf32> into tensor<?xf32>
    }
  }
  return %r#1 : tensor<?xf32>
}

// -----

// A slice whose rows are not contiguous (every other column) would be
// copied by the host into a buffer of the tile's own: refused.
#tile = affine_map<(d0)[s0] -> (-d0 + s0, 40)>
func.func @tile_of_strided_columns(%v: tensor<3x?x256xbf16>,
                                   %q: tensor<128xbf16>)
    -> (tensor<?x128xbf16>, tensor<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<3x?x256xbf16>
  %o0 = tensor.empty(%n) : tensor<?x128xbf16>
  %lse0 = tensor.empty(%n) : tensor<?xf32>
  %r:2 = scf.forall (%t) = (0) to (%n) step (40)
      shared_outs(%o = %o0, %lse = %lse0) -> (tensor<?x128xbf16>, tensor<?xf32>) {
    %rows = affine.min #tile(%t)[%n]
    %slice = tensor.extract_slice %v[0, %t, 0] [3, %rows, 128] [1, 1, 2]
        : tensor<3x?x256xbf16> to tensor<3x?x128xbf16>
    // expected-error @+1 {{attnres-bufferize-host: the tile loop's op reads or writes a buffer of its own, a copy bufferization makes, rather than views of the loop's buffers (an output read in the loop, say, or a slice whose rows are not contiguous)}}
    %ot, %lset = attnres.forward packed(%slice : tensor<3x?x128xbf16>)
        query(%q : tensor<128xbf16>) save(lse)
        -> tensor<?x128xbf16>, tensor<?xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %ot into %o[%t, 0] [%rows, 128] [1, 1]
          : tensor<?x128xbf16> into tensor<?x128xbf16>
      tensor.parallel_insert_slice %lset into %lse[%t] [%rows] [1]
          : tensor<?xf32> into tensor<?xf32>
    }
  }
  return %r#0, %r#1 : tensor<?x128xbf16>, tensor<?xf32>
}

// -----

// attnres-split-sources' stacking (a tensor.concat of unit-dimension
// expansions of the partial results) becomes one buffer per stack that each
// partial forward writes its slice of, made before the first partial (its
// sizes the op's result sizes), and is freed at the end of the function:
// nothing is copied, and the merge reads the stacks.
// CHECK-LABEL: func.func @stack_whole(
// CHECK-SAME: %[[V:.*]]: memref<4x?x64xbf16>, %[[W:.*]]: memref<4x?x64xbf16>, %[[Q:.*]]: memref<64xbf16>)
// CHECK-NOT: gpu.memcpy
// CHECK: %[[N:.*]] = memref.dim %[[V]], %c1
// CHECK: %[[OS:.*]] = gpu.alloc  (%[[N]]) : memref<2x?x64xf32>
// CHECK: %[[M:.*]] = memref.dim %[[V]], %c1
// CHECK: %[[LS:.*]] = gpu.alloc  (%[[M]]) : memref<2x?xf32>
// CHECK: %[[O0:.*]] = memref.subview %[[OS]][0, 0, 0] [1, %[[N]], 64] [1, 1, 1] : memref<2x?x64xf32> to memref<?x64xf32, strided<[64, 1]>>
// CHECK: %[[L0:.*]] = memref.subview %[[LS]][0, 0] [1, %[[M]]] [1, 1] : memref<2x?xf32> to memref<?xf32, strided<[1]>>
// CHECK: attnres.forward_into packed(%[[V]] : memref<4x?x64xbf16>) query(%[[Q]] : memref<64xbf16>) save(lse) outs(%[[O0]], %[[L0]] :
// CHECK: %[[O1:.*]] = memref.subview %[[OS]][1, 0, 0] [1, %[[N]], 64] [1, 1, 1] : memref<2x?x64xf32> to memref<?x64xf32, strided<[64, 1], offset: ?>>
// CHECK: %[[L1:.*]] = memref.subview %[[LS]][1, 0] [1, %[[M]]] [1, 1] : memref<2x?xf32> to memref<?xf32, strided<[1], offset: ?>>
// CHECK: attnres.forward_into packed(%[[W]] : memref<4x?x64xbf16>) query(%[[Q]] : memref<64xbf16>) save(lse) outs(%[[O1]], %[[L1]] :
// CHECK: attnres.partition_reduce_into softmax %[[OS]] : memref<2x?x64xf32> lse(%[[LS]] : memref<2x?xf32>)
// CHECK-NOT: gpu.memcpy
// CHECK: gpu.dealloc  %[[OS]]
// CHECK: gpu.dealloc  %[[LS]]
// CHECK: return
func.func @stack_whole(%v: tensor<4x?x64xbf16>, %w: tensor<4x?x64xbf16>,
                       %q: tensor<64xbf16>) -> tensor<?x64xbf16> {
  %c0 = arith.constant 0 : index
  %o0, %l0 = attnres.forward packed(%v : tensor<4x?x64xbf16>)
      query(%q : tensor<64xbf16>) save(lse) -> tensor<?x64xf32>, tensor<?xf32>
  %o1, %l1 = attnres.forward packed(%w : tensor<4x?x64xbf16>)
      query(%q : tensor<64xbf16>) save(lse) -> tensor<?x64xf32>, tensor<?xf32>
  %n0 = tensor.dim %o0, %c0 : tensor<?x64xf32>
  %n1 = tensor.dim %o1, %c0 : tensor<?x64xf32>
  %e0 = tensor.expand_shape %o0 [[0, 1], [2]] output_shape [1, %n0, 64]
      : tensor<?x64xf32> into tensor<1x?x64xf32>
  %e1 = tensor.expand_shape %o1 [[0, 1], [2]] output_shape [1, %n1, 64]
      : tensor<?x64xf32> into tensor<1x?x64xf32>
  %os = tensor.concat dim(0) %e0, %e1
      : (tensor<1x?x64xf32>, tensor<1x?x64xf32>) -> tensor<2x?x64xf32>
  %f0 = tensor.expand_shape %l0 [[0, 1]] output_shape [1, %n0]
      : tensor<?xf32> into tensor<1x?xf32>
  %f1 = tensor.expand_shape %l1 [[0, 1]] output_shape [1, %n1]
      : tensor<?xf32> into tensor<1x?xf32>
  %ls = tensor.concat dim(0) %f0, %f1
      : (tensor<1x?xf32>, tensor<1x?xf32>) -> tensor<2x?xf32>
  %o, %lse = attnres.partition_reduce softmax %os : tensor<2x?x64xf32>
      lse(%ls : tensor<2x?xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
  return %o : tensor<?x64xbf16>
}

// -----

// A stack of the caller's tensors would need copies into views of the
// stack; upstream's gpu.memcpy lowering addresses a target from its
// allocation's start, which is right for slice 0 alone: refused at slice 1.
func.func @stack_arguments(%a: tensor<?x64xf32>, %b: tensor<?x64xf32>,
                           %la: tensor<?xf32>, %lb: tensor<?xf32>)
    -> tensor<?x64xbf16> {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %a, %c0 : tensor<?x64xf32>
  %e0 = tensor.expand_shape %a [[0, 1], [2]] output_shape [1, %n, 64]
      : tensor<?x64xf32> into tensor<1x?x64xf32>
  %e1 = tensor.expand_shape %b [[0, 1], [2]] output_shape [1, %n, 64]
      : tensor<?x64xf32> into tensor<1x?x64xf32>
  %os = tensor.concat dim(0) %e0, %e1
      : (tensor<1x?x64xf32>, tensor<1x?x64xf32>) -> tensor<2x?x64xf32>
  %f0 = tensor.expand_shape %la [[0, 1]] output_shape [1, %n]
      : tensor<?xf32> into tensor<1x?xf32>
  %f1 = tensor.expand_shape %lb [[0, 1]] output_shape [1, %n]
      : tensor<?xf32> into tensor<1x?xf32>
  // expected-error @+1 {{attnres-bufferize-host: keep-host=1 copies whole device buffers only; here a copy into or out of a view remains (a piece of a stack that its op cannot write in place: an argument of the function, a result also used besides the stack; or a slice of a buffer that is returned)}}
  %ls = tensor.concat dim(0) %f0, %f1
      : (tensor<1x?xf32>, tensor<1x?xf32>) -> tensor<2x?xf32>
  %o, %lse = attnres.partition_reduce softmax %os : tensor<2x?x64xf32>
      lse(%ls : tensor<2x?xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
  return %o : tensor<?x64xbf16>
}

// -----

// Pieces of other static sizes than the stack's (the concat's type): the
// dynamic piece is cast to them and copied (into slice 0, which
// gpu.memcpy addresses right), the static one written in place.
// CHECK-LABEL: func.func @stack_mixed_shapes(
// CHECK: %[[OS:.*]] = gpu.alloc  () : memref<2x8x64xf32>
// CHECK: %[[S0:.*]] = memref.subview %[[OS]][0, 0, 0] [1, 8, 64] [1, 1, 1]
// CHECK: gpu.memcpy  %[[S0]], %{{.*}} : memref<8x64xf32, strided<[64, 1]>>, memref<8x64xf32>
// CHECK: %[[S1:.*]] = memref.subview %[[OS]][1, 0, 0] [1, 8, 64] [1, 1, 1]
// CHECK: attnres.forward_into packed(%arg1 : memref<4x8x64xbf16>) query(%arg2 : memref<64xbf16>) save(lse) outs(%[[S1]],
// CHECK: attnres.partition_reduce_into softmax %[[OS]]
func.func @stack_mixed_shapes(%v: tensor<4x?x64xbf16>, %w: tensor<4x8x64xbf16>,
                              %q: tensor<64xbf16>) -> tensor<8x64xbf16> {
  %c0 = arith.constant 0 : index
  %o0, %l0 = attnres.forward packed(%v : tensor<4x?x64xbf16>)
      query(%q : tensor<64xbf16>) save(lse) -> tensor<?x64xf32>, tensor<?xf32>
  %o1, %l1 = attnres.forward packed(%w : tensor<4x8x64xbf16>)
      query(%q : tensor<64xbf16>) save(lse) -> tensor<8x64xf32>, tensor<8xf32>
  %n0 = tensor.dim %o0, %c0 : tensor<?x64xf32>
  %e0 = tensor.expand_shape %o0 [[0, 1], [2]] output_shape [1, %n0, 64]
      : tensor<?x64xf32> into tensor<1x?x64xf32>
  %e1 = tensor.expand_shape %o1 [[0, 1], [2]] output_shape [1, 8, 64]
      : tensor<8x64xf32> into tensor<1x8x64xf32>
  %os = tensor.concat dim(0) %e0, %e1
      : (tensor<1x?x64xf32>, tensor<1x8x64xf32>) -> tensor<2x8x64xf32>
  %f0 = tensor.expand_shape %l0 [[0, 1]] output_shape [1, %n0]
      : tensor<?xf32> into tensor<1x?xf32>
  %f1 = tensor.expand_shape %l1 [[0, 1]] output_shape [1, 8]
      : tensor<8xf32> into tensor<1x8xf32>
  %ls = tensor.concat dim(0) %f0, %f1
      : (tensor<1x?xf32>, tensor<1x8xf32>) -> tensor<2x8xf32>
  %o, %lse = attnres.partition_reduce softmax %os : tensor<2x8x64xf32>
      lse(%ls : tensor<2x8xf32>) -> tensor<8x64xbf16>, tensor<8xf32>
  return %o : tensor<8x64xbf16>
}

// -----

// Two tile loops whose outputs CSE made one tensor.empty: each still gets
// its own slice of the stack, and writes it in place. (The second loop
// slices its packed sources' partition, rows 2 and 3 of the four, a view
// its tiles are views of.)
// CHECK-LABEL: func.func @stack_shared_empty(
// CHECK-NOT: gpu.memcpy
// CHECK: %[[OS:.*]] = gpu.alloc  (%{{.*}}) : memref<2x?x64xf32>
// CHECK: memref.subview %[[OS]][0, 0, 0]
// CHECK: scf.forall
// CHECK: attnres.forward_into
// CHECK: %[[HALF:.*]] = memref.subview %arg0[2, 0, 0] [2, %{{.*}}, 64] [1, 1, 1]
// CHECK: memref.subview %[[OS]][1, 0, 0]
// CHECK: scf.forall
// CHECK: memref.subview %[[HALF]][0, %{{.*}}, 0]
// CHECK: attnres.forward_into
// CHECK-NOT: gpu.memcpy
// CHECK: return
#tile = affine_map<(d0)[s0] -> (8, s0 - d0)>
func.func @stack_shared_empty(%v: tensor<4x?x64xbf16>, %q: tensor<64xbf16>)
    -> tensor<2x?x64xf32> {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<4x?x64xbf16>
  %low = tensor.extract_slice %v[0, 0, 0] [2, %n, 64] [1, 1, 1]
      : tensor<4x?x64xbf16> to tensor<2x?x64xbf16>
  %out = tensor.empty(%n) : tensor<?x64xf32>
  %lout = tensor.empty(%n) : tensor<?xf32>
  %r0:2 = scf.forall (%t) = (0) to (%n) step (8)
      shared_outs(%o = %out, %l = %lout) -> (tensor<?x64xf32>, tensor<?xf32>) {
    %size = affine.min #tile(%t)[%n]
    %vs = tensor.extract_slice %low[0, %t, 0] [2, %size, 64] [1, 1, 1]
        : tensor<2x?x64xbf16> to tensor<2x?x64xbf16>
    %ot, %lt = attnres.forward packed(%vs : tensor<2x?x64xbf16>)
        query(%q : tensor<64xbf16>) save(lse) -> tensor<?x64xf32>, tensor<?xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %ot into %o[%t, 0] [%size, 64] [1, 1]
          : tensor<?x64xf32> into tensor<?x64xf32>
      tensor.parallel_insert_slice %lt into %l[%t] [%size] [1]
          : tensor<?xf32> into tensor<?xf32>
    }
  }
  %high = tensor.extract_slice %v[2, 0, 0] [2, %n, 64] [1, 1, 1]
      : tensor<4x?x64xbf16> to tensor<2x?x64xbf16>
  %r1:2 = scf.forall (%t) = (0) to (%n) step (8)
      shared_outs(%o = %out, %l = %lout) -> (tensor<?x64xf32>, tensor<?xf32>) {
    %size = affine.min #tile(%t)[%n]
    %vs = tensor.extract_slice %high[0, %t, 0] [2, %size, 64] [1, 1, 1]
        : tensor<2x?x64xbf16> to tensor<2x?x64xbf16>
    %ot, %lt = attnres.forward packed(%vs : tensor<2x?x64xbf16>)
        query(%q : tensor<64xbf16>) save(lse) -> tensor<?x64xf32>, tensor<?xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %ot into %o[%t, 0] [%size, 64] [1, 1]
          : tensor<?x64xf32> into tensor<?x64xf32>
      tensor.parallel_insert_slice %lt into %l[%t] [%size] [1]
          : tensor<?xf32> into tensor<?xf32>
    }
  }
  %e0 = tensor.expand_shape %r0#0 [[0, 1], [2]] output_shape [1, %n, 64]
      : tensor<?x64xf32> into tensor<1x?x64xf32>
  %e1 = tensor.expand_shape %r1#0 [[0, 1], [2]] output_shape [1, %n, 64]
      : tensor<?x64xf32> into tensor<1x?x64xf32>
  %os = tensor.concat dim(0) %e0, %e1
      : (tensor<1x?x64xf32>, tensor<1x?x64xf32>) -> tensor<2x?x64xf32>
  return %os : tensor<2x?x64xf32>
}

// -----

// A concatenation that is not a stack (along tokens) would be copied on
// the host's orders piece by piece: refused, as other tensor ops are.
func.func @concat_tokens(%a: tensor<?x64xf32>, %b: tensor<?x64xf32>)
    -> tensor<?x64xf32> {
  // expected-error @+1 {{attnres-bufferize-host: keep-host=1 keeps every tensor in device memory, which only attnres ops, tensor.dim, reshapes, slices of consecutive rows and stacks (a tensor.concat of unit-dimension expansions) may use; 'tensor.concat' is none of them (keep-host=0 compiles the attnres ops alone)}}
  %ab = tensor.concat dim(0) %a, %b
      : (tensor<?x64xf32>, tensor<?x64xf32>) -> tensor<?x64xf32>
  return %ab : tensor<?x64xf32>
}

// -----

// A slice of consecutive rows is a view; returned, it would be copied into
// a buffer of its own from a view: refused.
func.func @returned_slice(%v: tensor<4x?x64xbf16>) -> tensor<2x?x64xbf16> {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<4x?x64xbf16>
  // expected-error @+1 {{attnres-bufferize-host: keep-host=1 copies whole device buffers only}}
  %half = tensor.extract_slice %v[1, 0, 0] [2, %n, 64] [1, 1, 1]
      : tensor<4x?x64xbf16> to tensor<2x?x64xbf16>
  return %half : tensor<2x?x64xbf16>
}

// -----

// Whole partial forwards of packed sources read their partitions in place
// (views of consecutive rows, addressed from their offsets by
// attnres-launch-kernels), not copies bufferization makes of them.
// CHECK-LABEL: func.func @partitions_in_place(
// CHECK-NOT: gpu.memcpy
// CHECK: %[[LOW:.*]] = memref.subview %arg0[0, 0, 0] [2, %{{.*}}, 64] [1, 1, 1]
// CHECK: %[[HIGH:.*]] = memref.subview %arg0[2, 0, 0] [2, %{{.*}}, 64] [1, 1, 1] : memref<4x?x64xbf16> to memref<2x?x64xbf16, strided<[?, 64, 1], offset: ?>>
// CHECK: attnres.forward_into packed(%{{.*}} : memref<2x?x64xbf16>)
// CHECK: attnres.forward_into packed(%[[HIGH]] : memref<2x?x64xbf16, strided<[?, 64, 1], offset: ?>>)
// CHECK-NOT: gpu.memcpy
// CHECK: return
func.func @partitions_in_place(%v: tensor<4x?x64xbf16>, %q: tensor<64xbf16>)
    -> (tensor<?x64xf32>, tensor<?x64xf32>) {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<4x?x64xbf16>
  %low = tensor.extract_slice %v[0, 0, 0] [2, %n, 64] [1, 1, 1]
      : tensor<4x?x64xbf16> to tensor<2x?x64xbf16>
  %high = tensor.extract_slice %v[2, 0, 0] [2, %n, 64] [1, 1, 1]
      : tensor<4x?x64xbf16> to tensor<2x?x64xbf16>
  %o0, %l0 = attnres.forward packed(%low : tensor<2x?x64xbf16>)
      query(%q : tensor<64xbf16>) save(lse) -> tensor<?x64xf32>, tensor<?xf32>
  %o1, %l1 = attnres.forward packed(%high : tensor<2x?x64xbf16>)
      query(%q : tensor<64xbf16>) save(lse) -> tensor<?x64xf32>, tensor<?xf32>
  return %o0, %o1 : tensor<?x64xf32>, tensor<?x64xf32>
}

// -----

// An accumulating backward adds into the buffer of the gradient it is given,
// here the caller's argument, in place (that is what accumulating is for:
// one gradient buffer for every reader of the sources), and returns it; only
// the query's gradient gets a new buffer.
// CHECK-LABEL: func.func @accumulating(
// CHECK-SAME: %[[V:[a-z0-9]+]]: memref<3x?x64xbf16>, {{.*}}, %[[ACC:[a-z0-9]+]]: memref<3x?x64xbf16>) -> (memref<3x?x64xbf16>, memref<16xf32>)
// CHECK-NOT: memref.copy
// CHECK-NOT: gpu.memcpy
// CHECK: %[[DQ:.*]] = gpu.alloc  () : memref<16xf32>
// CHECK: attnres.backward_into packed(%[[V]] : memref<3x?x64xbf16>) {{.*}} accumulate outs(%[[ACC]], %[[DQ]] : memref<3x?x64xbf16>, memref<16xf32>)
// CHECK: return %[[ACC]], %[[DQ]]
func.func @accumulating(%v: tensor<3x?x64xbf16>, %q: tensor<16xf32>,
                        %do: tensor<?x64xbf16>, %lse: tensor<?xf32>,
                        %o: tensor<?x64xbf16>, %acc: tensor<3x?x64xbf16>)
    -> (tensor<3x?x64xbf16>, tensor<16xf32>) {
  %dv, %dq = attnres.backward packed(%v : tensor<3x?x64xbf16>)
      query(%q : tensor<16xf32>) grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<?xf32>)
      saved(%o : tensor<?x64xbf16>) accumulate(%acc : tensor<3x?x64xbf16>)
      -> tensor<3x?x64xbf16>, tensor<16xf32>
  return %dv, %dq : tensor<3x?x64xbf16>, tensor<16xf32>
}
