// RUN: attnres-opt %s --split-input-file --verify-diagnostics \
// RUN:   --convert-attnres-to-gpu="keep-host=1 async-copies=1 clusters=1" --attnres-bufferize-host --attnres-launch-kernels | FileCheck %s

// With keep-host, the function stays, on device buffers (attnres-bufferize-
// host): the packed sources and the weights are read in place, o and lse are
// allocated on the device with the token count as their dynamic size, the table of the four source rows
// (base + l * N * D * 2 bytes) is filled on the host and copied to the
// device, and the forward kernel is launched with the grid of its own rule,
// ceil(N / 4) blocks of 128 threads (4 rows a block), only when there are
// tokens. Four sources of 512-byte rows never split over sources (at most
// min(4 / 4, 4 * 512 / 32 KiB) partitions): no split is emitted.
// CHECK-NOT: attnresGpuResidentBlocks
// Each source row and each caller buffer is checked against the alignment
// the kernel's loads need (rows: 8 bf16 vectors, 16 bytes); a misaligned one
// is reported through the runtime and the launch skipped.
// CHECK-DAG: llvm.mlir.global internal constant @attnres_refusal_1("the row of source 0 must be aligned to 16 bytes for kernel packed_0_forward; the launch was skipped\00")
// CHECK-DAG: llvm.mlir.global internal constant @attnres_refusal_5("'query' must be aligned to 16 bytes for kernel packed_0_forward; the launch was skipped\00")
// CHECK-DAG: llvm.mlir.global internal constant @attnres_refusal_6("'key_norm' must be aligned to 16 bytes for kernel packed_0_forward; the launch was skipped\00")
// CHECK-DAG: func.func private @attnresGpuRefuseLaunch(!llvm.ptr)
// CHECK-LABEL: func.func @packed(
// CHECK-SAME: %[[V:.*]]: memref<4x?x256xbf16>, %[[Q:.*]]: memref<256xbf16>, %[[G:.*]]: memref<256xbf16>) -> (memref<?x256xbf16>, memref<?xf32>)
// CHECK: %[[N:.*]] = memref.dim %[[V]], %c1
// CHECK: %[[O:.*]] = gpu.alloc  (%[[N]]) : memref<?x256xbf16>
// CHECK: %[[LSE:.*]] = gpu.alloc  (%[[N]]) : memref<?xf32>
// CHECK: %[[N64:.*]] = arith.index_cast %{{.*}} : index to i64
// CHECK: %[[ROW:.*]] = arith.muli %[[N64]], %c512_i64
// CHECK: memref.extract_aligned_pointer_as_index %[[V]]
// CHECK: arith.remui %{{.*}}, %c16_i64
// CHECK: llvm.mlir.addressof @attnres_refusal_1
// CHECK: scf.if
// CHECK-NEXT: func.call @attnresGpuRefuseLaunch
// CHECK: %[[HOST:.*]] = memref.alloca() : memref<4xi64>
// CHECK: memref.store %{{.*}}, %[[HOST]][%c3{{.*}}] : memref<4xi64>
// CHECK: %[[TABLE:.*]] = gpu.alloc  () : memref<4xi64>
// CHECK: gpu.memcpy  %[[TABLE]], %[[HOST]]
// CHECK: llvm.mlir.addressof @attnres_refusal_5
// CHECK: scf.if
// CHECK-NEXT: func.call @attnresGpuRefuseLaunch
// CHECK: %[[BLOCKS:.*]] = arith.ceildivui %{{.*}}, %c4
// CHECK: %[[ANY:.*]] = arith.cmpi ugt, %[[BLOCKS]], %c0
// CHECK: %[[GO:.*]] = arith.andi %{{.*}}, %[[ANY]] : i1
// CHECK: scf.if %[[GO]] {
// CHECK-NEXT: gpu.launch_func  @attnres_kernels::@packed_0_forward blocks in (%[[BLOCKS]], %{{.*}}, %{{.*}}) threads in (%c128, %{{.*}}, %{{.*}}) args(%{{.*}} : !llvm.ptr<1>, %{{.*}} : !llvm.ptr<1>, %{{.*}} : !llvm.ptr<1>, %{{.*}} : !llvm.ptr<1>, %{{.*}} : !llvm.ptr<1>, %[[N64]] : i64)
// CHECK: gpu.dealloc  %[[TABLE]]
// CHECK: return %[[O]], %[[LSE]]
// CHECK: gpu.module @attnres_kernels
// CHECK: gpu.func @packed_0_forward(
func.func @packed(%v: tensor<4x?x256xbf16>, %q: tensor<256xbf16>,
                  %g: tensor<256xbf16>) -> (tensor<?x256xbf16>, tensor<?xf32>) {
  %o, %lse = attnres.forward packed(%v : tensor<4x?x256xbf16>)
      query(%q : tensor<256xbf16>) key_norm(%g : tensor<256xbf16>) save(lse)
      -> tensor<?x256xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x256xbf16>, tensor<?xf32>
}

