// A merge with the output norm of a split forward and its saved o_pre; FP32
// partial gradients of a backward over one block of tokens.
func.func @partition_reduce_output_norm(%p: tensor<3x4x?x64xf32>, %l: tensor<3x4x?xf32>,
                                        %h: tensor<4x64xbf16>, %v: tensor<?x64xbf16>,
                                        %q: tensor<16xbf16>, %do: tensor<?x64xbf16>,
                                        %lse: tensor<?xf32>) -> tensor<16xf32> {
  %o, %m, %o_pre = attnres.partition_reduce softmax %p : tensor<3x4x?x64xf32>
      lse(%l : tensor<3x4x?xf32>) output_norm(%h : tensor<4x64xbf16>) {eps = 1.0e-5 : f64}
      -> tensor<4x?x64xbf16>, tensor<4x?xf32>, tensor<4x?x64xbf16>
  %dv, %dq = attnres.backward sources(%v : tensor<?x64xbf16>) query(%q : tensor<16xbf16>)
      grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<?xf32>) -> tensor<?x64xbf16>, tensor<16xf32>
  return %dq : tensor<16xf32>
}
