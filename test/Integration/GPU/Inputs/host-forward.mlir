// attnres ops in host functions: with the keep-host option of
// attnres-lower-to-nvvm-pipeline the functions stay, each op becomes the
// launches of its kernels, and host-forward-main.c calls them through the
// C interface (llvm.emit_c_interface).
func.func @mix(%v: tensor<4x?x256xbf16>, %q: tensor<256xbf16>,
               %g: tensor<256xbf16>) -> (tensor<?x256xbf16>, tensor<?xf32>)
    attributes {llvm.emit_c_interface} {
  %o, %lse = attnres.forward packed(%v : tensor<4x?x256xbf16>)
      query(%q : tensor<256xbf16>) key_norm(%g : tensor<256xbf16>)
      save(lse) {scale = 5.000000e-01 : f64}
      -> tensor<?x256xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x256xbf16>, tensor<?xf32>
}

// Sixteen sources of 4096 columns: few tokens split over the sources (the
// clustered kernel, or the partial kernel and the merge with
// ATTNRES_NO_CLUSTERS=1), many take the whole kernel.
func.func @decode(%v: tensor<16x?x4096xbf16>, %q: tensor<4096xbf16>,
                  %g: tensor<4096xbf16>) -> (tensor<?x4096xbf16>, tensor<?xf32>)
    attributes {llvm.emit_c_interface} {
  %o, %lse = attnres.forward packed(%v : tensor<16x?x4096xbf16>)
      query(%q : tensor<4096xbf16>) key_norm(%g : tensor<4096xbf16>)
      save(lse) {scale = 5.000000e-01 : f64}
      -> tensor<?x4096xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x4096xbf16>, tensor<?xf32>
}

// Two queries over the same six sources: o and lse a query.
func.func @queries(%v: tensor<6x?x256xbf16>, %q: tensor<2x256xbf16>,
                   %g: tensor<256xbf16>)
    -> (tensor<2x?x256xbf16>, tensor<2x?xf32>)
    attributes {llvm.emit_c_interface} {
  %o, %lse = attnres.forward packed(%v : tensor<6x?x256xbf16>)
      query(%q : tensor<2x256xbf16>) key_norm(%g : tensor<256xbf16>)
      save(lse) {scale = 5.000000e-01 : f64}
      -> tensor<2x?x256xbf16>, tensor<2x?xf32>
  return %o, %lse : tensor<2x?x256xbf16>, tensor<2x?xf32>
}

// A merge of five partial results with a sink (what a forward split over
// its sources computes last, given here by the caller, with empty
// partitions and infinite sinks among them).
func.func @merge(%p: tensor<5x?x256xf32>, %l: tensor<5x?xf32>,
                 %s: tensor<?xf32>) -> (tensor<?x256xbf16>, tensor<?xf32>)
    attributes {llvm.emit_c_interface} {
  %o, %lse = attnres.partition_reduce softmax %p : tensor<5x?x256xf32>
      lse(%l : tensor<5x?xf32>) sink(%s : tensor<?xf32>)
      -> tensor<?x256xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x256xbf16>, tensor<?xf32>
}

// Twenty partitions (more than the merge keeps in registers: the lanes of
// a row stage the weights in workgroup memory) and an output norm.
func.func @merge_norm(%p: tensor<20x?x256xf32>, %l: tensor<20x?xf32>,
                      %h: tensor<256xbf16>)
    -> (tensor<?x256xbf16>, tensor<?xf32>)
    attributes {llvm.emit_c_interface} {
  %o, %lse = attnres.partition_reduce softmax %p : tensor<20x?x256xf32>
      lse(%l : tensor<20x?xf32>) output_norm(%h : tensor<256xbf16>)
      -> tensor<?x256xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x256xbf16>, tensor<?xf32>
}
