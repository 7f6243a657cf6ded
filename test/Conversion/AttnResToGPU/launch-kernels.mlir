// RUN: attnres-opt %s --split-input-file --verify-diagnostics --attnres-bufferize-host --attnres-launch-kernels -o /dev/null
// RUN: attnres-opt %S/Inputs/sum.mlir --convert-attnres-to-gpu=keep-host=1 | FileCheck %s --check-prefix=NAMED
// RUN: attnres-opt %S/Inputs/sum.mlir --convert-attnres-to-gpu=keep-host=1 --attnres-bufferize-host | FileCheck %s --check-prefix=BUFFERS
// RUN: attnres-opt %S/Inputs/sum.mlir --convert-attnres-to-gpu=keep-host=1 --attnres-bufferize-host --attnres-launch-kernels | FileCheck %s --check-prefix=LAUNCHED
// RUN: not attnres-opt %S/Inputs/sum.mlir --convert-attnres-to-gpu=keep-host=1 --attnres-launch-kernels 2>&1 | FileCheck %s --check-prefix=UNBUFFERED

// convert-attnres-to-gpu with keep-host keeps the function and names on the
// op its kernels (the op's manifest entry); no host code yet.
// NAMED-LABEL: func.func @sum(
// NAMED: attnres.partition_reduce sum {{.*}} {attnres.launch = {num_partitions = 3 : i64, op = "partition_reduce_sum", output_type = "f32", sum = "sum_0_sum"}}
// NAMED-NOT: gpu.launch_func
// NAMED: gpu.func @sum_0_sum(
// NAMED-SAME: attnres.kernel = {arguments = [{alignment = 4 : i64, kind = "buffer", name = "partials"

// attnres-bufferize-host: the function on device buffers, the op on buffers
// writing the one it allocates, the kernels it names kept.
// BUFFERS-LABEL: func.func @sum(
// BUFFERS-SAME: %[[P:.*]]: memref<3x?x8xf32>) -> memref<?x8xf32>
// BUFFERS: %[[N:.*]] = memref.dim %[[P]], %c1
// BUFFERS: %[[S:.*]] = gpu.alloc  (%[[N]]) : memref<?x8xf32>
// BUFFERS: attnres.partition_reduce_into sum %[[P]] : memref<3x?x8xf32> outs(%[[S]] : memref<?x8xf32>) {attnres.launch = {{{.*}}sum = "sum_0_sum"}}
// BUFFERS: return %[[S]] : memref<?x8xf32>

// attnres-launch-kernels reads the kernel's description back from the module:
// its arguments in order, its grid rule (ceil(N / 256) blocks of 256
// threads) and the alignment its loads and stores need, which it checks of
// both buffers.
// LAUNCHED-LABEL: func.func @sum(
// LAUNCHED-SAME: %[[P:.*]]: memref<3x?x8xf32>) -> memref<?x8xf32>
// LAUNCHED-NOT: attnres.
// LAUNCHED: %[[S:.*]] = gpu.alloc
// LAUNCHED: memref.extract_aligned_pointer_as_index %[[P]]
// LAUNCHED: memref.extract_aligned_pointer_as_index %[[S]]
// LAUNCHED: arith.remui %{{.*}}, %c4_i64
// LAUNCHED: arith.remui %{{.*}}, %c4_i64
// LAUNCHED: %[[GRID:.*]] = arith.ceildivui %{{.*}}, %c256
// LAUNCHED: gpu.launch_func  @attnres_kernels::@sum_0_sum blocks in (%[[GRID]], %c1{{.*}}, %c1{{.*}}) threads in (%c256{{.*}}, %c1{{.*}}, %c1{{.*}})  args(%{{.*}} : !llvm.ptr<1>, %{{.*}} : !llvm.ptr<1>, %{{.*}} : i64)
// LAUNCHED: return %[[S]] : memref<?x8xf32>

