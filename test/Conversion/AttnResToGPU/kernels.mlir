// RUN: attnres-opt %s --split-input-file --convert-attnres-to-gpu | FileCheck %s
// RUN: not attnres-opt %S/Inputs/sum-on-buffers.mlir --convert-attnres-to-gpu 2>&1 | FileCheck %s --check-prefix=BUFFERS
// BUFFERS: error: convert-attnres-to-gpu lowers the attnres ops on tensors; 'attnres.partition_reduce_into' is an op on buffers, what bufferization makes of one: lower the module before bufferizing it
// RUN: attnres-opt %s --split-input-file --convert-attnres-to-gpu=subgroup-size=64 | FileCheck %s --check-prefix=AMD
// RUN: not attnres-opt %s --split-input-file --convert-attnres-to-gpu=subgroup-size=48 2>&1 | FileCheck %s --check-prefix=BAD
// BAD: convert-attnres-to-gpu: subgroup-size must be a power of two
// RUN: not attnres-opt %s --split-input-file --convert-attnres-to-gpu=reduction-threads=2048 2>&1 | FileCheck %s --check-prefix=REDUCTION
// RUN: not attnres-opt %s --split-input-file --convert-attnres-to-gpu=reduction-threads=-1 2>&1 | FileCheck %s --check-prefix=REDUCTION
// REDUCTION: convert-attnres-to-gpu: reduction-threads must be 0 (chosen) or at most max-block-threads (1024), got {{2048|-1}}
// RUN: not attnres-opt %s --split-input-file --convert-attnres-to-gpu=merge-loads-in-flight=-1 2>&1 | FileCheck %s --check-prefix=NEGATIVE
// RUN: not attnres-opt %s --split-input-file --convert-attnres-to-gpu=merge-tile-columns=-512 2>&1 | FileCheck %s --check-prefix=NEGATIVE
// NEGATIVE: convert-attnres-to-gpu: forward-source-batch, backward-source-batch, unroll-sources, merge-tile-columns and merge-loads-in-flight must be >= 0
// With asynchronous copies (NVIDIA sm_80+), the backward stages its source
// rows through workgroup memory; the forward does not (measured slower).
// A thread of the backward holds one vector of each of its rows: 128
// registers suffice, and ptxas is told so (four blocks of 128 threads a
// multiprocessor); not on AMD, whose backend sizes its waves itself.
// RUN: attnres-opt %s --split-input-file --convert-attnres-to-gpu=subgroup-size=64 | FileCheck %s --check-prefix=AMD-BUDGET
// AMD-BUDGET-NOT: nvvm.minctasm
// RUN: not attnres-opt %s --split-input-file --convert-attnres-to-gpu=backward-min-blocks=33 2>&1 | FileCheck %s --check-prefix=MIN-BLOCKS
// RUN: not attnres-opt %s --split-input-file --convert-attnres-to-gpu=forward-min-blocks=-2 2>&1 | FileCheck %s --check-prefix=MIN-BLOCKS
// MIN-BLOCKS: convert-attnres-to-gpu: forward-min-blocks and backward-min-blocks must be in [-1, 32]
// RUN: attnres-opt %s --split-input-file --convert-attnres-to-gpu=async-copies=1 | FileCheck %s --check-prefix=STAGED
// RUN: not attnres-opt %s --split-input-file --convert-attnres-to-gpu=backward-staged-batches=2 2>&1 | FileCheck %s --check-prefix=NO-ASYNC
// NO-ASYNC: convert-attnres-to-gpu: staged batches need asynchronous copies (async-copies=1: NVIDIA sm_80 and later)
// RUN: not attnres-opt %s --split-input-file --convert-attnres-to-gpu="async-copies=1 backward-staged-batches=9" 2>&1 | FileCheck %s --check-prefix=STAGED-RANGE
// STAGED-RANGE: convert-attnres-to-gpu: forward-staged-batches must be in [0, 8] and backward-staged-batches in [-1, 8]
// RUN: attnres-opt %s --split-input-file --convert-attnres-to-gpu=clusters=1 | FileCheck %s --check-prefix=CLUSTER
// RUN: attnres-opt %s --split-input-file --convert-attnres-to-gpu | FileCheck %s --check-prefix=NO-CLUSTER
// NO-CLUSTER-NOT: forward_cluster
// NO-CLUSTER-NOT: nvvm.cluster
// RUN: not attnres-opt %s --split-input-file --convert-attnres-to-gpu="clusters=1 subgroup-size=64" 2>&1 | FileCheck %s --check-prefix=CLUSTER-AMD
// CLUSTER-AMD: convert-attnres-to-gpu: clusters=1 is NVIDIA's (sm_90 and later; subgroup-size 32)
// RUN: attnres-opt %s --split-input-file --convert-attnres-to-gpu="forward-source-batch=2 forward-prefetch=0" | FileCheck %s --check-prefix=ASKED

