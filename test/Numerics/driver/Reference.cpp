//===- Reference.cpp - float64 reference of docs/Math.md ---------------------===//
//
// Written from the equations of docs/Math.md, one token and one query at a time,
// with no reuse of the compiler's code or structure.
//
//===----------------------------------------------------------------------===//

#include "Reference.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

namespace mlir::attnres::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// Per-(query, token) quantities of the sources: the key norm, the logit
/// before scaling, and their magnitudes.
struct SourceRow {
  std::vector<double> rho;    // [L]
  std::vector<double> ell;    // [L]  rho * <t, g * q>
  std::vector<double> ellMag; // [L]  rho * sum |t * g * q|
};

double keyQuery(const Problem &pb, int64_t m, int64_t r) {
  double g = pb.hasKeyNorm ? pb.g[r] : 1.0;
  return g * pb.q[m * pb.R + r];
}

SourceRow sourceRow(const Problem &pb, int64_t m, int64_t n) {
  SourceRow row;
  for (int64_t l = 0; l < pb.L; ++l) {
    const double *t = &pb.v[(l * pb.N + n) * pb.D + (pb.D - pb.R)];
    double squares = 0.0;
    for (int64_t r = 0; r < pb.R; ++r)
      squares += t[r] * t[r];
    double rho = 1.0 / std::sqrt(squares / pb.R + pb.eps);
    double dot = 0.0, dotMag = 0.0;
    for (int64_t r = 0; r < pb.R; ++r) {
      dot += t[r] * keyQuery(pb, m, r);
      dotMag += std::fabs(t[r] * keyQuery(pb, m, r));
    }
    row.rho.push_back(rho);
    row.ell.push_back(rho * dot);
    row.ellMag.push_back(rho * dotMag);
  }
  return row;
}

double outputNormWeight(const Problem &pb, int64_t m, int64_t d) {
  return pb.h[(pb.perQueryOutputNorm ? m * pb.D : 0) + d];
}

/// exp(z - lse) of each source; 1 for one source, whose softmax weight is 1
/// whatever the lse given (rounded to f32, it differs from the logit).
std::vector<double> softmaxWeights(const Problem &pb, const SourceRow &row,
                                   double lse) {
  std::vector<double> p;
  if (pb.L == 1)
    return {1.0};
  for (int64_t l = 0; l < pb.L; ++l)
    p.push_back(std::exp(pb.scale * row.ell[l] - lse));
  return p;
}

} // namespace

Forward forward(const Problem &pb) {
  Forward out;
  int64_t MN = pb.M * pb.N;
  out.o.value.assign(MN * pb.D, 0.0);
  out.o.magnitude.assign(MN * pb.D, 0.0);
  out.oPre = out.o;
  out.lse.value.assign(MN, 0.0);
  out.lse.magnitude.assign(MN, 0.0);

  for (int64_t m = 0; m < pb.M; ++m) {
    for (int64_t n = 0; n < pb.N; ++n) {
      SourceRow row = sourceRow(pb, m, n);
      double maxLogit = -kInf, maxLogitMag = 0.0;
      for (int64_t l = 0; l < pb.L; ++l) {
        maxLogit = std::max(maxLogit, pb.scale * row.ell[l]);
        maxLogitMag =
            std::max(maxLogitMag, std::fabs(pb.scale) * row.ellMag[l]);
      }
      double sumExp = 0.0;
      for (int64_t l = 0; l < pb.L; ++l)
        sumExp += std::exp(pb.scale * row.ell[l] - maxLogit);
      double lse = maxLogit + std::log(sumExp);
      int64_t mn = m * pb.N + n;
      out.lse.value[mn] = lse;
      out.lse.magnitude[mn] =
          std::max(std::fabs(lse), maxLogitMag + std::fabs(std::log(sumExp)));

      std::vector<double> p = softmaxWeights(pb, row, lse);
      double *oPre = &out.oPre.value[mn * pb.D];
      double *oPreMag = &out.oPre.magnitude[mn * pb.D];
      for (int64_t l = 0; l < pb.L; ++l) {
        const double *v = &pb.v[(l * pb.N + n) * pb.D];
        for (int64_t d = 0; d < pb.D; ++d) {
          oPre[d] += p[l] * v[d];
          oPreMag[d] += p[l] * std::fabs(v[d]);
        }
      }
      double *o = &out.o.value[mn * pb.D];
      double *oMag = &out.o.magnitude[mn * pb.D];
      if (!pb.hasOutputNorm) {
        std::copy(oPre, oPre + pb.D, o);
        std::copy(oPreMag, oPreMag + pb.D, oMag);
        continue;
      }
      double squares = 0.0;
      for (int64_t d = 0; d < pb.D; ++d)
        squares += oPre[d] * oPre[d];
      double rho = 1.0 / std::sqrt(squares / pb.D + pb.eps);
      for (int64_t d = 0; d < pb.D; ++d) {
        double h = outputNormWeight(pb, m, d);
        o[d] = oPre[d] * rho * h;
        oMag[d] = oPreMag[d] * rho * std::fabs(h);
      }
    }
  }
  return out;
}

