/*===- attnres-c/Dialects.h - attnres in the MLIR C API -----------*- C -*-===*\
|*                                                                            *|
|* Registration of the attnres dialect through MLIR's C API, for compilers   *|
|* that embed it:                                                             *|
|*   mlirDialectHandleRegisterDialect(mlirGetDialectHandle__attnres__(), ctx) *|
|*                                                                            *|
\*===----------------------------------------------------------------------===*/

#ifndef ATTNRES_C_DIALECTS_H
#define ATTNRES_C_DIALECTS_H

#include "mlir-c/IR.h"

#ifdef __cplusplus
extern "C" {
#endif

MLIR_DECLARE_CAPI_DIALECT_REGISTRATION(AttnRes, attnres);

/// Inserts the attnres dialect and every upstream dialect its pipelines
/// produce, with their interface models, into `registry`.
MLIR_CAPI_EXPORTED void
attnresRegisterAllDialects(MlirDialectRegistry registry);

/// Registers the attnres passes and pipelines (and the upstream passes) so
/// that mlirParsePassPipeline and mlirOpPassManagerAddPipeline know them.
MLIR_CAPI_EXPORTED void attnresRegisterAllPasses(void);

#ifdef __cplusplus
}
#endif

#endif /* ATTNRES_C_DIALECTS_H */
