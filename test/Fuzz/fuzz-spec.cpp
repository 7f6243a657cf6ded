//===- fuzz-spec.cpp - libFuzzer: op specs through the C API --------------===//
//
// An input is "<spec>\n<kernel options>" (the second line optional), given
// to attnresCompileSpec for sm_90 as PTX (no assembler). A refusal with a
// message is the expected answer to a bad spec; a crash, an abort, a
// sanitizer report or a missing message is a bug.
//
//===----------------------------------------------------------------------===//

#include "attnres-c/Compiler.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string input(reinterpret_cast<const char *>(data), size);
  // Strings of the C API end at the first NUL.
  input = input.substr(0, input.find('\0'));
  std::string spec = input, kernelOptions;
  if (size_t newline = input.find('\n'); newline != std::string::npos) {
    spec = input.substr(0, newline);
    kernelOptions = input.substr(newline + 1);
  }
  AttnresCompileOptions options{"sm_90", "isa", 3, kernelOptions.c_str()};
  char *error = nullptr;
  AttnresBundle *bundle = attnresCompileSpec(spec.c_str(), &options, &error);
  if (bundle) {
    if (error || attnresBundleNumFiles(bundle) == 0)
      __builtin_trap();
    attnresBundleDestroy(bundle);
    return 0;
  }
  if (!error || !*error)
    __builtin_trap(); // every refusal says why
  attnresCompilerFreeString(error);
  return 0;
}
