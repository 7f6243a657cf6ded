//===- fuzz-bundle.cpp - libFuzzer: the runtime's bundle loading ----------===//
//
// An input is a manifest, then optionally a NUL byte and the binary's bytes.
// It is given to attnresRuntimeLoadFromMemory (which parses and checks the
// manifest before it opens a driver: on a machine without one it stops
// there) and, written into a bundle folder, to attnresRuntimeInspect, whose
// ops' workspace sizes and launch counts are then asked for a few token
// counts. Every answer must be a status with a message, never a crash, an
// abort or a sanitizer report.
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
  for (int op = 0; op < attnresRuntimeNumOps(runtime); ++op) {
    (void)attnresRuntimeOpKind(runtime, op);
    (void)attnresRuntimeOpDescription(runtime, op);
    for (int64_t tokens : {int64_t(1), int64_t(4096), int64_t(1) << 31}) {
      size_t bytes = 0;
      error = nullptr;
      check(attnresForwardWorkspaceSize(runtime, op, tokens, 0, &bytes, &error),
            error);
      error = nullptr;
      check(attnresBackwardWorkspaceSize(runtime, op, tokens, 0, 0, &bytes,
                                         &error),
            error);
      (void)attnresForwardPartitions(runtime, op, tokens);
      int64_t blocks = attnresBackwardBlocks(runtime, op, tokens);
      (void)attnresBackwardPartitions(runtime, op, blocks);
    }
  }
  attnresRuntimeDestroy(runtime);
  return 0;
}
