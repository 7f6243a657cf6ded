/* Calls @decode, @mix, @queries, @merge and @merge_norm of
 * host-forward.mlir (compiled with keep-host=1 into a host object that
 * launches their kernels, linked against libAttnResRuntime) on several
 * token counts, and checks o and lse against a float64 computation of the
 * same formulas (docs/Math.md: the forward, and the partition reduce for
 * the merges). Prints "host forward: NAME ok" for each and exits 0 when
 * every element is within bf16 rounding; prints the runtime's message and
 * exits 1 where a GPU call failed. With the argument "misaligned", passes a
 * query the kernel cannot read and expects the lowered code to refuse the
 * launch with a message. */

#include "attnres-c/GpuWrappers.h"
#include "host-program.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { L = 4, D = 256, N = 1001 };
static const double kScale = 0.5, kEps = 1e-6;

typedef struct {
  Desc2 o;
  Desc1 lse;
} Results;
typedef struct {
  Desc3 o;
  Desc2 lse;
} QueryResults;

void _mlir_ciface_mix(Results *results, Desc3 *v, Desc1 *q, Desc1 *g);
void _mlir_ciface_decode(Results *results, Desc3 *v, Desc1 *q, Desc1 *g);
void _mlir_ciface_queries(QueryResults *results, Desc3 *v, Desc2 *q, Desc1 *g);
void _mlir_ciface_merge(Results *results, Desc3 *p, Desc2 *l, Desc1 *sink);
void _mlir_ciface_merge_norm(Results *results, Desc3 *p, Desc2 *l, Desc1 *h);

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

/* Whether `got`, read back from bf16, is `want` within bf16 rounding
 * (bf16 keeps 8 bits: half an ulp is 2^-9 of the value; twice that, and
 * 1e-6 near 0, leave room for the FP32 arithmetic). False for NaN. */
static int withinBf16(double got, double want) {
  return fabs(got - want) <= ldexp(fabs(want), -8) + 1e-6;
}

/* Calls `function` (@mix or @decode), or with `queries` > 1
 * `queriesFunction` (@queries), on `tokens` tokens of `sources` sources of
 * width `width` and checks o and lse (a row each per query) against
 * float64. */
