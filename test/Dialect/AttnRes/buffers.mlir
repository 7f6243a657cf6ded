// RUN: attnres-opt %s --split-input-file | attnres-opt --split-input-file | FileCheck %s
// RUN: attnres-opt %s --split-input-file --mlir-print-op-generic | attnres-opt --split-input-file | FileCheck %s
// RUN: attnres-opt %s --split-input-file --canonicalize --cse | FileCheck %s
// The ops on buffers (what one-shot bufferization makes of the ops on
// tensors) print and parse back, in both forms; they write their outs, so
// canonicalization keeps them though they have no results.

// CHECK-LABEL: func.func @forward_saving_lse
// CHECK: attnres.forward_into packed(%{{.*}} : memref<4x?x64xbf16>) query(%{{.*}} : memref<64xbf16>) save(lse) outs(%{{.*}}, %{{.*}} : memref<?x64xbf16>, memref<?xf32>)
func.func @forward_saving_lse(%v: memref<4x?x64xbf16>, %q: memref<64xbf16>,
                              %o: memref<?x64xbf16>, %lse: memref<?xf32>) {
  attnres.forward_into packed(%v : memref<4x?x64xbf16>)
      query(%q : memref<64xbf16>) save(lse)
      outs(%o, %lse : memref<?x64xbf16>, memref<?xf32>)
  return
}

// -----

// A tile of a buffer is a view: its rows are contiguous, at an offset, with
// the whole buffer's leading strides (the sources' and the rows').
// CHECK-LABEL: func.func @forward_on_a_tile
// CHECK: attnres.forward_into packed(%{{.*}} : memref<4x?x64xbf16, strided<[?, 64, 1], offset: ?>>) query(%{{.*}} : memref<64xbf16>) save(lse) outs(%{{.*}}, %{{.*}} : memref<?x64xbf16, strided<[64, 1], offset: ?>>, memref<?xf32, strided<[1], offset: ?>>)
func.func @forward_on_a_tile(
    %v: memref<4x?x64xbf16, strided<[?, 64, 1], offset: ?>>,
    %q: memref<64xbf16>, %o: memref<?x64xbf16, strided<[64, 1], offset: ?>>,
    %lse: memref<?xf32, strided<[1], offset: ?>>) {
  attnres.forward_into packed(%v : memref<4x?x64xbf16, strided<[?, 64, 1], offset: ?>>)
      query(%q : memref<64xbf16>) save(lse)
      outs(%o, %lse : memref<?x64xbf16, strided<[64, 1], offset: ?>>,
                      memref<?xf32, strided<[1], offset: ?>>)
  return
}

// -----

// Four outs: o, lse, o_pre and its residual, with a list of sources, both
// norms and attributes.
// CHECK-LABEL: func.func @forward_saving_residual
// CHECK: attnres.forward_into sources(%{{.*}}, %{{.*}} : memref<?x64xbf16>) query(%{{.*}} : memref<2x16xf32>) key_norm(%{{.*}} : memref<16xf32>) output_norm(%{{.*}} : memref<2x64xf32>) save(o_pre_residual) outs(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : memref<2x?x64xbf16>, memref<2x?xf32>, memref<2x?x64xbf16>, memref<2x?x32xi8>) {eps = 1.000000e-05 : f64, scale = 5.000000e-01 : f64}
func.func @forward_saving_residual(
    %a: memref<?x64xbf16>, %b: memref<?x64xbf16>, %q: memref<2x16xf32>,
    %g: memref<16xf32>, %h: memref<2x64xf32>, %o: memref<2x?x64xbf16>,
    %lse: memref<2x?xf32>, %o_pre: memref<2x?x64xbf16>,
    %r: memref<2x?x32xi8>) {
  attnres.forward_into sources(%a, %b : memref<?x64xbf16>)
      query(%q : memref<2x16xf32>) key_norm(%g : memref<16xf32>)
      output_norm(%h : memref<2x64xf32>) save(o_pre_residual)
      outs(%o, %lse, %o_pre, %r : memref<2x?x64xbf16>, memref<2x?xf32>,
           memref<2x?x64xbf16>, memref<2x?x32xi8>)
      {eps = 1.0e-05 : f64, scale = 0.5 : f64}
  return
}

// -----

// save(o_pre_residual) without an output norm: o is o_pre, the residual is
// the third buffer.
// CHECK-LABEL: func.func @forward_residual_without_norm
// CHECK: save(o_pre_residual) outs(%{{.*}}, %{{.*}}, %{{.*}} : memref<?x64xbf16>, memref<?xf32>, memref<?x32xi8>)
func.func @forward_residual_without_norm(
    %v: memref<4x?x64xbf16>, %q: memref<64xbf16>, %o: memref<?x64xbf16>,
    %lse: memref<?xf32>, %r: memref<?x32xi8>) {
  attnres.forward_into packed(%v : memref<4x?x64xbf16>)
      query(%q : memref<64xbf16>) save(o_pre_residual)
      outs(%o, %lse, %r : memref<?x64xbf16>, memref<?xf32>, memref<?x32xi8>)
  return
}

// -----

