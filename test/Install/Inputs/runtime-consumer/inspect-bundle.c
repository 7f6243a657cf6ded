/* Inspects a kernel bundle through the installed runtime (no GPU needed):
 * prints its ops and the forward's partition count for 128 tokens, or the
 * runtime's error. */
#include <attnres-c/Runtime.h>

#include <stdio.h>

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: inspect-bundle BUNDLE-FOLDER\n");
    return 2;
  }
  AttnresRuntime *runtime = NULL;
  char *error = NULL;
  if (attnresRuntimeInspect(argv[1], &runtime, &error) != ATTNRES_OK) {
    printf("error: %s\n", error ? error : "(no message)");
    attnresFreeString(error);
    return 1;
  }
  int ops = attnresRuntimeNumOps(runtime);
  printf("ops: %d\n", ops);
  for (int op = 0; op < ops; ++op)
    printf("op %d: %s\n", op, attnresRuntimeOpKind(runtime, op));
  printf("forward partitions for 128 tokens: %lld\n",
         (long long)attnresForwardPartitions(runtime, 0, 128));
  attnresRuntimeDestroy(runtime);
  return 0;
}
