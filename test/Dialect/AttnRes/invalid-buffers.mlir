// RUN: attnres-opt %s --split-input-file --verify-diagnostics
// The ops on buffers: their own rules (contiguous rows, no buffer written
// that the op also reads or writes elsewhere, the outs a result each), and
// the rules of the ops on tensors, which they share.

func.func @source_rows_apart(%v: memref<4x?x64xbf16, strided<[?, 128, 2]>>,
                             %q: memref<64xbf16>, %o: memref<?x64xbf16>,
                             %lse: memref<?xf32>) {
  // expected-error @+1 {{takes buffers whose rows are contiguous (a strided layout with stride 1 in the last dimension); operand #0 is 'memref<4x?x64xbf16, strided<[?, 128, 2]>>'}}
  attnres.forward_into packed(%v : memref<4x?x64xbf16, strided<[?, 128, 2]>>)
      query(%q : memref<64xbf16>) save(lse)
      outs(%o, %lse : memref<?x64xbf16>, memref<?xf32>)
  return
}

// -----

// A layout that is no strided layout (a modulo of the index) is refused
// with the same rule.
func.func @source_not_strided(
    %v: memref<4x8x64xbf16, affine_map<(l, n, d) -> (l, n mod 4, d)>>,
    %q: memref<64xbf16>, %o: memref<8x64xbf16>, %lse: memref<8xf32>) {
  // expected-error @+1 {{takes buffers whose rows are contiguous (a strided layout with stride 1 in the last dimension); operand #0 is 'memref<4x8x64xbf16, affine_map<(d0, d1, d2) -> (d0, d1 mod 4, d2)>>'}}
  attnres.forward_into
      packed(%v : memref<4x8x64xbf16, affine_map<(l, n, d) -> (l, n mod 4, d)>>)
      query(%q : memref<64xbf16>) save(lse)
      outs(%o, %lse : memref<8x64xbf16>, memref<8xf32>)
  return
}

// -----

func.func @forward_without_lse(%v: memref<4x?x64xbf16>, %q: memref<64xbf16>,
                               %o: memref<?x64xbf16>) {
  // expected-error @+1 {{writes 2 buffers (o, lse), but outs has 1}}
  attnres.forward_into packed(%v : memref<4x?x64xbf16>)
      query(%q : memref<64xbf16>) save(lse) outs(%o : memref<?x64xbf16>)
  return
}

// -----

func.func @forward_without_o_pre(%v: memref<4x?x64xbf16>, %q: memref<64xbf16>,
                                 %h: memref<64xf32>, %o: memref<?x64xbf16>,
                                 %lse: memref<?xf32>) {
  // expected-error @+1 {{writes 3 buffers (o, lse, o_pre), but outs has 2}}
  attnres.forward_into packed(%v : memref<4x?x64xbf16>)
      query(%q : memref<64xbf16>) output_norm(%h : memref<64xf32>)
      outs(%o, %lse : memref<?x64xbf16>, memref<?xf32>)
  return
}

// -----

func.func @forward_without_residual(%v: memref<4x?x64xbf16>, %q: memref<64xbf16>,
                                    %o: memref<?x64xbf16>, %lse: memref<?xf32>) {
  // expected-error @+1 {{writes 3 buffers (o, lse, the o_pre residual), but outs has 2}}
  attnres.forward_into packed(%v : memref<4x?x64xbf16>)
      query(%q : memref<64xbf16>) save(o_pre_residual)
      outs(%o, %lse : memref<?x64xbf16>, memref<?xf32>)
  return
}

// -----

// The tensor op's rules: here lse's element type.
func.func @forward_lse_not_f32(%v: memref<4x?x64xbf16>, %q: memref<64xbf16>,
                               %o: memref<?x64xbf16>, %lse: memref<?xbf16>) {
  // expected-error @+1 {{lse must have element type 'f32', got 'memref<?xbf16>'}}
  attnres.forward_into packed(%v : memref<4x?x64xbf16>)
      query(%q : memref<64xbf16>) save(lse)
      outs(%o, %lse : memref<?x64xbf16>, memref<?xbf16>)
  return
}

// -----

func.func @backward_without_key_norm_gradient(
    %v: memref<2x?x64xbf16>, %q: memref<16xf32>, %g: memref<16xf32>,
    %do: memref<?x64xbf16>, %lse: memref<?xf32>, %dv: memref<2x?x64xbf16>,
    %dq: memref<16xf32>) {
  // expected-error @+1 {{writes 3 buffers (a gradient per source operand, the query's, the key_norm weight's), but outs has 2}}
  attnres.backward_into packed(%v : memref<2x?x64xbf16>)
      query(%q : memref<16xf32>) key_norm(%g : memref<16xf32>)
      grad(%do : memref<?x64xbf16>) lse(%lse : memref<?xf32>)
      outs(%dv, %dq : memref<2x?x64xbf16>, memref<16xf32>)
  return
}

// -----

func.func @backward_gradient_of_another_shape(
    %v: memref<2x?x64xbf16>, %q: memref<16xf32>, %do: memref<?x64xbf16>,
    %lse: memref<?xf32>, %dv: memref<2x?x32xbf16>, %dq: memref<16xf32>) {
  // expected-error @+1 {{source gradient #0 must have the type of source #0 'memref<2x?x64xbf16>', got 'memref<2x?x32xbf16>'}}
  attnres.backward_into packed(%v : memref<2x?x64xbf16>)
      query(%q : memref<16xf32>) grad(%do : memref<?x64xbf16>)
      lse(%lse : memref<?xf32>)
      outs(%dv, %dq : memref<2x?x32xbf16>, memref<16xf32>)
  return
}

