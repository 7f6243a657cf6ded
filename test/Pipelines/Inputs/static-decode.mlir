// A forward and its backward over a static token count: 2 tokens of 64
// bf16 sources of width 4096 (decoding), which the split passes' own auto
// would split at compile time for an H200 (16 partitions of the sources;
// the backward in 1 block of tokens).
func.func @decode(%v: tensor<64x2x4096xbf16>, %q: tensor<4096xbf16>)
    -> (tensor<2x4096xbf16>, tensor<2xf32>) {
  %o, %lse = attnres.forward packed(%v : tensor<64x2x4096xbf16>)
      query(%q : tensor<4096xbf16>) -> tensor<2x4096xbf16>, tensor<2xf32>
  return %o, %lse : tensor<2x4096xbf16>, tensor<2xf32>
}

func.func @decode_grad(%v: tensor<64x2x4096xbf16>, %q: tensor<4096xbf16>,
                       %do: tensor<2x4096xbf16>, %lse: tensor<2xf32>)
    -> (tensor<64x2x4096xbf16>, tensor<4096xbf16>) {
  %dv, %dq = attnres.backward packed(%v : tensor<64x2x4096xbf16>)
      query(%q : tensor<4096xbf16>) grad(%do : tensor<2x4096xbf16>)
      lse(%lse : tensor<2xf32>) -> tensor<64x2x4096xbf16>, tensor<4096xbf16>
  return %dv, %dq : tensor<64x2x4096xbf16>, tensor<4096xbf16>
}
