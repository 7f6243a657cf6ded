// One type per source is accepted and printed back as the shared type.
func.func @forward_list_per_source_types(%v0: tensor<8x32xf16>,
                                         %v1: tensor<8x32xf16>,
                                         %q: tensor<32xf16>) -> tensor<8x32xf16> {
  %o, %lse = attnres.forward sources(%v0, %v1 : tensor<8x32xf16>, tensor<8x32xf16>)
      query(%q : tensor<32xf16>) -> tensor<8x32xf16>, tensor<8xf32>
  return %o : tensor<8x32xf16>
}
