// Full AttnRes, the input of layer 4 of a Transformer: a softmax over the
// embedding and the outputs of layers 1-3, per token, with a learned query.
// bf16 activations [batch, sequence, 1024]; the sequence length is dynamic.
// The output norm is the fused pre-norm of layer 4; the forward saves o_pre so
// that the backward reads every source exactly once.

func.func @layer4_input(%embed: tensor<4x?x1024xbf16>,
                        %out1: tensor<4x?x1024xbf16>,
                        %out2: tensor<4x?x1024xbf16>,
                        %out3: tensor<4x?x1024xbf16>,
                        %query: tensor<1024xbf16>,
                        %key_norm: tensor<1024xbf16>,
                        %pre_norm: tensor<1024xbf16>)
    -> (tensor<4x?x1024xbf16>, tensor<4x?xf32>, tensor<4x?x1024xbf16>) {
  %o, %lse, %o_pre = attnres.forward
      sources(%embed, %out1, %out2, %out3 : tensor<4x?x1024xbf16>)
      query(%query : tensor<1024xbf16>)
      key_norm(%key_norm : tensor<1024xbf16>)
      output_norm(%pre_norm : tensor<1024xbf16>)
      -> tensor<4x?x1024xbf16>, tensor<4x?xf32>, tensor<4x?x1024xbf16>
  return %o, %lse, %o_pre
      : tensor<4x?x1024xbf16>, tensor<4x?xf32>, tensor<4x?x1024xbf16>
}

func.func @layer4_input_grad(%embed: tensor<4x?x1024xbf16>,
                             %out1: tensor<4x?x1024xbf16>,
                             %out2: tensor<4x?x1024xbf16>,
                             %out3: tensor<4x?x1024xbf16>,
                             %query: tensor<1024xbf16>,
                             %key_norm: tensor<1024xbf16>,
                             %pre_norm: tensor<1024xbf16>,
                             %grad: tensor<4x?x1024xbf16>,
                             %lse: tensor<4x?xf32>,
                             %o_pre: tensor<4x?x1024xbf16>)
    -> (tensor<4x?x1024xbf16>, tensor<4x?x1024xbf16>, tensor<4x?x1024xbf16>,
        tensor<4x?x1024xbf16>, tensor<1024xbf16>, tensor<1024xbf16>,
        tensor<1024xbf16>) {
  %dv:4, %dq, %dg, %dh = attnres.backward
      sources(%embed, %out1, %out2, %out3 : tensor<4x?x1024xbf16>)
      query(%query : tensor<1024xbf16>)
      key_norm(%key_norm : tensor<1024xbf16>)
      output_norm(%pre_norm : tensor<1024xbf16>)
      grad(%grad : tensor<4x?x1024xbf16>)
      lse(%lse : tensor<4x?xf32>)
      saved(%o_pre : tensor<4x?x1024xbf16>)
      -> tensor<4x?x1024xbf16>, tensor<4x?x1024xbf16>, tensor<4x?x1024xbf16>,
         tensor<4x?x1024xbf16>, tensor<1024xbf16>, tensor<1024xbf16>,
         tensor<1024xbf16>
  return %dv#0, %dv#1, %dv#2, %dv#3, %dq, %dg, %dh
      : tensor<4x?x1024xbf16>, tensor<4x?x1024xbf16>, tensor<4x?x1024xbf16>,
        tensor<4x?x1024xbf16>, tensor<1024xbf16>, tensor<1024xbf16>,
        tensor<1024xbf16>
}