// The launches write buffers: an op on tensors is bufferized first.
// UNBUFFERED: error: attnres-launch-kernels launches the attnres ops on buffers (attnres.forward_into, ...); bufferize this op first (attnres-bufferize-host)

// An op the conversion has not named kernels for.
func.func @unnamed(%p: tensor<3x?x8xf32>) -> tensor<?x8xf32> {
  // expected-error @+1 {{attnres-launch-kernels: the op names no kernels (its 'attnres.launch' attribute, which convert-attnres-to-gpu with keep-host=1 gives it)}}
  %s = attnres.partition_reduce sum %p : tensor<3x?x8xf32> -> tensor<?x8xf32>
  return %s : tensor<?x8xf32>
}

// -----

// A kernel the module does not have.
func.func @missing(%p: tensor<3x?x8xf32>) -> tensor<?x8xf32> {
  // expected-error @+1 {{attnres-launch-kernels: the module has no sum kernel for the op}}
  %s = attnres.partition_reduce sum %p : tensor<3x?x8xf32> {attnres.launch = {num_partitions = 3 : i64, sum = "nowhere"}} -> tensor<?x8xf32>
  return %s : tensor<?x8xf32>
}

// -----

// A kernel of another role than the op names it for.
func.func @role(%p: tensor<3x?x8xf32>) -> tensor<?x8xf32> {
  // expected-error @+1 {{attnres-launch-kernels: the op's sum kernel "km" is a merge kernel}}
  %s = attnres.partition_reduce sum %p : tensor<3x?x8xf32> {attnres.launch = {num_partitions = 3 : i64, sum = "km"}} -> tensor<?x8xf32>
  return %s : tensor<?x8xf32>
}
gpu.module @attnres_kernels {
  gpu.func @km(%a0: !llvm.ptr<1>) kernel attributes {attnres.kernel = {arguments = [{kind = "buffer", name = "o", shape = "[M, N, D]", type = "f32"}], block = 256 : i64, grid = [{divisor = 1 : i64, scale = 1 : i64, symbol = "N"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "1"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "1"}], name = "km", role = "merge", vector_width = 1 : i64, workgroup_bytes = 0 : i64}} {
    gpu.return
  }
}

// -----

// The facts the host code computes with must be the op's.
func.func @facts(%p: tensor<3x?x8xf32>) -> tensor<?x8xf32> {
  // expected-error @+1 {{attnres-launch-kernels: num_partitions = 4 is not the op's 3}}
  %s = attnres.partition_reduce sum %p : tensor<3x?x8xf32> {attnres.launch = {num_partitions = 4 : i64, sum = "k"}} -> tensor<?x8xf32>
  return %s : tensor<?x8xf32>
}

// -----

func.func @sources(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>) -> tensor<?x64xf32> {
  // expected-error @+1 {{attnres-launch-kernels: num_sources = 8 is not the op's 4}}
  %o, %lse = attnres.forward packed(%v : tensor<4x?x64xf32>) query(%q : tensor<64xf32>) save(lse) {attnres.launch = {forward = "kf", forward_partial = "kp", merge = "km", num_sources = 8 : i64, width = 64 : i64, rank = 64 : i64, num_queries = 1 : i64, rows_per_block = 4 : i64}} -> tensor<?x64xf32>, tensor<?xf32>
  return %o : tensor<?x64xf32>
}

// -----

// A description without the grid convert-attnres-to-gpu writes.
func.func @malformed(%p: tensor<3x?x8xf32>) -> tensor<?x8xf32> {
  %s = attnres.partition_reduce sum %p : tensor<3x?x8xf32> {attnres.launch = {num_partitions = 3 : i64, sum = "k"}} -> tensor<?x8xf32>
  return %s : tensor<?x8xf32>
}
gpu.module @attnres_kernels {
  // expected-error @+1 {{the kernel's attnres.kernel description needs 'arguments', a 'grid' of three dimensions and 'workgroup_bytes'}}
  gpu.func @k(%partials: !llvm.ptr<1>) kernel attributes {attnres.kernel = {arguments = [], name = "k", role = "sum"}} {
    gpu.return
  }
}