// -----

// A list of sources with two token dimensions: each source's own address in
// the table, N the product of the token sizes, o_pre allocated and passed
// where the op saves it next to a normalized o.
// CHECK-LABEL: func.func @list(
// CHECK-SAME: %[[A:.*]]: memref<2x?x64xf32>, %[[B:.*]]: memref<2x?x64xf32>
// CHECK: %[[D1:.*]] = memref.dim %[[A]], %c1
// CHECK-NEXT: gpu.alloc  (%[[D1]]) : memref<2x?x64xf32>
// CHECK-NEXT: gpu.alloc  (%[[D1]]) : memref<2x?xf32>
// CHECK-NEXT: gpu.alloc  (%[[D1]]) : memref<2x?x64xf32>
// CHECK: %[[T1:.*]] = memref.dim %[[A]], %c1
// CHECK: arith.muli %{{.*}}, %[[T1]]
// CHECK: memref.extract_aligned_pointer_as_index %[[A]]
// CHECK: memref.extract_aligned_pointer_as_index %[[B]]
// CHECK: gpu.launch_func  @attnres_kernels::@list_0_forward
// CHECK: return
func.func @list(%a: tensor<2x?x64xf32>, %b: tensor<2x?x64xf32>,
                %q: tensor<64xf32>, %h: tensor<64xf32>)
    -> (tensor<2x?x64xf32>, tensor<2x?x64xf32>) {
  %o, %lse, %o_pre = attnres.forward sources(%a, %b : tensor<2x?x64xf32>)
      query(%q : tensor<64xf32>) output_norm(%h : tensor<64xf32>)
      -> tensor<2x?x64xf32>, tensor<2x?xf32>, tensor<2x?x64xf32>
  return %o, %o_pre : tensor<2x?x64xf32>, tensor<2x?x64xf32>
}

// -----

// Three queries with per-query output norms: o, lse and o_pre gain a
// leading dimension of 3, the token count stays the dynamic size.
// CHECK-LABEL: func.func @queries(
// CHECK-SAME: %[[V:[^:]*]]: memref<5x?x64xbf16>
// CHECK: %[[T1:.*]] = memref.dim %[[V]], %c1
// CHECK-NEXT: gpu.alloc  (%[[T1]]) : memref<3x?x64xbf16>
// CHECK-NEXT: gpu.alloc  (%[[T1]]) : memref<3x?xf32>
// CHECK-NEXT: gpu.alloc  (%[[T1]]) : memref<3x?x64xbf16>
// CHECK: gpu.launch_func  @attnres_kernels::@queries_0_forward
func.func @queries(%v: tensor<5x?x64xbf16>, %q: tensor<3x64xbf16>,
                   %h: tensor<3x64xbf16>) -> tensor<3x?x64xbf16> {
  %o, %lse, %o_pre = attnres.forward packed(%v : tensor<5x?x64xbf16>)
      query(%q : tensor<3x64xbf16>) output_norm(%h : tensor<3x64xbf16>)
      -> tensor<3x?x64xbf16>, tensor<3x?xf32>, tensor<3x?x64xbf16>
  return %o : tensor<3x?x64xbf16>
}

// -----

