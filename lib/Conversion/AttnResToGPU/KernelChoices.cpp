//===- KernelChoices.cpp - how the attnres kernels are laid out -----------===//
//
// The lanes of a row and the walk over the sources, from the target's
// subgroup and the options: the choices convert-attnres-to-gpu makes its
// kernels with, and attnres-lower-tiles-to-gpu the thread code of a tile.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "llvm/Support/MathExtras.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::attnres::gpu_kernels;

static int64_t bytesOf(Type type) { return type.getIntOrFloatBitWidth() / 8; }

FailureOr<RowLayout> KernelChoices::layoutFor(Operation *op, StringRef pass,
                                              int64_t width,
                                              ArrayRef<Type> streamed,
                                              int64_t lanes, int64_t heldRows,
                                              bool forward) const {
  int64_t bytes = 16;
  for (Type type : streamed)
    if (type)
      bytes = std::min(bytes, bytesOf(type));
  if (lanes == 0 && heldRows > 0)
    lanes = defaultLanes(width / RowLayout::vectorWidthFor(width, bytes),
                         heldRows, forward);
  FailureOr<RowLayout> layout =
      RowLayout::choose(width, bytes, subgroupSize, maxBlockThreads, lanes);
  if (failed(layout))
    return op->emitError() << pass << ": threads-per-row = " << lanes
                           << " is not a power of two up to the subgroup ("
                           << subgroupSize
                           << ") or a multiple of it up to max-block-threads ("
                           << maxBlockThreads << ")";
  return layout;
}

/// Four 16-byte vectors a lane, so that a batch of two sources keeps eight
/// loads in flight (docs/Performance.md has the measurements); fewer where
/// a thread holds more rows of its own (one output row a query in the
/// forward; the output gradient and da a query in the backward, plus dh
/// with an output norm). At least 64 lanes in the forward.
int64_t KernelChoices::defaultLanes(int64_t vectors, int64_t heldRows,
                                    bool forward) const {
  int64_t chunks = std::clamp<int64_t>(4 / heldRows, 1, 4);
  int64_t lanes = std::max<int64_t>(llvm::divideCeil(vectors, chunks),
                                    forward ? 64 : subgroupSize);
  // Backward rows of 256 vectors or more (4 KiB: D = 2048 of bf16) take at
  // least 128 lanes: at D = 2048, two vectors a lane on 128 lanes (128
  // registers, four blocks of 128 threads a multiprocessor) beat four on
  // 64 (217 registers, four blocks of 64), 0.82-0.84 against 0.80-0.82 of
  // the floor at (8, 8192, 2048) in two runs; at D = 4096 four vectors on
  // 128 lanes stay ahead of two on 256.
  if (!forward && heldRows == 1 && vectors >= 256)
    lanes = std::max<int64_t>(lanes, 128);
  // Past 256 lanes a thread may use at most 128 registers: hold more of
  // the row per lane instead.
  if (!forward && heldRows > 1)
    lanes = std::min<int64_t>(lanes, 256);
  lanes = std::min<int64_t>(lanes, llvm::PowerOf2Ceil(vectors));
  if (lanes > subgroupSize)
    lanes = llvm::alignTo(lanes, subgroupSize);
  else
    lanes = llvm::PowerOf2Ceil(lanes);
  return std::min<int64_t>(lanes, maxBlockThreads);
}

/// Two sources a batch by default: with four vectors a lane, eight loads
/// in flight.
SourceSchedule KernelChoices::scheduleFor(int64_t batch, bool prefetch,
                                          int64_t numSources,
                                          int64_t stagedBatches) const {
  SourceSchedule schedule;
  schedule.batch = std::min<int64_t>(batch > 0 ? batch : 2, numSources);
  schedule.prefetch = prefetch && stagedBatches == 0;
  schedule.unrollLimit = unrollSources;
  schedule.stagedBatches = stagedBatches;
  return schedule;
}

int64_t KernelChoices::forwardStaging(const RowLayout &layout,
                                      Type value) const {
  return layout.vectorWidth * bytesOf(value) >= 4 ? forwardStagedBatches : 0;
}

FailureOr<RowLayout>
KernelChoices::forwardLayout(Operation *op, StringRef pass,
                             const AttnResSpec &spec) const {
  return layoutFor(op, pass, spec.width, {spec.value, spec.output},
                   forwardThreadsPerRow, spec.numQueries, /*forward=*/true);
}

/// A lane holds one vector of a row, and one subgroup covers the row.
static bool oneVectorALane(const RowLayout &layout) {
  return layout.chunks == 1 && !layout.blockReduce();
}

