// The residual of a 16-bit o_pre: the last forward result, the backward's
// residual(...) operand, the merge's last result.
func.func @o_pre_residual(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                          %q: tensor<2x16xf32>, %h: tensor<64xf32>,
                          %do: tensor<2x?x64xbf16>, %p: tensor<3x?x64xf32>,
                          %l: tensor<3x?xf32>)
    -> (tensor<2x16xf32>, tensor<?x32xi8>) {
  %o, %lse, %o_pre, %r = attnres.forward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<2x16xf32>) output_norm(%h : tensor<64xf32>)
      save(o_pre_residual)
      -> tensor<2x?x64xbf16>, tensor<2x?xf32>, tensor<2x?x64xbf16>, tensor<2x?x32xi8>
  %dv:2, %dq, %dh = attnres.backward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<2x16xf32>) output_norm(%h : tensor<64xf32>)
      grad(%do : tensor<2x?x64xbf16>) lse(%lse : tensor<2x?xf32>)
      saved(%o_pre : tensor<2x?x64xbf16>) residual(%r : tensor<2x?x32xi8>)
      -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<2x16xf32>, tensor<64xf32>
  %m, %ml, %mr = attnres.partition_reduce softmax %p : tensor<3x?x64xf32>
      lse(%l : tensor<3x?xf32>) -> tensor<?x64xf16>, tensor<?xf32>, tensor<?x32xi8>
  return %dq, %mr : tensor<2x16xf32>, tensor<?x32xi8>
}
