// An attnres op on buffers, what bufferization makes of a sum partition_reduce.
func.func @sum(%p: memref<7x16xf32>, %s: memref<16xbf16>) {
  attnres.partition_reduce_into sum %p : memref<7x16xf32>
      outs(%s : memref<16xbf16>)
  return
}
