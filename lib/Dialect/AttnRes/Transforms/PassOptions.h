//===- PassOptions.h - shared option parsing of attnres passes --*- C++ -*-===//

#ifndef ATTNRES_LIB_DIALECT_ATTNRES_TRANSFORMS_PASSOPTIONS_H
#define ATTNRES_LIB_DIALECT_ATTNRES_TRANSFORMS_PASSOPTIONS_H

#include "llvm/ADT/StringRef.h"

#include <optional>

namespace mlir::attnres {

/// A count option: a positive integer, or "auto" (returns std::nullopt in
/// `count`). Fails on anything else.
inline bool parseCountOption(llvm::StringRef text,
                             std::optional<int64_t> &count) {
  if (text == "auto") {
    count = std::nullopt;
    return true;
  }
  int64_t value;
  if (text.getAsInteger(10, value) || value < 1)
    return false;
  count = value;
  return true;
}

} // namespace mlir::attnres

#endif // ATTNRES_LIB_DIALECT_ATTNRES_TRANSFORMS_PASSOPTIONS_H
