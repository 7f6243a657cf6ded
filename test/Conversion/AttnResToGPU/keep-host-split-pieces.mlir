// RUN: attnres-opt %s --attnres-split-sources=partitions=2 \
// RUN:   --transform-preload-library=transform-library-paths=%S/Inputs/tile-second-forward.transform.mlir \
// RUN:   --transform-interpreter --convert-attnres-to-gpu="keep-host=1" \
// RUN:   --attnres-bufferize-host --attnres-launch-kernels --canonicalize --cse \
// RUN:   | FileCheck %s

// A split forward some of whose pieces are tiled runs piece by piece,
// whichever they are: here the second partial forward is a tile loop
// (attnres-lower-tiles-to-gpu's), the first and the merge are launched
// whole, all on the stacks of partial results, written in place.
// CHECK-LABEL: func.func @layer(
// CHECK: %[[OS:.*]] = gpu.alloc  (%{{.*}}) : memref<2x4x?x1024xf32>
// CHECK: gpu.launch_func  @attnres_kernels::@layer_0_forward
// CHECK: %[[O1:.*]] = memref.subview %[[OS]][1, 0, 0, 0] [1, 4, %{{.*}}, 1024]
// CHECK: scf.forall
// CHECK: memref.subview %[[O1]][
// CHECK: attnres.forward_into
// CHECK: gpu.launch_func  @attnres_kernels::@layer_1_merge
// CHECK: gpu.dealloc  %[[OS]]
func.func @layer(%v: tensor<4x?x1024xbf16>, %w: tensor<4x?x1024xbf16>,
                 %q: tensor<1024xbf16>, %h: tensor<1024xbf16>)
    -> (tensor<4x?x1024xbf16>, tensor<4x?xf32>, tensor<4x?x1024xbf16>) {
  %o, %lse, %o_pre = attnres.forward sources(%v, %w : tensor<4x?x1024xbf16>)
      query(%q : tensor<1024xbf16>) output_norm(%h : tensor<1024xbf16>)
      -> tensor<4x?x1024xbf16>, tensor<4x?xf32>, tensor<4x?x1024xbf16>
  return %o, %lse, %o_pre : tensor<4x?x1024xbf16>, tensor<4x?xf32>, tensor<4x?x1024xbf16>
}
