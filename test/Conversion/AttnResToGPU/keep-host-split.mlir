// RUN: attnres-opt %s --split-input-file --attnres-split-reduction=blocks=7 \
// RUN:   --convert-attnres-to-gpu="keep-host=1" | FileCheck %s
// RUN: attnres-opt %s --split-input-file --attnres-split-reduction=blocks=7 \
// RUN:   --canonicalize --cse --convert-attnres-to-gpu="keep-host=1" | FileCheck %s
// RUN: not attnres-opt %s --split-input-file --attnres-split-reduction=blocks=7 \
// RUN:   --convert-attnres-to-gpu 2>&1 | FileCheck %s --check-prefix=BUNDLE

// attnres-split-reduction's decomposition reaches the GPU: its loop over 7
// blocks of tokens becomes the backward kernel's grid (7 blocks, the
// kernel's num_blocks argument 7), its partial gradients the kernel's
// workspace rows, their partition_reduce sums its finalize. Nothing of the
// loop or the sums is left on the host, and no sum kernel is emitted.
// CHECK-LABEL: func.func @list(
// CHECK-NOT: scf.forall
// CHECK: call @attnresGpuResidentBlocks
// CHECK: gpu.launch_func  @attnres_kernels::@list_0_backward blocks in ({{.*}}) threads in ({{.*}}) args({{.*}}, %c7_i64{{.*}} : i64, %{{.*}} : i64)
// CHECK: gpu.launch_func  @attnres_kernels::@list_0_finalize
// CHECK-NOT: partition_reduce
// CHECK: return
// CHECK-NOT: gpu.func @list_{{.*}}_sum
// The bundle's backward is launched whole, its blocks chosen per call: the
// loop cannot be kept there.
// BUNDLE: error: convert-attnres-to-gpu: a bundle's backward is launched whole by the runtime, which picks its blocks per call (AttnresBackwardArgs.blocks); attnres-split-reduction's loop runs on the GPU with keep-host=1
func.func @list(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>, %q: tensor<16xbf16>,
                %g: tensor<16xbf16>, %do: tensor<?x64xbf16>, %lse: tensor<?xf32>,
                %o: tensor<?x64xbf16>)
    -> (tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xbf16>, tensor<16xbf16>) {
  %dv:2, %dq, %dg = attnres.backward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<16xbf16>) key_norm(%g : tensor<16xbf16>)
      grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<?xf32>) saved(%o : tensor<?x64xbf16>)
      -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xbf16>, tensor<16xbf16>
  return %dv#0, %dv#1, %dq, %dg : tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xbf16>, tensor<16xbf16>
}

// -----

// Two token dimensions: the pass merges them into one for the loop, which
// under keep-host is a view of the same device buffer; the source gradient
// comes back reshaped. Two queries and a per-query output norm: three
// partial gradients (query, output-norm weight), one finalize.
// CHECK-LABEL: func.func @packed_tokens_2d(
// CHECK: tensor.collapse_shape %{{.*}} {{\[\[}}0], [1, 2], [3]] : tensor<3x4x5x32xbf16> into tensor<3x20x32xbf16>
// CHECK-NOT: scf.forall
// CHECK: gpu.launch_func  @attnres_kernels::@packed_tokens_2d_0_backward blocks in ({{.*}}) threads in ({{.*}}) args({{.*}}, %c7_i64{{.*}} : i64, %{{.*}} : i64)
// CHECK: gpu.launch_func  @attnres_kernels::@packed_tokens_2d_0_finalize
// CHECK: tensor.expand_shape %{{.*}} {{\[\[}}0], [1, 2], [3]] output_shape [3, 4, 5, 32] : tensor<3x20x32xbf16> into tensor<3x4x5x32xbf16>
// CHECK: return
func.func @packed_tokens_2d(%v: tensor<3x4x5x32xbf16>, %q: tensor<2x32xbf16>,
                            %h: tensor<2x32xbf16>, %do: tensor<2x4x5x32xbf16>,
                            %lse: tensor<2x4x5xf32>)
    -> (tensor<3x4x5x32xbf16>, tensor<2x32xbf16>, tensor<2x32xbf16>) {
  %dv, %dq, %dh = attnres.backward packed(%v : tensor<3x4x5x32xbf16>)
      query(%q : tensor<2x32xbf16>) output_norm(%h : tensor<2x32xbf16>)
      grad(%do : tensor<2x4x5x32xbf16>) lse(%lse : tensor<2x4x5xf32>)
      -> tensor<3x4x5x32xbf16>, tensor<2x32xbf16>, tensor<2x32xbf16>
  return %dv, %dq, %dh : tensor<3x4x5x32xbf16>, tensor<2x32xbf16>, tensor<2x32xbf16>
}
