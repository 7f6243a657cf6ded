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
