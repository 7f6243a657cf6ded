//===- AttnResOps.td - attnres operations -------------------*- tablegen -*-===//

#ifndef ATTNRES_DIALECT_ATTNRES_IR_ATTNRESOPS_TD
#define ATTNRES_DIALECT_ATTNRES_IR_ATTNRESOPS_TD

include "attnres/Dialect/AttnRes/IR/AttnResDialect.td"
include "attnres/Dialect/AttnRes/IR/AttnResEnums.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/TilingInterface.td"

// Every op tiles over its token dimensions through TilingInterface and
// reports its result shapes (token dimensions from its operands).
defvar AttnRes_TilingTraits = [
    DeclareOpInterfaceMethods<TilingInterface,
        ["getIterationDomain", "getLoopIteratorTypes",
         "getTiledImplementation", "getResultTilePosition"]>,
    DeclareOpInterfaceMethods<ReifyRankedShapedTypeOpInterface,
        ["reifyResultShapes"]>];

// Shared by the forward and the backward: the sources, the query and the two
// optional weights, in that order.
defvar AttnRes_SourceOperands = (ins
    Variadic<AnyRankedTensor>:$sources,
    UnitAttr:$packed,
    AnyRankedTensor:$query,
    Optional<AnyRankedTensor>:$key_norm_weight,
    Optional<AnyRankedTensor>:$output_norm_weight);

defvar AttnRes_NormAttrs = (ins
    DefaultValuedAttr<F64Attr, "1.0e-6">:$eps,
    DefaultValuedAttr<F64Attr, "1.0">:$scale);

defvar AttnRes_SourceFormat = [{
    custom<SourceList>($sources, type($sources), $packed)
    `query` `(` $query `:` type($query) `)`
    (`key_norm` `(` $key_norm_weight^ `:` type($key_norm_weight) `)`)?
    (`output_norm` `(` $output_norm_weight^ `:` type($output_norm_weight) `)`)?
}];

defvar AttnRes_SourceShapeAccessors = [{
    /// The number of sources L (operands, or the leading dimension when packed).
    int64_t getNumSourceValues();
    /// The width D of every source.
    int64_t getWidth();
    /// The query rank R (the key is the last R coordinates of a source).
    int64_t getRank();
    /// The number of queries M (1 for a rank-1 query).
    int64_t getNumQueries();
    /// True when the query is [M, R] and every per-token result gains a
    /// leading M dimension.
    bool isMultiQuery();
}];

defvar AttnRes_SourceAccessors = AttnRes_SourceShapeAccessors # [{
    /// The type of one source, [T..., D], packed or not.
    ::mlir::RankedTensorType getSourceType();
}];

//===----------------------------------------------------------------------===//
// attnres.forward
//===----------------------------------------------------------------------===//