Backward backward(const Problem &pb, const std::vector<double> &gradOutput,
                  const std::vector<double> &lse,
                  const std::vector<double> *savedOPre,
                  const std::vector<double> *gradLse,
                  const std::vector<double> *accumulated) {
  Backward out;
  out.dv.value.assign(pb.L * pb.N * pb.D, 0.0);
  out.dv.magnitude = out.dv.value;
  if (accumulated)
    for (size_t i = 0; i < accumulated->size(); ++i) {
      out.dv.value[i] = (*accumulated)[i];
      out.dv.magnitude[i] = std::fabs((*accumulated)[i]);
    }
  std::vector<double> da(pb.M * pb.R, 0.0), daMag(pb.M * pb.R, 0.0);
  int64_t hRows = pb.perQueryOutputNorm ? pb.M : 1;
  if (pb.hasOutputNorm) {
    out.dh.value.assign(hRows * pb.D, 0.0);
    out.dh.magnitude = out.dh.value;
  }

  for (int64_t m = 0; m < pb.M; ++m) {
    for (int64_t n = 0; n < pb.N; ++n) {
      int64_t mn = m * pb.N + n;
      SourceRow row = sourceRow(pb, m, n);
      std::vector<double> p = softmaxWeights(pb, row, lse[mn]);

      std::vector<double> oPre(pb.D, 0.0), oPreMag(pb.D, 0.0);
      if (savedOPre) {
        for (int64_t d = 0; d < pb.D; ++d) {
          oPre[d] = (*savedOPre)[mn * pb.D + d];
          oPreMag[d] = std::fabs(oPre[d]);
        }
      } else {
        for (int64_t l = 0; l < pb.L; ++l)
          for (int64_t d = 0; d < pb.D; ++d) {
            double v = pb.v[(l * pb.N + n) * pb.D + d];
            oPre[d] += p[l] * v;
            oPreMag[d] += p[l] * std::fabs(v);
          }
      }

      // do_pre: through the output norm when there is one.
      const double *dout = &gradOutput[mn * pb.D];
      std::vector<double> dPre(pb.D), dPreMag(pb.D);
      if (pb.hasOutputNorm) {
        double squares = 0.0;
        for (int64_t d = 0; d < pb.D; ++d)
          squares += oPre[d] * oPre[d];
        double rho = 1.0 / std::sqrt(squares / pb.D + pb.eps);
        double mean = 0.0, meanMag = 0.0;
        for (int64_t d = 0; d < pb.D; ++d) {
          double xhat = oPre[d] * rho;
          double term = xhat * outputNormWeight(pb, m, d) * dout[d];
          mean += term / pb.D;
          meanMag += std::fabs(term) / pb.D;
        }
        for (int64_t d = 0; d < pb.D; ++d) {
          double h = outputNormWeight(pb, m, d);
          double xhat = oPre[d] * rho;
          dPre[d] = rho * (h * dout[d] - xhat * mean);
          dPreMag[d] =
              rho * (std::fabs(h * dout[d]) + std::fabs(xhat) * meanMag);
          int64_t hIndex = (pb.perQueryOutputNorm ? m * pb.D : 0) + d;
          out.dh.value[hIndex] += xhat * dout[d];
          out.dh.magnitude[hIndex] += std::fabs(xhat * dout[d]);
        }
      } else {
        for (int64_t d = 0; d < pb.D; ++d) {
          dPre[d] = dout[d];
          dPreMag[d] = std::fabs(dout[d]);
        }
      }

      double delta = 0.0, deltaMag = 0.0;
      for (int64_t d = 0; d < pb.D; ++d) {
        delta += dPre[d] * oPre[d];
        deltaMag += dPreMag[d] * oPreMag[d];
      }
      // d lse / d z_l = p_l: the lse's gradient moves every logit's.
      if (gradLse) {
        delta -= (*gradLse)[mn];
        deltaMag += std::fabs((*gradLse)[mn]);
      }

      for (int64_t l = 0; l < pb.L; ++l) {
        const double *v = &pb.v[(l * pb.N + n) * pb.D];
        double *dv = &out.dv.value[(l * pb.N + n) * pb.D];
        double *dvMag = &out.dv.magnitude[(l * pb.N + n) * pb.D];
        double dot = 0.0, dotMag = 0.0;
        for (int64_t d = 0; d < pb.D; ++d) {
          dot += dPre[d] * v[d];
          dotMag += dPreMag[d] * std::fabs(v[d]);
        }
        double ds = pb.scale * p[l] * (dot - delta);
        double dsMag = std::fabs(pb.scale) * p[l] * (dotMag + deltaMag);
        for (int64_t d = 0; d < pb.D; ++d) {
          dv[d] += p[l] * dPre[d];
          dvMag[d] += p[l] * dPreMag[d];
        }
        double rho = row.rho[l];
        for (int64_t r = 0; r < pb.R; ++r) {
          int64_t d = pb.D - pb.R + r;
          double khat = rho * v[d];
          double a = keyQuery(pb, m, r);
          dv[d] += ds * rho * (a - khat * row.ell[l] / pb.R);
          dvMag[d] += dsMag * rho *
                      (std::fabs(a) + std::fabs(khat) * row.ellMag[l] / pb.R);
          da[m * pb.R + r] += ds * khat;
          daMag[m * pb.R + r] += dsMag * std::fabs(khat);
        }
      }
    }
  }

  out.dq.value.assign(pb.M * pb.R, 0.0);
  out.dq.magnitude = out.dq.value;
  if (pb.hasKeyNorm) {
    out.dg.value.assign(pb.R, 0.0);
    out.dg.magnitude = out.dg.value;
  }
  for (int64_t m = 0; m < pb.M; ++m)
    for (int64_t r = 0; r < pb.R; ++r) {
      int64_t mr = m * pb.R + r;
      double g = pb.hasKeyNorm ? pb.g[r] : 1.0;
      out.dq.value[mr] = da[mr] * g;
      out.dq.magnitude[mr] = daMag[mr] * std::fabs(g);
      if (pb.hasKeyNorm) {
        out.dg.value[r] += da[mr] * pb.q[mr];
        out.dg.magnitude[r] += daMag[mr] * std::fabs(pb.q[mr]);
      }
    }
  return out;
}

