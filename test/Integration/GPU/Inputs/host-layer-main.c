/* Calls the two functions of examples/full_attnres_layer.mlir, compiled
 * with keep-host=1 into a shared library that launches their kernels:
 * @layer4_input (the forward: o, lse and o_pre of four bf16 sources
 * [4, T, 1024] with a key norm and an output norm) and, on its results,
 * @layer4_input_grad (the backward: the four source gradients and those of
 * the query and both norm weights). Checks every result against a float64
 * computation of docs/Math.md's formulas from the same bf16 inputs: an
 * error passes within 1e-2 of the tensor's size (its largest reference
 * element; for the token reductions dq, dg and dh the largest sum of
 * absolute terms), the bf16 tolerance of the GPU cases, and so must the
 * relative (Frobenius) error of each tensor. Prints
 * "host layer: ok" and exits 0, or names the first failure and exits 1.
 * With the argument "calls-only" it makes the two calls, frees every buffer
 * and checks nothing else: for a GPU library that runs no kernels (the
 * fake HIP of test/Runtime/Inputs/fake-hip.c). */

#include "attnres-c/GpuWrappers.h"
#include "host-program.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { L = 4, B = 4, T = 257, N = B * T, D = 1024 };
static const double kEps = 1e-6, kTolerance = 1e-2;

typedef struct {
  Desc3 o;
  Desc2 lse;
  Desc3 oPre;
} Forward;
typedef struct {
  Desc3 dv[L];
  Desc1 dq, dg, dh;
} Backward;

void _mlir_ciface_layer4_input(Forward *results, Desc3 *embed, Desc3 *out1,
                               Desc3 *out2, Desc3 *out3, Desc1 *query,
                               Desc1 *keyNorm, Desc1 *preNorm);
void _mlir_ciface_layer4_input_grad(Backward *results, Desc3 *embed,
                                    Desc3 *out1, Desc3 *out2, Desc3 *out3,
                                    Desc1 *query, Desc1 *keyNorm,
                                    Desc1 *preNorm, Desc3 *grad, Desc2 *lse,
                                    Desc3 *oPre);

static uint32_t state = 2024;
static double uniform(void) { /* in [-1, 1) */
  state = state * 1664525u + 1013904223u;
  return (state >> 8) * (2.0 / 16777216.0) - 1.0;
}

static int failed(const char *what) {
  const char *message = attnresGpuLastError();
  printf("host layer: %s failed: %s\n", what,
         message ? message : "(no message)");
  return 1;
}

/* Managed memory: filled here, read by the kernels. */
static void *shared(size_t bytes) { return mgpuMemAlloc(bytes, NULL, true); }

/* A device result copied to the host. */
static void *fetch(const void *device, size_t bytes) {
  void *host = malloc(bytes);
  mgpuMemcpy(host, (void *)device, bytes, NULL);
  mgpuStreamSynchronize(NULL);
  return host;
}

static Desc3 rows3(void *data) {
  Desc3 d = {data, data, 0, {B, T, D}, {(int64_t)T * D, D, 1}};
  return d;
}
static Desc1 vector1(void *data) {
  Desc1 d = {data, data, 0, {D}, {1}};
  return d;
}

/* Worst error of `count` results against the float64 reference, relative
 * to `size`; fails when above kTolerance. Reports the relative Frobenius
 * error too. */
static double worst = 0;
static int check(const char *name, const double *got, const double *expected,
                 int64_t count, double size) {
  double errorSquares = 0, referenceSquares = 0, largest = 0;
  for (int64_t i = 0; i < count; ++i) {
    double error = fabs(got[i] - expected[i]);
    if (!(error <= kTolerance * size)) {
      printf("host layer: %s[%lld] = %g, expected %g (size %g)\n", name,
             (long long)i, got[i], expected[i], size);
      return 1;
    }
    largest = fmax(largest, error / size);
    errorSquares += error * error;
    referenceSquares += expected[i] * expected[i];
  }
  double frobenius = sqrt(errorSquares / fmax(referenceSquares, 1e-300));
  if (!(frobenius <= kTolerance)) {
    printf("host layer: %s has a relative (Frobenius) error of %g\n", name,
           frobenius);
    return 1;
  }
  worst = fmax(worst, largest);
  printf("  %-6s worst %.1e of its size, relative Frobenius %.1e\n", name,
         largest, frobenius);
  return 0;
}

static double *bf16s(const uint16_t *values, int64_t count) {
  double *out = malloc(sizeof(double) * count);
  for (int64_t i = 0; i < count; ++i)
    out[i] = fromBf16(values[i]);
  return out;
}

static double largestMagnitude(const double *values, int64_t count) {
  double largest = 0;
  for (int64_t i = 0; i < count; ++i)
    largest = fmax(largest, fabs(values[i]));
  return largest;
}

