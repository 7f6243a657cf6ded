//===- ManifestSchema.h - what a bundle's manifest.json holds ---*- C++ -*-===//
//
// The one description of the manifest that both its writer (the compiler,
// lib/Bundle) and its reader (the runtime, which has no LLVM) use: the
// format version, the names of the fields the runtime computes with, and
// the range of each number. The writer refuses to write a manifest outside
// these ranges; the reader refuses to read one.
//
// Plain C++17, no dependencies.
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_BUNDLE_MANIFESTSCHEMA_H
#define ATTNRES_BUNDLE_MANIFESTSCHEMA_H

#include <cstdint>
#include <string>
#include <vector>

namespace attnres::manifest {

/// One kernel argument, as the manifest describes it.
struct ArgumentDescription {
  std::string name;
  std::string kind;  // "buffer", "table" (of buffers) or "i64"
  std::string type;  // element type of a buffer or of the table's buffers
  std::string shape; // documentation, e.g. "[M, N, D]"
  /// Of a buffer or table: the bytes its address must be a multiple of (the
  /// widest access the kernel makes through it); 0 where not stated.
  int64_t alignment = 0;
};

/// A grid dimension: ceil(symbol * scale / divisor), symbol one of "N"
/// (tokens), "P" (partitions), "B" (blocks), "rows" or "1".
struct GridRule {
  std::string symbol;
  int64_t scale = 1, divisor = 1;
};

/// What the manifest says of one kernel (its "kernels" entry).
struct KernelDescription {
  std::string name, role;
  std::vector<ArgumentDescription> arguments;
  GridRule grid[3];
  /// Threads a block.
  int64_t block = 1;
  /// Workgroup (shared) memory the kernel declares.
  int64_t workgroupBytes = 0;
  /// Elements per vector access of the row buffers.
  int64_t vectorWidth = 1;
  /// The blocks along the grid's y dimension form one thread-block cluster
  /// (at most 8; NVIDIA sm_90 and later), which the launch must ask for.
  bool clusterY = false;
};

inline constexpr int64_t kFormatVersion = 1;

/// Top-level fields.
inline constexpr const char kFormatVersionKey[] = "format_version";
inline constexpr const char kTarget[] = "target";
inline constexpr const char kVendor[] = "vendor"; // in target
inline constexpr const char kBinaries[] = "binaries";
inline constexpr const char kFile[] = "file"; // in a binary
inline constexpr const char kRules[] = "rules";
inline constexpr const char kLaunch[] = "launch"; // in rules
inline constexpr const char kOps[] = "ops";
inline constexpr const char kKernels[] = "kernels";

/// A whole number the runtime reads, and its range.
struct NumberField {
  const char *key;
  int64_t min, max;
};

/// Kernel descriptions.
inline constexpr NumberField kKernelBlock = {"block", 1, 1024};
/// Of a kernel argument that is a buffer or a table: the bytes its address
/// must be a multiple of (a power of two, isPowerOfTwo).
inline constexpr NumberField kArgumentAlignment = {"alignment", 1, 256};
inline constexpr bool isPowerOfTwo(int64_t value) {
  return value > 0 && (value & (value - 1)) == 0;
}
inline constexpr NumberField kKernelVectorWidth = {"vector_width", 1, 64};
/// A boolean: KernelDescription::clusterY.
inline constexpr const char kKernelClusterY[] = "cluster_y";
/// Each of the three grid dimensions: ceil(symbol * scale / divisor).
inline constexpr NumberField kGridScale = {"scale", 1, int64_t(1) << 20};
inline constexpr NumberField kGridDivisor = {"divisor", 1, int64_t(1) << 20};

/// The op facts sizes and grids are computed from (the compiler's own
/// limits on L, D, R, M).
inline constexpr NumberField kOpFacts[] = {{"num_sources", 1, 4096},
                                           {"width", 1, 65536},
                                           {"rank", 1, 65536},
                                           {"num_queries", 1, 16},
                                           {"rows_per_block", 1, 1024},
                                           {"num_partitions", 1, 4096},
                                           {"partial_rows_per_block", 1, 1024}};

/// rules.launch: the launch rules as numbers.
inline constexpr NumberField kLaunchRules[] = {
    {"blocks_per_multiprocessor", 1, int64_t(1) << 40},
    {"sources_per_partition", 1, int64_t(1) << 40},
    {"partition_bytes", 1, int64_t(1) << 40},
    {"tokens_per_block", 1, int64_t(1) << 40}};

/// Manifests are a few kilobytes; nesting deeper than this is not one.
inline constexpr int kMaxDepth = 64;

} // namespace attnres::manifest

#endif // ATTNRES_BUNDLE_MANIFESTSCHEMA_H