def AttnRes_ForwardOp : AttnRes_Op<"forward",
    !listconcat([Pure, AttrSizedOperandSegments, AttrSizedResultSegments],
                AttnRes_TilingTraits)> {
  let summary = "softmax over sources with a learned query (AttnRes forward)";
  let description = [{
    Computes, for every token, the AttnRes mixture of the sources (see the
    dialect description for the equations).

    Sources are either a list of same-typed tensors `[T..., D]`
    (`sources(...)`, no stacking copy) or one packed tensor `[L, T..., D]`
    (`packed(...)`). `T...` are the token dimensions (any number, possibly
    dynamic); `D` is static.

    The query is `[R]` (one query) or `[M, R]` with `1 <= M <= 16` (several
    queries read the sources once; each has its own softmax and output). The
    key of a source is its last `R <= D` coordinates. Per-token results get a
    leading `M` dimension for an `[M, R]` query.

    * `key_norm`: optional key-norm weight `g`, `[R]`, shared by all queries.
    * `output_norm`: optional output-norm weight `h`, `[D]` or `[M, D]`; when
      present `o` is the RMS-normalized `o_pre` times `h`.
    * `eps` (default `1e-6`) must be finite and positive; `scale` (default
      `1.0`) multiplies every logit and must be finite.
    * `save` (default `o_pre`) tells what the backward will get: with `o_pre`
      and an output norm, the op has a third result `o_pre` (with no output
      norm `o` itself is `o_pre`); with `lse` the backward recomputes.
      `o_pre_residual` saves what `o_pre` does and also the residual of its
      rounding to a 16-bit type (see the dialect description), so that the
      backward's gradients are as accurate as with FP32 `o_pre`: it needs a
      `bf16` or `f16` output and an even `D`.

    Results: `o` (`[M?, T..., D]`, the source element type or `f32` for FP32
    partial results), `lse` (`[M?, T...]`, `f32`, natural log), `o_pre`
    when saved (same type as `o`), and last, with `save(o_pre_residual)`,
    the residual (`[M?, T..., D/2]`, `i8`).

    Example: three sources in a list, one query and a key norm.

    ```mlir
    func.func @forward(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                       %v2: tensor<?x64xbf16>, %q: tensor<16xf32>,
                       %g: tensor<16xf32>) -> (tensor<?x64xbf16>, tensor<?xf32>) {
      %o, %lse = attnres.forward sources(%v0, %v1, %v2 : tensor<?x64xbf16>)
          query(%q : tensor<16xf32>) key_norm(%g : tensor<16xf32>)
          -> tensor<?x64xbf16>, tensor<?xf32>
      return %o, %lse : tensor<?x64xbf16>, tensor<?xf32>
    }
    ```

    Four queries over a packed tensor of eight sources, with an output norm,
    saving `o_pre` for a single-pass backward:

    ```mlir
    func.func @block(%v: tensor<8x?x128xbf16>, %q: tensor<4x128xf32>,
                     %h: tensor<4x128xf32>) -> tensor<4x?x128xbf16> {
      %o, %lse, %o_pre = attnres.forward packed(%v : tensor<8x?x128xbf16>)
          query(%q : tensor<4x128xf32>) output_norm(%h : tensor<4x128xf32>)
          {eps = 1.0e-05 : f64}
          -> tensor<4x?x128xbf16>, tensor<4x?xf32>, tensor<4x?x128xbf16>
      return %o : tensor<4x?x128xbf16>
    }
    ```
  }];

  let arguments = !con(AttnRes_SourceOperands, AttnRes_NormAttrs, (ins
      DefaultValuedAttr<AttnRes_SaveMode, "::mlir::attnres::SaveMode::OPre">:$save));
  let results = (outs
      AnyRankedTensor:$output,
      AnyRankedTensor:$lse,
      Optional<AnyRankedTensor>:$o_pre,
      Optional<AnyRankedTensor>:$o_pre_residual);

  let assemblyFormat = AttnRes_SourceFormat # [{
    (`save` `(` $save^ `)`)?
    attr-dict
    custom<SavedResultTypes>(type($output), type($lse), type($o_pre),
        type($o_pre_residual))
  }];

  let extraClassDeclaration = AttnRes_SourceAccessors;
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
}

//===----------------------------------------------------------------------===//
// attnres.backward
//===----------------------------------------------------------------------===//

