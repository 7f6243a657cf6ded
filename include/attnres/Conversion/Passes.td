//===- Passes.td - attnres conversion passes ----------------*- tablegen -*-===//

#ifndef ATTNRES_CONVERSION_PASSES_TD
#define ATTNRES_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def ConvertAttnResToLinalg : Pass<"convert-attnres-to-linalg"> {
  let summary = "Lower attnres ops to linalg.generic on tensors (the executable reference)";
  let description = [{
    Rewrites every `attnres.forward`, `attnres.backward` and
    `attnres.partition_reduce` into `linalg.generic`, `tensor` and `arith` /
    `math` ops on tensors, computing in FP32 exactly as docs/Math.md states the
    equations: the logit of a source from its RMS-normalized key, a max-shifted
    log-sum-exp, the mixture, the optional output RMS norm, and the gradients
    (with the token reductions in a fixed loop order). Token dimensions are
    flattened to one and restored on the results.

    This lowering favours clarity over speed: it is the oracle the split and
    tiling passes are checked against on the host CPU, not the GPU path.
  }];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::linalg::LinalgDialect",
    "::mlir::math::MathDialect",
    "::mlir::tensor::TensorDialect"
  ];
}

def AttnResMapToBlocks : Pass<"attnres-map-to-blocks"> {
  let summary = "Map the split and tile passes' loops to GPU blocks";
  let description = [{
    Gives each unmapped `scf.forall` around one attnres op the upstream
    device mapping (`mapping = [...]`, GPU dialect attributes) under which
    `convert-attnres-to-gpu` (keep-host) runs it: every iteration is a
    block of one grid dimension.

    * attnres-tile's loops (a forward or softmax partition_reduce over a
      tile of tokens): the loop's dimensions linearized onto the blocks, the
      last fastest; dimension i of r is `#gpu.block<linear_dim_{r-1-i}>`
      (block x takes tile `x mod T` of run `x / T`).
    * attnres-split-reduction's loop (a backward over a block of tokens):
      `#gpu.block<x>`, a block of the grid a block of tokens.

    Loops already mapped, and loops around anything else, are left alone.
    The conversion accepts a loop unmapped or mapped this way (a loop of
    one dimension with either attribute: one grid) and refuses another
    mapping with the one it needs. A transform script may map its loops
    itself (`tile_using_forall ... (mapping = [...])`).
  }];
  let dependentDialects = ["::mlir::gpu::GPUDialect"];
}

