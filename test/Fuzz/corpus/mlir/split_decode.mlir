// Few tokens, many sources (decoding): one forward over 64 sources, written
// by hand as two partial forwards over 32 sources each, with FP32 partial
// outputs, merged by their log-sum-exps. attnres-split-sources produces this
// structure from a single forward.

func.func @decode_step(%v: tensor<64x?x4096xbf16>, %q: tensor<4096xbf16>)
    -> (tensor<?x4096xbf16>, tensor<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = tensor.dim %v, %c1 : tensor<64x?x4096xbf16>
  %low = tensor.extract_slice %v[0, 0, 0] [32, %n, 4096] [1, 1, 1]
      : tensor<64x?x4096xbf16> to tensor<32x?x4096xbf16>
  %high = tensor.extract_slice %v[32, 0, 0] [32, %n, 4096] [1, 1, 1]
      : tensor<64x?x4096xbf16> to tensor<32x?x4096xbf16>
  %o0, %lse0 = attnres.forward packed(%low : tensor<32x?x4096xbf16>)
      query(%q : tensor<4096xbf16>) save(lse)
      -> tensor<?x4096xf32>, tensor<?xf32>
  %o1, %lse1 = attnres.forward packed(%high : tensor<32x?x4096xbf16>)
      query(%q : tensor<4096xbf16>) save(lse)
      -> tensor<?x4096xf32>, tensor<?xf32>
  %e0 = tensor.empty(%n) : tensor<2x?x4096xf32>
  %p0 = tensor.insert_slice %o0 into %e0[0, 0, 0] [1, %n, 4096] [1, 1, 1]
      : tensor<?x4096xf32> into tensor<2x?x4096xf32>
  %partials = tensor.insert_slice %o1 into %p0[1, 0, 0] [1, %n, 4096] [1, 1, 1]
      : tensor<?x4096xf32> into tensor<2x?x4096xf32>
  %l0 = tensor.empty(%n) : tensor<2x?xf32>
  %l1 = tensor.insert_slice %lse0 into %l0[0, 0] [1, %n] [1, 1]
      : tensor<?xf32> into tensor<2x?xf32>
  %lses = tensor.insert_slice %lse1 into %l1[1, 0] [1, %n] [1, 1]
      : tensor<?xf32> into tensor<2x?xf32>
  %o, %lse = attnres.partition_reduce softmax %partials : tensor<2x?x4096xf32>
      lse(%lses : tensor<2x?xf32>)
      -> tensor<?x4096xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x4096xbf16>, tensor<?xf32>
}