// A forward becomes three kernels (unsplit, partial, merge). D = 1024 bf16
// is 128 vectors of 8: by default two vectors a lane, a block of 64 threads
// per row (two subgroups). The sources are walked in batches of two: both
// rows loaded, then one row sum (shuffles, then a workgroup buffer across the
// two subgroups) for their key norms and dot products, one barrier per
// batch. The workgroup buffer: 2 floats per value, 1 settled value (the
// output norm) and two halves of 2 x (1 + M) = 4 loop values: 18 floats.
// The host function is gone: launching is the runtime's. The key is the
// whole row (R = D), so the query is read as vectors too, before the walk
// (and is a vector-aligned row buffer, "[M, D]": its alignment, 16 bytes, is
// read from that load; the source table's, 8, from its pointer loads).
// CHECK-LABEL: gpu.module @attnres_kernels
// CHECK-SAME: attnres.ops = [{
// CHECK-SAME: forward = "layer_0_forward"
// CHECK-SAME: forward_partial = "layer_0_forward_partial"
// CHECK-SAME: merge = "layer_0_merge"
// CHECK-SAME: op = "forward"
// CHECK-SAME: rows_per_block = 1
// CHECK-SAME: source_batch = 2
// CHECK-SAME: threads_per_row = 64
// CHECK-SAME: vector_width = 8
// CHECK: gpu.func @layer_0_forward(%{{.*}}: !llvm.ptr<1>, %{{.*}}: !llvm.ptr<1>, %{{.*}}: !llvm.ptr<1>, %{{.*}}: !llvm.ptr<1>, %{{.*}}: i64) workgroup(%{{.*}} : memref<18xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}) kernel
// CHECK-SAME: {alignment = 8 : i64, kind = "table", name = "sources", shape = "L x [N, D]", type = "bf16"}
// CHECK-SAME: {alignment = 16 : i64, kind = "buffer", name = "query", shape = "[M, D]", type = "bf16"}
// CHECK-SAME: block = 64
// CHECK-SAME: grid = [{divisor = 1 : i64, scale = 1 : i64, symbol = "N"}
// CHECK-SAME: known_block_size = array<i32: 64, 1, 1>
// CHECK-NOT: -> bf16
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK-NOT: -> bf16
// CHECK: scf.for
// CHECK-COUNT-4: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK: gpu.shuffle  xor
// CHECK: gpu.barrier
// CHECK: vector.load %{{.*}} {alignment = 8 : i64} : memref<18xf32, #gpu.address_space<workgroup>>, vector<2xf32>
// CHECK-NOT: gpu.barrier
// CHECK: math.exp2
// CHECK: scf.yield
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 16 : i64} : vector<8xbf16>, !llvm.ptr<1>
// CHECK: gpu.func @layer_0_forward_partial
// CHECK-SAME: name = "num_partitions"
// CHECK: gpu.func @layer_0_merge
// CHECK-NOT: func.func
// On AMD the 64 lanes of a row are one subgroup: four rows a block, no
// workgroup buffer.
// AMD-LABEL: gpu.module @attnres_kernels
// AMD: gpu.func @layer_0_forward
// AMD-SAME: memref<1xf32, #gpu.address_space<workgroup>>
// AMD-SAME: block = 256
// AMD-NOT: gpu.barrier
// AMD: gpu.func @layer_0_forward_partial
// With clusters (sm_90), a fourth kernel: the partial walk, then the merge
// in the cluster of the row's P blocks (grid N x P, cluster_y). Each block
// stores its FP32 partial row (1024 floats, after the 18 of the row sums,
// aligned to 8: from float 24) and lse into workgroup memory; a cluster
// barrier; the lse of all eight possible partitions through distributed
// shared memory (mapa to address space 7), then each of its tile's vectors
// of 4 merged from the eight regions (16-byte loads) and stored as 4 bf16
// (8 bytes); a last barrier before the block exits.
// CLUSTER-LABEL: gpu.module @attnres_kernels
// CLUSTER-SAME: forward_cluster = "layer_0_forward_cluster"
// CLUSTER: gpu.func @layer_0_forward_cluster
// CLUSTER-SAME: memref<1050xf32, #gpu.address_space<workgroup>>
// CLUSTER-SAME: {alignment = 8 : i64, kind = "buffer", name = "o", shape = "[M, N, D]", type = "bf16"}
// CLUSTER-SAME: block = 64
// CLUSTER-SAME: cluster_y = true
// CLUSTER-SAME: grid = [{divisor = 1 : i64, scale = 1 : i64, symbol = "N"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "P"}
// CLUSTER-SAME: role = "forward_cluster"
// CLUSTER: llvm.store %{{.*}}, %{{.*}} {alignment = 16 : i64} : vector<8xf32>, !llvm.ptr<3>
// CLUSTER: nvvm.cluster.arrive {aligned}
// CLUSTER-NEXT: nvvm.cluster.wait {aligned}
// CLUSTER-COUNT-8: nvvm.mapa %{{.*}}, %{{.*}} : !llvm.ptr<3> -> !llvm.ptr<7>
// CLUSTER-COUNT-8: llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<7> -> f32
// CLUSTER: scf.for
// CLUSTER-COUNT-8: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<7> -> vector<4xf32>
// CLUSTER: llvm.store %{{.*}}, %{{.*}} {alignment = 8 : i64} : vector<4xbf16>, !llvm.ptr<1>
// CLUSTER: nvvm.cluster.arrive {aligned}
// CLUSTER-NEXT: nvvm.cluster.wait {aligned}
// CLUSTER-NEXT: gpu.return
func.func @layer(%v0: tensor<?x1024xbf16>, %v1: tensor<?x1024xbf16>,
                 %q: tensor<1024xbf16>) {
  %o, %lse = attnres.forward sources(%v0, %v1 : tensor<?x1024xbf16>)
      query(%q : tensor<1024xbf16>) -> tensor<?x1024xbf16>, tensor<?xf32>
  return
}

