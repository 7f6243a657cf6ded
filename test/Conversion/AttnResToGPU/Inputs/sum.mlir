// A partition_reduce sum of three FP32 partitions of N rows of 8.
func.func @sum(%p: tensor<3x?x8xf32>) -> tensor<?x8xf32> {
  %s = attnres.partition_reduce sum %p : tensor<3x?x8xf32> -> tensor<?x8xf32>
  return %s : tensor<?x8xf32>
}