// An output norm and no key norm: its gradient follows the query's.
// CHECK-LABEL: func.func @backward_output_norm
// CHECK: attnres.backward_into packed(%{{.*}} : memref<2x?x64xbf16>) query(%{{.*}} : memref<64xf32>) output_norm(%{{.*}} : memref<64xf32>) {{.*}} outs(%{{.*}}, %{{.*}}, %{{.*}} : memref<2x?x64xbf16>, memref<64xf32>, memref<64xf32>)
func.func @backward_output_norm(%v: memref<2x?x64xbf16>, %q: memref<64xf32>,
                                %h: memref<64xf32>, %do: memref<?x64xbf16>,
                                %lse: memref<?xf32>, %dv: memref<2x?x64xbf16>,
                                %dq: memref<64xf32>, %dh: memref<64xf32>) {
  attnres.backward_into packed(%v : memref<2x?x64xbf16>)
      query(%q : memref<64xf32>) output_norm(%h : memref<64xf32>)
      grad(%do : memref<?x64xbf16>) lse(%lse : memref<?xf32>)
      outs(%dv, %dq, %dh : memref<2x?x64xbf16>, memref<64xf32>, memref<64xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @backward
// CHECK: attnres.backward_into sources(%{{.*}}, %{{.*}} : memref<?x64xbf16>) query(%{{.*}} : memref<16xf32>) key_norm(%{{.*}} : memref<16xf32>) grad(%{{.*}} : memref<?x64xbf16>) lse(%{{.*}} : memref<?xf32>) saved(%{{.*}} : memref<?x64xbf16>) outs(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : memref<?x64xbf16>, memref<?x64xbf16>, memref<16xf32>, memref<16xf32>)
func.func @backward(%a: memref<?x64xbf16>, %b: memref<?x64xbf16>,
                    %q: memref<16xf32>, %g: memref<16xf32>,
                    %do: memref<?x64xbf16>, %lse: memref<?xf32>,
                    %o: memref<?x64xbf16>, %da: memref<?x64xbf16>,
                    %db: memref<?x64xbf16>, %dq: memref<16xf32>,
                    %dg: memref<16xf32>) {
  attnres.backward_into sources(%a, %b : memref<?x64xbf16>)
      query(%q : memref<16xf32>) key_norm(%g : memref<16xf32>)
      grad(%do : memref<?x64xbf16>) lse(%lse : memref<?xf32>)
      saved(%o : memref<?x64xbf16>)
      outs(%da, %db, %dq, %dg : memref<?x64xbf16>, memref<?x64xbf16>,
           memref<16xf32>, memref<16xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @merge_with_norm
// CHECK: attnres.partition_reduce_into softmax %{{.*}} : memref<4x?x64xf32> lse(%{{.*}} : memref<4x?xf32>) output_norm(%{{.*}} : memref<64xf32>) outs(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : memref<?x64xbf16>, memref<?xf32>, memref<?x64xbf16>, memref<?x32xi8>)
func.func @merge_with_norm(%p: memref<4x?x64xf32>, %lp: memref<4x?xf32>,
                           %h: memref<64xf32>, %o: memref<?x64xbf16>,
                           %lse: memref<?xf32>, %o_pre: memref<?x64xbf16>,
                           %r: memref<?x32xi8>) {
  attnres.partition_reduce_into softmax %p : memref<4x?x64xf32>
      lse(%lp : memref<4x?xf32>) output_norm(%h : memref<64xf32>)
      outs(%o, %lse, %o_pre, %r : memref<?x64xbf16>, memref<?xf32>,
           memref<?x64xbf16>, memref<?x32xi8>)
  return
}

// -----

// Without an output norm, a third buffer of i8 is the residual.
// CHECK-LABEL: func.func @merge_saving_residual
// CHECK: outs(%{{.*}}, %{{.*}}, %{{.*}} : memref<?x64xbf16>, memref<?xf32>, memref<?x32xi8>)
func.func @merge_saving_residual(%p: memref<4x?x64xf32>, %lp: memref<4x?xf32>,
                                 %o: memref<?x64xbf16>, %lse: memref<?xf32>,
                                 %r: memref<?x32xi8>) {
  attnres.partition_reduce_into softmax %p : memref<4x?x64xf32>
      lse(%lp : memref<4x?xf32>)
      outs(%o, %lse, %r : memref<?x64xbf16>, memref<?xf32>, memref<?x32xi8>)
  return
}

// -----

// CHECK-LABEL: func.func @sum
// CHECK: attnres.partition_reduce_into sum %{{.*}} : memref<7x16xf32> outs(%{{.*}} : memref<16xbf16>)
func.func @sum(%p: memref<7x16xf32>, %s: memref<16xbf16>) {
  attnres.partition_reduce_into sum %p : memref<7x16xf32>
      outs(%s : memref<16xbf16>)
  return
}

// -----

// CHECK-LABEL: func.func @accumulating_into
// CHECK: attnres.backward_into packed(%{{.*}} : memref<2x?x64xbf16>) query(%{{.*}} : memref<16xf32>) grad(%{{.*}} : memref<?x64xbf16>) lse(%{{.*}} : memref<?xf32>) accumulate outs(%{{.*}}, %{{.*}} : memref<2x?x64xbf16>, memref<16xf32>)
func.func @accumulating_into(%v: memref<2x?x64xbf16>, %q: memref<16xf32>,
                             %do: memref<?x64xbf16>, %lse: memref<?xf32>,
                             %dv: memref<2x?x64xbf16>, %dq: memref<16xf32>) {
  attnres.backward_into packed(%v : memref<2x?x64xbf16>)
      query(%q : memref<16xf32>) grad(%do : memref<?x64xbf16>)
      lse(%lse : memref<?xf32>) accumulate
      outs(%dv, %dq : memref<2x?x64xbf16>, memref<16xf32>)
  return
}