// -----

// A description listing other arguments than the kernel takes.
func.func @arity(%p: tensor<3x?x8xf32>) -> tensor<?x8xf32> {
  %s = attnres.partition_reduce sum %p : tensor<3x?x8xf32> {attnres.launch = {num_partitions = 3 : i64, sum = "k"}} -> tensor<?x8xf32>
  return %s : tensor<?x8xf32>
}
gpu.module @attnres_kernels {
  // expected-error @+1 {{the kernel's attnres.kernel description lists 0 arguments of 1}}
  gpu.func @k(%a0: !llvm.ptr<1>) kernel attributes {attnres.kernel = {arguments = [], block = 256 : i64, grid = [{divisor = 1 : i64, scale = 1 : i64, symbol = "N"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "1"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "1"}], name = "k", role = "sum", vector_width = 1 : i64, workgroup_bytes = 0 : i64}} {
    gpu.return
  }
}

// -----

// A grid rule that would divide by zero: the numbers are held to the
// manifest schema's ranges.
func.func @divisor(%p: tensor<3x?x8xf32>) -> tensor<?x8xf32> {
  %s = attnres.partition_reduce sum %p : tensor<3x?x8xf32> {attnres.launch = {num_partitions = 3 : i64, sum = "k"}} -> tensor<?x8xf32>
  return %s : tensor<?x8xf32>
}
gpu.module @attnres_kernels {
  // expected-error @+1 {{the kernel's attnres.kernel description has 'divisor' = 0, outside [1, 1048576]}}
  gpu.func @k(%a0: !llvm.ptr<1>) kernel attributes {attnres.kernel = {arguments = [{kind = "buffer", name = "o", shape = "[M, N, D]", type = "f32"}], block = 256 : i64, grid = [{divisor = 0 : i64, scale = 1 : i64, symbol = "N"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "1"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "1"}], name = "k", role = "sum", vector_width = 1 : i64, workgroup_bytes = 0 : i64}} {
    gpu.return
  }
}

// -----

// A description names its own kernel: the runtime finds kernels by it.
func.func @renamed(%p: tensor<3x?x8xf32>) -> tensor<?x8xf32> {
  %s = attnres.partition_reduce sum %p : tensor<3x?x8xf32> {attnres.launch = {num_partitions = 3 : i64, sum = "other"}} -> tensor<?x8xf32>
  return %s : tensor<?x8xf32>
}
gpu.module @attnres_kernels {
  // expected-error @+1 {{attnres-launch-kernels: the kernel's description names 'other', which must be its own name and name no other kernel of the module}}
  gpu.func @k(%a0: !llvm.ptr<1>) kernel attributes {attnres.kernel = {arguments = [{kind = "buffer", name = "o", shape = "[M, N, D]", type = "f32"}], block = 256 : i64, grid = [{divisor = 1 : i64, scale = 1 : i64, symbol = "N"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "1"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "1"}], name = "other", role = "sum", vector_width = 1 : i64, workgroup_bytes = 0 : i64}} {
    gpu.return
  }
}

// -----

// The runtime's functions have their types.
// expected-error @+1 {{attnres-launch-kernels: @attnresGpuRefuseLaunch is the runtime's function of type '(!llvm.ptr) -> ()'}}
func.func private @attnresGpuRefuseLaunch(i64)
func.func @clash(%p: tensor<3x?x8xf32>) -> tensor<?x8xf32> {
  %s = attnres.partition_reduce sum %p : tensor<3x?x8xf32> {attnres.launch = {num_partitions = 3 : i64, sum = "k"}} -> tensor<?x8xf32>
  return %s : tensor<?x8xf32>
}

// -----