/// Where a lane holds one vector of a row that one subgroup covers (rows of
/// up to 32 vectors on NVIDIA: D = 256 of bf16), eight sources a batch, so
/// that a lane still keeps eight loads in flight; two elsewhere
/// (scheduleFor's default). Rows reduced across subgroups are left out: at
/// D = 512 of bf16 (64 lanes) the same walk took 150 registers, and the
/// forward with an output norm, held to 128, spilled. At a decode-sized
/// N the forward's few blocks walk the sources one batch after another, and
/// each batch costs a round trip to memory and a row sum: at (N, D) =
/// (16, 256) on an H100 a read of 64 sources took 16.7 us with two a batch
/// and 8.6 us with eight, prefetched (32 sources: 8.9 and 5.0 us;
/// docs/Performance.md).
int64_t KernelChoices::forwardBatch(const RowLayout &layout) const {
  if (forwardSourceBatch > 0)
    return forwardSourceBatch;
  return oneVectorALane(layout) ? 8 : 0;
}

/// The unsplit forward does not prefetch unless asked where a lane holds
/// several vectors of a row (or the row spans subgroups): its many rows keep
/// the device busy (the split over sources, for few rows, does). With one
/// vector a lane the next batch costs few registers (80 at D = 256 with eight a
/// batch), and a small row's forward is the one that runs with few rows.
SourceSchedule KernelChoices::forwardSchedule(const AttnResSpec &spec,
                                              const RowLayout &layout) const {
  bool prefetch =
      forwardPrefetch >= 0 ? forwardPrefetch > 0 : oneVectorALane(layout);
  return scheduleFor(forwardBatch(layout), prefetch, spec.numSources,
                     forwardStaging(layout, spec.value));
}

FailureOr<RowLayout> KernelChoices::mergeLayout(Operation *op, StringRef pass,
                                                int64_t width,
                                                Type output) const {
  return layoutFor(op, pass, width,
                   {Float32Type::get(op->getContext()), output},
                   /*lanes=*/0);
}

FailureOr<RowLayout>
KernelChoices::backwardLayout(Operation *op, StringRef pass,
                              const AttnResSpec &spec) const {
  return layoutFor(op, pass, spec.width, {spec.value, spec.grad, spec.saved},
                   backwardThreadsPerRow,
                   spec.numQueries + (spec.outputNorm ? 1 : 0));
}

/// Prefetching holds another batch of rows: only where a thread holds one
/// query's rows (with an output norm too: measured faster, 0.65 vs 0.52 of
/// the floor at L = 10, N = 32768, D = 4096). Staged, a batch of one source
/// (as fast as two, and a longer ring).
SourceSchedule KernelChoices::backwardSchedule(const AttnResSpec &spec,
                                               const RowLayout &layout) const {
  bool prefetchRows =
      backwardPrefetch >= 0 ? backwardPrefetch > 0 : spec.numQueries == 1;
  int64_t batch = backwardSourceBatch;
  if (batch == 0 && backwardStaging(layout, spec.value, 1, spec.numQueries) > 0)
    batch = 1;
  return scheduleFor(
      batch, prefetchRows, spec.numSources,
      backwardStaging(layout, spec.value,
                      std::min<int64_t>(batch > 0 ? batch : 2, spec.numSources),
                      spec.numQueries));
}

/// None where rows are read in vectors of under 4 bytes, which a copy cannot
/// move; as asked; else (async copies, one query) the most batches up to 3
/// whose ring fits next to the row sums (measured on the H200: 0.80-0.84 of
/// the floor -> 0.84-0.89 at the training shapes, docs/Performance.md), at
/// least 2; 2 where a block works on one row and a batch takes at most 4 KiB
/// of the ring (D = 2048 on 128 lanes: 0.85-0.86 against 0.82-0.83 with 3 at
/// (8, 8192, 2048)).
int64_t KernelChoices::backwardStaging(const RowLayout &layout, Type value,
                                       int64_t batch,
                                       int64_t numQueries) const {
  int64_t vectorBytes = layout.vectorWidth * bytesOf(value);
  if (vectorBytes < 4)
    return 0;
  if (backwardStagedBatches >= 0)
    return backwardStagedBatches;
  if (!asyncCopies || numQueries != 1)
    return 0;
  int64_t slotBytes = layout.chunks * layout.blockThreads() * vectorBytes;
  // A kilobyte for the row sums.
  int64_t fits = (kMaxWorkgroupBytes - 1024) / (batch * slotBytes);
  constexpr int64_t kSmallSlotBytes = 4 * 1024;
  bool smallRow =
      layout.rowsPerBlock == 1 && batch * slotBytes <= kSmallSlotBytes;
  int64_t staged = std::min<int64_t>(smallRow ? 2 : 3, fits);
  return staged >= 2 ? staged : 0;
}