Merge softmaxMerge(int64_t P, int64_t N, int64_t D,
                   const std::vector<double> &partials,
                   const std::vector<double> &lse,
                   const std::vector<double> *sink) {
  Merge out;
  out.o.value.assign(N * D, 0.0);
  out.o.magnitude.assign(N * D, 0.0);
  out.lse.value.assign(N, 0.0);
  out.lse.magnitude.assign(N, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double sinkLogit = sink ? (*sink)[n] : -kInf;
    double maxLse = sinkLogit;
    for (int64_t p = 0; p < P; ++p)
      maxLse = std::max(maxLse, lse[p * N + n]);
    if (maxLse == -kInf) {
      // Every partition empty and no mass in the sink: o = 0, lse = -inf.
      out.lse.value[n] = -kInf;
      continue;
    }
    // w(x) = exp(x - max); at an infinite maximum only the infinite entries
    // carry mass (docs/Math.md section 3: a +inf sink takes all of it).
    auto weight = [&](double x) {
      if (x == -kInf)
        return 0.0;
      if (std::isinf(maxLse))
        return x == maxLse ? 1.0 : 0.0;
      return std::exp(x - maxLse);
    };
    double total = weight(sinkLogit);
    for (int64_t p = 0; p < P; ++p)
      total += weight(lse[p * N + n]);
    for (int64_t p = 0; p < P; ++p) {
      double w = weight(lse[p * N + n]);
      if (w == 0.0)
        continue; // an empty partition: its partial output is garbage
      for (int64_t d = 0; d < D; ++d) {
        double x = partials[(p * N + n) * D + d];
        out.o.value[n * D + d] += w * x / total;
        out.o.magnitude[n * D + d] += w * std::fabs(x) / total;
      }
    }
    out.lse.value[n] = std::isinf(maxLse) ? maxLse : maxLse + std::log(total);
    out.lse.magnitude[n] = std::fabs(maxLse) + std::fabs(std::log(total));
  }
  return out;
}