// -----

// Small rows share a block: D = 64 bf16 is 8 vectors, so 8 lanes per row
// and 16 rows per block of 128; row sums stay within the subgroup (no
// barrier). A key of 16 of the 64 coordinates (R < D) is read element by
// element ("[M, R]": no vector alignment asked). The backward's grid is blocks of tokens x partitions of the
// sources; its 16 row groups add their FP32 partial rows of dq in group
// order through workgroup memory (15 x 8 lanes x 8 floats = 960: the only
// barriers of the kernel, after the walk) and group 0 writes the block's one
// partial row, which finalize sums: its 16 subgroups (few column tiles, so
// the most a block gets) splitting the partial rows of a tile of 32
// columns.
// Staged (STAGED): a ring of 3 batches of one source, one 16-byte vector a
// thread each (3 x 128 x 16 bytes = 1536 floats); the first batches are
// copied before the walk, then each trip waits for the oldest copy group,
// reads its rows and copies the batch 3 ahead into the same slots.
// STAGED-NOT: nvvm.cp.async
// STAGED-LABEL: gpu.func @grad_0_backward
// STAGED-SAME: workgroup(%{{.*}} : memref<1536xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// STAGED: nvvm.cp.async.shared.global %{{.*}}, %{{.*}}, 16, cache = cg
// STAGED: nvvm.cp.async.commit.group
// STAGED: scf.for
// STAGED: nvvm.cp.async.wait.group 2
// STAGED: vector.load %{{.*}} : memref<1536xf32, #gpu.address_space<workgroup>>, vector<4xf32>
// STAGED: nvvm.cp.async.shared.global
// STAGED: nvvm.cp.async.commit.group
// STAGED-LABEL: gpu.func @grad_0_finalize
// A null entry of the table of gradient rows (grad_sources, %arg6) asks for
// no gradient of that source: its row is written (and, accumulating, read)
// only where the entry is not null. Without write-tags an entry is the
// row's address as it is (no bit of it taken off).
// RUN: attnres-opt %s --split-input-file --convert-attnres-to-gpu | FileCheck %s --check-prefix=NULL-GRAD
// NULL-GRAD-LABEL: gpu.func @grad_0_backward
// NULL-GRAD: %[[SLOT:.*]] = llvm.getelementptr %arg6[%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, !llvm.ptr<1>
// NULL-GRAD-NEXT: %[[ROW:.*]] = llvm.load %[[SLOT]] {alignment = 8 : i64} : !llvm.ptr<1> -> !llvm.ptr<1>
// NULL-GRAD-NOT: llvm.ptrtoint %[[ROW]]
// NULL-GRAD: %[[NULL:.*]] = llvm.mlir.zero : !llvm.ptr<1>
// NULL-GRAD-NEXT: %[[WANTED:.*]] = llvm.icmp "ne" %[[ROW]], %[[NULL]] : !llvm.ptr<1>
// NULL-GRAD-NEXT: %[[WRITES:.*]] = arith.andi %{{.*}}, %[[WANTED]] : i1
// NULL-GRAD: %[[CHUNK:.*]] = arith.andi %[[WRITES]], %{{.*}} : i1
// NULL-GRAD-NEXT: scf.if %[[CHUNK]] {
// NULL-GRAD: %[[AT:.*]] = llvm.getelementptr %[[ROW]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, bf16
// NULL-GRAD-NEXT: llvm.store %{{.*}}, %[[AT]] {alignment = 16 : i64} : vector<8xbf16>, !llvm.ptr<1>
// NULL-GRAD-LABEL: gpu.func @grad_0_finalize
// CHECK-LABEL: gpu.module @attnres_kernels
// CHECK-SAME: backward = "grad_0_backward"
// CHECK-SAME: finalize = "grad_0_finalize"
// CHECK-SAME: partial_rows_per_block = 1
// CHECK-SAME: rows_per_block = 16
// CHECK-SAME: skips_null_gradients = true
// CHECK: gpu.func @grad_0_backward
// CHECK-SAME: workgroup(%{{.*}} : memref<960xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: {alignment = 2 : i64, kind = "buffer", name = "query", shape = "[M, R]", type = "bf16"}
// CHECK-SAME: {alignment = 2 : i64, kind = "buffer", name = "key_norm", shape = "[R]", type = "bf16"}
// CHECK-SAME: name = "grad_sources"
// CHECK-SAME: name = "partial_da"
// CHECK-SAME: name = "num_blocks"
// CHECK-SAME: name = "num_partitions"
// CHECK-SAME: grid = [{divisor = 1 : i64, scale = 1 : i64, symbol = "B"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "P"}
// CHECK-SAME: nvvm.minctasm = 4
// CHECK-NOT: gpu.barrier
// CHECK: scf.yield %{{.*}}#0 : vector<8xf32>
// CHECK: gpu.barrier
// CHECK: vector.store %{{.*}} : memref<960xf32, #gpu.address_space<workgroup>>, vector<8xf32>
// CHECK: gpu.barrier
// CHECK-COUNT-15: vector.load %{{.*}} : memref<960xf32, #gpu.address_space<workgroup>>, vector<8xf32>
// CHECK-NOT: gpu.barrier
// CHECK: gpu.func @grad_0_finalize
// CHECK-SAME: workgroup(%{{.*}} : memref<512xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: name = "dq"
// CHECK-SAME: name = "dg"
// CHECK-SAME: block = 512
// CHECK-SAME: grid = [{divisor = 1 : i64, scale = 1 : i64, symbol = "1"}
// CHECK: scf.for
// CHECK: memref.store
// CHECK: gpu.barrier
// CHECK: memref.load
func.func @grad(%v: tensor<3x?x64xbf16>, %q: tensor<16xbf16>, %g: tensor<16xbf16>,
                %do: tensor<?x64xbf16>, %lse: tensor<?xf32>, %o: tensor<?x64xbf16>) {
  %dv, %dq, %dg = attnres.backward packed(%v : tensor<3x?x64xbf16>)
      query(%q : tensor<16xbf16>) key_norm(%g : tensor<16xbf16>)
      grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<?xf32>) saved(%o : tensor<?x64xbf16>)
      -> tensor<3x?x64xbf16>, tensor<16xbf16>, tensor<16xbf16>
  return
}