// Sixteen sources of 8 KiB rows can split (at most min(16 / 4, 16 * 8 KiB /
// 32 KiB) = 4 partitions): P is the runtime's rule, computed from the token
// count and the device's occupancy of the partial kernel; with P = 1 the
// whole kernel, else the clustered kernel with the most partitions up to P
// whose clusters all fit at once (attnresGpuClusterCapacity for 2..8 blocks),
// else the partial kernel and the merge over a workspace freed after them.
// CHECK-LABEL: func.func @decode(
// CHECK: %[[N:.*]] = arith.index_cast %{{.*}} : index to i64
// CHECK: %[[RESIDENT:.*]] = call @attnresGpuResidentBlocks(%{{.*}}, %c128_i64{{.*}})
// CHECK: %[[WANTED:.*]] = arith.divsi %[[RESIDENT]], %{{.*}}
// CHECK: arith.minsi %[[WANTED]], %c4_i64
// CHECK: %[[P:.*]] = arith.minsi %{{.*}}, %c16_i64
// CHECK: %[[SPLIT:.*]] = arith.cmpi sgt, %[[P]], %c1_i64
// CHECK: scf.if %[[SPLIT]] {
// CHECK: %[[CAP2:.*]] = func.call @attnresGpuClusterCapacity(%{{.*}}, %c128_i64{{.*}}, %c2_i64{{.*}})
// CHECK: arith.cmpi sle, %[[N]], %[[CAP2]]
// CHECK: %[[CAP8:.*]] = func.call @attnresGpuClusterCapacity(%{{.*}}, %c128_i64{{.*}}, %c8_i64{{.*}})
// CHECK: %[[CP:.*]] = arith.select %{{.*}}, %c8_i64{{.*}}, %{{.*}} : i64
// CHECK: %[[CLUSTER:.*]] = arith.cmpi sge, %[[CP]], %c2_i64
// CHECK: scf.if %[[CLUSTER]] {
// CHECK: gpu.launch_func  @attnres_kernels::@decode_0_forward_cluster clusters in (%c1{{.*}}, %[[Y:.*]], %c1{{.*}}) blocks in (%{{.*}}, %[[Y]], %c1{{.*}}) threads in (%c128, {{.*}}) args({{.*}}, %[[N]] : i64, %[[CP]] : i64)
// CHECK: } else {
// CHECK: %[[WORK:.*]] = gpu.alloc  (%{{.*}}) : memref<?xi8>
// CHECK: gpu.launch_func  @attnres_kernels::@decode_0_forward_partial {{.*}} args({{.*}}, %[[N]] : i64, %[[P]] : i64)
// CHECK: gpu.launch_func  @attnres_kernels::@decode_0_merge {{.*}} args({{.*}}, %[[P]] : i64)
// CHECK: gpu.dealloc  %[[WORK]]
// CHECK: } else {
// CHECK: gpu.launch_func  @attnres_kernels::@decode_0_forward blocks
// CHECK: return
func.func @decode(%v: tensor<16x?x4096xbf16>, %q: tensor<4096xbf16>)
    -> tensor<?x4096xbf16> {
  %o, %lse = attnres.forward packed(%v : tensor<16x?x4096xbf16>)
      query(%q : tensor<4096xbf16>) save(lse)
      -> tensor<?x4096xbf16>, tensor<?xf32>
  return %o : tensor<?x4096xbf16>
}

// -----

