// An attnres.forward in a host function: with the keep-host option of
// attnres-lower-to-nvvm-pipeline the function stays, the op becomes the
// launch of its kernel, and host-forward-main.c calls it through the C
// interface (llvm.emit_c_interface).
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