def AttnRes_BackwardOp : AttnRes_Op<"backward",
    !listconcat([Pure, AttrSizedOperandSegments, AttrSizedResultSegments],
                AttnRes_TilingTraits)> {
  let summary = "gradients of attnres.forward";
  let description = [{
    Computes the gradients of `attnres.forward` with respect to every source,
    the query, and the key-norm and output-norm weights when present. The
    source, query and weight operands, `eps` and `scale` are those of the
    forward.

    * `grad(%do)`: the gradient of the forward's `o`.
    * `lse(%lse)`: the forward's `lse`. With two sources or more it may be
      the `lse` (with `saved`, the `o_pre`) of a forward over more sources:
      the results are then these sources' share of that forward's gradients
      (the query's and weights' summed over these sources only). With one
      source the weight is taken as exactly 1 (so that a one-source op's
      `dq` is exactly zero): the `lse` must be that source's own.
    * `saved(%o_pre)`: optional; the forward's `o_pre` (or `o` when there is
      no output norm). With it the backward reads every source once; without
      it the backward recomputes `o_pre` from the sources and `lse` (one more
      pass over the sources).
    * `residual(%r)`: optional, with a 16-bit `saved`; the residual of its
      rounding (`save(o_pre_residual)`), `[M?, T..., D/2]` `i8`: `delta` and
      the output norm's statistics are then formed from `o_pre` to 14 times
      the precision of the 16-bit type.
    * `grad_lse(%dlse)`: optional, `[M?, T...]` `f32`; the gradient of the
      forward's `lse`, for a forward whose `lse` is used (a partial result
      merged by `partition_reduce`). It adds `scale * p_s * dlse` to every
      logit's gradient: the backward forms `delta - dlse` where it would form
      `delta`. Without it the `lse` result is taken to be unused.
    * `accumulate(%g...)`: optional, one tensor per source operand (one
      packed tensor when the sources are packed), of the source gradients'
      types; the gradients the sources already have. The source gradient
      results are then these plus this op's contributions (each formed in
      FP32, added to the FP32 value of the accumulated element and rounded
      once), so that a source read by several ops gets one gradient tensor
      that each op's backward adds into in place once bufferized (a
      residual history: every later layer reads every earlier output).

    The query, key-norm and output-norm gradients are reductions over every
    token; they are computed in FP32 in a fixed order (deterministic) and
    stored in the element type of their parameter, or in f32 (FP32 partial
    sums over a block of tokens, which `attnres-split-reduction` produces and
    a `sum` partition_reduce finalizes). Results, in order: one gradient per
    source operand (a single packed gradient when the sources are packed),
    the query gradient, then the key-norm and output-norm weight gradients
    when those weights are present. They have the shapes of the matching
    operands.

    Example: the single-pass backward of a two-source forward (no output
    norm, so the forward's `o` is its `o_pre`).

    ```mlir
    func.func @backward(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,
                        %q: tensor<16xf32>, %g: tensor<16xf32>,
                        %do: tensor<?x64xbf16>, %lse: tensor<?xf32>,
                        %o: tensor<?x64xbf16>) -> tensor<16xf32> {
      %dv:2, %dq, %dg = attnres.backward sources(%v0, %v1 : tensor<?x64xbf16>)
          query(%q : tensor<16xf32>) key_norm(%g : tensor<16xf32>)
          grad(%do : tensor<?x64xbf16>) lse(%lse : tensor<?xf32>)
          saved(%o : tensor<?x64xbf16>)
          -> tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<16xf32>, tensor<16xf32>
      return %dq : tensor<16xf32>
    }
    ```
  }];

  let arguments = !con(AttnRes_SourceOperands, (ins
      AnyRankedTensor:$grad_output,
      AnyRankedTensor:$lse,
      Optional<AnyRankedTensor>:$saved_output,
      Optional<AnyRankedTensor>:$saved_residual,
      Optional<AnyRankedTensor>:$grad_lse,
      Variadic<AnyRankedTensor>:$accumulated), AttnRes_NormAttrs);
  let results = (outs
      Variadic<AnyRankedTensor>:$grad_sources,
      AnyRankedTensor:$grad_query,
      Optional<AnyRankedTensor>:$grad_key_norm_weight,
      Optional<AnyRankedTensor>:$grad_output_norm_weight);

  let assemblyFormat = AttnRes_SourceFormat # [{
    `grad` `(` $grad_output `:` type($grad_output) `)`
    `lse` `(` $lse `:` type($lse) `)`
    (`saved` `(` $saved_output^ `:` type($saved_output) `)`)?
    (`residual` `(` $saved_residual^ `:` type($saved_residual) `)`)?
    (`grad_lse` `(` $grad_lse^ `:` type($grad_lse) `)`)?
    (`accumulate` `(` $accumulated^ `:` type($accumulated) `)`)?
    attr-dict
    custom<GradientTypes>(ref(type($sources)), ref(type($key_norm_weight)),
        ref(type($output_norm_weight)), type($grad_sources), type($grad_query),
        type($grad_key_norm_weight), type($grad_output_norm_weight))
  }];

  let extraClassDeclaration = AttnRes_SourceAccessors;
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
}

//===----------------------------------------------------------------------===//
// attnres.partition_reduce
//===----------------------------------------------------------------------===//

