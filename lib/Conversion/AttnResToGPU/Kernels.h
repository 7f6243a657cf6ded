//===- Kernels.h - the attnres GPU kernels ----------------------*- C++ -*-===//
//
// Generators of the gpu.func kernels that implement the attnres ops, and the
// description of each kernel's interface that goes into the bundle manifest.
//
// Layouts: a source, o, o_pre and grad are rows of width D, row (m, n) of a
// per-query tensor at offset (m * N + n) * D; lse is [M, N]; the residual of
// a 16-bit o_pre is rows of D / 2 bytes (two 4-bit residuals a byte). Sources
// (and source gradients) are reached through a device table of L row-major [N,
// D] pointers, so list and packed sources share one kernel.
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_LIB_CONVERSION_ATTNRESTOGPU_KERNELS_H
#define ATTNRES_LIB_CONVERSION_ATTNRESTOGPU_KERNELS_H

#include "KernelEmitter.h"
#include "attnres/Bundle/ManifestSchema.h"

#include <string>
#include <vector>

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "llvm/ADT/StringMap.h"

namespace mlir::func {
class FuncOp;
} // namespace mlir::func
namespace mlir {
class OffsetSizeAndStrideOpInterface;
} // namespace mlir
namespace mlir::tensor {
class ConcatOp;
} // namespace mlir::tensor
namespace mlir::scf {
class ForallOp;
} // namespace mlir::scf
namespace mlir::attnres {
class ForwardIntoOp;
} // namespace mlir::attnres

namespace mlir::attnres::gpu_kernels {

/// Everything a forward or backward kernel is specialized on.
struct AttnResSpec {
  int64_t numSources = 1, width = 1, rank = 1, numQueries = 1; // L, D, R, M
  Type value, query;
  Type keyNorm, outputNorm; // null when absent
  bool perQueryOutputNorm = false;
  double eps = 1e-6, scale = 1.0;
  // forward
  Type output;
  bool writeOPre = false;
  bool writeResidual = false; // save(o_pre_residual)
  // backward
  Type grad, saved;          // saved is null for the recompute backward
  bool readResidual = false; // residual(...) of the saved o_pre
  bool readGradLse = false;  // grad_lse(...): delta - dlse in place of delta
  // accumulate: each source gradient row is read, added to in FP32 and
  // written back (the gradients the sources already have).
  bool accumulate = false;
  // Not the op's: convert-attnres-to-gpu's write-tags option. An entry of
  // the table of source gradients may be tagged in bit 0 (its row's address
  // plus one), which the backward takes off the address and an accumulating
  // backward takes as "write this row over, do not read it".
  bool writeTags = false;
  Type gradQuery, gradKeyNorm, gradOutputNorm;
};

/// The spec of a forward's kernels (an attnres.forward or forward_into).
AttnResSpec forwardSpec(Operation *forward);
/// The spec of a backward's kernels (an attnres.backward or backward_into).
AttnResSpec backwardSpec(Operation *backward);

/// The choices the kernels are made with, from the target and the options
/// of convert-attnres-to-gpu (attnres-lower-tiles-to-gpu takes the
/// forward's): how many lanes share a row and how a row's sources are
/// walked (KernelChoices.cpp).
struct KernelChoices {
  // In this order the passes brace-initialize them from their options.
  int64_t subgroupSize = 32, maxBlockThreads = 1024, unrollSources = 0;
  int64_t forwardThreadsPerRow = 0, forwardSourceBatch = 0;
  int64_t forwardPrefetch = -1, forwardStagedBatches = 0;
  int64_t backwardThreadsPerRow = 0, backwardSourceBatch = 0;
  int64_t backwardPrefetch = -1, backwardStagedBatches = -1;
  bool asyncCopies = false;

