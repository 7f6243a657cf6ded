// RUN: attnres-opt %s --split-input-file --attnres-split-sources=partitions=3 \
// RUN:   --convert-attnres-to-gpu="keep-host=1 async-copies=1 clusters=1 backward-partitions=2" --attnres-bufferize-host --attnres-launch-kernels \
// RUN:   | FileCheck %s
// RUN: not attnres-opt %s --split-input-file --attnres-split-reduction=blocks=5 \
// RUN:   --convert-attnres-to-gpu="keep-host=1 backward-partitions=2" 2>&1 \
// RUN:   | FileCheck %s --check-prefix=SPLIT
// RUN: attnres-opt %s --split-input-file --attnres-split-sources=partitions=1 \
// RUN:   --convert-attnres-to-gpu="keep-host=1 async-copies=1 clusters=1" --attnres-bufferize-host --attnres-launch-kernels \
// RUN:   | FileCheck %s --check-prefix=ONE
// RUN: not attnres-opt %s --split-input-file \
// RUN:   --convert-attnres-to-gpu="keep-host=1 backward-partitions=9" --attnres-bufferize-host --attnres-launch-kernels 2>&1 \
// RUN:   | FileCheck %s --check-prefix=TOO-MANY
// RUN: not attnres-opt %s --convert-attnres-to-gpu="backward-partitions=2" 2>&1 \
// RUN:   | FileCheck %s --check-prefix=BUNDLE
// RUN: not attnres-opt %s --convert-attnres-to-gpu="keep-host=1 backward-partitions=-1" 2>&1 \
// RUN:   | FileCheck %s --check-prefix=NEGATIVE

// Counts the user fixed replace the runtime's rules: no occupancy query, the
// forward always split into attnres-split-sources' 3 partitions (clustered
// only with 3 blocks a cluster, where its clusters fit, else the partial
// kernel and the merge).
// CHECK-LABEL: func.func @forward(
// CHECK-NOT: attnresGpuResidentBlocks
// CHECK: %[[CAP:.*]] = func.call @attnresGpuClusterCapacity(%{{.*}}, %c128_i64{{.*}}, %c3_i64{{.*}})
// CHECK-NOT: attnresGpuClusterCapacity
// CHECK: gpu.launch_func  @attnres_kernels::@forward_0_forward_cluster
// CHECK: gpu.launch_func  @attnres_kernels::@forward_0_forward_partial {{.*}} %c3_i64{{.*}} : i64)
// CHECK: gpu.launch_func  @attnres_kernels::@forward_0_merge
// One partition: the whole kernel, no split launched.
// ONE-LABEL: func.func @forward(
// ONE-NOT: attnresGpuResidentBlocks
// ONE-NOT: attnresGpuClusterCapacity
// ONE: gpu.launch_func  @attnres_kernels::@forward_0_forward blocks
// ONE-NOT: gpu.launch_func
// ONE: return
// BUNDLE: error: convert-attnres-to-gpu: backward-partitions fixes the launches of keep-host=1; a bundle's launches take it per call (the runtime's AttnresBackwardArgs)
// NEGATIVE: error: convert-attnres-to-gpu: backward-partitions must be >= 0 (0: the runtime's rule)
func.func @forward(%v: tensor<8x?x4096xbf16>, %q: tensor<4096xbf16>)
    -> tensor<?x4096xbf16> {
  %o, %lse = attnres.forward packed(%v : tensor<8x?x4096xbf16>)
      query(%q : tensor<4096xbf16>) save(lse)
      -> tensor<?x4096xbf16>, tensor<?xf32>
  return %o : tensor<?x4096xbf16>
}

// -----

// The backward on 2 partitions of its sources: the partition count is the
// constant (its blocks of tokens the runtime's rule, from the device's
// occupancy). attnres-split-reduction's loop is not partitioned: its
// blocks each walk every source.
// CHECK-LABEL: func.func @backward(
// CHECK: call @attnresGpuResidentBlocks
// CHECK: gpu.launch_func  @attnres_kernels::@backward_0_backward blocks in (%{{.*}}, %{{.*}}, %{{.*}}) threads in ({{.*}}) args({{.*}}, %{{.*}} : i64, %c2_i64{{.*}} : i64)
// SPLIT: error: convert-attnres-to-gpu: backward-partitions splits the sources of a backward launched whole; this one is attnres-split-reduction's loop, whose blocks each walk every source of their tokens
// TOO-MANY: error: convert-attnres-to-gpu: backward-partitions = 9 is more than the op's 8 sources
func.func @backward(%v: tensor<8x?x64xf32>, %q: tensor<64xf32>,
                    %do: tensor<?x64xf32>, %lse: tensor<?xf32>)
    -> (tensor<8x?x64xf32>, tensor<64xf32>) {
  %dv, %dq = attnres.backward packed(%v : tensor<8x?x64xf32>)
      query(%q : tensor<64xf32>) grad(%do : tensor<?x64xf32>)
      lse(%lse : tensor<?xf32>)
      -> tensor<8x?x64xf32>, tensor<64xf32>
  return %dv, %dq : tensor<8x?x64xf32>, tensor<64xf32>
}
