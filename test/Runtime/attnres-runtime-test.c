/*===- attnres-runtime-test.c - the runtime's CPU side, from C ----------===*\
|*                                                                            *|
|* Inspects a bundle (no GPU, no driver): its ops, launch rules and          *|
|* workspace sizes; then checks that misuse comes back as error statuses and *|
|* messages, and (argument "load") what loading reports on this machine.     *|
|*                                                                            *|
\*===----------------------------------------------------------------------===*/

#include "attnres-c/Runtime.h"

#include "ShowStatus.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s <bundle> <malformed bundle> [load]\n", argv[0]);
    return 2;
  }
  AttnresRuntime *runtime = NULL;
  char *error = NULL;
  AttnresStatus status = attnresRuntimeInspect(argv[1], &runtime, &error);
  if (status != ATTNRES_OK) {
    show("inspect", status, error);
    return 1;
  }
  int ops = attnresRuntimeNumOps(runtime);
  printf("ops: %d\n", ops);
  for (int op = 0; op < ops; ++op)
    printf("op %d: %s\n", op, attnresRuntimeOpKind(runtime, op));
  printf("description of op 0 names its forward kernel: %s\n",
         strstr(attnresRuntimeOpDescription(runtime, 0),
                "\"forward\":\"attnres_0_forward\"")
             ? "yes"
             : "no");

  int64_t tokens[] = {1, 128, 100000};
  for (int i = 0; i < 3; ++i) {
    size_t forward = 0, backward = 0;
    attnresForwardWorkspaceSize(runtime, 0, tokens[i], 0, &forward, NULL);
    attnresBackwardWorkspaceSize(runtime, 1, tokens[i], 0, 0, &backward, NULL);
    int64_t blocks = attnresBackwardBlocks(runtime, 1, tokens[i]);
    printf("N=%lld: partitions %lld (workspace %zu), blocks %lld x "
           "partitions %lld (workspace %zu)\n",
           (long long)tokens[i],
           (long long)attnresForwardPartitions(runtime, 0, tokens[i]), forward,
           (long long)blocks,
           (long long)attnresBackwardPartitions(runtime, 1, blocks), backward);
  }

  AttnresForwardArgs forward;
  memset(&forward, 0, sizeof(forward));
  forward.num_tokens = 16;
  SHOW("split forward without a workspace",
       attnresForward(runtime, 0, &forward, NULL, &error));
  forward.partitions = 1;
  SHOW("forward on an inspected bundle",
       attnresForward(runtime, 0, &forward, NULL, &error));
  SHOW("forward of a backward op",
       attnresForward(runtime, 1, &forward, NULL, &error));
  SHOW("op out of range", attnresForward(runtime, 7, &forward, NULL, &error));
  SHOW("null arguments", attnresForward(runtime, 0, NULL, NULL, &error));
  forward.partitions = 99;
  SHOW("too many partitions",
       attnresForward(runtime, 0, &forward, NULL, &error));
  attnresRuntimeDestroy(runtime);

  runtime = NULL;
  SHOW("malformed bundle", attnresRuntimeInspect(argv[2], &runtime, &error));
  SHOW("missing bundle",
       attnresRuntimeInspect("/nonexistent/attnres", &runtime, &error));
  SHOW("null directory", attnresRuntimeLoad(NULL, &runtime, &error));

  static const char binary[] = "not a GPU binary";
  SHOW("malformed manifest in memory",
       attnresRuntimeLoadFromMemory("{\"kernels\": 3}", 14, binary,
                                    sizeof(binary), &runtime, &error));
  SHOW("null binary",
       attnresRuntimeLoadFromMemory("{}", 2, NULL, 0, &runtime, &error));

  if (argc > 3 && strcmp(argv[3], "load") == 0) {
    error = NULL;
    runtime = NULL;
    status = attnresRuntimeLoad(argv[1], &runtime, &error);
    show("load", status, error);
    if (status == ATTNRES_OK)
      attnresRuntimeDestroy(runtime);
  }
  return 0;
}