def AttnRes_PartitionReduceOp : AttnRes_Op<"partition_reduce",
    !listconcat([Pure, AttrSizedOperandSegments, AttrSizedResultSegments],
                AttnRes_TilingTraits)> {
  let summary = "merge per-partition partial results";
  let description = [{
    Combines `P` partial results packed along a leading dimension.

    `softmax` merges partial attention outputs by their log-sum-exps (the
    split-K / flash-decoding algebra): `partials` is `[P, T..., D]` `f32`
    (each a normalized partial output), `lse(...)` is `[P, T...]` `f32`, and
    the optional `sink(...)` is `[T...]` `f32`, an extra logit that has no
    value. With `m = max(max_p lse_p, sink)`, `w_p = exp(lse_p - m)` and
    `S = sum_p w_p + exp(sink - m)`, the results are `o = sum_p w_p * o_p / S`
    (`[T..., D]`, `bf16`, `f16` or `f32`) and `lse = m + log(S)` (`[T...]`,
    `f32`). An empty partition has `lse_p = -inf` and contributes nothing,
    whatever its `o_p` holds (NaN included); when every partition is empty
    (and the sink, if any, is `-inf`) `o` is 0 and `lse` is `-inf`. A `+inf`
    sink takes all the mass.

    With `output_norm(%h)` (softmax only) the merged output is RMS-normalized
    and scaled, exactly as the forward's output norm:
    `o = merged / sqrt(mean(merged^2) + eps) * h` with `h` `[D]`, or `[K, D]`
    for results `[K, T..., D]` (one weight per query when the partials come
    from a multi-query forward), and an optional third result `o_pre`
    returns the merged output before the norm. This is how a forward split
    over its sources applies the output norm after the merge. A last,
    optional `i8` result `[T..., D/2]` (softmax only, a `bf16` or `f16`
    output, an even `D`) is the residual of the 16-bit `o_pre` (the merged
    output, before any norm): the forward's `save(o_pre_residual)` after a
    split.

    `sum` adds `P` FP32 partials `[P, S...]` in FP32 in the fixed order
    `p = 0, 1, ..., P-1` and stores the result `[S...]` in `bf16`, `f16` or
    `f32`: the deterministic finalize step of a split reduction.

    Examples:

    ```mlir
    func.func @merge(%op: tensor<4x?x64xf32>, %lp: tensor<4x?xf32>,
                     %s: tensor<?xf32>) -> (tensor<?x64xbf16>, tensor<?xf32>) {
      %o, %lse = attnres.partition_reduce softmax %op : tensor<4x?x64xf32>
          lse(%lp : tensor<4x?xf32>) sink(%s : tensor<?xf32>)
          -> tensor<?x64xbf16>, tensor<?xf32>
      return %o, %lse : tensor<?x64xbf16>, tensor<?xf32>
    }

    func.func @finalize(%partials: tensor<7x16xf32>) -> tensor<16xf32> {
      %dq = attnres.partition_reduce sum %partials : tensor<7x16xf32>
          -> tensor<16xf32>
      return %dq : tensor<16xf32>
    }
    ```
  }];

  let arguments = (ins
      AttnRes_ReduceKind:$kind,
      AnyRankedTensor:$partials,
      Optional<AnyRankedTensor>:$partial_lse,
      Optional<AnyRankedTensor>:$sink,
      Optional<AnyRankedTensor>:$output_norm_weight,
      DefaultValuedAttr<F64Attr, "1.0e-6">:$eps);
  let results = (outs
      AnyRankedTensor:$output,
      Optional<AnyRankedTensor>:$lse,
      Optional<AnyRankedTensor>:$o_pre,
      Optional<AnyRankedTensor>:$o_pre_residual);

  let assemblyFormat = [{
    $kind $partials `:` type($partials)
    (`lse` `(` $partial_lse^ `:` type($partial_lse) `)`)?
    (`sink` `(` $sink^ `:` type($sink) `)`)?
    (`output_norm` `(` $output_norm_weight^ `:` type($output_norm_weight) `)`)?
    attr-dict
    custom<ReduceResultTypes>(type($output), type($lse), type($o_pre),
        type($o_pre_residual))
  }];

  let extraClassDeclaration = [{
    /// The number of partitions P (the leading dimension of the partials).
    int64_t getNumPartitions();
  }];
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
}

//===----------------------------------------------------------------------===//
// The ops on buffers
//===----------------------------------------------------------------------===//

