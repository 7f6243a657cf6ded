func.func @backward_saved(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                          %q: tensor<16xf32>, %g: tensor<16xbf16>,
                          %h: tensor<64xbf16>, %do: tensor<?x64xbf16>,
                          %lse: tensor<?xf32>, %o_pre: tensor<?x64xbf16>)
    -> tensor<64xbf16> {
  %dv:2, %dq, %dg, %dh = attnres.backward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) key_norm(%g : tensor<16xbf16>)
      output_norm(%h : tensor<64xbf16>) grad(%do : tensor<?x64xbf16>)
      lse(%lse : tensor<?xf32>) saved(%o_pre : tensor<?x64xbf16>)
      {scale = 0.25 : f64}
      -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xf32>, tensor<16xbf16>,
         tensor<64xbf16>
  return %dh : tensor<64xbf16>
}
