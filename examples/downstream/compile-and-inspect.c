/* Compiles an attnres spec with the installed C API, writes the bundle and
 * inspects it with the installed runtime (no GPU needed):
 *
 *   compile-and-inspect SPEC TARGET OUTPUT-FOLDER
 */
#include <attnres-c/Compiler.h>
#include <attnres-c/Runtime.h>

#include <stdio.h>

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: compile-and-inspect SPEC TARGET OUTPUT-FOLDER\n");
    return 2;
  }
  AttnresCompileOptions options = {argv[2], NULL, -1, NULL};
  char *error = NULL;
  AttnresBundle *bundle = attnresCompileSpec(argv[1], &options, &error);
  if (!bundle) {
    printf("compile error: %s\n", error ? error : "(no message)");
    attnresCompilerFreeString(error);
    return 1;
  }
  if (attnresBundleWrite(bundle, argv[3], &error) != 0) {
    printf("write error: %s\n", error ? error : "(no message)");
    attnresCompilerFreeString(error);
    attnresBundleDestroy(bundle);
    return 1;
  }
  printf("compiled by %s: %zu files\n", attnresCompilerVersion(),
         attnresBundleNumFiles(bundle));
  attnresBundleDestroy(bundle);

  AttnresRuntime *runtime = NULL;
  char *message = NULL;
  if (attnresRuntimeInspect(argv[3], &runtime, &message) != ATTNRES_OK) {
    printf("inspect error: %s\n", message ? message : "(no message)");
    attnresFreeString(message);
    return 1;
  }
  for (int op = 0; op < attnresRuntimeNumOps(runtime); ++op)
    printf("op %d: %s\n", op, attnresRuntimeOpKind(runtime, op));
  attnresRuntimeDestroy(runtime);
  return 0;
}
