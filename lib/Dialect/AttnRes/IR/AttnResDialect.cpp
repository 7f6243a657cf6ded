//===- AttnResDialect.cpp - the attnres dialect ---------------------------===//

#include "attnres/Dialect/AttnRes/IR/AttnResDialect.h"
#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::attnres;

#include "attnres/Dialect/AttnRes/IR/AttnResDialect.cpp.inc"

void AttnResDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "attnres/Dialect/AttnRes/IR/AttnResOps.cpp.inc"
      >();
}