// What one-shot bufferization makes of the three ops (their
// BufferizableOpInterface): the same operands as buffers, the same
// attributes, and instead of results the buffers they are written into,
// `outs`, in the order of the results. The rules are those of the ops on
// tensors, every buffer is dense from its start (an identity layout: the
// kernels address rows from a buffer's first element), and a buffer in
// `outs` is no other buffer of the op (the kernels read the operands while
// they write).

defvar AttnRes_SourceBuffers = (ins
    Variadic<AnyMemRef>:$sources,
    UnitAttr:$packed,
    AnyMemRef:$query,
    Optional<AnyMemRef>:$key_norm_weight,
    Optional<AnyMemRef>:$output_norm_weight);

defvar AttnRes_BufferTraits = [AttrSizedOperandSegments,
    DeclareOpInterfaceMethods<MemoryEffectsOpInterface>];

// Each reads every operand but `outs` and writes `outs`.
defvar AttnRes_BufferEffects = [{
  void $cppClass::getEffects(
      ::llvm::SmallVectorImpl<::mlir::SideEffects::EffectInstance<
          ::mlir::MemoryEffects::Effect>> &effects) {
    bufferEffects(*this, getOuts(), effects);
  }
}];

def AttnRes_ForwardIntoOp : AttnRes_Op<"forward_into", AttnRes_BufferTraits> {
  let summary = "attnres.forward on buffers";
  let description = [{
    `attnres.forward` reading buffers and writing its results into `outs`:
    `o`, `lse`, then `o_pre` and its residual where the forward saves them
    (the results of the op on tensors, in order). It reads every operand but
    `outs` and writes `outs`.

    ```mlir
    func.func @forward(%v: memref<4x?x64xbf16>, %q: memref<64xbf16>,
                       %o: memref<?x64xbf16>, %lse: memref<?xf32>) {
      attnres.forward_into packed(%v : memref<4x?x64xbf16>)
          query(%q : memref<64xbf16>) save(lse)
          outs(%o, %lse : memref<?x64xbf16>, memref<?xf32>)
      return
    }
    ```
  }];

  let arguments = !con(AttnRes_SourceBuffers, AttnRes_NormAttrs, (ins
      DefaultValuedAttr<AttnRes_SaveMode, "::mlir::attnres::SaveMode::OPre">:$save,
      Variadic<AnyMemRef>:$outs));

  let assemblyFormat = AttnRes_SourceFormat # [{
    (`save` `(` $save^ `)`)?
    `outs` `(` $outs `:` type($outs) `)`
    attr-dict
  }];

  let extraClassDeclaration = AttnRes_SourceShapeAccessors # [{
    /// The buffer of one source, [T..., D], packed or not.
    ::mlir::MemRefType getSourceType();
    /// The buffers of the op's results on tensors (absent ones null).
    ::mlir::Value getOutputBuffer();
    ::mlir::Value getLseBuffer();
    ::mlir::Value getOPreBuffer();
    ::mlir::Value getOPreResidualBuffer();
  }];
  let extraClassDefinition = AttnRes_BufferEffects;
  let hasVerifier = 1;
}

