func.func @sum(%p: memref<3x?x8xf32>, %s: memref<?x8xf32>) {
  attnres.partition_reduce_into sum %p : memref<3x?x8xf32> outs(%s : memref<?x8xf32>) {attnres.launch = {num_partitions = 3 : i64, op = "partition_reduce_sum", output_type = "f32", sum = "k"}}
  return
}
gpu.module @attnres_kernels {
  gpu.func @k(%partials: !llvm.ptr<1>, %output: !llvm.ptr<1>, %n: i64) kernel attributes {attnres.kernel = {arguments = [{alignment = 4 : i64, kind = "buffer", name = "partials", shape = "[P, S]", type = "f32"}, {alignment = 4 : i64, kind = "buffer", name = "output", shape = "[S]", type = "f32"}, {kind = "i64", name = "num_elements", shape = "", type = "i64"}], block = 256 : i64, grid = [{divisor = 256 : i64, scale = 1 : i64, symbol = "N"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "1"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "1"}], name = "k", role = "sum", vector_width = 1 : i64, workgroup_bytes = 4 : i64}} {
    gpu.return
  }
}