def ConvertAttnResToGPU : Pass<"convert-attnres-to-gpu", "::mlir::ModuleOp"> {
  let summary = "Generate GPU kernels for the attnres ops of a module";
  let description = [{
    Replaces the functions of the module by one `gpu.module @attnres_kernels`
    holding, for every attnres op, the kernels that compute it:

    * `attnres.forward`: `<fn>_<i>_forward` (one pass over the sources with
      an online softmax; tokens to blocks, D to lanes), and for the split over
      sources `<fn>_<i>_forward_partial` (grid y = partitions, FP32 partial
      rows) and `<fn>_<i>_merge`;
    * `attnres.backward`: `<fn>_<i>_backward` (blocks of tokens, dv and
      per-block FP32 partial rows of the query / weight gradients) and
      `<fn>_<i>_finalize` (the partial rows summed in block order);
    * `attnres.partition_reduce`: `<fn>_<i>_merge` or `<fn>_<i>_sum`.

    Each kernel carries an `attnres.kernel` dictionary (role, arguments,
    grid rule as a function of the token count, block size, workgroup
    bytes) and the module an `attnres.ops` array describing each op and its
    kernels: what the bundle manifest is written from. The host side is the
    runtime's: the manifest says what to launch.

    Rows are read with vector loads of up to 16 bytes; row sums use
    `gpu.shuffle xor` within a subgroup and a workgroup buffer across
    subgroups; accumulation is FP32; the partition and block counts of the
    split forward and the backward are kernel arguments, chosen at run time.

    The sources of a row are walked in batches: the rows of a batch are all
    loaded (and the next batch's prefetched) before one row sum reduces the
    key norms and dot products of the whole batch, so a thread keeps several
    16-byte loads in flight and a block meets at one barrier per batch. The
    options below set the lanes of a row, the batch, prefetching and
    unrolling; their defaults come from measurements on the H200
    (docs/Performance.md).

    With `keep-host=1` the functions stay, each attnres op annotated with
    its kernels and launch counts (an `attnres.launch` attribute), which
    `attnres-bufferize-host` keeps on the op on buffers and
    `attnres-launch-kernels` replaces by the host code that launches
    them. The split passes' decompositions run on the grid the IR states:
    the P partial forwards of `attnres-split-sources` and their softmax
    merge, all untiled, as the forward split over P partitions of the
    sources (partition p of the kernels reads the sources of partial
    forward p). A loop around one forward, backward or softmax merge that
    writes every result of its op (attnres-tile's loops, a split forward's
    tiled pieces, `attnres-split-reduction`'s loop over B blocks of tokens,
    each writing its tokens' source gradients and a row of each partial
    gradient) is left a loop, with no kernel, for
    `attnres-lower-tiles-to-gpu`; the `partition_reduce sum`s of a split
    backward's partial gradients are launched as sum kernels
    (`backward-partitions` applies to whole backwards only). A forward's
    or merge's loop that writes only some of its op's results (as
    canonicalization drops a loop's unused results) is given a shared
    output for each other one, written at the tile's place (a device
    buffer freed unread). What a loop's body computes and never uses is
    erased; a loop of another form is an error naming what differs, as is the split loop without keep-host (a bundle's backward is
    launched whole, its blocks chosen per call). A loop may carry the
    mapping attribute attnres-map-to-blocks gives it; another mapping is an
    error that names the one it needs.
  }];
  let options = [
    Option<"subgroupSize", "subgroup-size", "int64_t", /*default=*/"32",
           "Lanes of a subgroup (32 on NVIDIA, 64 on AMD)">,
    Option<"maxBlockThreads", "max-block-threads", "int64_t",
           /*default=*/"1024", "Largest block">,
    Option<"reductionThreads", "reduction-threads", "int64_t",
           /*default=*/"0",
           "Block size of the finalize and sum kernels; 0 chooses (sum: 256; "
           "finalize: 8 to 16 subgroups, so that its grid holds about 2048 "
           "subgroups)">,
    Option<"forwardThreadsPerRow", "forward-threads-per-row", "int64_t",
           /*default=*/"0",
           "Lanes that share a row in the forward kernels: a power of two up "
           "to a subgroup, or a multiple of the subgroup; 0 chooses">,
    Option<"backwardThreadsPerRow", "backward-threads-per-row", "int64_t",
           /*default=*/"0", "The same for the backward kernel">,
    Option<"forwardSourceBatch", "forward-source-batch", "int64_t",
           /*default=*/"0",
           "Sources whose rows the forward loads before one row sum reduces "
           "them together (loads in flight, one barrier per batch); 0 "
           "chooses (8 where a lane holds one 16-byte vector of a row and one "
           "subgroup covers the row, else 2)">,
    Option<"backwardSourceBatch", "backward-source-batch", "int64_t",
           /*default=*/"0", "The same for the backward kernel">,
    Option<"forwardPrefetch", "forward-prefetch", "int64_t",
           /*default=*/"-1",
           "Load the forward's next batch of source rows while the current "
           "one is reduced: 1 or 0; -1 chooses (off for the unsplit forward "
           "unless a lane holds one vector of a row in one subgroup, on for "
           "the partial forward of the split over sources)">,
    Option<"backwardPrefetch", "backward-prefetch", "int64_t",
           /*default=*/"-1",
           "The same for the backward kernel: 1 or 0; -1 chooses (on for one "
           "query)">,
    Option<"asyncCopies", "async-copies", "bool", /*default=*/"false",
           "The target has NVIDIA's asynchronous copies from global to "
           "workgroup memory (cp.async: sm_80 and later), which the staged "
           "source walks use">,
    Option<"writeTags", "write-tags", "bool", /*default=*/"false",
           "The backward kernels take an entry of the table of source "
           "gradients with bit 0 set (a row's address plus one; rows are "
           "16-byte aligned) as that row, which an accumulating backward "
           "writes over instead of reading and adding to (a source whose "
           "gradient starts there: no zeros filled and read back). Off by "
           "default: the test of the bit costs the accumulating backward "
           "a register and a branch a source, and every other caller's "
           "kernels stay as they are without it">,
    Option<"clusters", "clusters", "bool", /*default=*/"false",
           "The target has NVIDIA's thread-block clusters with distributed "
           "shared memory (sm_90 and later): the forward then also gets a "
           "kernel for the split over sources that merges the partial rows "
           "of a row inside the cluster of its blocks, in one launch, "
           "instead of through global memory and a merge kernel (where the "
           "row's partial rows fit in a block's workgroup memory: one query "
           "up to D = 8192)">,
    Option<"forwardStagedBatches", "forward-staged-batches", "int64_t",
           /*default=*/"0",
           "Batches of source rows the forward copies ahead into workgroup "
           "memory with asynchronous copies (needs async-copies), which hold "
           "no registers while in flight; 0: rows are loaded into registers "
           "(measured slower for the forward). Rows read in vectors of under "
           "4 bytes (16-bit values with an odd D) are always loaded into "
           "registers">,
    Option<"backwardStagedBatches", "backward-staged-batches", "int64_t",
           /*default=*/"-1",
           "The same for the backward kernel; -1 chooses (with async-copies "
           "and one query: up to 3 batches of one source, as many as fit in "
           "48 KiB of workgroup memory, or 2 where a block works on one row "
           "and a batch takes at most 4 KiB; else 0)">,
    Option<"forwardMinBlocks", "forward-min-blocks", "int64_t",
           /*default=*/"-1",
           "Blocks of the unsplit and of the clustered forward kernel that "
           "must fit on a multiprocessor at once (NVIDIA: ptxas limits "
           "registers accordingly); 0: no limit; -1 chooses 512 threads a "
           "multiprocessor (128 registers a thread): for the unsplit forward "
           "with one query and an output norm or blocks of 256 threads or "
           "more, for the clustered one with blocks of 256 threads or more; "
           "else no limit">,
    Option<"backwardMinBlocks", "backward-min-blocks", "int64_t",
           /*default=*/"-1",
           "The same for the backward kernel; -1 chooses 512 threads a "
           "multiprocessor where a thread holds at most two vectors of each "
           "of its rows and there is one query, else no limit">,
    Option<"unrollSources", "unroll-sources", "int64_t", /*default=*/"0",
           "Unroll the forward's walk over the sources at compile time up to "
           "this many sources (a loop beyond)">,
    Option<"mergeTileColumns", "merge-tile-columns", "int64_t",
           /*default=*/"0",
           "Columns of a row each block of a split forward's merge takes, "
           "where there is no output norm (the few rows of a split forward "
           "then fill more of the GPU): 0 chooses 512 (rows narrower than "
           "1024 columns stay whole); D is split into the most tiles at least "
           "that wide whose width is a multiple of 8">,
    Option<"mergeLoadsInFlight", "merge-loads-in-flight", "int64_t",
           /*default=*/"0",
           "Partial rows a merge with a run-time partition count loads before "
           "it adds any: 0 chooses 4">,
    Option<"keepHost", "keep-host", "bool", /*default=*/"false",
           "Keep the functions, each attnres op (a split forward's pieces "
           "folded into one) annotated with its kernels and the launch "
           "counts the IR fixed (its attnres.launch attribute), for "
           "attnres-bufferize-host and attnres-launch-kernels to replace "
           "by the host code that launches them">,
    Option<"backwardPartitions", "backward-partitions", "int64_t",
           /*default=*/"0",
           "With keep-host: partitions P of the sources of every backward; "
           "0: the runtime's rule at run time">
  ];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::bufferization::BufferizationDialect",
    "::mlir::func::FuncDialect",
    "::mlir::gpu::GPUDialect",
    "::mlir::LLVM::LLVMDialect",
    "::mlir::math::MathDialect",
    "::mlir::memref::MemRefDialect",
    "::mlir::NVVM::NVVMDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::tensor::TensorDialect",
    "::mlir::vector::VectorDialect"
  ];
}

