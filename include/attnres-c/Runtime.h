/*===- attnres-c/Runtime.h - load bundles, launch attnres kernels -*- C -*-===*\
|*                                                                            *|
|* The attnres runtime: loads a kernel bundle (attnres-compile's folder, or   *|
|* its manifest and binary in memory) and launches the kernels of its ops on  *|
|* a stream, through the CUDA driver API or HIP, both loaded at run time      *|
|* (dlopen): the library needs neither to build or to load.                   *|
|*                                                                            *|
|* Every function returns ATTNRES_OK or an error status; on error, when       *|
|* `error` is not null, *error receives a message to free with                *|
|* attnresFreeString. Nothing aborts or exits.                                *|
|*                                                                            *|
\*===----------------------------------------------------------------------===*/

#ifndef ATTNRES_C_RUNTIME_H
#define ATTNRES_C_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define ATTNRES_RUNTIME_EXPORT __declspec(dllexport)
#else
#define ATTNRES_RUNTIME_EXPORT __attribute__((visibility("default")))
#endif

typedef enum AttnresStatus {
  ATTNRES_OK = 0,
  ATTNRES_ERROR_INVALID_ARGUMENT = 1, /* a null, misaligned or wrong value */
  ATTNRES_ERROR_BUNDLE = 2,           /* unreadable or malformed bundle */
  ATTNRES_ERROR_NO_DRIVER = 3,        /* libcuda / libamdhip64 not loadable */
  ATTNRES_ERROR_DRIVER = 4,           /* the driver reported an error */
} AttnresStatus;

typedef struct AttnresRuntime AttnresRuntime;

/* Loading. The device is the current one of the calling thread (its primary
 * context is made current when none is). */
ATTNRES_RUNTIME_EXPORT AttnresStatus attnresRuntimeLoad(const char *directory,
                                                        AttnresRuntime **out,
                                                        char **error);
ATTNRES_RUNTIME_EXPORT AttnresStatus attnresRuntimeLoadFromMemory(
    const char *manifest, size_t manifestSize, const void *binary,
    size_t binarySize, AttnresRuntime **out, char **error);
/* Parses and checks a bundle without touching a GPU (no driver needed). */
ATTNRES_RUNTIME_EXPORT AttnresStatus attnresRuntimeInspect(
    const char *directory, AttnresRuntime **out, char **error);
ATTNRES_RUNTIME_EXPORT void attnresRuntimeDestroy(AttnresRuntime *runtime);
ATTNRES_RUNTIME_EXPORT void attnresFreeString(char *string);

/* The ops of the bundle: `kind` is "forward", "backward",
 * "partition_reduce_softmax" or "partition_reduce_sum"; the description is
 * the op's manifest entry (JSON), valid while the runtime lives. */
ATTNRES_RUNTIME_EXPORT int attnresRuntimeNumOps(const AttnresRuntime *runtime);
ATTNRES_RUNTIME_EXPORT const char *
attnresRuntimeOpKind(const AttnresRuntime *runtime, int op);
ATTNRES_RUNTIME_EXPORT const char *
attnresRuntimeOpDescription(const AttnresRuntime *runtime, int op);
/* Multiprocessors of the device (0 for an inspected bundle). */
ATTNRES_RUNTIME_EXPORT int
attnresRuntimeMultiprocessors(const AttnresRuntime *runtime);

/* Forward of op `op`: `sources` is a device table of L pointers to [N, D]
 * rows; per-query tensors are [M, N, ...]. Optional pointers are null when
 * the op has no such operand or result. `o_pre_residual` ([M, N, D/2] bytes)
 * is written by a forward compiled with save(o_pre_residual). `partitions` =
 * 0 chooses by the manifest's rule. The workspace must hold
 * attnresForwardWorkspaceSize bytes, aligned to 256 (0 bytes where the split
 * runs as the one clustered kernel, which needs none). */
typedef struct AttnresForwardArgs {
  int64_t num_tokens;
  const void *sources;
  const void *query, *key_norm, *output_norm;
  void *o, *lse, *o_pre;
  int64_t partitions;
  void *workspace;
  size_t workspace_size;
  void *o_pre_residual;
} AttnresForwardArgs;

ATTNRES_RUNTIME_EXPORT AttnresStatus attnresForwardWorkspaceSize(
    const AttnresRuntime *runtime, int op, int64_t num_tokens,
    int64_t partitions, size_t *size, char **error);
