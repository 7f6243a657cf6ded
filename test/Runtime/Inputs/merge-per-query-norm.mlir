// A softmax partition_reduce whose output norm has a weight row per query
// ([M, D]): its merge kernel reads the weight row of row r at
// r / rows_per_weight.
func.func @merge(%p: tensor<3x4x?x64xf32>, %l: tensor<3x4x?xf32>,
                 %h: tensor<4x64xbf16>) -> tensor<4x?x64xbf16> {
  %o, %m = attnres.partition_reduce softmax %p : tensor<3x4x?x64xf32>
      lse(%l : tensor<3x4x?xf32>) output_norm(%h : tensor<4x64xbf16>)
      -> tensor<4x?x64xbf16>, tensor<4x?xf32>
  return %o : tensor<4x?x64xbf16>
}
