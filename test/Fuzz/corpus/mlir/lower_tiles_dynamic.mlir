#size = affine_map<(d0)[s0] -> (10, s0 - d0)>
func.func @dynamic_tiles(%v: memref<2x?x64xf32>, %q: memref<64xf32>,
                         %o: memref<?x64xf32>, %lse: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = memref.dim %v, %c1 : memref<2x?x64xf32>
  scf.forall (%t) = (0) to (%n) step (10) {
    %size = affine.min #size(%t)[%n]
    %vs = memref.subview %v[0, %t, 0] [2, %size, 64] [1, 1, 1]
        : memref<2x?x64xf32> to memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>
    %os = memref.subview %o[%t, 0] [%size, 64] [1, 1]
        : memref<?x64xf32> to memref<?x64xf32, strided<[64, 1], offset: ?>>
    %ls = memref.subview %lse[%t] [%size] [1]
        : memref<?xf32> to memref<?xf32, strided<[1], offset: ?>>
    attnres.forward_into packed(%vs : memref<2x?x64xf32, strided<[?, 64, 1], offset: ?>>)
        query(%q : memref<64xf32>)
        outs(%os, %ls : memref<?x64xf32, strided<[64, 1], offset: ?>>,
                        memref<?xf32, strided<[1], offset: ?>>)
  }
  return
}
