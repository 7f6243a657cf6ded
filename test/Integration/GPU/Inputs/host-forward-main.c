/* Calls @mix of host-forward.mlir (compiled with keep-host=1 into a host
 * object that launches the forward kernel, linked against
 * libAttnResRuntime) on N tokens, and checks o and lse against a float64
 * computation of the same formulas (docs/Math.md section 1). Prints
 * "host forward: ok" and exits 0 when every element is within bf16
 * rounding; prints the runtime's message and exits 1 where a GPU call
 * failed. With the argument "misaligned", passes a query the kernel cannot
 * read and expects the lowered code to refuse the launch with a message. */

#include "attnres-c/GpuWrappers.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { L = 4, D = 256, N = 1001 };
static const double kScale = 0.5, kEps = 1e-6;

typedef struct {
  void *allocated, *aligned;
  int64_t offset, sizes[3], strides[3];
} Desc3;
typedef struct {
  void *allocated, *aligned;
  int64_t offset, sizes[2], strides[2];
} Desc2;
typedef struct {
  void *allocated, *aligned;
  int64_t offset, sizes[1], strides[1];
} Desc1;
typedef struct {
  Desc2 o;
  Desc1 lse;
} Results;

void _mlir_ciface_mix(Results *results, Desc3 *v, Desc1 *q, Desc1 *g);

static uint16_t toBf16(float x) { /* round to nearest even */
  uint32_t bits;
  memcpy(&bits, &x, 4);
  bits += 0x7fff + ((bits >> 16) & 1);
  return (uint16_t)(bits >> 16);
}
static double fromBf16(uint16_t x) {
  uint32_t bits = (uint32_t)x << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
static uint32_t state = 12345;
static float uniform(void) { /* in [-1, 1) */
  state = state * 1664525u + 1013904223u;
  return (float)((state >> 8) * (2.0 / 16777216.0) - 1.0);
}

static int failed(const char *what) {
  const char *message = attnresGpuLastError();
  printf("host forward: %s failed: %s\n", what,
         message ? message : "(no message)");
  return 1;
}

/* A query two bytes past an aligned address: the kernel's 16-byte loads
 * cannot read it, so the lowered code must skip the launch and report why.
 * The token count is 0 here, so the refusal is the only report even
 * without a GPU. */
static int misaligned(void) {
  static uint16_t v[L * D], q[D + 8], g[D];
  Desc3 vd = {v, v, 0, {L, 0, D}, {0, D, 1}};
  Desc1 qd = {q, q + 1, 0, {D}, {1}}, gd = {g, g, 0, {D}, {1}};
  Results results;
  attnresGpuClearError();
  _mlir_ciface_mix(&results, &vd, &qd, &gd);
  const char *message = attnresGpuLastError();
  if (!message || !strstr(message, "must be aligned")) {
    printf("host forward: a misaligned query was not refused (%s)\n",
           message ? message : "no message");
    return 1;
  }
  printf("host forward: misaligned query refused: %s\n", message);
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "misaligned") == 0)
    return misaligned();
  uint16_t *v = mgpuMemAlloc(sizeof(uint16_t) * L * N * D, NULL, true);
  uint16_t *q = mgpuMemAlloc(sizeof(uint16_t) * D, NULL, true);
  uint16_t *g = mgpuMemAlloc(sizeof(uint16_t) * D, NULL, true);
  if (!v || !q || !g)
    return failed("mgpuMemAlloc");
  for (int64_t i = 0; i < (int64_t)L * N * D; ++i)
    v[i] = toBf16(2.0f * uniform());
  for (int64_t d = 0; d < D; ++d) {
    q[d] = toBf16(0.3f * uniform());
    g[d] = toBf16(1.0f + 0.2f * uniform());
  }
  /* Larger rows for source 2 of some tokens: the softmax is not uniform. */
  for (int64_t n = 0; n < N; n += 3)
    for (int64_t d = 0; d < D; ++d)
      v[(2 * N + n) * D + d] = toBf16(4.0f * (float)fromBf16(q[d]) / 0.3f);

  Desc3 vd = {v, v, 0, {L, N, D}, {(int64_t)N * D, D, 1}};
  Desc1 qd = {q, q, 0, {D}, {1}}, gd = {g, g, 0, {D}, {1}};
  Results results;
  memset(&results, 0, sizeof(results));
  _mlir_ciface_mix(&results, &vd, &qd, &gd);
  if (attnresGpuLastError())
    return failed("mix");
  if (results.o.sizes[0] != N || results.o.sizes[1] != D ||
      results.lse.sizes[0] != N) {
    printf("host forward: results of shape [%lld, %lld] and [%lld]\n",
           (long long)results.o.sizes[0], (long long)results.o.sizes[1],
           (long long)results.lse.sizes[0]);
    return 1;
  }
  static uint16_t o[N * D];
  static float lse[N];
  mgpuMemcpy(o, results.o.aligned, sizeof(o), NULL);
  mgpuMemcpy(lse, results.lse.aligned, sizeof(lse), NULL);
  mgpuStreamSynchronize(NULL);
  mgpuMemFree(results.o.allocated, NULL);
  mgpuMemFree(results.lse.allocated, NULL);
  if (attnresGpuLastError())
    return failed("copying the results back");

  double errorSquares = 0, referenceSquares = 0, worstLse = 0;
  for (int64_t n = 0; n < N; ++n) {
    double logit[L], top = -INFINITY;
    for (int64_t l = 0; l < L; ++l) {
      const uint16_t *row = v + (l * N + n) * D;
      double squares = 0, dot = 0;
      for (int64_t d = 0; d < D; ++d)
        squares += fromBf16(row[d]) * fromBf16(row[d]);
      double rho = 1.0 / sqrt(squares / D + kEps);
      for (int64_t d = 0; d < D; ++d)
        dot += rho * fromBf16(row[d]) * fromBf16(g[d]) * fromBf16(q[d]);
      logit[l] = kScale * dot;
      top = fmax(top, logit[l]);
    }
    double sum = 0;
    for (int64_t l = 0; l < L; ++l)
      sum += exp(logit[l] - top);
    double expected = top + log(sum);
    worstLse = fmax(worstLse, fabs(lse[n] - expected));
    for (int64_t d = 0; d < D; ++d) {
      double mixed = 0;
      for (int64_t l = 0; l < L; ++l)
        mixed += exp(logit[l] - expected) * fromBf16(v[(l * N + n) * D + d]);
      /* bf16 keeps 8 bits: half an ulp is 2^-9 of the value. */
      double error = fabs(fromBf16(o[n * D + d]) - mixed);
      double allowed = ldexp(fabs(mixed), -8) + 1e-6;
      if (error > allowed) {
        printf("host forward: o[%lld][%lld] = %g, expected %g\n", (long long)n,
               (long long)d, fromBf16(o[n * D + d]), mixed);
        return 1;
      }
      errorSquares += error * error;
      referenceSquares += mixed * mixed;
    }
  }
  if (worstLse > 1e-4) {
    printf("host forward: lse off by %g\n", worstLse);
    return 1;
  }
  mgpuMemFree(v, NULL);
  mgpuMemFree(q, NULL);
  mgpuMemFree(g, NULL);
  printf("host forward: ok (%d tokens; relative (Frobenius) error of o "
         "%.1e, worst error of lse %.1e)\n",
         N, sqrt(errorSquares / referenceSquares), worstLse);
  return 0;
}
