// The recompute backward (no saved output) of a packed, multi-query forward.
func.func @backward_recompute_packed(%v: tensor<4x?x32xf16>, %q: tensor<2x8xf16>,
                                     %do: tensor<2x?x32xf16>, %lse: tensor<2x?xf32>)
    -> tensor<4x?x32xf16> {
  %dv, %dq = attnres.backward packed(%v : tensor<4x?x32xf16>)
      query(%q : tensor<2x8xf16>) grad(%do : tensor<2x?x32xf16>)
      lse(%lse : tensor<2x?xf32>) -> tensor<4x?x32xf16>, tensor<2x8xf16>
  return %dv : tensor<4x?x32xf16>
}