def AttnResBufferizeHost : Pass<"attnres-bufferize-host", "::mlir::ModuleOp"> {
  let summary = "Bufferize the kept host functions into device memory";
  let description = [{
    The second stage of `keep-host=1`, after `convert-attnres-to-gpu`:
    upstream one-shot bufferization of the module's functions, arguments
    and results included (plain memrefs, identity layouts, so that a caller
    passes plain descriptors), with every buffer it allocates in device
    memory (`gpu.alloc`; copies `gpu.memcpy`). Each attnres op becomes its
    op on buffers (`attnres.forward_into`, ...) with its attributes, the
    kernels it names among them, reading its operands' buffers in place and
    writing into a new buffer a result. The kept functions hold only attnres
    ops, `tensor.dim`, reshapes, slices of consecutive rows and stacks
    (`convert-attnres-to-gpu` checks it), so those are the only buffers;
    and the tile loops of forwards and softmax merges, which stay loops:
    each tile's op reads its slices of the operands in place, as views, and
    writes into its tiles of the loop's outputs (the views bufferization
    would copy a new buffer into), for `attnres-lower-tiles-to-gpu`. A
    stack of `attnres-split-sources` (a `tensor.concat` of unit-dimension
    expansions of the partial results) becomes one buffer that each
    partial forward (its tile loop, or the op itself) writes its slice of
    in place, freed, like every buffer the pass allocates that the
    function does not return, at the end of the function.
  }];
  let dependentDialects = [
    "::mlir::bufferization::BufferizationDialect",
    "::mlir::gpu::GPUDialect",
    "::mlir::memref::MemRefDialect",
  ];
}