// Rows of 16 KiB of sources (32 of D = 256 bf16) are too short for the
// partial kernel's merge (P = min(resident / blocks, 32 / 4, 16 KiB /
// 32 KiB) is 1), not for the clustered kernel, whose blocks (4 rows each)
// merge on chip: from 32 sources on it takes up to min(resident / blocks,
// 32 / 4, 8) = 8 partitions where its clusters, one a block of 4 rows, fit
// at once; where none does, the partial kernel's P decides between it and
// the whole kernel. Fewer sources (@fewer_short_rows) always take the whole
// kernel: a clustered launch costs about what its walk over 32 sources does.
// CHECK-LABEL: func.func @short_rows(
// CHECK: %[[N:.*]] = arith.index_cast %{{.*}} : index to i64
// CHECK: %[[RESIDENT:.*]] = call @attnresGpuResidentBlocks(%{{.*}}, %c128_i64{{.*}})
// CHECK: %[[BLOCKS:.*]] = arith.ceildivsi %[[N]], %c4_i64
// CHECK: arith.minsi %{{.*}}, %c1_i64
// CHECK: %[[P:.*]] = arith.minsi %{{.*}}, %c32_i64
// CHECK: %[[WANTED:.*]] = arith.divsi %[[RESIDENT]], %{{.*}}
// CHECK: arith.minsi %[[WANTED]], %c8_i64
// CHECK: %[[CLUSTERED:.*]] = arith.maxsi %{{.*}}, %c1_i64
// CHECK: %[[UPTO:.*]] = arith.maxsi %[[P]], %[[CLUSTERED]]
// CHECK: %[[SPLIT:.*]] = arith.cmpi sgt, %[[UPTO]], %c1_i64
// CHECK: scf.if %[[SPLIT]] {
// CHECK: %[[CAP2:.*]] = func.call @attnresGpuClusterCapacity(%{{.*}}, %c128_i64{{.*}}, %c2_i64{{.*}})
// CHECK: arith.cmpi sle, %[[BLOCKS]], %[[CAP2]]
// CHECK: arith.cmpi sle, %c2_i64{{.*}}, %[[UPTO]]
// CHECK: %[[CP:.*]] = arith.select %{{.*}}, %c8_i64{{.*}}, %{{.*}} : i64
// CHECK: %[[CLUSTER:.*]] = arith.cmpi sge, %[[CP]], %c2_i64
// CHECK: scf.if %[[CLUSTER]] {
// CHECK: gpu.launch_func  @attnres_kernels::@short_rows_0_forward_cluster clusters in (%c1{{.*}}, %[[Y:.*]], %c1{{.*}}) blocks in (%{{.*}}, %[[Y]], %c1{{.*}}) threads in (%c128, {{.*}}) args({{.*}}, %[[N]] : i64, %[[CP]] : i64)
// CHECK: } else {
// CHECK: %[[PARTIAL:.*]] = arith.cmpi sgt, %[[P]], %c1_i64
// CHECK: scf.if %[[PARTIAL]] {
// CHECK: gpu.launch_func  @attnres_kernels::@short_rows_0_forward_partial {{.*}} args({{.*}}, %[[N]] : i64, %[[P]] : i64)
// CHECK: gpu.launch_func  @attnres_kernels::@short_rows_0_merge
// CHECK: } else {
// CHECK: gpu.launch_func  @attnres_kernels::@short_rows_0_forward blocks
// CHECK: } else {
// CHECK: gpu.launch_func  @attnres_kernels::@short_rows_0_forward blocks
// CHECK: return
// CHECK-LABEL: func.func @fewer_short_rows(
// CHECK-NOT: attnresGpuClusterCapacity
// CHECK-NOT: forward_partial
// CHECK: gpu.launch_func  @attnres_kernels::@fewer_short_rows_0_forward blocks
// CHECK-NOT: gpu.launch_func
// CHECK: return
func.func @short_rows(%v: tensor<32x?x256xbf16>, %q: tensor<256xbf16>)
    -> tensor<?x256xbf16> {
  %o, %lse = attnres.forward packed(%v : tensor<32x?x256xbf16>)
      query(%q : tensor<256xbf16>) save(lse)
      -> tensor<?x256xbf16>, tensor<?xf32>
  return %o : tensor<?x256xbf16>
}
func.func @fewer_short_rows(%v: tensor<31x?x256xbf16>, %q: tensor<256xbf16>)
    -> tensor<?x256xbf16> {
  %o, %lse = attnres.forward packed(%v : tensor<31x?x256xbf16>)
      query(%q : tensor<256xbf16>) save(lse)
      -> tensor<?x256xbf16>, tensor<?xf32>
  return %o : tensor<?x256xbf16>
}

// -----