// -----

// The backward at D = 2048 bf16 (256 vectors): 128 lanes of two vectors, one
// row a block (measured faster on the H200 than 64 lanes of four). Staged,
// its batches take 2 x 128 x 16 bytes = 4 KiB of the ring, so the ring holds
// two of them (2048 floats after the row sums' 32), not three: the oldest
// copy group is waited for with one still in flight.
// CHECK-LABEL: gpu.module @attnres_kernels
// CHECK-SAME: backward = "wide_0_backward"
// CHECK-SAME: rows_per_block = 1
// CHECK-SAME: threads_per_row = 128
// CHECK: gpu.func @wide_0_backward
// CHECK-SAME: block = 128
// STAGED-LABEL: gpu.func @wide_0_backward
// STAGED-SAME: workgroup(%{{.*}} : memref<2080xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// STAGED: scf.for
// STAGED: nvvm.cp.async.wait.group 1
// STAGED-LABEL: gpu.func @wide_0_finalize
func.func @wide(%v: tensor<8x?x2048xbf16>, %q: tensor<2048xbf16>,
                %do: tensor<?x2048xbf16>, %lse: tensor<?xf32>, %o: tensor<?x2048xbf16>) {
  %dv, %dq = attnres.backward packed(%v : tensor<8x?x2048xbf16>)
      query(%q : tensor<2048xbf16>)
      grad(%do : tensor<?x2048xbf16>) lse(%lse : tensor<?xf32>) saved(%o : tensor<?x2048xbf16>)
      -> tensor<8x?x2048xbf16>, tensor<2048xbf16>
  return
}

