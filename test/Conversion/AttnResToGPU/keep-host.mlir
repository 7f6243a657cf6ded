// RUN: attnres-opt %s --split-input-file --verify-diagnostics \
// RUN:   --convert-attnres-to-gpu="keep-host=1 async-copies=1 clusters=1" | FileCheck %s

// With keep-host, the function stays: the packed sources and the weights are
// read in place as buffers, o and lse are allocated on the device with the
// token count as their dynamic size, the table of the four source rows
// (base + l * N * D * 2 bytes) is filled on the host and copied to the
// device, and the forward kernel is launched with the grid of its own rule,
// ceil(N / 4) blocks of 128 threads (4 rows a block), only when there are
// tokens.
// Each source row and each caller buffer is checked against the alignment
// the kernel's loads need (rows: 8 bf16 vectors, 16 bytes); a misaligned one
// is reported through the runtime and the launch skipped.
// CHECK-DAG: llvm.mlir.global internal constant @attnres_refusal_1("the row of source 0 must be aligned to 16 bytes for kernel packed_0_forward; the launch was skipped\00")
// CHECK-DAG: llvm.mlir.global internal constant @attnres_refusal_5("'query' must be aligned to 16 bytes for kernel packed_0_forward; the launch was skipped\00")
// CHECK-DAG: llvm.mlir.global internal constant @attnres_refusal_6("'key_norm' must be aligned to 16 bytes for kernel packed_0_forward; the launch was skipped\00")
// CHECK-DAG: func.func private @attnresGpuRefuseLaunch(!llvm.ptr)
// CHECK-LABEL: func.func @packed(
// CHECK-SAME: %[[V:.*]]: tensor<4x?x256xbf16>, %[[Q:.*]]: tensor<256xbf16>, %[[G:.*]]: tensor<256xbf16>)
// CHECK: %[[N:.*]] = tensor.dim %[[V]], %c1
// CHECK: %[[N64:.*]] = arith.index_cast %{{.*}} : index to i64
// CHECK-DAG: %[[VB:.*]] = bufferization.to_buffer %[[V]] read_only : tensor<4x?x256xbf16> to memref<4x?x256xbf16>
// CHECK-DAG: bufferization.to_buffer %[[Q]] read_only
// CHECK-DAG: bufferization.to_buffer %[[G]] read_only
// CHECK: %[[O:.*]] = gpu.alloc  (%[[N]]) : memref<?x256xbf16>
// CHECK: %[[LSE:.*]] = gpu.alloc  (%[[N]]) : memref<?xf32>
// CHECK: %[[HOST:.*]] = memref.alloca() : memref<4xi64>
// CHECK: %[[ROW:.*]] = arith.muli %[[N64]], %c512_i64
// CHECK: memref.store %{{.*}}, %[[HOST]][%c3{{.*}}] : memref<4xi64>
// CHECK: %[[TABLE:.*]] = gpu.alloc  () : memref<4xi64>
// CHECK: gpu.memcpy  %[[TABLE]], %[[HOST]]
// CHECK: %[[REM:.*]] = arith.remui %{{.*}}, %c16_i64
// CHECK: llvm.mlir.addressof @attnres_refusal_5
// CHECK: scf.if
// CHECK-NEXT: func.call @attnresGpuRefuseLaunch
// CHECK: %[[BLOCKS:.*]] = arith.ceildivui %{{.*}}, %c4
// CHECK: %[[ANY:.*]] = arith.cmpi ugt, %{{.*}}, %c0
// CHECK: %[[GO:.*]] = arith.andi %[[ANY]], %{{.*}} : i1
// CHECK: scf.if %[[GO]] {
// CHECK-NEXT: gpu.launch_func  @attnres_kernels::@packed_0_forward blocks in (%[[BLOCKS]], %{{.*}}, %{{.*}}) threads in (%c128, %{{.*}}, %{{.*}}) args(%{{.*}} : !llvm.ptr<1>, %{{.*}} : !llvm.ptr<1>, %{{.*}} : !llvm.ptr<1>, %{{.*}} : !llvm.ptr<1>, %{{.*}} : !llvm.ptr<1>, %[[N64]] : i64)
// CHECK: gpu.dealloc  %[[TABLE]]
// CHECK: %[[OT:.*]] = bufferization.to_tensor %[[O]] restrict writable
// CHECK: %[[LSET:.*]] = bufferization.to_tensor %[[LSE]] restrict writable
// CHECK: return %[[OT]], %[[LSET]]
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
// CHECK-SAME: %[[A:.*]]: tensor<2x?x64xf32>, %[[B:.*]]: tensor<2x?x64xf32>
// CHECK: %[[T1:.*]] = tensor.dim %[[A]], %c1
// CHECK: arith.muli %{{.*}}, %[[T1]]
// CHECK-DAG: %[[AB:.*]] = bufferization.to_buffer %[[A]] read_only
// CHECK-DAG: %[[BB:.*]] = bufferization.to_buffer %[[B]] read_only
// CHECK: gpu.alloc  (%[[T1]]) : memref<2x?x64xf32>
// CHECK: gpu.alloc  (%[[T1]]) : memref<2x?xf32>
// CHECK: gpu.alloc  (%[[T1]]) : memref<2x?x64xf32>
// CHECK: memref.extract_aligned_pointer_as_index %[[AB]]
// CHECK: memref.extract_aligned_pointer_as_index %[[BB]]
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
// CHECK: %[[T:.*]] = tensor.dim %{{.*}}, %c1
// CHECK: gpu.alloc  (%[[T]]) : memref<3x?x64xbf16>
// CHECK: gpu.alloc  (%[[T]]) : memref<3x?xf32>
// CHECK: gpu.alloc  (%[[T]]) : memref<3x?x64xbf16>
// CHECK: gpu.launch_func  @attnres_kernels::@queries_0_forward
func.func @queries(%v: tensor<5x?x64xbf16>, %q: tensor<3x64xbf16>,
                   %h: tensor<3x64xbf16>) -> tensor<3x?x64xbf16> {
  %o, %lse, %o_pre = attnres.forward packed(%v : tensor<5x?x64xbf16>)
      query(%q : tensor<3x64xbf16>) output_norm(%h : tensor<3x64xbf16>)
      -> tensor<3x?x64xbf16>, tensor<3x?xf32>, tensor<3x?x64xbf16>
  return %o : tensor<3x?x64xbf16>
}

// -----

// Only the forward is lowered to launches so far: a backward says so.
func.func @backward(%v: tensor<2x?x64xf32>, %q: tensor<64xf32>,
                    %do: tensor<?x64xf32>, %lse: tensor<?xf32>)
    -> (tensor<2x?x64xf32>, tensor<64xf32>) {
  // expected-error @+1 {{convert-attnres-to-gpu: keep-host=1 lowers attnres.forward to launches so far; attnres.backward is launched by the runtime from a bundle (keep-host=0)}}
  %dv, %dq = attnres.backward packed(%v : tensor<2x?x64xf32>)
      query(%q : tensor<64xf32>) grad(%do : tensor<?x64xf32>)
      lse(%lse : tensor<?xf32>)
      -> tensor<2x?x64xf32>, tensor<64xf32>
  return %dv, %dq : tensor<2x?x64xf32>, tensor<64xf32>
}
