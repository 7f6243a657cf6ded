//===- attnres-runtime-cpp-test.cpp - the runtime's C++ API -------------===//
//
// Inspects a bundle through attnres::Runtime and shows that errors arrive as
// attnres::RuntimeError with the runtime's status and message.
//
//===----------------------------------------------------------------------===//

#include "attnres/Runtime/Runtime.h"

#include <iostream>

int main(int argc, char **argv) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " <bundle>\n";
    return 2;
  }
  attnres::Runtime runtime = attnres::Runtime::inspect(argv[1]);
  std::cout << "ops: " << runtime.numOps() << "\n";
  for (int op = 0; op < runtime.numOps(); ++op)
    std::cout << "op " << op << ": " << runtime.opKind(op) << "\n";
  std::cout << "backward workspace for 64 tokens: "
            << runtime.backwardWorkspaceSize(1, 64) << "\n";

  attnres::Runtime moved = std::move(runtime);
  std::cout << "moved: " << moved.numOps() << " ops, source empty: "
            << (runtime.handle() == nullptr ? "yes" : "no") << "\n";

  AttnresForwardArgs args = {};
  args.num_tokens = 8;
  args.partitions = 1;
  try {
    moved.forward(0, args, nullptr);
    std::cout << "forward: no error\n";
  } catch (const attnres::RuntimeError &error) {
    std::cout << "forward: status " << error.status() << ": " << error.what()
              << "\n";
  }
  try {
    attnres::Runtime::inspect("/nonexistent/attnres");
    std::cout << "missing: no error\n";
  } catch (const attnres::RuntimeError &error) {
    std::cout << "missing: status " << error.status() << ": " << error.what()
              << "\n";
  }
  return 0;
}
