/*===- attnres-runtime-limits-test.c - the runtime under hostile input --===*\
|*                                                                            *|
|* No GPU. Three modes:                                                       *|
|*   sizes BUNDLE MERGE   token, block and partition counts at the edges of  *|
|*                        int64_t on an inspected bundle (BUNDLE: a forward  *|
|*                        and a backward with two queries; MERGE: a softmax  *|
|*                        partition_reduce with a weight row per query).     *|
|*   memory MANIFEST BINARY  the in-memory loader on a bundle's own files   *|
|*                        and on oversized or malformed ones.                *|
|*   inspect DIR...       each folder inspected: its status and message.     *|
|* Each answer is printed for FileCheck. Run in the plain and the sanitizer  *|
|* trees, where UBSan reports any signed overflow.                           *|
|*                                                                            *|
\*===----------------------------------------------------------------------===*/

#include "attnres-c/GpuWrappers.h"
#include "attnres-c/Runtime.h"

#include "ShowStatus.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static AttnresRuntime *inspect(const char *folder) {
  AttnresRuntime *runtime = NULL;
  char *error = NULL;
  AttnresStatus status = attnresRuntimeInspect(folder, &runtime, &error);
  if (status != ATTNRES_OK) {
    show(folder, status, error);
    exit(1);
  }
  return runtime;
}

static int sizes(const char *bundle, const char *mergeBundle) {
  const int64_t max = INT64_MAX, tokens62 = (int64_t)1 << 62,
                blocks58 = (int64_t)1 << 58;
  AttnresRuntime *runtime = inspect(bundle);
  char *error = NULL;
  size_t bytes = 0;

  /* Launch counts stay right at the edge: the blocks the device holds, one
   * partition; no workspace for one partition. */
  printf("backward blocks, N = 2^63 - 1: %lld\n",
         (long long)attnresBackwardBlocks(runtime, 1, max));
  printf("forward partitions, N = 2^63 - 1: %lld\n",
         (long long)attnresForwardPartitions(runtime, 0, max));
  printf("negative N: forward partitions %lld, backward blocks %lld\n",
         (long long)attnresForwardPartitions(runtime, 0, -1),
         (long long)attnresBackwardBlocks(runtime, 1, -1));
  SHOW("forward workspace, N = 2^63 - 1 by rule",
       attnresForwardWorkspaceSize(runtime, 0, max, 0, &bytes, &error));
  printf("  bytes %zu\n", bytes);
  SHOW("backward workspace, N = 2^63 - 1 by rule",
       attnresBackwardWorkspaceSize(runtime, 1, max, 0, 0, &bytes, &error));
  printf("  bytes %zu\n", bytes);

  /* Sizes that do not fit in 64 bits are refused, naming the counts. */
  SHOW("forward workspace, N = 2^62, P = 4",
       attnresForwardWorkspaceSize(runtime, 0, tokens62, 4, &bytes, &error));
  SHOW(
      "backward workspace, B = 2^58, P = 1",
      attnresBackwardWorkspaceSize(runtime, 1, 1, blocks58, 1, &bytes, &error));
  SHOW("backward workspace, B = 2^63 - 1, P = 4",
       attnresBackwardWorkspaceSize(runtime, 1, max, max, 4, &bytes, &error));
  SHOW("forward workspace, P = 65 > L",
       attnresForwardWorkspaceSize(runtime, 0, 16, 65, &bytes, &error));

  /* The launches refuse them too, before anything is launched. */
  AttnresForwardArgs forward;
  memset(&forward, 0, sizeof(forward));
  forward.num_tokens = tokens62;
  forward.partitions = 1;
  SHOW("forward, N = 2^62 (M * N rows)",
       attnresForward(runtime, 0, &forward, NULL, &error));
  forward.num_tokens = (int64_t)1 << 60;
  forward.partitions = 4;
  SHOW("forward, N = 2^60, P = 4",
       attnresForward(runtime, 0, &forward, NULL, &error));
  AttnresBackwardArgs backward;
  memset(&backward, 0, sizeof(backward));
  backward.num_tokens = 1;
  backward.blocks = blocks58;
  backward.partitions = 1;
  SHOW("backward, B = 2^58",
       attnresBackward(runtime, 1, &backward, NULL, &error));
  attnresRuntimeDestroy(runtime);

  runtime = inspect(mergeBundle);
  AttnresMergeArgs merge;
  memset(&merge, 0, sizeof(merge));
  merge.num_rows = 8;
  SHOW("merge with a weight row a query, rows_per_weight = 0",
       attnresMerge(runtime, 0, &merge, NULL, &error));
  attnresRuntimeDestroy(runtime);

  /* The memref wrappers of lowered host code size a dense memref from its
   * descriptor: 2^40 x 2^40 floats are refused before the driver is asked. */
  static float cell;
  struct {
    float *allocated, *aligned;
    int64_t offset, sizes[2], strides[2];
  } huge = {&cell,
            &cell,
            0,
            {(int64_t)1 << 40, (int64_t)1 << 40},
            {(int64_t)1 << 40, 1}};
  attnresGpuClearError();
  mgpuMemHostRegisterMemRef(2, &huge, sizeof(float));
  printf("memref of 2^80 floats: %s\n", attnresGpuLastError());
  return 0;
}