// A backward: the gradients allocated with the shapes of their operands,
// two tables (the source rows and the gradient rows, each checked), then the blocks B and partitions P of the runtime's rules
// from the device's occupancy of the kernel (attnresGpuResidentBlocks):
// B = max(1, min(resident, ceil(N / 16))) (16 rows a block),
// P = clamp(min(resident / B, L / 4), 1, L), the workspace of P * B partial
// rows (da: 256 bytes a row, dh: 256 bytes a row, each part 256-byte
// aligned), the backward on B x P blocks and the finalize on its fixed grid.
// Each caller buffer is checked once, at the larger of the two kernels'
// alignments.
// CHECK-DAG: llvm.mlir.global internal constant @attnres_kernel_name_backward_0_backward("backward_0_backward\00")
// CHECK-DAG: llvm.mlir.global internal constant @attnres_refusal_9("the gradient row of source 0 must be aligned to 16 bytes for kernel backward_0_backward; the launch was skipped\00")
// CHECK-DAG: func.func private @attnresGpuResidentBlocks(!llvm.ptr, i64) -> i64
// CHECK-LABEL: func.func @backward(
// CHECK-SAME: %[[V:[^:]*]]: memref<8x?x64xbf16>
// CHECK: %[[DVN:.*]] = memref.dim %[[V]], %c1
// CHECK: %[[DV:.*]] = gpu.alloc  (%[[DVN]]) : memref<8x?x64xbf16>
// CHECK: %[[DQ:.*]] = gpu.alloc  () : memref<64xbf16>
// CHECK: %[[DG:.*]] = gpu.alloc  () : memref<64xbf16>
// CHECK: %[[DH:.*]] = gpu.alloc  () : memref<64xbf16>
// CHECK: %[[N:.*]] = arith.index_cast %{{.*}} : index to i64
// CHECK: llvm.mlir.addressof @attnres_refusal_8
// CHECK: llvm.mlir.addressof @attnres_refusal_16
// CHECK: %[[ROWS:.*]] = gpu.alloc  () : memref<8xi64>
// CHECK: %[[GRADS:.*]] = gpu.alloc  () : memref<8xi64>
// CHECK: %[[RESIDENT:.*]] = call @attnresGpuResidentBlocks(%{{.*}}, %c128_i64
// CHECK: %[[TB:.*]] = arith.ceildivsi %[[N]], %c16_i64
// CHECK: %[[B0:.*]] = arith.minsi %[[RESIDENT]], %[[TB]]
// CHECK: %[[B:.*]] = arith.maxsi %c1_i64{{.*}}, %[[B0]]
// CHECK: %[[P0:.*]] = arith.divsi %[[RESIDENT]], %{{.*}}
// CHECK: arith.minsi %[[P0]], %c2_i64
// CHECK: %[[P:.*]] = arith.minsi %{{.*}}, %c8_i64
// CHECK: %[[PB:.*]] = arith.muli %[[P]], %[[B]]
// CHECK: %[[PARTIAL:.*]] = arith.muli %[[PB]], %c1_i64
// CHECK: %[[BYTES:.*]] = arith.index_cast %{{.*}} : i64 to index
// CHECK: %[[WORK:.*]] = gpu.alloc  (%[[BYTES]]) : memref<?xi8>
// CHECK: llvm.mlir.addressof @attnres_refusal_25
// CHECK-NOT: @attnres_refusal_26
// CHECK: %[[BI:.*]] = arith.index_cast %[[B]] : i64 to index
// CHECK: %[[PI:.*]] = arith.index_cast %[[P]] : i64 to index
// CHECK: arith.muli %[[BI]], %c1
// CHECK: arith.muli %[[PI]], %c1
// CHECK: gpu.launch_func  @attnres_kernels::@backward_0_backward blocks in (%{{.*}}, %{{.*}}, %c1{{.*}}) threads in (%c128, {{.*}}) args({{.*}}, %[[N]] : i64, %[[B]] : i64, %[[P]] : i64)
// CHECK: gpu.launch_func  @attnres_kernels::@backward_0_finalize blocks in (%c4{{.*}}, %c1{{.*}}, %c1{{.*}}) threads in (%c512, {{.*}}) args({{.*}}, %[[PARTIAL]] : i64)
// CHECK-DAG: gpu.dealloc  %[[ROWS]]
// CHECK-DAG: gpu.dealloc  %[[GRADS]]
// CHECK-DAG: gpu.dealloc  %[[WORK]]
// CHECK: return %[[DV]], %[[DQ]], %[[DG]], %[[DH]]
func.func @backward(%v: tensor<8x?x64xbf16>, %q: tensor<64xbf16>,
                    %g: tensor<64xbf16>, %h: tensor<64xbf16>,
                    %do: tensor<?x64xbf16>, %lse: tensor<?xf32>,
                    %o: tensor<?x64xbf16>)
    -> (tensor<8x?x64xbf16>, tensor<64xbf16>, tensor<64xbf16>,
        tensor<64xbf16>) {
  %dv, %dq, %dg, %dh = attnres.backward packed(%v : tensor<8x?x64xbf16>)
      query(%q : tensor<64xbf16>) key_norm(%g : tensor<64xbf16>)
      output_norm(%h : tensor<64xbf16>) grad(%do : tensor<?x64xbf16>)
      lse(%lse : tensor<?xf32>) saved(%o : tensor<?x64xbf16>)
      -> tensor<8x?x64xbf16>, tensor<64xbf16>, tensor<64xbf16>,
         tensor<64xbf16>
  return %dv, %dq, %dg, %dh
      : tensor<8x?x64xbf16>, tensor<64xbf16>, tensor<64xbf16>, tensor<64xbf16>
}

