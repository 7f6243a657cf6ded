//===- AttnResDialect.h - the attnres dialect -------------------*- C++ -*-===//

#ifndef ATTNRES_DIALECT_ATTNRES_IR_ATTNRESDIALECT_H
#define ATTNRES_DIALECT_ATTNRES_IR_ATTNRESDIALECT_H

#include "mlir/IR/Dialect.h"

#include "attnres/Dialect/AttnRes/IR/AttnResDialect.h.inc"

#endif // ATTNRES_DIALECT_ATTNRES_IR_ATTNRESDIALECT_H