static char *readFile(const char *path, size_t *size) {
  FILE *file = fopen(path, "rb");
  if (!file) {
    perror(path);
    exit(1);
  }
  fseek(file, 0, SEEK_END);
  long length = ftell(file);
  fseek(file, 0, SEEK_SET);
  char *data = malloc((size_t)length + 1);
  if (fread(data, 1, (size_t)length, file) != (size_t)length) {
    perror(path);
    exit(1);
  }
  fclose(file);
  data[length] = '\0';
  *size = (size_t)length;
  return data;
}

static int memory(const char *manifestPath, const char *binaryPath) {
  char *error = NULL;
  size_t manifestSize, binarySize;
  char *manifest = readFile(manifestPath, &manifestSize);
  char *binary = readFile(binaryPath, &binarySize);
  AttnresRuntime *runtime = NULL;

  /* A manifest past the folder loaders' 16 MiB: refused before it is parsed
   * (the bytes after the real manifest are spaces, which JSON allows). */
  size_t bigSize = ((size_t)16 << 20) + 1;
  char *big = malloc(bigSize);
  memset(big, ' ', bigSize);
  memcpy(big, manifest, manifestSize);
  SHOW("manifest of 16 MiB + 1",
       attnresRuntimeLoadFromMemory(big, bigSize, binary, binarySize, &runtime,
                                    &error));
  /* The same at exactly 16 MiB parses (and then needs a driver). */
  error = NULL;
  AttnresStatus status = attnresRuntimeLoadFromMemory(
      big, bigSize - 1, binary, binarySize, &runtime, &error);
  printf("manifest of 16 MiB: %s\n",
         status == ATTNRES_ERROR_BUNDLE ? error : "not refused as a bundle");
  attnresFreeString(error);
  if (status == ATTNRES_OK)
    attnresRuntimeDestroy(runtime);
  free(big);
  /* A binary past 512 MiB: refused by its size alone, before any byte of
   * it is read (so the buffer need not be that large). */
  SHOW("binary of 512 MiB + 1",
       attnresRuntimeLoadFromMemory(manifest, manifestSize, binary,
                                    ((size_t)512 << 20) + 1, &runtime, &error));
  /* The folder loaders' check of the manifest's binaries. */
  char *noBinaries = strstr(manifest, "\"binaries\"");
  if (!noBinaries) {
    fprintf(stderr, "the manifest has no binaries entry\n");
    return 1;
  }
  memcpy(noBinaries, "\"binarieZ\"", 10);
  SHOW("manifest without binaries",
       attnresRuntimeLoadFromMemory(manifest, manifestSize, binary, binarySize,
                                    &runtime, &error));
  free(manifest);
  free(binary);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "sizes") == 0)
    return sizes(argv[2], argv[3]);
  if (argc == 4 && strcmp(argv[1], "memory") == 0)
    return memory(argv[2], argv[3]);
  if (argc >= 2 && strcmp(argv[1], "inspect") == 0) {
    for (int i = 2; i < argc; ++i) {
      AttnresRuntime *runtime = NULL;
      char *error = NULL;
      const char *name = strrchr(argv[i], '/');
      AttnresStatus status = attnresRuntimeInspect(argv[i], &runtime, &error);
      show(name ? name + 1 : argv[i], status, error);
      attnresRuntimeDestroy(runtime);
    }
    return 0;
  }
  fprintf(stderr,
          "usage: %s sizes BUNDLE MERGE | memory MANIFEST BINARY | inspect "
          "DIR...\n",
          argv[0]);
  return 2;
}
