//===- Reference.h - float64 reference of docs/Math.md -------------*- C++ -*-===//
//
// A plain C++ float64 implementation of the AttnRes equations of docs/Math.md
// (sections 1-3), written from the equations and independent of the compiler.
// Layouts are row-major with the token dimensions flattened to N:
//   v [L, N, D]   q [M, R]   g [R]   h [Mh, D] (Mh = 1 or M)
//   o, o_pre, do [M, N, D]   lse [M, N]
//
// Every result also has a *magnitude*: for each element, a bound on the sum
// of the absolute values of the terms that make it up (propagated through
// every cancellation). Tolerances are relative to the largest magnitude of
// a tensor, which is what floating-point summation error scales with: a
// gradient that cancels to almost zero is still checked at the scale of its
// terms, not at the scale of its rounding noise.
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_TEST_NUMERICS_REFERENCE_H
#define ATTNRES_TEST_NUMERICS_REFERENCE_H

#include <cstdint>
#include <vector>

namespace mlir::attnres::reference {

struct Tensor {
  std::vector<double> value;
  std::vector<double> magnitude;
};

struct Problem {
  int64_t L = 1, N = 1, D = 1, R = 1, M = 1;
  bool hasKeyNorm = false, hasOutputNorm = false, perQueryOutputNorm = false;
  double eps = 1e-6, scale = 1.0;
  std::vector<double> v, q, g, h;
};

struct Forward {
  Tensor o, lse, oPre;
};

struct Backward {
  Tensor dv, dq, dg, dh;
};

Forward forward(const Problem &problem);

/// `savedOPre` is the forward's o_pre ([M, N, D]) for the single-pass
/// backward, or null to recompute it from the sources and lse. `gradLse`
/// ([M, N]) is the gradient of the forward's lse, or null when the lse is
/// not used. `accumulated` ([L, N, D]) is the gradient the sources already
/// have, which dv adds to (an accumulating backward), or null.
Backward backward(const Problem &problem, const std::vector<double> &gradOutput,
                  const std::vector<double> &lse,
                  const std::vector<double> *savedOPre,
                  const std::vector<double> *gradLse = nullptr,
                  const std::vector<double> *accumulated = nullptr);

/// Softmax merge of P partitions: partials [P, N, D], lse [P, N], optional
/// sink [N]. Returns o [N, D] and lse [N].
struct Merge {
  Tensor o, lse;
};
Merge softmaxMerge(int64_t P, int64_t N, int64_t D,
                   const std::vector<double> &partials,
                   const std::vector<double> &lse,
                   const std::vector<double> *sink);

/// rows / sqrt(mean(rows^2) + eps) * h for rows [N, D]; h is [D], or [K, D]
/// with row n using h row n / (N / K).
Tensor normalizeRows(const Tensor &rows, int64_t N, int64_t D,
                     const std::vector<double> &h, int64_t K, double eps);

/// Sum of P partials [P, S] -> [S].
Tensor sum(int64_t P, int64_t S, const std::vector<double> &partials);

/// Checks backward() against central finite differences of forward() on
/// small random problems; returns the largest relative error seen and
/// prints one line per problem when `verbose`.
double checkGradientsByFiniteDifferences(bool verbose);

} // namespace mlir::attnres::reference

#endif // ATTNRES_TEST_NUMERICS_REFERENCE_H
