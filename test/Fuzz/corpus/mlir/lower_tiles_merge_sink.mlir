#size = affine_map<(d0)[s0] -> (32, s0 - d0)>
func.func @merge_tiles(%p: memref<3x?x64xf32>, %pl: memref<3x?xf32>,
                       %sink: memref<?xf32>, %o: memref<?x64xbf16>,
                       %lse: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %p, %c1 : memref<3x?x64xf32>
  scf.forall (%t) = (0) to (%n) step (32) {
    %size = affine.min #size(%t)[%n]
    %ps = memref.subview %p[0, %t, 0] [3, %size, 64] [1, 1, 1]
        : memref<3x?x64xf32> to memref<3x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %pls = memref.subview %pl[0, %t] [3, %size] [1, 1]
        : memref<3x?xf32> to memref<3x?xf32, strided<[?, 1], offset: ?>>
    %ss = memref.subview %sink[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xbf16> to memref<?x64xbf16, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    attnres.partition_reduce_into softmax %ps : memref<3x?x64xf32, strided<[?, 64, 1], offset: ?>>
        lse(%pls : memref<3x?xf32, strided<[?, 1], offset: ?>>)
        sink(%ss : memref<?xf32, strided<[1], offset: ?>>)
        outs(%os, %ls : memref<?x64xbf16, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return
}