// The host code's strings are its own symbols.
// expected-error @+1 {{attnres-launch-kernels: the symbol names of the host code's strings (attnres_kernel_name_*, attnres_refusal_*) are its own; the module has @attnres_refusal_1}}
llvm.mlir.global internal constant @attnres_refusal_1("mine\00") {addr_space = 0 : i32}
func.func @strings(%p: tensor<3x?x8xf32>) -> tensor<?x8xf32> {
  %s = attnres.partition_reduce sum %p : tensor<3x?x8xf32> {attnres.launch = {num_partitions = 3 : i64, sum = "k"}} -> tensor<?x8xf32>
  return %s : tensor<?x8xf32>
}

// -----

// A fixed count must be a count.
func.func @count(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>) -> tensor<?x64xf32> {
  // expected-error @+1 {{attnres-launch-kernels: forward_partitions must be a count in [1, 2147483647] (absent: the runtime's rule)}}
  %o, %lse = attnres.forward packed(%v : tensor<4x?x64xf32>) query(%q : tensor<64xf32>) save(lse) {attnres.launch = {forward = "kf", forward_partial = "kp", merge = "km", num_sources = 4 : i64, width = 64 : i64, rank = 64 : i64, num_queries = 1 : i64, rows_per_block = 4 : i64, forward_partitions = 0 : i64}} -> tensor<?x64xf32>, tensor<?xf32>
  return %o : tensor<?x64xf32>
}

// -----

// Of a signless integer type, as the conversion writes it.
func.func @unsigned(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>) -> tensor<?x64xf32> {
  // expected-error @+1 {{attnres-launch-kernels: forward_partitions must be a count in [1, 2147483647] (absent: the runtime's rule)}}
  %o, %lse = attnres.forward packed(%v : tensor<4x?x64xf32>) query(%q : tensor<64xf32>) save(lse) {attnres.launch = {forward = "kf", forward_partial = "kp", merge = "km", num_sources = 4 : i64, width = 64 : i64, rank = 64 : i64, num_queries = 1 : i64, rows_per_block = 4 : i64, forward_partitions = 2 : ui64}} -> tensor<?x64xf32>, tensor<?xf32>
  return %o : tensor<?x64xf32>
}

// -----

// The sizes the host code computes with are held to the schema's ranges.
func.func @rows(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>) -> tensor<?x64xf32> {
  // expected-error @+1 {{attnres-launch-kernels: rows_per_block must be an integer in [1, 1024]}}
  %o, %lse = attnres.forward packed(%v : tensor<4x?x64xf32>) query(%q : tensor<64xf32>) save(lse) {attnres.launch = {forward = "kf", forward_partial = "kp", merge = "km", num_sources = 4 : i64, width = 64 : i64, rank = 64 : i64, num_queries = 1 : i64, rows_per_block = 0 : i64}} -> tensor<?x64xf32>, tensor<?xf32>
  return %o : tensor<?x64xf32>
}

// -----

// A backward's workspace is sized by its partial rows: the fact is needed.
func.func @partial_rows(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>, %g: tensor<?x64xf32>, %lse: tensor<?xf32>) -> tensor<4x?x64xf32> {
  // expected-error @+1 {{attnres-launch-kernels: the op's attnres.launch needs 'partial_rows_per_block'}}
  %gv, %gq = attnres.backward packed(%v : tensor<4x?x64xf32>) query(%q : tensor<64xf32>) grad(%g : tensor<?x64xf32>) lse(%lse : tensor<?xf32>) {attnres.launch = {backward = "kb", finalize = "kz", num_sources = 4 : i64, width = 64 : i64, rank = 64 : i64, num_queries = 1 : i64, rows_per_block = 4 : i64}} -> tensor<4x?x64xf32>, tensor<64xf32>
  return %gv : tensor<4x?x64xf32>
}

// -----

