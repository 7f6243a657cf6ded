//===- Passes.td - attnres transformations ------------------*- tablegen -*-===//

#ifndef ATTNRES_DIALECT_ATTNRES_TRANSFORMS_PASSES_TD
#define ATTNRES_DIALECT_ATTNRES_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def AttnResSplitSources : Pass<"attnres-split-sources"> {
  let summary = "Split a forward over L sources into P partial forwards and a "
                "softmax merge (flash-decoding over depth)";
  let description = [{
    Rewrites every `attnres.forward` over `L` sources into `P` forwards over
    contiguous slices of the sources (partition `p` holds sources
    `[floor(p * L / P), floor((p + 1) * L / P))`, as the split forward
    kernels walk them), each returning an FP32 partial output and its `lse`, and
    one `attnres.partition_reduce softmax` that merges them. The output
    norm, if any, moves to the merge, which applies it to the merged
    output; a saved `o_pre` is the merged output before the norm. Multi-query
    forwards split the same way (the merge sees `[M, T..., D]` rows). The
    result is exact up to FP32 rounding: the softmax merge is associative.

    `partitions` is a number (clamped to `L`; `partitions=1` gives one FP32
    partial and the merge, an op with one source is otherwise left alone)
    or `auto` (which leaves an op it would give one partition alone). With
    `auto`, few rows (tokens times queries) leave the GPU idle, so the pass
    splits until there are about two blocks per multiprocessor:
    `P = floor(2 * num-multiprocessors / rows)` (rounded down: one more
    partition than the device holds at once would start a second wave of
    blocks), but no more than `L / 4`
    partitions (each partial forward still reads at least four sources) and
    no more than one partition per `min-partition-bytes` of source data per
    row (`L * D * element size`), so that the merge stays cheap next to the
    reads it replaces. A forward whose token count is dynamic is not split
    by `auto` (its row count is unknown), nor is any forward with
    `num-multiprocessors=0`, which leaves the target's size to run time:
    the GPU pipelines pass it, so that their launches split whole forwards
    at run time by the same rule for the device they run on.
  }];
  let options = [
    Option<"partitions", "partitions", "std::string", /*default=*/"\"auto\"",
           "Number of partitions P, or 'auto'">,
    Option<"numMultiprocessors", "num-multiprocessors", "int64_t",
           /*default=*/"132",
           "Multiprocessors of the target (for 'auto'; 132 on an H200; 0: "
           "known at run time, 'auto' splits nothing)">,
    Option<"minPartitionBytes", "min-partition-bytes", "int64_t",
           /*default=*/"32768",
           "Least source bytes per row that one partition reads (for 'auto')">
  ];
  let dependentDialects = ["::mlir::tensor::TensorDialect"];
}

def AttnResSplitReduction : Pass<"attnres-split-reduction"> {
  let summary = "Split the backward's token reductions into per-block FP32 "
                "partials and a deterministic sum";
  let description = [{
    Rewrites every `attnres.backward` into an `scf.forall` over `B` blocks
    of tokens (the token dimensions are merged into one; block `b` takes
    tokens `[b * ceil(N / B), min((b + 1) * ceil(N / B), N))`, possibly none).
    Each block runs the backward on its tokens through the op's
    TilingInterface: it writes the source gradients of its tokens and FP32
    partial sums of the query, key-norm and output-norm gradients into row
    `b` of `[B, ...]` partial tensors. One `attnres.partition_reduce sum`
    per gradient then adds the rows in the fixed order `b = 0, ..., B-1` and
    stores the parameter's element type: deterministic, no atomics.

    Block `b` takes tokens `[min(b * ceil(N / B), N), min((b + 1) *
    ceil(N / B), N))`, as a block of the GPU backward kernel does.

    `blocks` is a number or `auto`. With `auto`, `B = min(2 *
    num-multiprocessors, ceil(N / min-block-tokens))` (two blocks per
    multiprocessor keep the GPU busy and make the finalize read only `B`
    short rows; small `N` takes fewer); a backward whose token count is
    dynamic is not split by `auto`, nor is any backward with
    `num-multiprocessors=0` (the target's size left to run time, as the GPU
    pipelines ask): the GPU kernels then size their blocks at run time from
    `N` and the device's occupancy.
  }];
  let options = [
    Option<"blocks", "blocks", "std::string", /*default=*/"\"auto\"",
           "Number of token blocks B, or 'auto'">,
    Option<"numMultiprocessors", "num-multiprocessors", "int64_t",
           /*default=*/"132",
           "Multiprocessors of the target (for 'auto'; 132 on an H200; 0: "
           "known at run time, 'auto' splits nothing)">,
    Option<"minBlockTokens", "min-block-tokens", "int64_t", /*default=*/"16",
           "Least tokens per block (for 'auto')">
  ];
  let dependentDialects = [
    "::mlir::affine::AffineDialect",
    "::mlir::arith::ArithDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::tensor::TensorDialect"
  ];
}

def AttnResTile : Pass<"attnres-tile"> {
  let summary = "Tile attnres ops over their token dimensions into scf.forall";
  let description = [{
    Tiles every `attnres.forward` and softmax `attnres.partition_reduce`
    (a merge) over its token dimensions with the upstream SCF tiling driver
    (`scf::tileUsingSCF`) and the ops' TilingInterface, producing an
    `scf.forall` whose body runs the op on one tile of tokens.
    `tile-sizes` gives one size per token dimension, outermost first
    (missing sizes and 0 leave a dimension whole).

    A `sum` partition_reduce is left whole: it adds partial rows
    elementwise (attnres-split-reduction's partial gradients), and its
    dimensions are not tokens.

    Under `keep-host=1`, a tiled op runs with one block per tile, its loop
    a launch of its own (`attnres-lower-tiles-to-gpu`), the pieces of a
    split forward included. It needs tiles of consecutive tokens: the
    first r token dimensions tiled, all but the last of them by 1, the
    others whole.

    `attnres.backward` is not tiled here: its query and weight gradients
    are reductions over every token, which `attnres-split-reduction` splits
    into per-block partials; run that pass first.
  }];
  let options = [
    ListOption<"tileSizes", "tile-sizes", "int64_t",
               "Tile size per token dimension, outermost first">
  ];
  let dependentDialects = [
    "::mlir::affine::AffineDialect",
    "::mlir::arith::ArithDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::tensor::TensorDialect"
  ];
}

#endif // ATTNRES_DIALECT_ATTNRES_TRANSFORMS_PASSES_TD