// -----

func.func @sum_of_two(%p: memref<7x16xf32>, %a: memref<16xf32>,
                      %b: memref<16xf32>) {
  // expected-error @+1 {{writes 1 buffer (the sum), but outs has 2}}
  attnres.partition_reduce_into sum %p : memref<7x16xf32>
      outs(%a, %b : memref<16xf32>, memref<16xf32>)
  return
}

// -----

func.func @merge_without_lse(%p: memref<4x?x64xf32>, %lp: memref<4x?xf32>,
                             %o: memref<?x64xbf16>) {
  // expected-error @+1 {{writes the merged output, the merged lse and optionally o_pre and its residual (2 to 4 buffers), but outs has 1}}
  attnres.partition_reduce_into softmax %p : memref<4x?x64xf32>
      lse(%lp : memref<4x?xf32>) outs(%o : memref<?x64xbf16>)
  return
}

// -----

func.func @merge_o_pre_without_norm(%p: memref<4x?x64xf32>, %lp: memref<4x?xf32>,
                                    %o: memref<?x64xbf16>, %lse: memref<?xf32>,
                                    %o_pre: memref<?x64xbf16>) {
  // expected-error @+1 {{o_pre is a buffer in outs only with an output_norm(...) operand (without one the output is o_pre)}}
  attnres.partition_reduce_into softmax %p : memref<4x?x64xf32>
      lse(%lp : memref<4x?xf32>)
      outs(%o, %lse, %o_pre : memref<?x64xbf16>, memref<?xf32>, memref<?x64xbf16>)
  return
}

// -----

// A gradient written over the sources it is computed from.
func.func @backward_into_its_sources(
    %v: memref<2x?x64xbf16>, %q: memref<16xf32>, %do: memref<?x64xbf16>,
    %lse: memref<?xf32>, %dq: memref<16xf32>) {
  // expected-error @+1 {{writes outs #0, which is also its operand #0: a buffer it writes must be no other buffer of the op}}
  attnres.backward_into packed(%v : memref<2x?x64xbf16>)
      query(%q : memref<16xf32>) grad(%do : memref<?x64xbf16>)
      lse(%lse : memref<?xf32>)
      outs(%v, %dq : memref<2x?x64xbf16>, memref<16xf32>)
  return
}

// -----

// o_pre written into o's buffer.
func.func @forward_o_pre_into_o(%v: memref<4x?x64xbf16>, %q: memref<64xbf16>,
                                %h: memref<64xf32>, %o: memref<?x64xbf16>,
                                %lse: memref<?xf32>) {
  // expected-error @+1 {{writes outs #0, which is also its outs #2: a buffer it writes must be no other buffer of the op}}
  attnres.forward_into packed(%v : memref<4x?x64xbf16>)
      query(%q : memref<64xbf16>) output_norm(%h : memref<64xf32>)
      outs(%o, %lse, %o : memref<?x64xbf16>, memref<?xf32>, memref<?x64xbf16>)
  return
}

// -----

func.func @backward_strided_gradient(
    %v: memref<2x?x64xbf16>, %q: memref<16xf32>, %do: memref<?x64xbf16>,
    %lse: memref<?xf32>, %dv: memref<2x?x64xbf16, strided<[?, 64, 3]>>,
    %dq: memref<16xf32>) {
  // expected-error @+1 {{takes buffers whose rows are contiguous (a strided layout with stride 1 in the last dimension); outs #0 is 'memref<2x?x64xbf16, strided<[?, 64, 3]>>'}}
  attnres.backward_into packed(%v : memref<2x?x64xbf16>)
      query(%q : memref<16xf32>) grad(%do : memref<?x64xbf16>)
      lse(%lse : memref<?xf32>)
      outs(%dv, %dq : memref<2x?x64xbf16, strided<[?, 64, 3]>>, memref<16xf32>)
  return
}

// -----

func.func @sum_of_nothing(%p: memref<7x16xf32>) {
  // expected-error @+1 {{writes 1 buffer (the sum), but outs has 0}}
  "attnres.partition_reduce_into"(%p) <{kind = 1 : i32, operandSegmentSizes = array<i32: 1, 0, 0, 0, 0>}> : (memref<7x16xf32>) -> ()
  return
}

// -----

// With an output norm, a third buffer of i8 is a residual without its o_pre.
func.func @merge_residual_without_o_pre(
    %p: memref<4x?x64xf32>, %lp: memref<4x?xf32>, %h: memref<64xf32>,
    %o: memref<?x64xbf16>, %lse: memref<?xf32>, %r: memref<?x32xi8>) {
  // expected-error @+1 {{with an output norm, the o_pre residual needs the o_pre buffer in outs it belongs to}}
  attnres.partition_reduce_into softmax %p : memref<4x?x64xf32>
      lse(%lp : memref<4x?xf32>) output_norm(%h : memref<64xf32>)
      outs(%o, %lse, %r : memref<?x64xbf16>, memref<?xf32>, memref<?x32xi8>)
  return
}