def AttnRes_BackwardIntoOp : AttnRes_Op<"backward_into", AttnRes_BufferTraits> {
  let summary = "attnres.backward on buffers";
  let description = [{
    `attnres.backward` reading buffers and writing its gradients into
    `outs`: one per source operand, the query's, then the key-norm and
    output-norm weights' where the op has those weights (the results of the
    op on tensors, in order). With `accumulate`, the source gradients'
    buffers hold the gradients the sources already have and the op adds its
    contributions into them (what `accumulate(...)` on tensors becomes):
    it reads and writes them.

    ```mlir
    func.func @backward(%v: memref<2x?x64xbf16>, %q: memref<64xf32>,
                        %do: memref<?x64xbf16>, %lse: memref<?xf32>,
                        %dv: memref<2x?x64xbf16>, %dq: memref<64xf32>) {
      attnres.backward_into packed(%v : memref<2x?x64xbf16>)
          query(%q : memref<64xf32>) grad(%do : memref<?x64xbf16>)
          lse(%lse : memref<?xf32>)
          outs(%dv, %dq : memref<2x?x64xbf16>, memref<64xf32>)
      return
    }
    ```
  }];

  let arguments = !con(AttnRes_SourceBuffers, (ins
      AnyMemRef:$grad_output,
      AnyMemRef:$lse,
      Optional<AnyMemRef>:$saved_output,
      Optional<AnyMemRef>:$saved_residual,
      Optional<AnyMemRef>:$grad_lse), AttnRes_NormAttrs, (ins
      UnitAttr:$accumulate,
      Variadic<AnyMemRef>:$outs));

  let assemblyFormat = AttnRes_SourceFormat # [{
    `grad` `(` $grad_output `:` type($grad_output) `)`
    `lse` `(` $lse `:` type($lse) `)`
    (`saved` `(` $saved_output^ `:` type($saved_output) `)`)?
    (`residual` `(` $saved_residual^ `:` type($saved_residual) `)`)?
    (`grad_lse` `(` $grad_lse^ `:` type($grad_lse) `)`)?
    (`accumulate` $accumulate^)?
    `outs` `(` $outs `:` type($outs) `)`
    attr-dict
  }];

  let extraClassDeclaration = AttnRes_SourceShapeAccessors # [{
    /// The buffer of one source, [T..., D], packed or not.
    ::mlir::MemRefType getSourceType();
    /// The buffers of the op's results on tensors (absent ones null; empty
    /// for an op that does not verify).
    ::mlir::ValueRange getGradSourceBuffers();
    ::mlir::Value getGradQueryBuffer();
    ::mlir::Value getGradKeyNormWeightBuffer();
    ::mlir::Value getGradOutputNormWeightBuffer();
  }];
  // With `accumulate` it also reads the source gradients' buffers.
  let extraClassDefinition = [{
    void $cppClass::getEffects(
        ::llvm::SmallVectorImpl<::mlir::SideEffects::EffectInstance<
            ::mlir::MemoryEffects::Effect>> &effects) {
      bufferEffects(*this, getOuts(), effects,
                    getAccumulate() ? getGradSourceBuffers().size() : 0);
    }
  }];
  let hasVerifier = 1;
}

def AttnRes_PartitionReduceIntoOp : AttnRes_Op<"partition_reduce_into",
    AttnRes_BufferTraits> {
  let summary = "attnres.partition_reduce on buffers";
  let description = [{
    `attnres.partition_reduce` reading buffers and writing its results into
    `outs`: the output, then for the softmax kind the merged `lse` and,
    where the op on tensors returns them, `o_pre` (a float buffer) and the
    residual (`i8`).

    ```mlir
    func.func @finalize(%partials: memref<7x16xf32>, %dq: memref<16xf32>) {
      attnres.partition_reduce_into sum %partials : memref<7x16xf32>
          outs(%dq : memref<16xf32>)
      return
    }
    ```
  }];

  let arguments = (ins
      AttnRes_ReduceKind:$kind,
      AnyMemRef:$partials,
      Optional<AnyMemRef>:$partial_lse,
      Optional<AnyMemRef>:$sink,
      Optional<AnyMemRef>:$output_norm_weight,
      DefaultValuedAttr<F64Attr, "1.0e-6">:$eps,
      Variadic<AnyMemRef>:$outs);

  let assemblyFormat = [{
    $kind $partials `:` type($partials)
    (`lse` `(` $partial_lse^ `:` type($partial_lse) `)`)?
    (`sink` `(` $sink^ `:` type($sink) `)`)?
    (`output_norm` `(` $output_norm_weight^ `:` type($output_norm_weight) `)`)?
    `outs` `(` $outs `:` type($outs) `)`
    attr-dict
  }];

  let extraClassDeclaration = [{
    /// The number of partitions P (the leading dimension of the partials).
    int64_t getNumPartitions();
    /// The buffers of the op's results on tensors (absent ones null).
    ::mlir::Value getOutputBuffer();
    ::mlir::Value getLseBuffer();
    ::mlir::Value getOPreBuffer();
    ::mlir::Value getOPreResidualBuffer();
  }];
  let extraClassDefinition = AttnRes_BufferEffects;
  let hasVerifier = 1;
}

#endif // ATTNRES_DIALECT_ATTNRES_IR_ATTNRESOPS_TD
