//===- Runtime.h - the attnres runtime's C++ API ----------------*- C++ -*-===//
//
// A header-only C++ face over attnres-c/Runtime.h: an owning handle, and
// errors as exceptions carrying the status and the runtime's message. No
// MLIR, no LLVM, no GPU SDK: link against libAttnResRuntime only.
//
//   attnres::Runtime runtime = attnres::Runtime::load("bundle/");
//   AttnresForwardArgs args = {...};
//   runtime.forward(0, args, stream);
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_RUNTIME_RUNTIME_H
#define ATTNRES_RUNTIME_RUNTIME_H

#include "attnres-c/Runtime.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace attnres {

class RuntimeError : public std::runtime_error {
public:
  RuntimeError(AttnresStatus status, const std::string &message)
      : std::runtime_error(message), status_(status) {}
  AttnresStatus status() const { return status_; }

private:
  AttnresStatus status_;
};

class Runtime {
public:
  /// Loads the bundle folder for the calling thread's current device.
  static Runtime load(const std::string &directory) {
    return Runtime(open(attnresRuntimeLoad, directory));
  }
  /// Parses and checks a bundle without a GPU or driver.
  static Runtime inspect(const std::string &directory) {
    return Runtime(open(attnresRuntimeInspect, directory));
  }
  static Runtime loadFromMemory(const std::string &manifest, const void *binary,
                                size_t binarySize) {
    AttnresRuntime *handle = nullptr;
    char *error = nullptr;
    AttnresStatus status = attnresRuntimeLoadFromMemory(
        manifest.data(), manifest.size(), binary, binarySize, &handle, &error);
    check(status, error);
    return Runtime(handle);
  }

  Runtime(Runtime &&other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)) {}
  Runtime &operator=(Runtime &&other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  Runtime(const Runtime &) = delete;
  Runtime &operator=(const Runtime &) = delete;
  ~Runtime() { attnresRuntimeDestroy(handle_); }

  int numOps() const { return attnresRuntimeNumOps(handle_); }
  std::string opKind(int op) const {
    const char *kind = attnresRuntimeOpKind(handle_, op);
    return kind ? kind : "";
  }
  /// The op's manifest entry, as JSON text.
  std::string opDescription(int op) const {
    const char *description = attnresRuntimeOpDescription(handle_, op);
    return description ? description : "";
  }
  int multiprocessors() const { return attnresRuntimeMultiprocessors(handle_); }

  int64_t forwardPartitions(int op, int64_t numTokens) const {
    return attnresForwardPartitions(handle_, op, numTokens);
  }
  size_t forwardWorkspaceSize(int op, int64_t numTokens,
                              int64_t partitions = 0) const {
    size_t size = 0;
    char *error = nullptr;
    AttnresStatus status = attnresForwardWorkspaceSize(
        handle_, op, numTokens, partitions, &size, &error);
    check(status, error);
    return size;
  }
  void forward(int op, const AttnresForwardArgs &args, void *stream) const {
    char *error = nullptr;
    AttnresStatus status = attnresForward(handle_, op, &args, stream, &error);
    check(status, error);
  }

  int64_t backwardBlocks(int op, int64_t numTokens) const {
    return attnresBackwardBlocks(handle_, op, numTokens);
  }
  int64_t backwardPartitions(int op, int64_t blocks) const {
    return attnresBackwardPartitions(handle_, op, blocks);
  }
  size_t backwardWorkspaceSize(int op, int64_t numTokens, int64_t blocks = 0,
                               int64_t partitions = 0) const {
    size_t size = 0;
    char *error = nullptr;
    AttnresStatus status = attnresBackwardWorkspaceSize(
        handle_, op, numTokens, blocks, partitions, &size, &error);
    check(status, error);
    return size;
  }
  void backward(int op, const AttnresBackwardArgs &args, void *stream) const {
    char *error = nullptr;
    AttnresStatus status = attnresBackward(handle_, op, &args, stream, &error);
    check(status, error);
  }

  void merge(int op, const AttnresMergeArgs &args, void *stream) const {
    char *error = nullptr;
    AttnresStatus status = attnresMerge(handle_, op, &args, stream, &error);
    check(status, error);
  }
  void sum(int op, const void *partials, void *output, int64_t numElements,
           void *stream) const {
    char *error = nullptr;
    AttnresStatus status =
        attnresSum(handle_, op, partials, output, numElements, stream, &error);
    check(status, error);
  }

  const AttnresRuntime *handle() const { return handle_; }

private:
  explicit Runtime(AttnresRuntime *handle) : handle_(handle) {}

  template <typename Open>
  static AttnresRuntime *open(Open function, const std::string &directory) {
    AttnresRuntime *handle = nullptr;
    char *error = nullptr;
    AttnresStatus status = function(directory.c_str(), &handle, &error);
    check(status, error);
    return handle;
  }

  /// Takes the status of a call already made: argument evaluation order is
  /// unspecified, so the call and the read of `error` must not share one.
  static void check(AttnresStatus status, char *error) {
    if (status == ATTNRES_OK)
      return;
    std::string message = error ? error : "attnres runtime error";
    attnresFreeString(error);
    throw RuntimeError(status, message);
  }

  AttnresRuntime *handle_ = nullptr;
};

} // namespace attnres

#endif // ATTNRES_RUNTIME_RUNTIME_H
