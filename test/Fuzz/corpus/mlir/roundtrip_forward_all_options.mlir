// All optional parts, non-default attributes, o_pre saved.
func.func @forward_all_options(%v0: tensor<2x?x128xf32>, %v1: tensor<2x?x128xf32>,
                               %q: tensor<32xbf16>, %g: tensor<32xf32>,
                               %h: tensor<128xbf16>) -> tensor<2x?x128xf32> {
  %o, %lse, %o_pre = attnres.forward sources(%v0, %v1 : tensor<2x?x128xf32>)
      query(%q : tensor<32xbf16>) key_norm(%g : tensor<32xf32>)
      output_norm(%h : tensor<128xbf16>) {eps = 1.0e-3 : f64, scale = 0.5 : f64}
      -> tensor<2x?x128xf32>, tensor<2x?xf32>, tensor<2x?x128xf32>
  return %o_pre : tensor<2x?x128xf32>
}
