/* What the C programs that call host code compiled by attnres share: the
 * ranked memref descriptors of MLIR's C interface (llvm.emit_c_interface,
 * llvm-request-c-wrappers) and bf16 conversions. */

#ifndef ATTNRES_TEST_INPUTS_HOST_PROGRAM_H
#define ATTNRES_TEST_INPUTS_HOST_PROGRAM_H

#include <stdint.h>
#include <string.h>

/* A ranked memref of rank 1, 2 or 3 as the C interface passes it. */
typedef struct {
  void *allocated, *aligned;
  int64_t offset, sizes[1], strides[1];
} Desc1;
typedef struct {
  void *allocated, *aligned;
  int64_t offset, sizes[2], strides[2];
} Desc2;
typedef struct {
  void *allocated, *aligned;
  int64_t offset, sizes[3], strides[3];
} Desc3;

/* `value` in bf16, rounded to nearest even (through float). */
static inline uint16_t toBf16(double value) {
  float x = (float)value;
  uint32_t bits;
  memcpy(&bits, &x, 4);
  bits += 0x7fff + ((bits >> 16) & 1);
  return (uint16_t)(bits >> 16);
}
static inline double fromBf16(uint16_t x) {
  uint32_t bits = (uint32_t)x << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

#endif /* ATTNRES_TEST_INPUTS_HOST_PROGRAM_H */