// -----

// partition_reduce ops get a merge (sink as an argument) or a sum kernel.
// Four partitions are unrolled, their lse in registers: no loop over them,
// and rows of 8 lanes need no barrier. 64 partitions are shared by the lanes
// of a row, their weights staged in workgroup memory (8 rows of 16 lanes x
// 128 weights), a tile at a time.
// CHECK-LABEL: gpu.module @attnres_kernels
// CHECK-SAME: has_sink = true
// CHECK-SAME: op = "partition_reduce_softmax"
// CHECK-SAME: op = "partition_reduce_sum"
// CHECK-SAME: num_partitions = 64
// CHECK: gpu.func @merges_0_merge
// CHECK-SAME: workgroup(%{{.*}} : memref<1xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: name = "sink"
// CHECK-NOT: scf.for
// CHECK-NOT: gpu.barrier
// CHECK: gpu.return
// CHECK: gpu.func @merges_1_sum
// CHECK: gpu.func @merges_2_merge
// CHECK-SAME: workgroup(%{{.*}} : memref<1024xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK: scf.for
// CHECK: memref.store
// CHECK: gpu.barrier
// CHECK: memref.load
// CHECK: gpu.barrier
func.func @merges(%p: tensor<4x?x64xf32>, %l: tensor<4x?xf32>, %s: tensor<?xf32>,
                  %x: tensor<7x16xf32>, %p64: tensor<64x?x64xf32>, %l64: tensor<64x?xf32>) {
  %o, %lse = attnres.partition_reduce softmax %p : tensor<4x?x64xf32>
      lse(%l : tensor<4x?xf32>) sink(%s : tensor<?xf32>) -> tensor<?x64xbf16>, tensor<?xf32>
  %sum = attnres.partition_reduce sum %x : tensor<7x16xf32> -> tensor<16xf32>
  %o64, %lse64 = attnres.partition_reduce softmax %p64 : tensor<64x?x64xf32>
      lse(%l64 : tensor<64x?xf32>) -> tensor<?x64xf32>, tensor<?xf32>
  return
}

// -----

// A row of 8192 bf16 takes 256 lanes of four vectors: ptxas is asked for two
// such blocks a multiprocessor (128 registers a thread; left alone it took
// 130 at L = 64, one block). The partial forward gets no budget.
// CHECK-LABEL: gpu.module @attnres_kernels
// CHECK: gpu.func @wide_0_forward
// CHECK-SAME: block = 256
// CHECK-SAME: nvvm.minctasm = 2
// CHECK: gpu.func @wide_0_forward_partial
// CHECK-NOT: nvvm.minctasm
// CHECK: gpu.func @wide_0_merge
// Its clustered forward walks without prefetching, also in two blocks a
// multiprocessor, so that 16 clusters of 8 fit on the H200.
// CLUSTER-LABEL: gpu.func @wide_0_forward_cluster
// CLUSTER-SAME: nvvm.minctasm = 2
func.func @wide(%v: tensor<2x?x8192xbf16>, %q: tensor<8192xbf16>) {
  %o, %lse = attnres.forward packed(%v : tensor<2x?x8192xbf16>)
      query(%q : tensor<8192xbf16>) -> tensor<?x8192xbf16>, tensor<?xf32>
  return
}

// -----

