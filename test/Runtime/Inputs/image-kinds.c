/* Gives libAttnResRuntime's mgpuModuleLoad an AMD GPU code object first
 * (an ELF header for EM_AMDGPU, no sections), then a CUDA one (EM_CUDA),
 * and looks a kernel up in each: the first image decides that the process
 * runs on HIP, so the second is refused by name of both vendors; the first
 * has no such kernel. Prints each lookup's result and message. */

#include "attnres-c/GpuWrappers.h"

#include <stdio.h>
#include <string.h>

static void elfHeader(unsigned char *image, unsigned machine) {
  memset(image, 0, 64);
  memcpy(image, "\177ELF", 4);
  image[4] = 2; /* ELFCLASS64 */
  image[5] = 1; /* little-endian */
  image[18] = (unsigned char)(machine & 0xff);
  image[19] = (unsigned char)(machine >> 8);
}

static void lookUp(const char *what, void *module) {
  attnresGpuClearError();
  void *kernel = mgpuModuleGetFunction(module, "k");
  const char *message = attnresGpuLastError();
  printf("%s: %s: %s\n", what, kernel ? "found" : "not found",
         message ? message : "(no message)");
}

int main(void) {
  unsigned char amd[64], nvidia[64];
  elfHeader(amd, 224);
  elfHeader(nvidia, 190);
  void *first = mgpuModuleLoad(amd, sizeof(amd));
  void *second = mgpuModuleLoad(nvidia, sizeof(nvidia));
  lookUp("amd image", first);
  lookUp("nvidia image", second);
  mgpuModuleUnload(second);
  mgpuModuleUnload(first);
  return 0;
}
