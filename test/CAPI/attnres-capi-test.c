/*===- attnres-capi-test.c - the attnres C API, from C ------------------===*\
|*                                                                            *|
|* Registers the dialect through its handle, parses and walks attnres IR,    *|
|* compiles a module and a spec to bundles, and checks that bad input comes  *|
|* back as error messages.                                                    *|
|*                                                                            *|
\*===----------------------------------------------------------------------===*/

#include "attnres-c/Compiler.h"
#include "attnres-c/Dialects.h"

#include "mlir-c/IR.h"
#include "mlir-c/Pass.h"

#include <stdio.h>
#include <string.h>

static const char *module_text =
    "func.func @layer(%v0: tensor<?x64xbf16>, %v1: tensor<?x64xbf16>,\n"
    "                 %q: tensor<64xbf16>) -> tensor<?x64xbf16> {\n"
    "  %o, %lse = attnres.forward sources(%v0, %v1 : tensor<?x64xbf16>)\n"
    "      query(%q : tensor<64xbf16>) -> tensor<?x64xbf16>, tensor<?xf32>\n"
    "  return %o : tensor<?x64xbf16>\n"
    "}\n";

static int count_attnres_ops(MlirOperation op) {
  int count = 0;
  MlirIdentifier name = mlirOperationGetName(op);
  MlirStringRef text = mlirIdentifierStr(name);
  if (text.length > 8 && strncmp(text.data, "attnres.", 8) == 0)
    ++count;
  for (intptr_t r = 0; r < mlirOperationGetNumRegions(op); ++r) {
    MlirRegion region = mlirOperationGetRegion(op, r);
    for (MlirBlock block = mlirRegionGetFirstBlock(region);
         !mlirBlockIsNull(block); block = mlirBlockGetNextInRegion(block))
      for (MlirOperation inner = mlirBlockGetFirstOperation(block);
           !mlirOperationIsNull(inner);
           inner = mlirOperationGetNextInBlock(inner))
        count += count_attnres_ops(inner);
  }
  return count;
}

int main(int argc, char **argv) {
  const char *out = argc > 1 ? argv[1] : "capi-bundle";

  /* Dialect registration through MLIR's C API macro. */
  MlirDialectHandle handle = mlirGetDialectHandle__attnres__();
  MlirStringRef ns = mlirDialectHandleGetNamespace(handle);
  printf("dialect namespace: %.*s\n", (int)ns.length, ns.data);

  MlirDialectRegistry registry = mlirDialectRegistryCreate();
  attnresRegisterAllDialects(registry);
  MlirContext context = mlirContextCreateWithRegistry(registry, false);
  mlirDialectRegistryDestroy(registry);
  mlirContextLoadAllAvailableDialects(context);

  MlirModule module = mlirModuleCreateParse(
      context, mlirStringRefCreateFromCString(module_text));
  if (mlirModuleIsNull(module)) {
    printf("parse failed\n");
    return 1;
  }
  printf("attnres ops: %d\n",
         count_attnres_ops(mlirModuleGetOperation(module)));

  /* Passes and pipelines are registered for the textual pipeline parser. */
  attnresRegisterAllPasses();
  MlirPassManager pm = mlirPassManagerCreate(context);
  MlirOpPassManager opm = mlirPassManagerGetAsOpPassManager(pm);
  MlirLogicalResult parsed = mlirParsePassPipeline(
      opm,
      mlirStringRefCreateFromCString(
          "builtin.module(func.func(attnres-split-sources{partitions=2}))"),
      NULL, NULL);
  printf("pipeline parsed: %s\n",
         mlirLogicalResultIsSuccess(parsed) ? "yes" : "no");
  mlirPassManagerDestroy(pm);

  /* One-call compile of the module. */
  AttnresCompileOptions options = {"sm_90", "isa", 3};
  char *error = NULL;
  AttnresBundle *bundle = attnresCompileModule(module, &options, &error);
  if (!bundle) {
    printf("compile failed: %s\n", error);
    attnresCompilerFreeString(error);
    return 1;
  }
  size_t size = 0;
  const char *ptx = (const char *)attnresBundleFileData(bundle, 0, &size);
  printf("file: %s (%s)\n", attnresBundleFileName(bundle, 0),
         size > 0 && strstr(ptx, ".target sm_90") ? "PTX for sm_90" : "?");
  printf("manifest names layer_0_forward: %s\n",
         strstr(attnresBundleManifest(bundle), "\"layer_0_forward\"") ? "yes"
                                                                      : "no");
  if (attnresBundleWrite(bundle, out, &error) != 0) {
    printf("write failed: %s\n", error);
    return 1;
  }
  attnresBundleDestroy(bundle);
  mlirModuleDestroy(module);
  mlirContextDestroy(context);

  /* A spec, and errors as messages. */
  bundle =
      attnresCompileSpec("train:L=3,D=128,dtype=f32,key_norm", NULL, &error);
  printf("spec compiled: %s, %zu file(s)\n", bundle ? "yes" : "no",
         attnresBundleNumFiles(bundle));
  attnresBundleDestroy(bundle);

  /* The lowering's choices, and a bad one refused with its reason. */
  AttnresCompileOptions tuned = {"sm_90", "isa", 3,
                                 "forward-source-batch=3 "
                                 "forward-threads-per-row=8"};
  bundle = attnresCompileSpec("forward:L=4,D=64", &tuned, &error);
  printf("kernel options: %s\n",
         bundle && strstr(attnresBundleManifest(bundle), "\"source_batch\": 3")
             ? "recorded"
             : "?");
  attnresBundleDestroy(bundle);
  tuned.kernel_options = "forward-threads-per-row=3";
  bundle = attnresCompileSpec("forward:L=4,D=64", &tuned, &error);
  printf("bad kernel options: %s\n", bundle ? "compiled?!" : error);
  attnresCompilerFreeString(error);

  bundle = attnresCompileSpec("forward:L=3,D=64,eps=-1", NULL, &error);
  printf("bad spec: %s\n", bundle ? "compiled?!" : error);
  attnresCompilerFreeString(error);

  options.target = "sm_1000x";
  bundle = attnresCompileSpec("forward:L=3,D=64", &options, &error);
  printf("bad target: %s\n", bundle ? "compiled?!" : error);
  attnresCompilerFreeString(error);

  const char *broken = "func.func @f() { attnres.forward }";
  bundle = attnresCompileSource(broken, strlen(broken), NULL, &error);
  printf("bad source: %s\n", bundle ? "compiled?!" : error);
  attnresCompilerFreeString(error);

  bundle = attnresCompileSpec(NULL, NULL, &error);
  printf("null spec: %s\n", bundle ? "compiled?!" : error);
  attnresCompilerFreeString(error);

  printf("version: %s\n", attnresCompilerVersion());
  return 0;
}