// With an output norm, the clustered forward merges its tile twice: first
// o_pre (and the tile's squares, summed over the block and put next to the
// lse), then, after a second cluster barrier and the P sums through
// distributed shared memory, o = o_pre * rho * weight. Three barriers.
// CLUSTER-LABEL: gpu.func @normed_0_forward_cluster
// CLUSTER-SAME: name = "output_norm"
// CLUSTER-SAME: name = "o_pre"
// CLUSTER: nvvm.cluster.wait {aligned}
// CLUSTER: scf.for
// CLUSTER: gpu.barrier
// CLUSTER: nvvm.cluster.wait {aligned}
// CLUSTER: math.rsqrt
// CLUSTER: scf.for
// CLUSTER: nvvm.cluster.wait {aligned}
// CLUSTER-NEXT: gpu.return
func.func @normed(%v: tensor<4x?x1024xbf16>, %q: tensor<1024xbf16>,
                  %h: tensor<1024xbf16>) {
  %o, %lse, %o_pre = attnres.forward packed(%v : tensor<4x?x1024xbf16>)
      query(%q : tensor<1024xbf16>) output_norm(%h : tensor<1024xbf16>)
      save(o_pre) -> tensor<?x1024xbf16>, tensor<?xf32>, tensor<?x1024xbf16>
  return
}

// -----

// A backward given the lse's gradient (of a partial result, f32 grad and
// saved o): the kernel takes it as a buffer after the saved o_pre and forms
// delta - dlse where it would form delta.
// CHECK-LABEL: backward = "partial_0_backward"
// CHECK-SAME: reads_grad_lse = true
// CHECK: gpu.func @partial_0_backward(
// CHECK-SAME: name = "saved", shape = "[M, N, D]", type = "f32"}, {alignment = 4 : i64, kind = "buffer", name = "grad_lse", shape = "[M, N]", type = "f32"}, {{{.*}}name = "grad_sources"
// CHECK: %[[AT:.*]] = llvm.getelementptr %arg5[%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32
// CHECK-NEXT: %[[DLSE:.*]] = llvm.load %[[AT]] {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK-NEXT: arith.subf %{{.*}}, %[[DLSE]] fastmath<contract> : f32
func.func @partial(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>, %q: tensor<16xf32>,
                   %do: tensor<?x64xf32>, %lse: tensor<?xf32>, %o: tensor<?x64xf32>,
                   %dlse: tensor<?xf32>) {
  %dv:2, %dq = attnres.backward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) grad(%do : tensor<?x64xf32>) lse(%lse : tensor<?xf32>)
      saved(%o : tensor<?x64xf32>) grad_lse(%dlse : tensor<?xf32>)
      -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xf32>
  return
}

// -----

