func.func @partition_reduce_softmax(%o: tensor<4x?x64xf32>, %lse: tensor<4x?xf32>,
                                    %sink: tensor<?xf32>)
    -> (tensor<?x64xbf16>, tensor<?x64xf32>) {
  %a, %la = attnres.partition_reduce softmax %o : tensor<4x?x64xf32>
      lse(%lse : tensor<4x?xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
  %b, %lb = attnres.partition_reduce softmax %o : tensor<4x?x64xf32>
      lse(%lse : tensor<4x?xf32>) sink(%sink : tensor<?xf32>)
      -> tensor<?x64xf32>, tensor<?xf32>
  return %a, %b : tensor<?x64xbf16>, tensor<?x64xf32>
}