// More partitions than sources.
func.func @partitions(%v: tensor<4x?x64xf32>, %q: tensor<64xf32>) -> tensor<?x64xf32> {
  // expected-error @+1 {{attnres-launch-kernels: forward_partitions = 5 is more than the op's 4 sources}}
  %o, %lse = attnres.forward packed(%v : tensor<4x?x64xf32>) query(%q : tensor<64xf32>) save(lse) {attnres.launch = {forward = "kf", forward_partial = "kp", merge = "km", num_sources = 4 : i64, width = 64 : i64, rank = 64 : i64, num_queries = 1 : i64, rows_per_block = 4 : i64, forward_partitions = 5 : i64}} -> tensor<?x64xf32>, tensor<?xf32>
  return %o : tensor<?x64xf32>
}
gpu.module @attnres_kernels {
  gpu.func @kf(%a0: !llvm.ptr<1>) kernel attributes {attnres.kernel = {arguments = [{kind = "buffer", name = "o", shape = "[M, N, D]", type = "f32"}], block = 256 : i64, grid = [{divisor = 1 : i64, scale = 1 : i64, symbol = "N"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "1"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "1"}], name = "kf", role = "forward", vector_width = 1 : i64, workgroup_bytes = 0 : i64}} {
    gpu.return
  }
  gpu.func @kp(%a0: !llvm.ptr<1>) kernel attributes {attnres.kernel = {arguments = [{kind = "buffer", name = "o", shape = "[M, N, D]", type = "f32"}], block = 256 : i64, grid = [{divisor = 1 : i64, scale = 1 : i64, symbol = "N"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "1"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "1"}], name = "kp", role = "forward_partial", vector_width = 1 : i64, workgroup_bytes = 0 : i64}} {
    gpu.return
  }
  gpu.func @km(%a0: !llvm.ptr<1>) kernel attributes {attnres.kernel = {arguments = [{kind = "buffer", name = "o", shape = "[M, N, D]", type = "f32"}], block = 256 : i64, grid = [{divisor = 1 : i64, scale = 1 : i64, symbol = "N"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "1"}, {divisor = 1 : i64, scale = 1 : i64, symbol = "1"}], name = "km", role = "merge", vector_width = 1 : i64, workgroup_bytes = 0 : i64}} {
    gpu.return
  }
}

// -----

// An op on buffers inside a region (attnres-bufferize-host refuses one on
// tensors) is refused, as by the conversion.
func.func @nested(%p: memref<3x?x8xf32>, %s: memref<?x8xf32>, %c: i1) {
  scf.if %c {
    // expected-error @+1 {{attnres-launch-kernels: keep-host=1 launches attnres ops at the top level of a function of the module it runs on; this one is inside 'scf.if'}}
    attnres.partition_reduce_into sum %p : memref<3x?x8xf32> outs(%s : memref<?x8xf32>) {attnres.launch = {num_partitions = 3 : i64, sum = "k"}}
  }
  return
}

// -----

// An op on views (a tile of a buffer): its kernels address whole buffers
// from their first element.
func.func @view(%p: memref<3x?x8xf32, strided<[?, 8, 1], offset: ?>>, %s: memref<?x8xf32>) {
  // expected-error @+1 {{attnres-launch-kernels launches the kernels of whole buffers, whose elements lie one after the other (an identity layout, or consecutive rows of such a buffer); operand #0 is 'memref<3x?x8xf32, strided<[?, 8, 1], offset: ?>>'}}
  attnres.partition_reduce_into sum %p : memref<3x?x8xf32, strided<[?, 8, 1], offset: ?>> outs(%s : memref<?x8xf32>) {attnres.launch = {num_partitions = 3 : i64, sum = "k"}}
  return
}

// -----

// So is a function of a nested module: the pass launches the functions of
// the module it runs on.
module {
  module @inner {
    func.func @inner(%p: tensor<3x?x8xf32>) -> tensor<?x8xf32> {
      // expected-error @+1 {{attnres-launch-kernels: keep-host=1 launches attnres ops at the top level of a function of the module it runs on; this one is in a function of a nested module}}
      %s = attnres.partition_reduce sum %p : tensor<3x?x8xf32> {attnres.launch = {num_partitions = 3 : i64, sum = "k"}} -> tensor<?x8xf32>
      return %s : tensor<?x8xf32>
    }
  }
}