def AttnResLaunchKernels : Pass<"attnres-launch-kernels", "::mlir::ModuleOp"> {
  let summary = "Replace each attnres op on buffers by host code that launches its kernels";
  let description = [{
    The host side of `keep-host=1`, after `convert-attnres-to-gpu` and
    `attnres-bufferize-host`: the conversion keeps the functions and puts
    on each attnres op an `attnres.launch` attribute naming its kernels by
    role (the op's manifest entry: `forward`, `forward_partial`, `merge`,
    ... with the shapes the launches need) and the counts the IR
    fixed (`forward_partitions`, `backward_partitions`;
    absent: chosen at run time), which bufferization keeps on the op on
    buffers. This pass reads each kernel's description back from its
    `attnres.kernel` attribute (what the bundle manifest is written from:
    arguments, grid rule, block) and replaces each op on buffers by the
    device tables of its source rows, its workspaces (`gpu.alloc`), checks
    of its buffers against the alignment each kernel needs (a misaligned
    one skips the launches with a message), and `gpu.launch_func` of its
    kernels on grids computed in IR from the token count, with the
    partition and block counts of the runtime's launch rules
    (`attnres/Bundle/LaunchRules.h`) where the IR fixed none.

    Hand-written input is checked as the conversion's is: an attnres op on
    tensors (not bufferized), an op on buffers without the attribute or
    outside the top level of a function of the module, a description that
    does not have the form the conversion writes (fields, the manifest
    schema's ranges, its own kernel's name and argument count), a kernel of
    another role than the op names it for, facts that are not the op's
    (sources, width, rank, queries, partitions) or outside the schema's
    ranges, counts and tiles that are not whole numbers of blocks, and
    symbols of the module that clash with the runtime's functions or the
    host code's strings are errors.
  }];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::func::FuncDialect",
    "::mlir::gpu::GPUDialect",
    "::mlir::LLVM::LLVMDialect",
    "::mlir::memref::MemRefDialect",
    "::mlir::scf::SCFDialect",
  ];
}

