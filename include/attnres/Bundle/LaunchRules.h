//===- LaunchRules.h - partitions and blocks of a launch --------*- C++ -*-===//
//
// The rules that size the split forward and the backward, written once: the
// runtime evaluates them at each launch (with the constants of the bundle's
// manifest and the device's occupancy), the split passes with their `auto`
// options at compile time, and the compiler writes their constants into
// every manifest (rules.launch) and states them in its rules text.
//
// Plain C++17 (with GCC's and Clang's overflow builtins), no dependencies
// (the runtime has no LLVM).
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_BUNDLE_LAUNCHRULES_H
#define ATTNRES_BUNDLE_LAUNCHRULES_H

#include <algorithm>
#include <cstdint>

namespace attnres::launch {

/// The constants of the rules, in the order of the manifest's
/// rules.launch (ManifestSchema.h's kLaunchRules).
struct Rules {
  /// Blocks in flight per multiprocessor where the device's occupancy of a
  /// kernel is not known (an inspected bundle; the split passes).
  int64_t blocksPerMultiprocessor = 2;
  /// The fewest sources a partition of the split forward or backward reads.
  int64_t sourcesPerPartition = 4;
  /// The fewest bytes of a row's sources a partition of the split forward
  /// reads, so that the merge stays cheap next to the reads it replaces.
  int64_t partitionBytes = 32768;
  /// The fewest row groups a backward block takes.
  int64_t tokensPerBlock = 1;
};

/// What the compiler writes into every manifest.
inline constexpr Rules kDefaultRules{};

/// ceil(a / b) for b > 0, without the overflow of (a + b - 1) / b near
/// INT64_MAX.
inline int64_t ceilDiv(int64_t a, int64_t b) { return a / b + (a % b > 0); }

/// The most blocks a thread-block cluster holds on every device that has
/// clusters (the portable cluster size, NVIDIA sm_90 and later): the most
/// partitions of the clustered forward, whose blocks of a row form one.
inline constexpr int64_t kMaxClusterBlocks = 8;

// The rules are written once, over an arithmetic `A` that supplies
// `Value`, `constant`, `min`, `max`, `div` (of non-negative values, rounded
// down), `ceilDiv`, `mul` and `add`: Integers below for the runtime and the
// split passes, IR values for the host code attnres-launch-kernels writes
// (keep-host), which computes them at run time from the token count.

/// Plain integers.
struct Integers {
  using Value = int64_t;
  Value constant(int64_t value) const { return value; }
  Value min(Value a, Value b) const { return std::min(a, b); }
  Value max(Value a, Value b) const { return std::max(a, b); }
  Value div(Value a, Value b) const { return a / b; }
  Value ceilDiv(Value a, Value b) const { return launch::ceilDiv(a, b); }
  Value mul(Value a, Value b) const { return a * b; }
  Value add(Value a, Value b) const { return a + b; }
};

/// Integers that remember an overflow: a result that does not fit in
/// int64_t (and every result computed from one) is `overflowed`. The
/// runtime sizes workspaces with them, so that a token, block or partition
/// count too large for any device is refused instead of wrapping around.
struct CheckedIntegers {
  struct Value {
    int64_t value = 0;
    bool overflowed = false;
  };
  Value constant(int64_t value) const { return {value, false}; }
  Value min(Value a, Value b) const {
    return {std::min(a.value, b.value), a.overflowed || b.overflowed};
  }
  Value max(Value a, Value b) const {
    return {std::max(a.value, b.value), a.overflowed || b.overflowed};
  }
  Value div(Value a, Value b) const {
    return {b.value ? a.value / b.value : 0,
            a.overflowed || b.overflowed || b.value == 0};
  }
  Value ceilDiv(Value a, Value b) const {
    return {b.value > 0 ? launch::ceilDiv(a.value, b.value) : 0,
            a.overflowed || b.overflowed || b.value <= 0};
  }
  Value mul(Value a, Value b) const {
    Value product;
    product.overflowed =
        __builtin_mul_overflow(a.value, b.value, &product.value) ||
        a.overflowed || b.overflowed;
    return product;
  }
  Value add(Value a, Value b) const {
    Value sum;
    sum.overflowed = __builtin_add_overflow(a.value, b.value, &sum.value) ||
                     a.overflowed || b.overflowed;
    return sum;
  }
};

/// The most partitions a forward's L sources split into, whatever the
/// device: L / sourcesPerPartition and rowSourceBytes / partitionBytes
/// (rowSourceBytes = L * D * element size), at least 1.
inline int64_t forwardPartitionLimit(int64_t numSources, int64_t rowSourceBytes,
                                     const Rules &rules) {
  return std::max<int64_t>(1, std::min(numSources / rules.sourcesPerPartition,
                                       rowSourceBytes / rules.partitionBytes));
}

/// Partitions of a forward's L sources when `tokenBlocks` blocks cover its
/// rows and the device holds `residentBlocks` at once:
/// floor(residentBlocks / tokenBlocks), rounded down because a partition
/// more than the device holds at once starts a second wave of blocks,
/// which costs more than the parallelism it adds; at most
/// forwardPartitionLimit; in [1, L].
template <typename A>
typename A::Value
forwardPartitions(const A &a, typename A::Value residentBlocks,
                  typename A::Value tokenBlocks, int64_t numSources,
                  int64_t rowSourceBytes, const Rules &rules) {
  auto wanted = a.div(residentBlocks, a.max(a.constant(1), tokenBlocks));
  auto partitions = a.min(wanted, a.constant(forwardPartitionLimit(
                                      numSources, rowSourceBytes, rules)));
  return a.min(a.max(partitions, a.constant(1)),
               a.constant(std::max<int64_t>(numSources, 1)));
}

/// The fewest sources a forward splits over a cluster where its rows are too
/// short for forwardPartitions: a clustered launch costs about what the
/// unsplit kernel's walk over 32 sources does. On an H100 at (N, D) =
/// (16, 256) (benchmarks/kernels.py, rows read from memory): unsplit 3.0 /
/// 4.1 / 7.1 / 12.6 us at L = 8 / 16 / 32 / 64, clustered over 8 partitions
/// 5.6 / 5.9 / 6.2 / 6.3 us.
inline constexpr int64_t kClusteredMinSources = 32;

/// Partitions of a forward's L sources for its clustered kernel (the P
/// blocks of a row merge their partial rows on chip, through distributed
/// shared memory): floor(residentBlocks / tokenBlocks), at most
/// clusteredPartitionLimit (L / sourcesPerPartition and kMaxClusterBlocks;
/// 1 below kClusteredMinSources sources), at least 1. A row's bytes do not
/// bound it as they bound forwardPartitions: that bound keeps the partial
/// kernel's merge, a second launch that reads P rows back from global memory,
/// cheap next to the reads it splits, and this merge is neither. Whether the
/// clusters fit on the device at once is the caller's to check.
inline int64_t clusteredPartitionLimit(int64_t numSources, const Rules &rules) {
  if (numSources < kClusteredMinSources)
    return 1;
  return std::clamp<int64_t>(numSources / rules.sourcesPerPartition, 1,
                             kMaxClusterBlocks);
}
template <typename A>
typename A::Value
clusteredForwardPartitions(const A &a, typename A::Value residentBlocks,
                           typename A::Value tokenBlocks, int64_t numSources,
                           const Rules &rules) {
  int64_t limit = clusteredPartitionLimit(numSources, rules);
  if (limit == 1)
    return a.constant(1);
  auto wanted = a.div(residentBlocks, a.max(a.constant(1), tokenBlocks));
  // One step a statement: on IR values the order of a call's arguments
  // would be the order of the ops.
  auto capped = a.min(wanted, a.constant(limit));
  return a.max(capped, a.constant(1));
}

/// Blocks of tokens of a backward over `tokens` tokens, each block taking at
/// least `leastTokens`: min(residentBlocks, ceil(tokens / leastTokens)), at
/// least 1.
template <typename A>
typename A::Value backwardBlocks(const A &a, typename A::Value residentBlocks,
                                 typename A::Value tokens,
                                 int64_t leastTokens) {
  auto blocks =
      a.ceilDiv(tokens, a.constant(std::max<int64_t>(1, leastTokens)));
  return a.max(a.constant(1), a.min(residentBlocks, blocks));
}

/// Partitions of a backward's L sources over `blocks` blocks of tokens:
/// floor(residentBlocks / blocks) (rounded down, as for the forward), at
/// most L / sourcesPerPartition; in [1, L].
template <typename A>
typename A::Value backwardPartitions(const A &a,
                                     typename A::Value residentBlocks,
                                     typename A::Value blocks,
                                     int64_t numSources, const Rules &rules) {
  auto wanted = a.div(residentBlocks, a.max(a.constant(1), blocks));
  auto partitions =
      a.min(wanted, a.constant(numSources / rules.sourcesPerPartition));
  return a.min(a.max(partitions, a.constant(1)),
               a.constant(std::max<int64_t>(numSources, 1)));
}

/// Bytes of `count` floats rounded up to 256 (each part of a workspace
/// starts 256-byte aligned).
template <typename A>
typename A::Value alignedFloatBytes(const A &a, typename A::Value count) {
  auto bytes = a.mul(count, a.constant(4));
  return a.mul(a.ceilDiv(bytes, a.constant(256)), a.constant(256));
}

/// Where the split forward's partial results lie in its workspace:
/// partial_o, `partialRows` (P * M * N) rows of `width` floats, at 0;
/// partial_lse, a float a row, at lseOffset.
template <typename A> struct ForwardWorkspace {
  typename A::Value lseOffset, bytes;
};
template <typename A>
ForwardWorkspace<A> forwardWorkspace(const A &a, typename A::Value partialRows,
                                     int64_t width) {
  auto oBytes = alignedFloatBytes(a, a.mul(partialRows, a.constant(width)));
  return {oBytes, a.add(oBytes, alignedFloatBytes(a, partialRows))};
}

/// Where the backward's partial rows lie in its workspace: partial_da, the
/// `partialRows` rows of `daFloats` floats of the query gradient's partial
/// sums, at 0; partial_dh, rows of `dhFloats` floats of the output-norm
/// weight gradient's (0: no output norm), at dhOffset; each 256-byte
/// aligned.
template <typename A> struct BackwardWorkspace {
  typename A::Value dhOffset, bytes;
};
template <typename A>
BackwardWorkspace<A> backwardWorkspace(const A &a,
                                       typename A::Value partialRows,
                                       int64_t daFloats, int64_t dhFloats) {
  auto aligned = [&](int64_t floats) {
    return alignedFloatBytes(a, a.mul(partialRows, a.constant(floats)));
  };
  auto daBytes = aligned(daFloats);
  return {daBytes, dhFloats ? a.add(daBytes, aligned(dhFloats)) : daBytes};
}

/// The rules on plain integers.
inline int64_t forwardPartitions(int64_t residentBlocks, int64_t tokenBlocks,
                                 int64_t numSources, int64_t rowSourceBytes,
                                 const Rules &rules) {
  return forwardPartitions(Integers(), residentBlocks, tokenBlocks, numSources,
                           rowSourceBytes, rules);
}
inline int64_t clusteredForwardPartitions(int64_t residentBlocks,
                                          int64_t tokenBlocks,
                                          int64_t numSources,
                                          const Rules &rules) {
  return clusteredForwardPartitions(Integers(), residentBlocks, tokenBlocks,
                                    numSources, rules);
}
inline int64_t backwardBlocks(int64_t residentBlocks, int64_t tokens,
                              int64_t leastTokens) {
  return backwardBlocks(Integers(), residentBlocks, tokens, leastTokens);
}
inline int64_t backwardPartitions(int64_t residentBlocks, int64_t blocks,
                                  int64_t numSources, const Rules &rules) {
  return backwardPartitions(Integers(), residentBlocks, blocks, numSources,
                            rules);
}

} // namespace attnres::launch

#endif // ATTNRES_BUNDLE_LAUNCHRULES_H