/* Frees the buffers the calls returned and the inputs. */
static int freeAll(Forward *forward, Backward *backward, void *inputs[],
                   int count) {
  Desc3 *rows[] = {&forward->o,      &forward->oPre,   &backward->dv[0],
                   &backward->dv[1], &backward->dv[2], &backward->dv[3]};
  for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); ++i)
    mgpuMemFree(rows[i]->allocated, NULL);
  mgpuMemFree(forward->lse.allocated, NULL);
  mgpuMemFree(backward->dq.allocated, NULL);
  mgpuMemFree(backward->dg.allocated, NULL);
  mgpuMemFree(backward->dh.allocated, NULL);
  for (int i = 0; i < count; ++i)
    mgpuMemFree(inputs[i], NULL);
  if (attnresGpuLastError())
    return failed("freeing the buffers");
  printf("host layer: calls made and buffers freed; results not checked\n");
  return 0;
}

int main(int argc, char **argv) {
  int callsOnly = argc > 1 && strcmp(argv[1], "calls-only") == 0;
  /* Inputs: sources of different scales (source 2 larger on every third
   * token, so the softmax is not uniform), the weights, the output
   * gradient. */
  uint16_t *v[L], *q = shared(2 * D), *g = shared(2 * D), *h = shared(2 * D);
  uint16_t *grad = shared(2 * (size_t)N * D);
  for (int s = 0; s < L; ++s)
    v[s] = shared(2 * (size_t)N * D);
  if (!q || !g || !h || !grad || !v[0] || !v[1] || !v[2] || !v[3])
    return failed("mgpuMemAlloc");
  for (int64_t d = 0; d < D; ++d) {
    q[d] = toBf16(0.06 * uniform());
    g[d] = toBf16(1.0 + 0.3 * uniform());
    h[d] = toBf16(1.0 + 0.5 * uniform());
  }
  for (int s = 0; s < L; ++s)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t d = 0; d < D; ++d) {
        double x = (1.0 + s) * uniform();
        if (s == 2 && n % 3 == 0)
          x = 3.0 * fromBf16(q[d]) / 0.06 + 0.1 * uniform();
        v[s][n * D + d] = toBf16(x);
      }
  for (int64_t i = 0; i < (int64_t)N * D; ++i)
    grad[i] = toBf16(uniform());

  Desc3 vd[L];
  for (int s = 0; s < L; ++s)
    vd[s] = rows3(v[s]);
  Desc1 qd = vector1(q), gd = vector1(g), hd = vector1(h);
  Forward forward;
  memset(&forward, 0, sizeof(forward));
  _mlir_ciface_layer4_input(&forward, &vd[0], &vd[1], &vd[2], &vd[3], &qd,
                            &gd, &hd);
  if (attnresGpuLastError())
    return failed("layer4_input");
  if (forward.o.sizes[1] != T || forward.lse.sizes[1] != T)
    return printf("host layer: the forward's results have %lld tokens, not "
                  "%d\n",
                  (long long)forward.o.sizes[1], T),
           1;

  /* The backward of the forward's own results, as in training. */
  Desc3 gradd = rows3(grad);
  Backward backward;
  memset(&backward, 0, sizeof(backward));
  _mlir_ciface_layer4_input_grad(&backward, &vd[0], &vd[1], &vd[2], &vd[3],
                                 &qd, &gd, &hd, &gradd, &forward.lse,
                                 &forward.oPre);
  if (attnresGpuLastError())
    return failed("layer4_input_grad");
  if (callsOnly) {
    void *inputs[] = {v[0], v[1], v[2], v[3], q, g, h, grad};
    return freeAll(&forward, &backward, inputs, 8);
  }

  size_t rowBytes = 2 * (size_t)N * D;
  double *o = bf16s(fetch(forward.o.aligned, rowBytes), (int64_t)N * D);
  double *oPre = bf16s(fetch(forward.oPre.aligned, rowBytes), (int64_t)N * D);
  float *lse32 = fetch(forward.lse.aligned, 4 * (size_t)N);
  double *dv[L];
  for (int s = 0; s < L; ++s)
    dv[s] = bf16s(fetch(backward.dv[s].aligned, rowBytes), (int64_t)N * D);
  double *dq = bf16s(fetch(backward.dq.aligned, 2 * D), D);
  double *dg = bf16s(fetch(backward.dg.aligned, 2 * D), D);
  double *dh = bf16s(fetch(backward.dh.aligned, 2 * D), D);
  if (attnresGpuLastError())
    return failed("copying the results back");
  double *lse = malloc(sizeof(double) * N);
  for (int64_t n = 0; n < N; ++n)
    lse[n] = lse32[n];

  /* The float64 reference (docs/Math.md; R = D: the key is the whole row;
   * scale 1; one query). */
  double *refO = calloc((size_t)N * D, 8), *refOPre = calloc((size_t)N * D, 8);
  double *refLse = calloc(N, 8), *refDv[L];
  for (int s = 0; s < L; ++s)
    refDv[s] = calloc((size_t)N * D, 8);
  double *da = calloc(D, 8), *daAbs = calloc(D, 8);
  double *refDh = calloc(D, 8), *dhAbs = calloc(D, 8);
  double *a = malloc(8 * D), *doPre = malloc(8 * D);
  for (int64_t d = 0; d < D; ++d)
    a[d] = fromBf16(g[d]) * fromBf16(q[d]);
  for (int64_t n = 0; n < N; ++n) {
    double rho[L], ell[L], p[L], top = -INFINITY;
    const uint16_t *row[L];
    for (int s = 0; s < L; ++s) {
      row[s] = v[s] + n * D;
      double squares = 0, dot = 0;
      for (int64_t d = 0; d < D; ++d) {
        double x = fromBf16(row[s][d]);
        squares += x * x;
        dot += x * a[d];
      }
      rho[s] = 1.0 / sqrt(squares / D + kEps);
      ell[s] = rho[s] * dot;
      top = fmax(top, ell[s]);
    }
    double sum = 0;
    for (int s = 0; s < L; ++s)
      sum += exp(ell[s] - top);
    refLse[n] = top + log(sum);
    for (int s = 0; s < L; ++s)
      p[s] = exp(ell[s] - refLse[n]);
    double *x = refOPre + n * D, squares = 0;
    for (int64_t d = 0; d < D; ++d) {
      for (int s = 0; s < L; ++s)
        x[d] += p[s] * fromBf16(row[s][d]);
      squares += x[d] * x[d];
    }
    double rhoO = 1.0 / sqrt(squares / D + kEps), mean = 0;
    const uint16_t *dout = grad + n * D;
    for (int64_t d = 0; d < D; ++d) {
      refO[n * D + d] = x[d] * rhoO * fromBf16(h[d]);
      mean += x[d] * rhoO * fromBf16(h[d]) * fromBf16(dout[d]);
    }
    mean /= D;
    double delta = 0;
    for (int64_t d = 0; d < D; ++d) {
      double xhat = x[d] * rhoO, dod = fromBf16(dout[d]);
      doPre[d] = rhoO * (fromBf16(h[d]) * dod - xhat * mean);
      refDh[d] += xhat * dod;
      dhAbs[d] += fabs(xhat * dod);
      delta += doPre[d] * x[d];
    }
    for (int s = 0; s < L; ++s) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d)
        dot += doPre[d] * fromBf16(row[s][d]);
      double ds = p[s] * (dot - delta);
      for (int64_t d = 0; d < D; ++d) {
        double khat = rho[s] * fromBf16(row[s][d]);
        refDv[s][n * D + d] =
            p[s] * doPre[d] + ds * rho[s] * (a[d] - khat * ell[s] / D);
        da[d] += ds * khat;
        daAbs[d] += fabs(ds * khat);
      }
    }
  }
  double *refDq = malloc(8 * D), *refDg = malloc(8 * D);
  double dqSize = 0, dgSize = 0;
  for (int64_t d = 0; d < D; ++d) {
    refDq[d] = da[d] * fromBf16(g[d]);
    refDg[d] = da[d] * fromBf16(q[d]);
    dqSize = fmax(dqSize, daAbs[d] * fabs(fromBf16(g[d])));
    dgSize = fmax(dgSize, daAbs[d] * fabs(fromBf16(q[d])));
  }

  printf("host layer: %d tokens ([%d, %d]), L = %d, D = %d\n", N, B, T, L, D);
  int64_t elements = (int64_t)N * D;
  if (check("o", o, refO, elements, largestMagnitude(refO, elements)) ||
      check("o_pre", oPre, refOPre, elements,
            largestMagnitude(refOPre, elements)) ||
      check("lse", lse, refLse, N, largestMagnitude(refLse, N)))
    return 1;
  static const char *names[L] = {"dv0", "dv1", "dv2", "dv3"};
  for (int s = 0; s < L; ++s)
    if (check(names[s], dv[s], refDv[s], elements,
              largestMagnitude(refDv[s], elements)))
      return 1;
  if (check("dq", dq, refDq, D, fmax(dqSize, largestMagnitude(refDq, D))) ||
      check("dg", dg, refDg, D, fmax(dgSize, largestMagnitude(refDg, D))) ||
      check("dh", dh, refDh, D,
            fmax(largestMagnitude(dhAbs, D), largestMagnitude(refDh, D))))
    return 1;
  printf("host layer: ok (forward and backward within %.1e of each "
         "tensor's size)\n",
         worst);
  return 0;
}
