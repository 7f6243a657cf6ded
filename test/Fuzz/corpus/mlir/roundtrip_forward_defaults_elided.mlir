// Default attributes are not printed; save(lse) is.
func.func @forward_defaults_elided(%v: tensor<3x?x?x16xbf16>, %q: tensor<4x16xbf16>,
                                   %h: tensor<16xbf16>) -> tensor<4x?x?x16xbf16> {
  %o, %lse = attnres.forward packed(%v : tensor<3x?x?x16xbf16>)
      query(%q : tensor<4x16xbf16>) output_norm(%h : tensor<16xbf16>)
      save(lse) {eps = 1.0e-6 : f64, scale = 1.0 : f64}
      -> tensor<4x?x?x16xbf16>, tensor<4x?x?xf32>
  return %o : tensor<4x?x?x16xbf16>
}