Tensor normalizeRows(const Tensor &rows, int64_t N, int64_t D,
                     const std::vector<double> &h, int64_t K, double eps) {
  Tensor out = rows;
  int64_t rowsPerWeight = K > 0 ? N / K : N;
  for (int64_t n = 0; n < N; ++n) {
    double squares = 0.0;
    for (int64_t d = 0; d < D; ++d)
      squares += rows.value[n * D + d] * rows.value[n * D + d];
    double rho = 1.0 / std::sqrt(squares / D + eps);
    const double *weight = &h[K > 0 ? (n / rowsPerWeight) * D : 0];
    for (int64_t d = 0; d < D; ++d) {
      out.value[n * D + d] = rows.value[n * D + d] * rho * weight[d];
      out.magnitude[n * D + d] =
          rows.magnitude[n * D + d] * rho * std::fabs(weight[d]);
    }
  }
  return out;
}

Tensor sum(int64_t P, int64_t S, const std::vector<double> &partials) {
  Tensor out;
  out.value.assign(S, 0.0);
  out.magnitude.assign(S, 0.0);
  for (int64_t p = 0; p < P; ++p)
    for (int64_t s = 0; s < S; ++s) {
      out.value[s] += partials[p * S + s];
      out.magnitude[s] += std::fabs(partials[p * S + s]);
    }
  return out;
}

namespace {

/// A second reader of a problem's sources (another layer of a model): its
/// own query, key-norm weight and output gradient.
struct SecondReader {
  std::vector<double> q, g, gradOutput;
};

/// The problem as `second` reads it: the same sources, its query and key
/// norm weight.
Problem readBy(const Problem &pb, const SecondReader &second) {
  Problem other = pb;
  other.q = second.q, other.g = second.g;
  return other;
}

/// <o, gradOutput> (+ <lse, gradLse> when given), plus the second reader's
/// <o', gradOutput'> when given.
double loss(const Problem &pb, const std::vector<double> &gradOutput,
            const std::vector<double> *gradLse,
            const SecondReader *second = nullptr) {
  Forward f = forward(pb);
  double total = 0.0;
  for (size_t i = 0; i < f.o.value.size(); ++i)
    total += f.o.value[i] * gradOutput[i];
  if (gradLse)
    for (size_t i = 0; i < f.lse.value.size(); ++i)
      total += f.lse.value[i] * (*gradLse)[i];
  if (second) {
    Forward other = forward(readBy(pb, *second));
    for (size_t i = 0; i < other.o.value.size(); ++i)
      total += other.o.value[i] * second->gradOutput[i];
  }
  return total;
}

/// max |analytic - numeric| / max |numeric| over one parameter tensor.
double compareWithDifferences(const Problem &pb,
                              const std::vector<double> &gradOutput,
                              const std::vector<double> *gradLse,
                              std::vector<double> Problem::*parameter,
                              const std::vector<double> &analytic,
                              const SecondReader *second = nullptr) {
  Problem probe = pb;
  double worst = 0.0, scale = 0.0;
  std::vector<double> numeric;
  for (size_t i = 0; i < (pb.*parameter).size(); ++i) {
    double x = (pb.*parameter)[i];
    double step = 1e-5 * std::max(1.0, std::fabs(x));
    (probe.*parameter)[i] = x + step;
    double up = loss(probe, gradOutput, gradLse, second);
    (probe.*parameter)[i] = x - step;
    double down = loss(probe, gradOutput, gradLse, second);
    (probe.*parameter)[i] = x;
    numeric.push_back((up - down) / (2 * step));
    scale = std::max(scale, std::fabs(numeric.back()));
  }
  for (size_t i = 0; i < numeric.size(); ++i)
    worst = std::max(worst, std::fabs(numeric[i] - analytic[i]));
  return worst / std::max(scale, 1e-300);
}

} // namespace

