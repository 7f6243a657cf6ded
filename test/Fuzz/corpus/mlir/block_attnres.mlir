// Block AttnRes: the embedding and four completed block sums, packed in one
// tensor [5, tokens, 2048], are read once by the queries of all 8 layers of
// the next block. Each query has its own softmax, its own output and its own
// pre-norm weight. The key is the last 256 coordinates of a source (R < D).
// This forward saves only lse: the backward recomputes (less memory).

func.func @next_block_inputs(%blocks: tensor<5x?x2048xbf16>,
                             %queries: tensor<8x256xf32>,
                             %key_norm: tensor<256xf32>,
                             %pre_norms: tensor<8x2048xf32>)
    -> (tensor<8x?x2048xbf16>, tensor<8x?xf32>) {
  %o, %lse = attnres.forward packed(%blocks : tensor<5x?x2048xbf16>)
      query(%queries : tensor<8x256xf32>)
      key_norm(%key_norm : tensor<256xf32>)
      output_norm(%pre_norms : tensor<8x2048xf32>)
      save(lse) {eps = 1.0e-05 : f64, scale = 0.0625 : f64}
      -> tensor<8x?x2048xbf16>, tensor<8x?xf32>
  return %o, %lse : tensor<8x?x2048xbf16>, tensor<8x?xf32>
}

func.func @next_block_inputs_grad(%blocks: tensor<5x?x2048xbf16>,
                                  %queries: tensor<8x256xf32>,
                                  %key_norm: tensor<256xf32>,
                                  %pre_norms: tensor<8x2048xf32>,
                                  %grads: tensor<8x?x2048xbf16>,
                                  %lse: tensor<8x?xf32>)
    -> (tensor<5x?x2048xbf16>, tensor<8x256xf32>, tensor<256xf32>,
        tensor<8x2048xf32>) {
  %dv, %dq, %dg, %dh = attnres.backward packed(%blocks : tensor<5x?x2048xbf16>)
      query(%queries : tensor<8x256xf32>)
      key_norm(%key_norm : tensor<256xf32>)
      output_norm(%pre_norms : tensor<8x2048xf32>)
      grad(%grads : tensor<8x?x2048xbf16>)
      lse(%lse : tensor<8x?xf32>)
      {eps = 1.0e-05 : f64, scale = 0.0625 : f64}
      -> tensor<5x?x2048xbf16>, tensor<8x256xf32>, tensor<256xf32>,
         tensor<8x2048xf32>
  return %dv, %dq, %dg, %dh : tensor<5x?x2048xbf16>, tensor<8x256xf32>,
      tensor<256xf32>, tensor<8x2048xf32>
}
