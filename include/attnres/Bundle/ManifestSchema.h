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

/// The largest files a bundle may hold, whether read from its folder or
/// handed over in memory: a manifest is a few kilobytes a kernel, a binary
/// of every kernel some megabytes.
inline constexpr int64_t kMaxManifestBytes = int64_t(16) << 20;
inline constexpr int64_t kMaxBinaryBytes = int64_t(512) << 20;

/// The most ops a bundle holds, kernels a bundle holds (an op has at most
/// four: forward, forward_partial, forward_cluster, merge) and arguments a
/// kernel takes (the backward, the most, takes 14). The compiler refuses to
/// write more; the runtime checks the counts before it reads the entries,
/// so that every manifest the caps admit is read in bounded time.
inline constexpr int64_t kMaxOps = 1024;
inline constexpr int64_t kMaxKernels = 4 * kMaxOps;
inline constexpr int64_t kMaxKernelArguments = 32;

/// Whether `word` is one of the space-separated words of `list`.
inline bool listed(const char *list, const std::string &word) {
  if (word.empty())
    return false;
  for (const char *at = list; *at;) {
    while (*at == ' ')
      ++at;
    const char *end = at;
    while (*end && *end != ' ')
      ++end;
    if (std::string(at, end) == word)
      return true;
    at = end;
  }
  return false;
}

/// Argument kinds: a device pointer to a buffer, a device pointer to a
/// table of buffer pointers (the sources), a 64-bit integer.
inline constexpr const char kArgumentKinds[] = "buffer table i64";
/// Element types of buffers and tables (i8: the 4-bit residual of o_pre,
/// two a byte), and of the op facts that name one (`*_type`).
inline constexpr const char kBufferTypes[] = "bf16 f16 f32 i8";
inline constexpr const char kValueTypes[] = "bf16 f16 f32";
/// Grid symbols: tokens, partitions, blocks, merged rows, one.
inline constexpr const char kGridSymbols[] = "N P B rows 1";

/// An op kind: the facts the runtime computes with (whole numbers in the
/// ranges of kOpFacts), the element-type facts it reads, and whether its
/// output-norm facts may appear.
struct OpKind {
  const char *kind;
  const char *numbers;
  const char *types;
};
inline constexpr OpKind kOpKinds[] = {
    {"forward", "num_sources width rank num_queries rows_per_block",
     "value_type"},
    {"backward", "num_sources width rank num_queries rows_per_block",
     "value_type"},
    {"partition_reduce_softmax", "num_partitions", ""},
    {"partition_reduce_sum", "", ""}};
/// Facts an op may lack: partial_rows_per_block (backward; bundles from
/// before 2026-12-01 lack it and mean rows_per_block), output_norm_type (an
/// element type: the op has an output norm) and output_norm_per_query (a
/// boolean).
inline constexpr const char kOutputNormType[] = "output_norm_type";
inline constexpr const char kOutputNormPerQuery[] = "output_norm_per_query";

/// A kernel an op launches, by role: the op fact naming it, whether every
/// op of the kind has one, the argument names the runtime supplies to it
/// (pointers to buffer and table arguments, values to i64 ones) and the
/// grid symbols it has values for (besides 1). Runtime.cpp's calls supply
/// these names; the compiler refuses a kernel that takes another.
struct KernelRole {
  const char *opKind, *role;
  bool required;
  const char *pointers, *integers, *grid;
};
#define ATTNRES_FORWARD_POINTERS                                               \
  "sources query key_norm output_norm o lse o_pre o_pre_residual"
#define ATTNRES_FORWARD_INTEGERS                                               \
  "num_tokens num_partitions num_rows rows_per_weight"
#define ATTNRES_BACKWARD_POINTERS                                              \
  "sources query key_norm output_norm grad lse saved saved_residual "          \
  "grad_lse grad_sources dq dg dh partial_da partial_dh"
#define ATTNRES_BACKWARD_INTEGERS                                              \
  "num_tokens num_blocks num_partitions num_partial_rows"
inline constexpr KernelRole kKernelRoles[] = {
    {"forward", "forward", true, ATTNRES_FORWARD_POINTERS,
     ATTNRES_FORWARD_INTEGERS, "N"},
    {"forward", "forward_partial", true,
     ATTNRES_FORWARD_POINTERS " partial_o partial_lse",
     ATTNRES_FORWARD_INTEGERS, "N P"},
    {"forward", "forward_cluster", false, ATTNRES_FORWARD_POINTERS,
     ATTNRES_FORWARD_INTEGERS, "N P"},
    {"forward", "merge", true,
     ATTNRES_FORWARD_POINTERS " partial_o partial_lse",
     ATTNRES_FORWARD_INTEGERS, "rows"},
    {"backward", "backward", true, ATTNRES_BACKWARD_POINTERS,
     ATTNRES_BACKWARD_INTEGERS, "B P"},
    {"backward", "finalize", true, ATTNRES_BACKWARD_POINTERS,
     ATTNRES_BACKWARD_INTEGERS, ""},
    {"partition_reduce_softmax", "merge", true,
     "partial_o partial_lse sink output_norm o lse o_pre o_pre_residual",
     "num_rows num_partitions rows_per_weight", "rows"},
    {"partition_reduce_sum", "sum", true, "partials output", "num_elements",
     "N"}};
#undef ATTNRES_FORWARD_POINTERS
#undef ATTNRES_FORWARD_INTEGERS
#undef ATTNRES_BACKWARD_POINTERS
#undef ATTNRES_BACKWARD_INTEGERS

/// Every role a kernel may have.
inline constexpr const char kRoles[] =
    "forward forward_partial forward_cluster merge backward finalize sum";

/// The kind named `kind`, or null.
inline const OpKind *findOpKind(const std::string &kind) {
  for (const OpKind &entry : kOpKinds)
    if (kind == entry.kind)
      return &entry;
  return nullptr;
}

/// Why a kernel of `role` cannot take `argument`, or "" where it can: its
/// kind must be known, a buffer or table must have an element type the
/// kernels use, and its name must be one the runtime supplies to the role.
inline std::string argumentProblem(const KernelRole &role,
                                   const ArgumentDescription &argument) {
  const std::string named = "argument '" + argument.name.substr(0, 64) + "'";
  if (!listed(kArgumentKinds, argument.kind))
    return named + " has kind '" + argument.kind.substr(0, 64) +
           "'; kinds are " + kArgumentKinds;
  bool integer = argument.kind == "i64";
  if (integer ? argument.type != "i64" : !listed(kBufferTypes, argument.type))
    return named + " has type '" + argument.type.substr(0, 64) + "'; a " +
           argument.kind + " has " +
           (integer ? std::string("i64") : std::string(kBufferTypes));
  if (!listed(integer ? role.integers : role.pointers, argument.name))
    return named + " (" + argument.kind + ") is not one the runtime passes " +
           "to a " + role.role + " kernel of a " + role.opKind +
           " op: " + (integer ? role.integers : role.pointers);
  return "";
}

/// Why a kernel of `role` cannot have a grid dimension of `symbol`, or "".
inline std::string gridProblem(const KernelRole &role,
                               const std::string &symbol) {
  if (symbol == "1" || listed(role.grid, symbol))
    return "";
  return "grid symbol '" + symbol.substr(0, 64) + "' has no value for a " +
         role.role + " kernel of a " + role.opKind +
         " op (its symbols: " + role.grid + (*role.grid ? " 1)" : "1)");
}

} // namespace attnres::manifest

#endif // ATTNRES_BUNDLE_MANIFESTSCHEMA_H
