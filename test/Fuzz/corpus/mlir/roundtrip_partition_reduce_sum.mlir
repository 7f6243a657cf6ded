func.func @partition_reduce_sum(%p: tensor<257x4x16xf32>, %s: tensor<3xf32>)
    -> (tensor<4x16xbf16>, tensor<f32>) {
  %a = attnres.partition_reduce sum %p : tensor<257x4x16xf32> -> tensor<4x16xbf16>
  %b = attnres.partition_reduce sum %s : tensor<3xf32> -> tensor<f32>
  return %a, %b : tensor<4x16xbf16>, tensor<f32>
}
