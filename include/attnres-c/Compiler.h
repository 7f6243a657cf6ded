/*===- attnres-c/Compiler.h - one-call compile to kernel bundles --*- C -*-===*\
|*                                                                            *|
|* Compiles a spec ("train:L=10,D=4096,dtype=bf16", docs/Bundle.md), module  *|
|* text, or an MlirModule to a kernel bundle for a target (sm_80, sm_90,     *|
|* sm_100, gfx942, gfx950, ...). Errors come back as messages, never as an   *|
|* abort or exit: on failure the functions return null and set *error (free  *|
|* it with attnresCompilerFreeString).                                        *|
|*                                                                            *|
\*===----------------------------------------------------------------------===*/

#ifndef ATTNRES_C_COMPILER_H
#define ATTNRES_C_COMPILER_H

#include "mlir-c/IR.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct AttnresBundle AttnresBundle;

typedef struct AttnresCompileOptions {
  const char *target; /* null: "sm_90" */
  const char *format; /* "bin" (null), "isa" or "fatbin" */
  int opt_level;      /* 0 to 3; negative: 3 */
  /* Options of convert-attnres-to-gpu in pass-option syntax, e.g.
   * "backward-source-batch=4 forward-prefetch=1"; null or "": its defaults,
   * chosen from measurements (docs/Performance.md). */
  const char *kernel_options;
} AttnresCompileOptions;

/* The spec and source entry points compile in one context of their own and
 * may be called from any thread (calls are serialized). */
MLIR_CAPI_EXPORTED AttnresBundle *
attnresCompileSpec(const char *spec, const AttnresCompileOptions *options,
                   char **error);
MLIR_CAPI_EXPORTED AttnresBundle *
attnresCompileSource(const char *source, size_t length,
                     const AttnresCompileOptions *options, char **error);
/* Compiles (and consumes the contents of) `module`, whose context must have
 * the attnres dialect registered. */
MLIR_CAPI_EXPORTED AttnresBundle *
attnresCompileModule(MlirModule module, const AttnresCompileOptions *options,
                     char **error);

MLIR_CAPI_EXPORTED const char *attnresBundleManifest(const AttnresBundle *b);
MLIR_CAPI_EXPORTED size_t attnresBundleNumFiles(const AttnresBundle *b);
MLIR_CAPI_EXPORTED const char *attnresBundleFileName(const AttnresBundle *b,
                                                     size_t index);
MLIR_CAPI_EXPORTED const void *
attnresBundleFileData(const AttnresBundle *b, size_t index, size_t *size);
/* Writes the bundle into `directory`; returns 0 on success. */
MLIR_CAPI_EXPORTED int attnresBundleWrite(const AttnresBundle *b,
                                          const char *directory, char **error);
MLIR_CAPI_EXPORTED void attnresBundleDestroy(AttnresBundle *b);

MLIR_CAPI_EXPORTED const char *attnresCompilerVersion(void);
MLIR_CAPI_EXPORTED void attnresCompilerFreeString(char *string);

#ifdef __cplusplus
}
#endif

#endif /* ATTNRES_C_COMPILER_H */