// -----

// A softmax partition_reduce: rows are the partials' dimensions after P
// (here N), the merge kernel's grid ceil(N / 16), P = 4 a constant; the
// partials, their lse, the sink, the weight and the results checked.
// CHECK-LABEL: func.func @merge(
// CHECK-SAME: %[[OP:[^:]*]]: memref<4x?x64xf32>
// CHECK: gpu.alloc  (%{{.*}}) : memref<?x64xbf16>
// CHECK: gpu.alloc  (%{{.*}}) : memref<?xf32>
// CHECK: %[[N:.*]] = memref.dim %[[OP]], %c1
// CHECK: %[[ROWS:.*]] = arith.muli %c1{{.*}}, %[[N]] : index
// CHECK: %[[ROWS64:.*]] = arith.index_cast %[[ROWS]] : index to i64
// CHECK: llvm.mlir.addressof @attnres_refusal_6
// CHECK: %[[GRID:.*]] = arith.ceildivui %{{.*}}, %c16
// CHECK: gpu.launch_func  @attnres_kernels::@merge_0_merge blocks in (%[[GRID]], {{.*}}) threads in (%c128, {{.*}}) args({{.*}}, %[[ROWS64]] : i64, %c4_i64 : i64)
func.func @merge(%op: tensor<4x?x64xf32>, %lp: tensor<4x?xf32>,
                 %s: tensor<?xf32>, %h: tensor<64xbf16>)
    -> (tensor<?x64xbf16>, tensor<?xf32>) {
  %o, %lse = attnres.partition_reduce softmax %op : tensor<4x?x64xf32>
      lse(%lp : tensor<4x?xf32>) sink(%s : tensor<?xf32>)
      output_norm(%h : tensor<64xbf16>) -> tensor<?x64xbf16>, tensor<?xf32>
  return %o, %lse : tensor<?x64xbf16>, tensor<?xf32>
}

// -----

// A weight a row group whose count K only the run time knows ([?, 64] over
// [K, N, 64] rows): K must be the partials' first token dimension (checked
// before the launch, which a mismatch skips), and the kernel's rows per
// weight row are rows / max(K, 1).
// CHECK: @attnres_refusal_{{[0-9]+}}("the output norm weight must have a row for each index of the partials' first token dimension, for kernel merge_groups_0_merge; the launch was skipped
// CHECK-LABEL: func.func @merge_groups(
// CHECK-SAME: %[[P:[^:]*]]: memref<3x?x?x64xf32>, %{{[^:]*}}: memref<3x?x?xf32>, %[[H:[^:]*]]: memref<?x64xbf16>
// CHECK: %[[ROWS64:.*]] = arith.index_cast %{{.*}} : index to i64
// CHECK: %[[K:.*]] = memref.dim %[[H]], %c0{{.*}} : memref<?x64xbf16>
// CHECK: %[[T0:.*]] = memref.dim %[[P]], %c1{{.*}} : memref<3x?x?x64xf32>
// CHECK: %[[SAME:.*]] = arith.cmpi eq, %[[K]], %[[T0]] : index
// CHECK: %[[DIFFER:.*]] = arith.xori %[[SAME]], %true{{.*}} : i1
// CHECK: scf.if %[[DIFFER]] {
// CHECK: func.call @attnresGpuRefuseLaunch
// CHECK: %[[K64:.*]] = arith.index_cast %[[K]] : index to i64
// CHECK: %[[GROUPS:.*]] = arith.maxui %[[K64]], %c1_i64{{.*}} : i64
// CHECK: %[[PER:.*]] = arith.divui %[[ROWS64]], %[[GROUPS]] : i64
// CHECK: gpu.launch_func  @attnres_kernels::@merge_groups_0_merge {{.*}}, %[[PER]] : i64)
func.func @merge_groups(%op: tensor<3x?x?x64xf32>, %lp: tensor<3x?x?xf32>,
                        %h: tensor<?x64xbf16>)
    -> (tensor<?x?x64xbf16>, tensor<?x?xf32>) {
  %o, %lse = attnres.partition_reduce softmax %op : tensor<3x?x?x64xf32>
      lse(%lp : tensor<3x?x?xf32>) output_norm(%h : tensor<?x64xbf16>)
      -> tensor<?x?x64xbf16>, tensor<?x?xf32>
  return %o, %lse : tensor<?x?x64xbf16>, tensor<?x?xf32>
}

