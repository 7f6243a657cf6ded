//===- fuzz-bundle.cpp - libFuzzer: the runtime's bundle loading ----------===//
//
// An input is a manifest, then optionally a NUL byte and the binary's bytes.
// It is given to attnresRuntimeLoadFromMemory (which parses and checks the
// manifest before it opens a driver: on a machine without one it stops
// there) and, written into a bundle folder, to attnresRuntimeInspect, whose
// ops' workspace sizes, launch counts and launches (which stop before the
// driver, the bundle being inspected) are then asked for token, block and
// partition counts up to the edge of int64_t. Every answer must be a status
// with a message, never a crash, an abort or a sanitizer report (UBSan's
// included: a wrapped size is one).
//
//===----------------------------------------------------------------------===//

#include "attnres-c/Runtime.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

namespace {
std::string folder() {
  static std::string path = [] {
    char pattern[] = "/tmp/attnres-fuzz-bundle-XXXXXX";
    const char *made = mkdtemp(pattern);
    if (!made)
      abort();
    return std::string(made);
  }();
  return path;
}

void write(const std::string &path, const std::string &bytes) {
  FILE *file = std::fopen(path.c_str(), "wb");
  if (!file)
    abort();
  std::fwrite(bytes.data(), 1, bytes.size(), file);
  std::fclose(file);
}

void check(AttnresStatus status, char *error) {
  if ((status == ATTNRES_OK) != (error == nullptr))
    __builtin_trap(); // a failure says why, a success says nothing
  attnresFreeString(error);
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string input(reinterpret_cast<const char *>(data), size);
  std::string manifest = input, binary;
  if (size_t nul = input.find('\0'); nul != std::string::npos) {
    manifest = input.substr(0, nul);
    binary = input.substr(nul + 1);
  }
  AttnresRuntime *runtime = nullptr;
  char *error = nullptr;
  AttnresStatus status = attnresRuntimeLoadFromMemory(
      manifest.data(), manifest.size(), binary.data(), binary.size(), &runtime,
      &error);
  check(status, error);
  attnresRuntimeDestroy(runtime);

  write(folder() + "/manifest.json", manifest);
  write(folder() + "/attnres_kernels.sm_90.cubin", binary);
  runtime = nullptr;
  error = nullptr;
  status = attnresRuntimeInspect(folder().c_str(), &runtime, &error);
  check(status, error);
  if (status != ATTNRES_OK)
    return 0;
  const int64_t counts[] = {
      0,         1, 4096, int64_t(1) << 31, int64_t(1) << 58, int64_t(1) << 62,
      INT64_MAX, -1};
  for (int op = 0; op < attnresRuntimeNumOps(runtime); ++op) {
    (void)attnresRuntimeOpKind(runtime, op);
    (void)attnresRuntimeOpDescription(runtime, op);
    for (int64_t tokens : counts) {
      // Counts chosen by the rules (0), and given.
      for (int64_t given : {int64_t(0), int64_t(1), int64_t(4), tokens}) {
        size_t bytes = 0;
        error = nullptr;
        check(attnresForwardWorkspaceSize(runtime, op, tokens, given, &bytes,
                                          &error),
              error);
        error = nullptr;
        check(attnresBackwardWorkspaceSize(runtime, op, tokens, given, given,
                                           &bytes, &error),
              error);
        AttnresForwardArgs forward = {};
        forward.num_tokens = tokens;
        forward.partitions = given;
        error = nullptr;
        check(attnresForward(runtime, op, &forward, nullptr, &error), error);
        AttnresBackwardArgs backward = {};
        backward.num_tokens = tokens;
        backward.blocks = given;
        backward.partitions = given;
        error = nullptr;
        check(attnresBackward(runtime, op, &backward, nullptr, &error), error);
      }
      AttnresMergeArgs merge = {};
      merge.num_rows = tokens;
      merge.rows_per_weight = tokens;
      error = nullptr;
      check(attnresMerge(runtime, op, &merge, nullptr, &error), error);
      error = nullptr;
      check(attnresSum(runtime, op, nullptr, nullptr, tokens, nullptr, &error),
            error);
      (void)attnresForwardPartitions(runtime, op, tokens);
      int64_t blocks = attnresBackwardBlocks(runtime, op, tokens);
      (void)attnresBackwardPartitions(runtime, op, blocks);
      (void)attnresBackwardPartitions(runtime, op, tokens);
    }
  }
  attnresRuntimeDestroy(runtime);
  return 0;
}