/* The partition count the manifest's rule picks for `num_tokens`; on a device
 * that runs the op's clustered forward (sm_90 and later), the largest count
 * up to it whose clusters all fit at once, where one does. 0 where `op` is
 * not a forward or `num_tokens` < 0. Sizes and counts are computed with
 * checked 64-bit arithmetic: a workspace or grid that does not fit is
 * refused, naming the counts (docs/CAPI.md, "Limits"). */
ATTNRES_RUNTIME_EXPORT int64_t attnresForwardPartitions(
    const AttnresRuntime *runtime, int op, int64_t num_tokens);
ATTNRES_RUNTIME_EXPORT AttnresStatus
attnresForward(const AttnresRuntime *runtime, int op,
               const AttnresForwardArgs *args, void *stream, char **error);

/* Backward of op `op`: `grad_sources` is a device table of L pointers to the
 * [N, D] source gradients; where the op's manifest entry says
 * "skips_null_gradients": true, a null entry asks for no gradient of that
 * source (its row is neither read nor written; dq, dg and dh still count
 * it). Older bundles store through every entry. Where it says
 * "writes_tagged_gradients": true (compiled with the kernel option
 * write-tags=1), an entry with bit 0 set (a row's address plus one; rows
 * are 16-byte aligned) is written over by an accumulating backward, not
 * read and added to; without the fact a tagged entry is an odd address.
 * dq, dg and dh have the parameters' shapes;
 * `saved_residual` is the forward's o_pre_residual where the op reads one,
 * `grad_lse` the lse's gradient where the op takes one.
 * `blocks` (of tokens) and `partitions` (of the sources) = 0 choose by the
 * manifest's rules. The workspace must hold attnresBackwardWorkspaceSize
 * bytes, aligned to 256. */
typedef struct AttnresBackwardArgs {
  int64_t num_tokens;
  const void *sources;
  const void *query, *key_norm, *output_norm;
  const void *grad, *lse, *saved;
  const void *grad_sources;
  void *dq, *dg, *dh;
  int64_t blocks;
  int64_t partitions;
  void *workspace;
  size_t workspace_size;
  const void *saved_residual;
  /* [M, N] f32: the gradient of the forward's lse, for an op compiled with
   * grad_lse(...) (the backward of a partial result); else null. */
  const void *grad_lse;
} AttnresBackwardArgs;

ATTNRES_RUNTIME_EXPORT AttnresStatus attnresBackwardWorkspaceSize(
    const AttnresRuntime *runtime, int op, int64_t num_tokens, int64_t blocks,
    int64_t partitions, size_t *size, char **error);
/* The token blocks the manifest's rule picks for `num_tokens`, and the
 * source partitions for that many blocks; 0 where `op` is not a backward,
 * `num_tokens` < 0 or `blocks` < 1. */
ATTNRES_RUNTIME_EXPORT int64_t attnresBackwardBlocks(
    const AttnresRuntime *runtime, int op, int64_t num_tokens);
ATTNRES_RUNTIME_EXPORT int64_t attnresBackwardPartitions(
    const AttnresRuntime *runtime, int op, int64_t blocks);
ATTNRES_RUNTIME_EXPORT AttnresStatus
attnresBackward(const AttnresRuntime *runtime, int op,
                const AttnresBackwardArgs *args, void *stream, char **error);

/* partition_reduce: softmax merge of `rows` rows of P partitions, or the sum
 * of P partials of `num_elements` each. */
typedef struct AttnresMergeArgs {
  int64_t num_rows;
  const void *partials, *partial_lse, *sink, *output_norm;
  void *o, *lse, *o_pre;
  int64_t rows_per_weight;
  void *o_pre_residual;
} AttnresMergeArgs;
ATTNRES_RUNTIME_EXPORT AttnresStatus attnresMerge(const AttnresRuntime *runtime,
                                                  int op,
                                                  const AttnresMergeArgs *args,
                                                  void *stream, char **error);
ATTNRES_RUNTIME_EXPORT AttnresStatus attnresSum(const AttnresRuntime *runtime,
                                                int op, const void *partials,
                                                void *output,
                                                int64_t num_elements,
                                                void *stream, char **error);

#ifdef __cplusplus
}
#endif

#endif /* ATTNRES_C_RUNTIME_H */
