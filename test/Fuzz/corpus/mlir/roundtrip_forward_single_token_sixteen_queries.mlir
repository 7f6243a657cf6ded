// A single token: sources of rank 1, lse of rank 0; 16 queries with a
// per-query output norm; an f32 partial output of bf16 sources.
func.func @forward_single_token_sixteen_queries(%v: tensor<8xbf16>,
                                                %q: tensor<16x8xf32>,
                                                %h: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %o, %lse = attnres.forward sources(%v : tensor<8xbf16>)
      query(%q : tensor<16x8xf32>) output_norm(%h : tensor<16x8xf32>) save(lse)
      -> tensor<16x8xf32>, tensor<16xf32>
  return %o : tensor<16x8xf32>
}