// An accumulating backward: its manifest entry says so, and each chunk of a
// source gradient row is loaded from the row the gradient table points to,
// widened, added to in FP32, rounded once and stored back to the same
// address (a 128-bit load and store of 8 bf16), all of it only where the
// table's entry for the source is not null: a null entry's row is not read
// either. Without write-tags nothing else: no test of an entry's bit 0, and
// no manifest fact that says it takes tagged entries.
// CHECK-LABEL: accumulates = true, backward = "accumulating_0_backward"
// CHECK-SAME: skips_null_gradients = true
// CHECK-NOT: writes_tagged_gradients
// CHECK: gpu.func @accumulating_0_backward(
// CHECK-NOT: llvm.ptrtoint
// CHECK: %[[NULL:.*]] = llvm.mlir.zero : !llvm.ptr<1>
// CHECK-NEXT: %[[WANTED:.*]] = llvm.icmp "ne" %[[ROW:.*]], %[[NULL]] : !llvm.ptr<1>
// CHECK-NEXT: %[[WRITES:.*]] = arith.andi %{{.*}}, %[[WANTED]] : i1
// CHECK: %[[CHUNK:.*]] = arith.andi %[[WRITES]], %{{.*}} : i1
// CHECK-NEXT: scf.if %[[CHUNK]] {
// CHECK: %[[AT:.*]] = llvm.getelementptr %[[ROW]][%[[I:.*]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, bf16
// CHECK-NEXT: %[[HAD:.*]] = llvm.load %[[AT]] {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK-NEXT: %[[WIDE:.*]] = llvm.fpext %[[HAD]] : vector<8xbf16> to vector<8xf32>
// CHECK-NEXT: %[[SUM:.*]] = arith.addf %{{.*}}, %[[WIDE]] fastmath<contract> : vector<8xf32>
// CHECK-NEXT: %[[ROUNDED:.*]] = llvm.fptrunc %[[SUM]] : vector<8xf32> to vector<8xbf16>
// CHECK-NEXT: %[[BACK:.*]] = llvm.getelementptr %[[ROW]][%[[I]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, bf16
// CHECK-NEXT: llvm.store %[[ROUNDED]], %[[BACK]] {alignment = 16 : i64} : vector<8xbf16>, !llvm.ptr<1>
// With write-tags (TAGS), the manifest says so, and an entry tagged in bit 0
// (its row's address plus one; rows are 16-byte aligned) is that row, which
// the accumulating backward writes over: the chunk is stored without the
// row being read. The tag is the same in every lane of the row.
// RUN: attnres-opt %s --split-input-file --convert-attnres-to-gpu=write-tags=1 | FileCheck %s --check-prefix=TAGS
// TAGS-LABEL: accumulates = true, backward = "accumulating_0_backward"
// TAGS-SAME: skips_null_gradients = true
// TAGS-SAME: writes_tagged_gradients = true
// TAGS: gpu.func @accumulating_0_backward(
// TAGS: %[[BITS:.*]] = llvm.ptrtoint %[[ENTRY:.*]] : !llvm.ptr<1> to i64
// TAGS: %[[TAG:.*]] = arith.andi %[[BITS]], %{{.*}} : i64
// TAGS: %[[BACK:.*]] = arith.subi %{{.*}}, %[[TAG]] : i64
// TAGS-NEXT: %[[ROW:.*]] = llvm.getelementptr %[[ENTRY]][%[[BACK]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
// TAGS: %[[OVER:.*]] = arith.cmpi ne, %[[TAG]], %{{.*}} : i64
// TAGS-NEXT: %[[NULL:.*]] = llvm.mlir.zero : !llvm.ptr<1>
// TAGS-NEXT: %[[WANTED:.*]] = llvm.icmp "ne" %[[ROW]], %[[NULL]] : !llvm.ptr<1>
// TAGS-NEXT: %[[WRITES:.*]] = arith.andi %{{.*}}, %[[WANTED]] : i1
// TAGS: %[[ADDS:.*]] = arith.xori %[[OVER]], %{{.*}} : i1
// TAGS: %[[CHUNK:.*]] = arith.andi %[[WRITES]], %{{.*}} : i1
// TAGS-NEXT: scf.if %[[CHUNK]] {
// TAGS: scf.if %[[OVER]] {
// TAGS-NEXT: %[[NEW:.*]] = llvm.fptrunc %{{.*}} : vector<8xf32> to vector<8xbf16>
// TAGS-NEXT: %[[TO:.*]] = llvm.getelementptr %[[ROW]][%[[I:.*]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, bf16
// TAGS-NEXT: llvm.store %[[NEW]], %[[TO]] {alignment = 16 : i64} : vector<8xbf16>, !llvm.ptr<1>
// TAGS-NEXT: }
// TAGS-NEXT: scf.if %[[ADDS]] {
// TAGS-NEXT: %[[AT:.*]] = llvm.getelementptr %[[ROW]][%[[I]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, bf16
// TAGS-NEXT: %[[HAD:.*]] = llvm.load %[[AT]] {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// TAGS-NEXT: %[[WIDE:.*]] = llvm.fpext %[[HAD]] : vector<8xbf16> to vector<8xf32>
// TAGS-NEXT: %[[SUM:.*]] = arith.addf %{{.*}}, %[[WIDE]] fastmath<contract> : vector<8xf32>
// TAGS-NEXT: %[[ROUNDED:.*]] = llvm.fptrunc %[[SUM]] : vector<8xf32> to vector<8xbf16>
// TAGS-NEXT: %[[AGAIN:.*]] = llvm.getelementptr %[[ROW]][%[[I]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, bf16
// TAGS-NEXT: llvm.store %[[ROUNDED]], %[[AGAIN]] {alignment = 16 : i64} : vector<8xbf16>, !llvm.ptr<1>
func.func @accumulating(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>, %q: tensor<16xf32>,
                        %do: tensor<?x64xbf16>, %lse: tensor<?xf32>, %o: tensor<?x64xbf16>,
                        %g0: tensor<?x64xbf16>, %g1: tensor<?x64xbf16>) {
  %dv:2, %dq = attnres.backward sources(%v0, %v1 : tensor<?x64xbf16>)
      query(%q : tensor<16xf32>) grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<?xf32>)
      saved(%o : tensor<?x64xbf16>) accumulate(%g0, %g1 : tensor<?x64xbf16>, tensor<?x64xbf16>)
      -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xf32>
  return
}