typedef void (*Forward)(Results *, Desc3 *, Desc1 *, Desc1 *);
typedef void (*QueriesForward)(QueryResults *, Desc3 *, Desc2 *, Desc1 *);
static int run(const char *name, Forward function,
               QueriesForward queriesFunction, int64_t sources, int64_t width,
               int64_t queries, int64_t tokens) {
  int64_t count = sources * tokens * width, rows = queries * tokens;
  uint16_t *v = mgpuMemAlloc(sizeof(uint16_t) * count, NULL, true);
  uint16_t *q = mgpuMemAlloc(sizeof(uint16_t) * queries * width, NULL, true);
  uint16_t *g = mgpuMemAlloc(sizeof(uint16_t) * width, NULL, true);
  uint16_t *o = malloc(sizeof(uint16_t) * rows * width);
  float *lse = malloc(sizeof(float) * rows);
  if (!v || !q || !g)
    return failed("mgpuMemAlloc");
  for (int64_t i = 0; i < count; ++i)
    v[i] = toBf16(2.0f * uniform());
  for (int64_t d = 0; d < width; ++d) {
    q[d] = toBf16(0.3f * uniform() * sqrtf(256.0f / (float)width));
    g[d] = toBf16(1.0f + 0.2f * uniform());
  }
  for (int64_t i = width; i < queries * width; ++i)
    q[i] = toBf16(0.3f * uniform() * sqrtf(256.0f / (float)width));
  /* Larger rows for source 2 of some tokens: the softmax is not uniform. */
  for (int64_t n = 0; n < tokens; n += 3)
    for (int64_t d = 0; d < width; ++d)
      v[(2 * tokens + n) * width + d] =
          toBf16(4.0f * (float)fromBf16(q[d]) / 0.3f * sqrtf(width / 256.0f));

  Desc3 vd = {v, v, 0, {sources, tokens, width}, {tokens * width, width, 1}};
  Desc1 gd = {g, g, 0, {width}, {1}};
  void *oAllocated, *oAligned, *lseAllocated, *lseAligned;
  int shaped;
  if (queries == 1) {
    Desc1 qd = {q, q, 0, {width}, {1}};
    Results results;
    memset(&results, 0, sizeof(results));
    function(&results, &vd, &qd, &gd);
    shaped = results.o.sizes[0] == tokens && results.o.sizes[1] == width &&
             results.lse.sizes[0] == tokens;
    oAllocated = results.o.allocated, oAligned = results.o.aligned;
    lseAllocated = results.lse.allocated, lseAligned = results.lse.aligned;
  } else {
    Desc2 qd = {q, q, 0, {queries, width}, {width, 1}};
    QueryResults results;
    memset(&results, 0, sizeof(results));
    queriesFunction(&results, &vd, &qd, &gd);
    shaped = results.o.sizes[0] == queries && results.o.sizes[1] == tokens &&
             results.o.sizes[2] == width && results.lse.sizes[0] == queries &&
             results.lse.sizes[1] == tokens;
    oAllocated = results.o.allocated, oAligned = results.o.aligned;
    lseAllocated = results.lse.allocated, lseAligned = results.lse.aligned;
  }
  if (attnresGpuLastError())
    return failed(name);
  if (!shaped) {
    printf("host forward: %s: results of the wrong shape\n", name);
    return 1;
  }
  mgpuMemcpy(o, oAligned, sizeof(uint16_t) * rows * width, NULL);
  mgpuMemcpy(lse, lseAligned, sizeof(float) * rows, NULL);
  mgpuStreamSynchronize(NULL);
  mgpuMemFree(oAllocated, NULL);
  mgpuMemFree(lseAllocated, NULL);
  if (attnresGpuLastError())
    return failed("copying the results back");

  double errorSquares = 0, referenceSquares = 0, worstLse = 0;
  double logit[16];
  for (int64_t m = 0; m < queries; ++m) {
    const uint16_t *query = q + m * width;
    for (int64_t n = 0; n < tokens; ++n) {
      int64_t row = m * tokens + n;
      double top = -INFINITY;
      for (int64_t l = 0; l < sources; ++l) {
        const uint16_t *source = v + (l * tokens + n) * width;
        double squares = 0, dot = 0;
        for (int64_t d = 0; d < width; ++d)
          squares += fromBf16(source[d]) * fromBf16(source[d]);
        double rho = 1.0 / sqrt(squares / width + kEps);
        for (int64_t d = 0; d < width; ++d)
          dot +=
              rho * fromBf16(source[d]) * fromBf16(g[d]) * fromBf16(query[d]);
        logit[l] = kScale * dot;
        top = fmax(top, logit[l]);
      }
      double sum = 0;
      for (int64_t l = 0; l < sources; ++l)
        sum += exp(logit[l] - top);
      double expected = top + log(sum);
      worstLse = fmax(worstLse, fabs(lse[row] - expected));
      if (!(fabs(lse[row] - expected) <= 1e-4)) { /* NaN too */
        printf("host forward: %s: lse[%lld][%lld] = %g, expected %g\n", name,
               (long long)m, (long long)n, lse[row], expected);
        return 1;
      }
      for (int64_t d = 0; d < width; ++d) {
        double mixed = 0;
        for (int64_t l = 0; l < sources; ++l)
          mixed += exp(logit[l] - expected) *
                   fromBf16(v[(l * tokens + n) * width + d]);
        double got = fromBf16(o[row * width + d]);
        if (!withinBf16(got, mixed)) {
          printf("host forward: %s: o[%lld][%lld][%lld] = %g, expected %g\n",
                 name, (long long)m, (long long)n, (long long)d, got, mixed);
          return 1;
        }
        double error = got - mixed;
        errorSquares += error * error;
        referenceSquares += mixed * mixed;
      }
    }
  }
  mgpuMemFree(v, NULL);
  mgpuMemFree(q, NULL);
  mgpuMemFree(g, NULL);
  free(o);
  free(lse);
  printf("host forward: %s ok (%lld tokens; relative (Frobenius) error of o "
         "%.1e, worst error of lse %.1e)\n",
         name, (long long)tokens, sqrt(errorSquares / referenceSquares),
         worstLse);
  return 0;
}