double checkGradientsByFiniteDifferences(bool verbose) {
  struct Shape {
    int64_t L, N, D, R, M;
    bool keyNorm, outputNorm, perQuery;
    double eps, scale;
  };
  const Shape shapes[] = {
      {3, 2, 6, 4, 1, false, false, false, 1e-6, 1.0},
      {3, 2, 6, 4, 1, true, false, false, 1e-6, 0.7},
      {3, 2, 6, 4, 1, true, true, false, 1e-6, 1.3},
      {4, 3, 5, 5, 2, true, true, true, 1e-2, 1.0},
      {2, 2, 7, 1, 3, false, true, false, 1e-6, -0.8},
      {1, 2, 4, 2, 1, true, true, false, 1e-6, 1.0},
      {5, 1, 8, 2, 2, true, false, false, 0.5, 2.0},
  };
  std::mt19937_64 rng(1234), lseRng(4321), secondRng(2468);
  std::normal_distribution<double> normal;
  double worst = 0.0;
  for (const Shape &s : shapes) {
    Problem pb;
    pb.L = s.L, pb.N = s.N, pb.D = s.D, pb.R = s.R, pb.M = s.M;
    pb.hasKeyNorm = s.keyNorm, pb.hasOutputNorm = s.outputNorm;
    pb.perQueryOutputNorm = s.perQuery, pb.eps = s.eps, pb.scale = s.scale;
    auto fill = [&](std::vector<double> &x, size_t count, double mean,
                    std::mt19937_64 &from) {
      x.resize(count);
      for (double &value : x)
        value = mean + normal(from);
    };
    fill(pb.v, s.L * s.N * s.D, 0.0, rng);
    fill(pb.q, s.M * s.R, 0.0, rng);
    fill(pb.g, s.R, 1.0, rng);
    fill(pb.h, (s.perQuery ? s.M : 1) * s.D, 1.0, rng);
    std::vector<double> gradOutput;
    fill(gradOutput, s.M * s.N * s.D, 0.0, rng);
    // From a generator of its own, so the problems stay those checked
    // before lse gradients were.
    std::vector<double> randomGradLse(s.M * s.N);
    for (double &value : randomGradLse)
      value = normal(lseRng);

    Forward f = forward(pb);
    // Once for a loss of o alone, once with the lse in it too.
    const std::vector<double> *withAndWithout[] = {nullptr, &randomGradLse};
    for (const std::vector<double> *gradLse : withAndWithout) {
      Backward saved =
          backward(pb, gradOutput, f.lse.value, &f.oPre.value, gradLse);
      Backward recomputed =
          backward(pb, gradOutput, f.lse.value, nullptr, gradLse);
      double error = 0.0;
      auto compare = [&](std::vector<double> Problem::*parameter,
                         const Tensor &analytic) {
        error =
            std::max(error, compareWithDifferences(pb, gradOutput, gradLse,
                                                   parameter, analytic.value));
      };
      compare(&Problem::v, saved.dv);
      compare(&Problem::q, saved.dq);
      if (s.keyNorm)
        compare(&Problem::g, saved.dg);
      if (s.outputNorm)
        compare(&Problem::h, saved.dh);
      // The recompute backward must agree with the single-pass one.
      for (size_t i = 0; i < saved.dv.value.size(); ++i)
        error = std::max(error,
                         std::fabs(saved.dv.value[i] - recomputed.dv.value[i]));
      // A second reader of the same sources (a later layer of a model)
      // whose backward accumulates into the first one's dv: the sum is the
      // sources' gradient of both readers' loss.
      // (From a generator of its own, so the problems stay those checked
      // before.)
      SecondReader second;
      fill(second.q, s.M * s.R, 0.0, secondRng);
      fill(second.g, s.R, 1.0, secondRng);
      fill(second.gradOutput, s.M * s.N * s.D, 0.0, secondRng);
      Problem other = readBy(pb, second);
      Forward otherForward = forward(other);
      Backward both =
          backward(other, second.gradOutput, otherForward.lse.value,
                   &otherForward.oPre.value, nullptr, &saved.dv.value);
      error = std::max(error,
                       compareWithDifferences(pb, gradOutput, gradLse,
                                              &Problem::v, both.dv.value,
                                              &second));
      if (verbose)
        std::printf("finite differences L=%lld N=%lld D=%lld R=%lld M=%lld "
                    "g=%d h=%d%s%s: max relative error %.3g\n",
                    (long long)s.L, (long long)s.N, (long long)s.D,
                    (long long)s.R, (long long)s.M, s.keyNorm, s.outputNorm,
                    s.perQuery ? "[M,D]" : "", gradLse ? " dlse" : "", error);
      worst = std::max(worst, error);
    }
  }
  return worst;
}

} // namespace mlir::attnres::reference
