//===- LaunchRules.h - partitions and blocks of a launch --------*- C++ -*-===//
//
// The rules that size the split forward and the backward, written once: the
// runtime evaluates them at each launch (with the constants of the bundle's
// manifest and the device's occupancy), the split passes with their `auto`
// options at compile time, and the compiler writes their constants into
// every manifest (rules.launch) and states them in its rules text.
//
// Plain C++17, no dependencies (the runtime has no LLVM).
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

inline int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// The most blocks a thread-block cluster holds on every device that has
/// clusters (the portable cluster size, NVIDIA sm_90 and later): the most
/// partitions of the clustered forward, whose blocks of a row form one.
inline constexpr int64_t kMaxClusterBlocks = 8;

/// Partitions of a forward's L sources when `tokenBlocks` blocks cover its
/// rows and the device holds `residentBlocks` at once:
/// floor(residentBlocks / tokenBlocks), rounded down because a partition
/// more than the device holds at once starts a second wave of blocks,
/// which costs more than the parallelism it adds; at most
/// L / sourcesPerPartition and rowSourceBytes / partitionBytes
/// (rowSourceBytes = L * D * element size); in [1, L].
inline int64_t forwardPartitions(int64_t residentBlocks, int64_t tokenBlocks,
                                 int64_t numSources, int64_t rowSourceBytes,
                                 const Rules &rules) {
  int64_t wanted = residentBlocks / std::max<int64_t>(1, tokenBlocks);
  int64_t partitions = std::min({wanted, numSources / rules.sourcesPerPartition,
                                 rowSourceBytes / rules.partitionBytes});
  return std::clamp<int64_t>(partitions, 1, std::max<int64_t>(numSources, 1));
}

/// Blocks of tokens of a backward over `tokens` tokens, each block taking at
/// least `leastTokens`: min(residentBlocks, ceil(tokens / leastTokens)), at
/// least 1.
inline int64_t backwardBlocks(int64_t residentBlocks, int64_t tokens,
                              int64_t leastTokens) {
  return std::max<int64_t>(
      1, std::min(residentBlocks,
                  ceilDiv(tokens, std::max<int64_t>(1, leastTokens))));
}

/// Partitions of a backward's L sources over `blocks` blocks of tokens:
/// floor(residentBlocks / blocks) (rounded down, as for the forward), at
/// most L / sourcesPerPartition; in [1, L].
inline int64_t backwardPartitions(int64_t residentBlocks, int64_t blocks,
                                  int64_t numSources, const Rules &rules) {
  int64_t wanted = residentBlocks / std::max<int64_t>(1, blocks);
  return std::clamp<int64_t>(
      std::min(wanted, numSources / rules.sourcesPerPartition), 1,
      std::max<int64_t>(numSources, 1));
}

} // namespace attnres::launch

#endif // ATTNRES_BUNDLE_LAUNCHRULES_H
