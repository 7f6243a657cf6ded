#rest = affine_map<(d0)[s0] -> (16, s0 - d0)>
func.func @merge_queries(%p: memref<4x2x?x64xf32>, %pl: memref<4x2x?xf32>,
                         %h: memref<2x64xf32>, %o: memref<2x?x64xbf16>,
                         %lse: memref<2x?xf32>) {
  %c2 = arith.constant 2 : index
  %n = memref.dim %p, %c2 : memref<4x2x?x64xf32>
  scf.forall (%k, %t) = (0, 0) to (2, %n) step (1, 16) {
    %size = affine.min #rest(%t)[%n]
    %ps = memref.subview %p[0, %k, %t, 0] [4, 1, %size, 64] [1, 1, 1, 1]
        : memref<4x2x?x64xf32> to memref<4x1x?x64xf32, strided<[?, ?, 64, 1], offset: ?>>
    %pls = memref.subview %pl[0, %k, %t] [4, 1, %size] [1, 1, 1]
        : memref<4x2x?xf32> to memref<4x1x?xf32, strided<[?, ?, 1], offset: ?>>
    %hs = memref.subview %h[%k, 0] [1, 64] [1, 1]
        : memref<2x64xf32> to memref<1x64xf32, strided<[64, 1], offset: ?>>
    %os = memref.subview %o[%k, %t, 0] [1, %size, 64] [1, 1, 1]
        : memref<2x?x64xbf16> to memref<1x?x64xbf16, strided<[?, 64, 1], offset: ?>>
    %ls = memref.subview %lse[%k, %t] [1, %size] [1, 1]
        : memref<2x?xf32> to memref<1x?xf32, strided<[?, 1], offset: ?>>
    attnres.partition_reduce_into softmax %ps : memref<4x1x?x64xf32, strided<[?, ?, 64, 1], offset: ?>>
        lse(%pls : memref<4x1x?xf32, strided<[?, ?, 1], offset: ?>>)
        output_norm(%hs : memref<1x64xf32, strided<[64, 1], offset: ?>>)
        outs(%os, %ls : memref<1x?x64xbf16, strided<[?, 64, 1], offset: ?>>,
                        memref<1x?xf32, strided<[?, 1], offset: ?>>)
  }
  return
}
