#count = affine_map<()[s0] -> (s0 ceildiv 8)>
#first = affine_map<(d0) -> (d0 * 16)>
#rest = affine_map<(d0)[s0] -> (-d0 + s0, 16)>
func.func @tile_numbers(%v: memref<2x3x?x64xbf16>, %q: memref<2x64xbf16>,
                        %o: memref<2x3x?x64xbf16>, %lse: memref<2x3x?xf32>) {
  %c2 = arith.constant 2 : index
  %s = memref.dim %v, %c2 : memref<2x3x?x64xbf16>
  %tiles = affine.apply #count()[%s]
  scf.forall (%b, %i) in (3, %tiles) {
    %t = affine.apply #first(%i)
    %size = affine.min #rest(%t)[%s]
    %vs = memref.subview %v[0, %b, %t, 0] [2, 1, %size, 64] [1, 1, 1, 1]
        : memref<2x3x?x64xbf16> to memref<2x1x?x64xbf16, strided<[?, ?, 64, 1], offset: ?>>
    %os = memref.subview %o[0, %b, %t, 0] [2, 1, %size, 64] [1, 1, 1, 1]
        : memref<2x3x?x64xbf16> to memref<2x1x?x64xbf16, strided<[?, ?, 64, 1], offset: ?>>
    %ls = memref.subview %lse[0, %b, %t] [2, 1, %size] [1, 1, 1]
        : memref<2x3x?xf32> to memref<2x1x?xf32, strided<[?, ?, 1], offset: ?>>
    attnres.forward_into packed(%vs : memref<2x1x?x64xbf16, strided<[?, ?, 64, 1], offset: ?>>)
        query(%q : memref<2x64xbf16>)
        outs(%os, %ls : memref<2x1x?x64xbf16, strided<[?, ?, 64, 1], offset: ?>>,
                        memref<2x1x?xf32, strided<[?, ?, 1], offset: ?>>)
  }
  return
}