  /// The row layout of a kernel streaming `streamed` types. `lanes` is the
  /// threads-per-row option; when it is 0, a forward or backward kernel
  /// (whose threads hold `heldRows` rows of their own) gets defaultLanes,
  /// other kernels RowLayout's own choice. An error on `op`, naming `pass`,
  /// where `lanes` cannot be laid out.
  FailureOr<RowLayout> layoutFor(Operation *op, StringRef pass, int64_t width,
                                 ArrayRef<Type> streamed, int64_t lanes,
                                 int64_t heldRows = 0,
                                 bool forward = false) const;
  /// The lanes of a row of `vectors` vectors the forward and backward
  /// kernels default to.
  int64_t defaultLanes(int64_t vectors, int64_t heldRows, bool forward) const;
  /// The walk over the sources: `batch` sources a row sum (0 chooses),
  /// prefetched or not, or `stagedBatches` staged.
  SourceSchedule scheduleFor(int64_t batch, bool prefetch, int64_t numSources,
                             int64_t stagedBatches) const;
  /// The forward's staged batches: as asked, where rows are read in
  /// vectors a copy can move (4 bytes or more).
  int64_t forwardStaging(const RowLayout &layout, Type value) const;
  /// The sources a batch of the forward's walks take (0: scheduleFor's
  /// default).
  int64_t forwardBatch(const RowLayout &layout) const;
  /// The layout of a forward's kernels, and the walk of the unsplit one.
  FailureOr<RowLayout> forwardLayout(Operation *op, StringRef pass,
                                     const AttnResSpec &spec) const;
  SourceSchedule forwardSchedule(const AttnResSpec &spec,
                                 const RowLayout &layout) const;
  /// The layout of a backward kernel, and its walk over the sources.
  FailureOr<RowLayout> backwardLayout(Operation *op, StringRef pass,
                                      const AttnResSpec &spec) const;
  SourceSchedule backwardSchedule(const AttnResSpec &spec,
                                  const RowLayout &layout) const;
  /// The backward's staged batches of `batch` sources.
  int64_t backwardStaging(const RowLayout &layout, Type value, int64_t batch,
                          int64_t numQueries) const;
  /// The layout of a merge kernel over rows of `width` elements: FP32
  /// partial rows in, `output` rows out.
  FailureOr<RowLayout> mergeLayout(Operation *op, StringRef pass, int64_t width,
                                   Type output) const;
};

/// The softmax merge of P partial rows of width D.
struct MergeSpec {
  int64_t width = 1;
  Type output, outputNorm;        // outputNorm null when absent
  bool perRowGroupWeight = false; // weight [K, D], row r uses r / rowsPerWeight
  bool sink = false, writeOPre = false;
  bool writeResidual = false; // of the merged o_pre
  /// Blocks split each row into this many tiles of width / columnTiles
  /// columns (only without an output norm, whose statistics need the whole
  /// row): more blocks for the few rows a split forward merges.
  int64_t columnTiles = 1;
  /// Partial rows loaded before any is added, with a run-time partition
  /// count: the step waits for one load latency, not one per partition.
  int64_t loadsInFlight = 4;
  double eps = 1e-6;
  /// P when known at compile time (a partition_reduce op), else 0. Up to
  /// kRegisterPartitions the partitions are unrolled and their lse kept in
  /// registers; otherwise the lanes of a row share the lse work and stage the
  /// weights in workgroup memory, tile by tile.
  int64_t staticPartitions = 0;
};

/// The spec of a softmax partition_reduce's merge kernel (the op on
/// tensors or on buffers), with `loadsInFlight` partial rows a step (0: the
/// default).
MergeSpec mergeSpec(Operation *merge, int64_t loadsInFlight);

constexpr int64_t kRegisterPartitions = 16;
/// Workgroup memory a kernel may declare statically: NVIDIA's 48 KiB
/// (more needs an opt-in), below AMD's 64 KiB; only the staged rings
/// (NVIDIA) come near it.
constexpr int64_t kMaxWorkgroupBytes = 48 * 1024;
/// Workgroup floats for the staged weights of all rows of a block (16 KiB):
/// a tile of up to 128 weights per row.
constexpr int64_t kWeightFloats = 4096;

/// A kernel as the manifest describes it (attnres/Bundle/ManifestSchema.h,
/// which the runtime reads with): each argument's alignment is filled in
/// from the kernel's own accesses when it is recorded.
using KernelInfo = ::attnres::manifest::KernelDescription;
using GridDimension = ::attnres::manifest::GridRule;

/// What a forward kernel does with the sources of a row.
enum class ForwardKind {
  /// Walks all L sources and writes o (and o_pre, lse).
  Whole,
  /// Walks the sources of partition blockIdx.y and writes an FP32 partial
  /// row and its lse for the merge kernel.
  Partial,
  /// The partial walk, then the merge in the kernel: the P blocks of a row
  /// form one thread-block cluster (NVIDIA sm_90 and later), keep their
  /// partial rows in workgroup memory and each merge a tile of the row's
  /// columns from all P through distributed shared memory. One launch and
  /// no partial rows in global memory; P at most launch::kMaxClusterBlocks
  /// (attnres/Bundle/LaunchRules.h).
  ClusterMerged,
};

/// Where a kernel's code goes in place of a gpu.func of its own
/// (attnres-lower-tiles-to-gpu): the body of `launch`, before `at`. The
/// kernel's arguments are the host's values `arguments` (i64 addresses and
/// integers, by the names of its description), which the launch captures;
/// its block and workgroup memory become the launch's, and its block walks
/// the rows [firstRow, firstRow + rowCount) (i64 values at `at`).
struct LaunchBody {
  gpu::LaunchOp launch;
  Operation *at;
  llvm::StringMap<Value> arguments;
  Value firstRow, rowCount;
  /// A backward's tile: the row it writes of each partial gradient.
  Value tileRow = {};
};

/// Sets the alignment of each address argument of `info` (bound to
/// `arguments`, in order) from the accesses of the code under `scope`: the
/// largest alignment a load, store or asynchronous copy assumes of an
/// address computed from it (through GEPs, selects and loop-carried
/// values); 1 for an argument the code does not access. The manifest says
/// it, the runtime and the host code check it: one fact, read from the
/// code that relies on it.
void recordAlignments(Operation *scope, ArrayRef<Value> arguments,
                      KernelInfo &info);

/// The workgroup memory emitForwardKernel would declare.
int64_t forwardWorkgroupBytes(OpBuilder &b, Location loc,
                              const AttnResSpec &spec, RowLayout layout,
                              SourceSchedule schedule, ForwardKind kind);

/// A forward kernel; with `into`, its code goes into that launch body
/// (a whole forward only).
KernelInfo emitForwardKernel(OpBuilder &b, Location loc, StringRef name,
                             const AttnResSpec &spec, RowLayout layout,
                             SourceSchedule schedule, ForwardKind kind,
                             const LaunchBody *into = nullptr);
/// A merge kernel; with `into`, its code goes into that launch body (one
/// column tile: whole rows).
KernelInfo emitMergeKernel(OpBuilder &b, Location loc, StringRef name,
                           const MergeSpec &spec, RowLayout layout,
                           const LaunchBody *into = nullptr);
/// A backward kernel; with `into`, its code goes into that launch body: a
/// tile of a split backward's loop, which walks every source of its rows
/// and writes row `tileRow` of the partial gradients (dq, dg, dh), its row
/// groups added first (through workgroup memory, in rounds where all of
/// their shares at once would take more than 32 KiB).
KernelInfo emitBackwardKernel(OpBuilder &b, Location loc, StringRef name,
                              const AttnResSpec &spec, RowLayout layout,
                              SourceSchedule schedule,
                              const LaunchBody *into = nullptr);
/// Partial rows of the query / weight gradients a whole backward kernel's
/// block writes: 1 where its row groups add theirs in the block first (in
/// one round, at most 32 KiB of workgroup memory), else one a group.
int64_t backwardPartialRowsPerBlock(const AttnResSpec &spec,
                                    const RowLayout &layout);
/// Sums the backward's partial rows: blocks of `threads` lanes (0: chosen
/// from the column tiles, at most `maxThreads`), each block a tile of
/// `subgroupSize` columns whose rows its subgroups split.
KernelInfo emitFinalizeKernel(OpBuilder &b, Location loc, StringRef name,
                              const AttnResSpec &spec, int64_t threads,
                              int64_t subgroupSize, int64_t maxThreads);
KernelInfo emitSumKernel(OpBuilder &b, Location loc, StringRef name,
                         int64_t partitions, Type output, int64_t threads);

/// The name of an element type in the manifest ("bf16", "f32", ...).
std::string typeName(Type type);

/// The kernels of a module, by name, each with its description (read back
/// from its `attnres.kernel` attribute by attnres-launch-kernels).
using RecordedKernels = llvm::StringMap<std::pair<gpu::GPUFuncOp, KernelInfo>>;

/// The description convert-attnres-to-gpu records on a kernel (its
/// `attnres.kernel` attribute, what the bundle manifest is written from),
/// read back; an error on `func` where it does not have the form the
/// pass writes.
FailureOr<KernelInfo> readKernelDescription(gpu::GPUFuncOp func);

/// The value of a signless integer attribute of at most 64 bits (what the
/// conversion writes); none for any other attribute, or none.
std::optional<int64_t> integerValue(Attribute attribute);

/// The most blocks of a grid's x dimension (CUDA's limit; HIP's is
/// larger): a bound on a fixed count of blocks or partitions and on a tile.
constexpr int64_t kMaxGridBlocks = (int64_t(1) << 31) - 1;

/// The attribute convert-attnres-to-gpu (keep-host) puts on each attnres op
/// for attnres-launch-kernels: the op's manifest entry (its kernels by
/// role and their shapes) and the launch counts the IR fixed
/// (`forward_partitions`, `backward_partitions`; absent:
/// the runtime's rules at run time).
constexpr char kLaunchAttrName[] = "attnres.launch";

/// Launch counts fixed for an op (0: the runtime's rules, at run time): a
/// forward's partitions from attnres-split-sources, a backward's partitions
/// of the sources from the backward-partitions option.
struct LaunchCounts {
  int64_t forwardPartitions = 0, backwardPartitions = 0;
};

/// Under keep-host every tensor of a function is a device buffer: a
/// function argument the caller allocated on the device, or a result of an
/// attnres op, which is allocated there. Any other op that takes or makes a
/// tensor would run on the host over device memory (a slice copied by the
/// host, a loop of launches writing into host buffers), so it is an error
/// (naming `pass`), as is an attnres op inside a region (an scf.if, say),
/// whose operands would be such slices. One region is let through: a tile
/// loop of a forward, backward or merge (isLoweredTileLoop), which runs on the
/// device as a whole. Checked by convert-attnres-to-gpu once the split passes'
/// decompositions are checked (a split forward's pieces folded into one);
/// attnres-bufferize-host then puts every such tensor in device memory.
LogicalResult checkKeptFunction(func::FuncOp function, StringRef pass);

/// A pure op without regions on integers and indices: the index arithmetic
/// a tile loop's body may hold next to its op (it runs on the device).
bool isIndexArithmetic(Operation *op);

/// The ops whose own tile loops attnres-lower-tiles-to-gpu runs as grids of
/// blocks: a forward, a backward (attnres-split-reduction's block of tokens)
/// or a softmax merge, on tensors or on buffers (a sum's dimensions are not
/// rows of tokens).
bool isLoweredTileOp(Operation *op);

/// An scf.forall at the top level of a function whose body is one
/// attnres.forward, attnres.backward or softmax attnres.partition_reduce on
/// slices of tensors,
/// with sizes and index arithmetic, and whose outputs are each written by
/// one of the op's results (a tile of it), every result written.
/// attnres-lower-tiles-to-gpu runs it as a grid of blocks (a piece of a
/// forward split over its sources too: its partial forwards write their
/// slices of the stacks the merge reads).
bool isLoweredTileLoop(scf::ForallOp loop);
/// Why `loop` is not such a loop (empty where it is).
std::string tileLoopMismatch(scf::ForallOp loop);

/// Whether `slice` (a tensor.extract_slice or memref.subview of `source`)
/// takes consecutive rows of it: unit strides, unit sizes up to one
/// dimension it cuts anywhere, and every later dimension whole. Such a
/// slice of a dense buffer is dense (a packed source's partition, a piece
/// of a stack).
bool isConsecutiveRows(OffsetSizeAndStrideOpInterface slice, Value source);

/// The size dynamic dimension `dim` of `value` was made with: an operand of
/// the tensor.empty, gpu.alloc or memref.alloc that made it; null for a
/// static dimension or any other producer.
Value madeWithSize(Value value, int64_t dim);

/// Whether `buffer`'s elements lie one after the other in row-major order
/// from its first element, which may be anywhere in its allocation: an
/// identity layout, or views of consecutive rows and reshapes of such a
/// buffer. The kernels address such a buffer from its first element.
bool isDenseView(Value buffer);

/// The piece a stack of one along a new leading dimension holds: the
/// source of a tensor.expand_shape that adds a unit dimension in front;
/// null for anything else.
Value stackedPiece(Value stacked);

/// The pieces a stack along a new leading dimension is made of: the
/// sources of a tensor.concat along dimension 0 of unit-dimension
/// expansions (attnres-split-sources stacks its partial results so); empty
/// if `concat` is not such a stack.
SmallVector<Value> stackedPieces(tensor::ConcatOp concat);

/// The host code of a tile loop made `launch` (attnres-lower-tiles-to-gpu):
/// `whole` is the tile's op (a forward_into, a backward_into or a softmax
/// partition_reduce_into) over the loop's whole buffers, placed before the
/// launch. The host builds what the op's kernel takes of `whole` (a
/// forward's table of source rows, each checked against `vectorWidth`
/// elements; the buffers' addresses; the token or row count), `emit`
/// writes the thread code into the launch from those values and returns
/// its description, whose alignments are checked before the launch, as is
/// each pair of sizes of `equal` (index values before the launch, with
/// what they are); the launch runs where every check passed and its grid
/// has blocks. Refusals name `kernel`; `whole` goes.
LogicalResult launchTile(
    Operation *whole, gpu::LaunchOp launch, int64_t vectorWidth,
    StringRef kernel, ArrayRef<std::tuple<Value, Value, std::string>> equal,
    function_ref<FailureOr<KernelInfo>(const llvm::StringMap<Value> &)> emit,
    unsigned &refusals);

/// A device buffer of `type` (gpu.alloc): the kept functions' buffers.
Value allocateOnDevice(OpBuilder &b, Location loc, MemRefType type,
                       ValueRange dynamicSizes);

/// Replaces each group of attnres-split-sources (P forwards over
/// consecutive partitions of the sources, their FP32 outputs and lses stacked
/// and merged by a softmax partition_reduce) by the forward over all
/// sources, mapped to P partitions (SplitDecompositions.cpp): the split
/// forward kernels' partitions are the group's. A merge of forward results
/// that differs from that form is an error. (Tiled pieces are loops of
/// their own, launched as such.)
LogicalResult
absorbSplitForwards(ModuleOp module,
                    llvm::DenseMap<Operation *, int64_t> &partitions);

/// The scf.forall mapping that states how the conversion runs a loop of
/// `rank` dimensions on the GPU: its iterations are the blocks of one grid
/// dimension. A tile loop's dimensions are linearized, the last fastest
/// (dimension i is #gpu.block<linear_dim_{rank-1-i}>); the one dimension of
/// attnres-split-reduction's loop is #gpu.block<x>.
ArrayAttr blockMapping(MLIRContext *context, int64_t rank, bool linear);

/// Whether `loop` is unmapped or mapped as blockMapping says (a loop of one
/// dimension either way: #gpu.block<x> and <linear_dim_0> are one grid);
/// else `reason` says what the mapping should be.
bool hasRealizedMapping(scf::ForallOp loop, bool linear, std::string &reason);

/// Gives each tile loop around a forward or softmax merge that drops some
/// of its op's results (as canonicalization drops a loop's unused results)
/// a shared output for each, written at its tile's place, so that the loop
/// runs as a grid of its own (its tiles write every result; the buffers of
/// the dropped ones are freed unread). What the body of any tile loop (a
/// backward's too) computes and never uses is erased first.
void completeTileLoops(ModuleOp module);

/// Checks each scf.forall around a forward, backward or merge (attnres-tile's
/// tiles of tokens, attnres-split-sources' pieces tiled,
/// attnres-split-reduction's blocks) for attnres-lower-tiles-to-gpu, which
/// runs it as a grid of its tiles: a loop of another form is an error naming
/// what differs (run after completeTileLoops), as is a backward's loop
/// without `keepHost` (a bundle's backward is launched whole; the other
/// loops are checked with keepHost only).
LogicalResult checkTileLoops(ModuleOp module, bool keepHost);

} // namespace mlir::attnres::gpu_kernels

#endif // ATTNRES_LIB_CONVERSION_ATTNRESTOGPU_KERNELS_H