def AttnResLowerTilesToGPU
    : Pass<"attnres-lower-tiles-to-gpu", "::mlir::ModuleOp"> {
  let summary = "Run each tile loop of a forward, backward or merge as a gpu.launch, one block a tile, with the tile's thread code";
  let description = [{
    The tile loops of `keep-host=1`, after `attnres-bufferize-host`: a
    top-level `scf.forall` whose body is one `attnres.forward_into`,
    `attnres.backward_into` or softmax `attnres.partition_reduce_into` on
    views of the function's buffers (a tile of `attnres-tile` or of a
    transform script, `attnres-split-reduction`'s block of tokens,
    bufferized in place) becomes a `gpu.launch` through
    upstream's loop mappings (`scf.forall` to `scf.parallel`, its
    dimensions collapsed into one, `convert-parallel-loops-to-gpu` on
    `#gpu.loop_dim_map<processor = block_x>`): one block an iteration.
    The tile's op inside the launch is then lowered to the thread code of
    its kernel (the forward's, the backward's or the merge's) over the
    tile's rows, its
    lanes and row sums as the kernel's (`docs/GPU.md`), reading the
    operands through the host's addresses (and a forward's table of source
    rows), which the launch captures. The host code before the launch
    builds the table and checks every
    buffer against the alignment of the thread code's accesses (a
    misaligned one skips the launch with a message, as
    `attnres-launch-kernels` does); a grid of no blocks launches nothing.
    Upstream `gpu-kernel-outlining` then makes the launch a `gpu.func` and a
    `gpu.launch_func`.

    A tile must be consecutive rows of its buffers: each operand with
    tokens (a forward's or backward's sources, a merge's partials, partial
    lses and sink, a `[K, D]` output norm weight of a merge, `o`, `lse`,
    `o_pre`, its residual, a backward's output and lse gradients and its
    source gradients) a `memref.subview` with unit strides of a dense buffer of the
    function (an identity layout, or a view of consecutive rows of one made
    before the loop, addressed from its offset), all at the same token
    offsets and sizes, whole in their other
    dimensions, the buffers' token counts the sources' or partials'
    (checked before the launch where only the run time knows them); the
    query and the other norm weights whole dense buffers; the token
    dimensions tiled before the last one the tile cuts of size 1, the ones
    after it whole. A backward's tile walks every source of its rows and
    writes one row of each of its partial query and weight gradients (dq =
    da * g, dg = sum over queries of da * q, dh; the sums after the loop
    add them): each a view of the `[1, ...]` slice at the loop's index of a
    dense buffer, whole in the other dimensions, the loop of one
    dimension. The loop may carry the mapping attnres-map-to-blocks
    gives it (its iterations the blocks of one grid dimension); another
    form or mapping is an error naming what differs.
  }];
  let options = [
    Option<"subgroupSize", "subgroup-size", "int64_t", /*default=*/"32",
           "Lanes of a subgroup (32 on NVIDIA, 64 on AMD)">,
    Option<"maxBlockThreads", "max-block-threads", "int64_t",
           /*default=*/"1024", "Largest block">,
    Option<"forwardThreadsPerRow", "forward-threads-per-row", "int64_t",
           /*default=*/"0",
           "Lanes that share a row: a power of two up to a subgroup, or a "
           "multiple of the subgroup; 0 chooses (as convert-attnres-to-gpu)">,
    Option<"forwardSourceBatch", "forward-source-batch", "int64_t",
           /*default=*/"0",
           "Sources whose rows are loaded before one row sum; 0 chooses (as "
           "convert-attnres-to-gpu)">,
    Option<"forwardPrefetch", "forward-prefetch", "int64_t",
           /*default=*/"-1",
           "Load the next batch of source rows while the current one is "
           "reduced: 1 or 0; -1 chooses (as convert-attnres-to-gpu for the "
           "unsplit forward)">,
    Option<"asyncCopies", "async-copies", "bool", /*default=*/"false",
           "The target has NVIDIA's asynchronous copies from global to "
           "workgroup memory (cp.async: sm_80 and later)">,
    Option<"forwardStagedBatches", "forward-staged-batches", "int64_t",
           /*default=*/"0",
           "Batches of source rows copied ahead into workgroup memory with "
           "asynchronous copies (needs async-copies), in [0, 8]; 0: loaded "
           "into registers">,
    Option<"unrollSources", "unroll-sources", "int64_t", /*default=*/"0",
           "Unroll the walk over the sources at compile time up to this many "
           "sources">,
    Option<"backwardThreadsPerRow", "backward-threads-per-row", "int64_t",
           /*default=*/"0", "The same for a backward's tiles">,
    Option<"backwardSourceBatch", "backward-source-batch", "int64_t",
           /*default=*/"0", "The same for a backward's tiles">,
    Option<"backwardPrefetch", "backward-prefetch", "int64_t",
           /*default=*/"-1",
           "The same for a backward's tiles: 1 or 0; -1 chooses (on for one "
           "query)">,
    Option<"backwardStagedBatches", "backward-staged-batches", "int64_t",
           /*default=*/"-1",
           "The same for a backward's tiles, in [-1, 8]; -1 chooses (as "
           "convert-attnres-to-gpu)">,
    Option<"mergeLoadsInFlight", "merge-loads-in-flight", "int64_t",
           /*default=*/"0",
           "Partial rows a merge of more than 16 partitions loads before it "
           "adds any: 0 chooses 4 (as convert-attnres-to-gpu)">,
  ];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::func::FuncDialect",
    "::mlir::gpu::GPUDialect",
    "::mlir::LLVM::LLVMDialect",
    "::mlir::memref::MemRefDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::vector::VectorDialect",
  ];
}

#endif // ATTNRES_CONVERSION_PASSES_TD