// -----

// A sum partition_reduce: every element of the result, N * 16, in blocks
// of 256.
// CHECK-LABEL: func.func @finalize(
// CHECK: gpu.alloc  (%{{.*}}) : memref<?x16xbf16>
// CHECK: %[[D:.*]] = memref.dim %{{.*}}, %c2
// CHECK: %[[ELEMENTS:.*]] = arith.muli %{{.*}}, %[[D]] : index
// CHECK: %[[ELEMENTS64:.*]] = arith.index_cast %[[ELEMENTS]] : index to i64
// CHECK: %[[GRID:.*]] = arith.ceildivui %{{.*}}, %c256
// CHECK: gpu.launch_func  @attnres_kernels::@finalize_0_sum blocks in (%[[GRID]], {{.*}}) threads in (%c256{{.*}}, {{.*}}) args(%{{.*}} : !llvm.ptr<1>, %{{.*}} : !llvm.ptr<1>, %[[ELEMENTS64]] : i64)
func.func @finalize(%partials: tensor<7x?x16xf32>) -> tensor<?x16xbf16> {
  %dq = attnres.partition_reduce sum %partials : tensor<7x?x16xf32>
      -> tensor<?x16xbf16>
  return %dq : tensor<?x16xbf16>
}

// -----

// Under keep-host tensors are device buffers: an op other than the attnres
// ops and tensor.dim that uses one would touch device memory on the host.
func.func @slice(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>)
    -> tensor<?x64xf32> {
  // expected-error @+1 {{convert-attnres-to-gpu: keep-host=1 keeps every tensor in device memory, which only attnres ops, tensor.dim, reshapes, slices of consecutive rows and stacks (a tensor.concat of unit-dimension expansions) may use; 'tensor.extract_slice' is none of them (keep-host=0 compiles the attnres ops alone)}}
  %low = tensor.extract_slice %v[0, 0, 0] [2, 16, 64] [1, 1, 1]
      : tensor<4x?x64xf32> to tensor<2x16x64xf32>
  %o, %lse = attnres.forward packed(%low : tensor<2x16x64xf32>)
      query(%q : tensor<64xf32>) save(lse)
      -> tensor<16x64xf32>, tensor<16xf32>
  %r = tensor.cast %o : tensor<16x64xf32> to tensor<?x64xf32>
  return %r : tensor<?x64xf32>
}

// -----

// A loop around an attnres op that is not a tile loop of attnres-tile (it
// writes none of the op's results) is refused by the tile loops' check.
func.func @in_loop(%v: tensor<4x8x64xf32>, %q: tensor<64xf32>) {
  // expected-error @+1 {{convert-attnres-to-gpu: keep-host=1 runs a loop around a forward or merge (attnres-tile's) as a grid of its tiles; here the loop's outputs are not its op's results, each written once}}
  scf.forall (%i) in (2) {
    %o, %lse = attnres.forward packed(%v : tensor<4x8x64xf32>)
        query(%q : tensor<64xf32>) save(lse)
        -> tensor<8x64xf32>, tensor<8xf32>
  }
  return
}

// -----

// Other regions would be host code over slices: refused, the op inside
// named.
func.func @in_if(%v: tensor<4x8x64xf32>, %q: tensor<64xf32>, %c: i1)
    -> tensor<8x64xf32> {
  %r = scf.if %c -> tensor<8x64xf32> {
    // expected-error @+1 {{convert-attnres-to-gpu: keep-host=1 launches attnres ops at the top level of a function; this one is inside 'scf.if' (the loops of attnres-split-reduction and attnres-tile are launched as their kernels' blocks; no other region is)}}
    %o, %lse = attnres.forward packed(%v : tensor<4x8x64xf32>)
        query(%q : tensor<64xf32>) save(lse)
        -> tensor<8x64xf32>, tensor<8xf32>
    scf.yield %o : tensor<8x64xf32>
  } else {
    %e = tensor.empty() : tensor<8x64xf32>
    scf.yield %e : tensor<8x64xf32>
  }
  return %r : tensor<8x64xf32>
}