// -----

// A row of 256 bf16 is 32 vectors, one a lane: the walk takes eight sources
// a batch, so that a lane keeps eight loads in flight as four vectors in
// batches of two do (the first case), and prefetches the next batch (eight
// more vectors, carried through the loop), where a row of several vectors
// a lane does not. At a decode-sized N the forward's few blocks walk the
// batches one after another. The options still decide where given.
// CHECK-LABEL: gpu.module @attnres_kernels
// CHECK-SAME: op = "forward"
// CHECK-SAME: source_batch = 8
// CHECK-SAME: threads_per_row = 32
// CHECK: gpu.func @small_0_forward(
// CHECK-COUNT-8: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK: scf.for {{.*}} -> (f32, f32, vector<8xf32>, {{.*}}, vector<8xbf16>, vector<8xbf16>, vector<8xbf16>, vector<8xbf16>, vector<8xbf16>, vector<8xbf16>, vector<8xbf16>, vector<8xbf16>)
// CHECK-COUNT-8: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK: gpu.func @small_0_forward_partial(
// ASKED: forward = "small_0_forward"
// ASKED-SAME: source_batch = 2
// ASKED: gpu.func @small_0_forward(
// ASKED: scf.for {{.*}} -> (f32, f32, vector<8xf32>, !llvm.ptr<1>, !llvm.ptr<1>)
// With clusters, a block of four rows merges each of them with the row's
// own lanes: its rows' regions (258 floats each: the FP32 row, its lse and
// sum of squares) lie 260 floats apart, so each starts 16-byte aligned
// (from float 8, after the row sums: 8 + 3 x 260 + 258 floats), a row
// group's offset taken from the thread's group (thread / 32), and the grid
// has a block for four rows.
// CLUSTER-LABEL: gpu.func @small_0_forward_cluster
// CLUSTER-SAME: memref<1046xf32, #gpu.address_space<workgroup>>
// CLUSTER-SAME: block = 128
// CLUSTER-SAME: cluster_y = true
// CLUSTER-SAME: grid = [{divisor = 4 : i64, scale = 1 : i64, symbol = "N"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "P"}
// CLUSTER: %[[GROUP:.*]] = arith.divui %{{.*}}, %c32_i64
// CLUSTER: %[[OFFSET:.*]] = arith.muli %[[GROUP]], %c260_i64
// CLUSTER: arith.addi %c8_i64{{.*}}, %[[OFFSET]]
// CLUSTER: llvm.store %{{.*}}, %{{.*}} {alignment = 16 : i64} : vector<8xf32>, !llvm.ptr<3>
// CLUSTER: nvvm.cluster.arrive {aligned}
// CLUSTER-COUNT-8: nvvm.mapa %{{.*}}, %{{.*}} : !llvm.ptr<3> -> !llvm.ptr<7>
// CLUSTER: scf.for
// CLUSTER-COUNT-8: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<7> -> vector<4xf32>
// CLUSTER: nvvm.cluster.wait {aligned}
// CLUSTER-NEXT: gpu.return
func.func @small(%v: tensor<16x?x256xbf16>, %q: tensor<256xbf16>) {
  %o, %lse = attnres.forward packed(%v : tensor<16x?x256xbf16>)
      query(%q : tensor<256xbf16>) -> tensor<?x256xbf16>, tensor<?xf32>
  return
}

// -----

// A row of 512 bf16 is 64 vectors, one a lane on two subgroups: the row sums
// cross subgroups, and the walk keeps batches of two, unprefetched (eight
// prefetched took 150 registers, and ptxas spilled the forward with an
// output norm under its 128).
// CHECK-LABEL: gpu.module @attnres_kernels
// CHECK-SAME: source_batch = 2
// CHECK-SAME: threads_per_row = 64
// CHECK: gpu.func @two_subgroups_0_forward(
// CHECK: scf.for {{.*}} -> (f32, f32, vector<8xf32>, !llvm.ptr<1>, !llvm.ptr<1>)
func.func @two_subgroups(%v: tensor<16x?x512xbf16>, %q: tensor<512xbf16>) {
  %o, %lse = attnres.forward packed(%v : tensor<16x?x512xbf16>)
      query(%q : tensor<512xbf16>) -> tensor<?x512xbf16>, tensor<?xf32>
  return
}
