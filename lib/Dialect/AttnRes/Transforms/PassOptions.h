//===- PassOptions.h - shared option parsing of attnres passes --*- C++ -*-===//

#ifndef ATTNRES_LIB_DIALECT_ATTNRES_TRANSFORMS_PASSOPTIONS_H
#define ATTNRES_LIB_DIALECT_ATTNRES_TRANSFORMS_PASSOPTIONS_H

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Location.h"
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

/// The split passes' num-multiprocessors: positive, or 0 for a target
/// sized at run time (their `auto` then splits nothing). Reports another
/// value at `loc` for `pass`.
inline LogicalResult
checkMultiprocessorsOption(Location loc, llvm::StringRef pass, int64_t value) {
  if (value >= 0)
    return success();
  return emitError(loc) << pass
                        << ": num-multiprocessors must be positive, or 0 for "
                           "a target sized at run time, got "
                        << value;
}

} // namespace mlir::attnres

#endif // ATTNRES_LIB_DIALECT_ATTNRES_TRANSFORMS_PASSOPTIONS_H