/* The weight exp(x - m) of a logit x under the maximum m: 0 for an empty
 * partition (-inf), 1 at the maximum (an infinite one included). */
static double mergeWeight(double x, double m) {
  if (x == -INFINITY)
    return 0;
  return x == m ? 1 : exp(x - m);
}

/* Calls @merge (`norm` 0: five partitions and a sink) or @merge_norm
 * (`norm` 1: twenty partitions and an output norm) on `tokens` rows and
 * checks o and lse against float64. The rows cycle through the cases the
 * merge must get right: an empty partition (lse -inf) whose row is NaN,
 * every partition empty (o 0, lse -inf; the sink -inf too), an infinite
 * sink (it takes all the mass: o 0, lse +inf), one partition far above the
 * others, and ordinary rows. */
static int runMerge(const char *name, int norm, int64_t partitions,
                    int64_t tokens) {
  enum { W = 256 };
  int64_t count = partitions * tokens * W;
  float *p = mgpuMemAlloc(sizeof(float) * count, NULL, true);
  float *l = mgpuMemAlloc(sizeof(float) * partitions * tokens, NULL, true);
  float *sink = mgpuMemAlloc(sizeof(float) * tokens, NULL, true);
  uint16_t *h = mgpuMemAlloc(sizeof(uint16_t) * W, NULL, true);
  uint16_t *o = malloc(sizeof(uint16_t) * tokens * W);
  float *lse = malloc(sizeof(float) * tokens);
  if (!p || !l || !sink || !h)
    return failed("mgpuMemAlloc");
  for (int64_t i = 0; i < count; ++i)
    p[i] = 2.0f * uniform();
  for (int64_t d = 0; d < W; ++d)
    h[d] = toBf16(1.0f + 0.2f * uniform());
  for (int64_t n = 0; n < tokens; ++n) {
    for (int64_t q = 0; q < partitions; ++q)
      l[q * tokens + n] = 6.0f * uniform();
    sink[n] = 2.0f * uniform();
    int64_t empty = n % partitions;
    switch (n % 7) {
    case 1:
      l[empty * tokens + n] = -INFINITY;
      for (int64_t d = 0; d < W; ++d)
        p[(empty * tokens + n) * W + d] = NAN;
      break;
    case 2:
      for (int64_t q = 0; q < partitions; ++q)
        l[q * tokens + n] = -INFINITY;
      for (int64_t d = 0; d < W; ++d)
        p[(empty * tokens + n) * W + d] = NAN;
      sink[n] = -INFINITY;
      break;
    case 3:
      sink[n] = norm ? sink[n] : INFINITY;
      break;
    case 4:
      l[empty * tokens + n] += 30.0f;
      break;
    }
  }

  Desc3 pd = {p, p, 0, {partitions, tokens, W}, {tokens * W, W, 1}};
  Desc2 ld = {l, l, 0, {partitions, tokens}, {tokens, 1}};
  Desc1 sd = {sink, sink, 0, {tokens}, {1}}, hd = {h, h, 0, {W}, {1}};
  Results results;
  memset(&results, 0, sizeof(results));
  if (norm)
    _mlir_ciface_merge_norm(&results, &pd, &ld, &hd);
  else
    _mlir_ciface_merge(&results, &pd, &ld, &sd);
  if (attnresGpuLastError())
    return failed(name);
  if (results.o.sizes[0] != tokens || results.o.sizes[1] != W ||
      results.lse.sizes[0] != tokens) {
    printf("host forward: %s: results of shape [%lld, %lld] and [%lld]\n", name,
           (long long)results.o.sizes[0], (long long)results.o.sizes[1],
           (long long)results.lse.sizes[0]);
    return 1;
  }
  mgpuMemcpy(o, results.o.aligned, sizeof(uint16_t) * tokens * W, NULL);
  mgpuMemcpy(lse, results.lse.aligned, sizeof(float) * tokens, NULL);
  mgpuStreamSynchronize(NULL);
  mgpuMemFree(results.o.allocated, NULL);
  mgpuMemFree(results.lse.allocated, NULL);
  if (attnresGpuLastError())
    return failed("copying the results back");

  double errorSquares = 0, referenceSquares = 0, worstLse = 0;
  double merged[W];
  for (int64_t n = 0; n < tokens; ++n) {
    double m = norm ? -INFINITY : sink[n];
    for (int64_t q = 0; q < partitions; ++q)
      m = fmax(m, l[q * tokens + n]);
    double total = norm ? 0 : mergeWeight(sink[n], m);
    for (int64_t d = 0; d < W; ++d)
      merged[d] = 0;
    for (int64_t q = 0; q < partitions; ++q) {
      double w = mergeWeight(l[q * tokens + n], m);
      total += w;
      if (w > 0)
        for (int64_t d = 0; d < W; ++d)
          merged[d] += w * p[(q * tokens + n) * W + d];
    }
    double squares = 0;
    for (int64_t d = 0; d < W; ++d) {
      merged[d] = total > 0 ? merged[d] / total : 0;
      squares += merged[d] * merged[d];
    }
    double rho = 1.0 / sqrt(squares / W + kEps);
    double expected = total > 0 ? m + log(total) : -INFINITY;
    if (isinf(expected)
            ? lse[n] != expected
            : !(fabs(lse[n] - expected) <= 1e-4 * fmax(1.0, fabs(expected)))) {
      printf("host forward: %s: lse[%lld] = %g, expected %g\n", name,
             (long long)n, lse[n], expected);
      return 1;
    }
    if (!isinf(expected))
      worstLse = fmax(worstLse, fabs(lse[n] - expected));
    for (int64_t d = 0; d < W; ++d) {
      double want = norm ? merged[d] * rho * fromBf16(h[d]) : merged[d];
      double got = fromBf16(o[n * W + d]);
      if (!withinBf16(got, want)) {
        printf("host forward: %s: o[%lld][%lld] = %g, expected %g\n", name,
               (long long)n, (long long)d, got, want);
        return 1;
      }
      double error = got - want;
      errorSquares += error * error;
      referenceSquares += want * want;
    }
  }
  mgpuMemFree(p, NULL);
  mgpuMemFree(l, NULL);
  mgpuMemFree(sink, NULL);
  mgpuMemFree(h, NULL);
  free(o);
  free(lse);
  printf("host forward: %s ok (%lld rows of %lld partitions; relative "
         "(Frobenius) error of o %.1e, worst error of a finite lse %.1e)\n",
         name, (long long)tokens, (long long)partitions,
         sqrt(errorSquares / referenceSquares), worstLse);
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "misaligned") == 0)
    return misaligned();
  /* @decode at token counts that split over sources and one that does not
   * (which path each takes depends on the device's occupancy). */
  static const int64_t decodeTokens[] = {5, 48, 300, 5000};
  for (unsigned i = 0; i < sizeof(decodeTokens) / sizeof(*decodeTokens); ++i)
    if (run("decode", _mlir_ciface_decode, NULL, 16, 4096, 1, decodeTokens[i]))
      return 1;
  if (run("mix", _mlir_ciface_mix, NULL, L, D, 1, N) ||
      run("queries", NULL, _mlir_ciface_queries, 6, D, 2, N))
    return 1;
  /* Fewer rows than a block takes, and many tiles (the last one short). */
  static const int64_t mergeRows[] = {3, N};
  for (unsigned i = 0; i < sizeof(mergeRows) / sizeof(*mergeRows); ++i)
    if (runMerge("merge", 0, 5, mergeRows[i]) ||
        runMerge("merge_norm", 1, 20, mergeRows[i]))
      return 1;
  return 0;
}
