#include "dynacp/solve/search/small_lp.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dynacp/model/error.hpp"

namespace dynacp::solve {

double small_lp_max(const std::vector<double>& A, const std::vector<double>& b, const std::vector<double>& c,
                    std::vector<double>* point) {
  const std::size_t m = b.size(), n = c.size(), cols = n + m, w = cols + 1;
  if (A.size() != m * n) invalid("small_lp_max: A has ", A.size(), " entries; need rows x cols = ", m, " x ", n);
  for (std::size_t r = 0; r < m; ++r)
    if (!(b[r] >= 0.0) || !std::isfinite(b[r])) invalid("small_lp_max: b[", r, "] = ", b[r], "; need finite and >= 0");
  std::vector<double> t(m * w, 0.0), obj(w, 0.0);  // rows: [A | slacks | b]; obj: the reduced gains
  std::vector<std::size_t> basis(m);
  std::vector<std::size_t> nonzero;  // columns where the pivot row is not zero
  for (std::size_t r = 0; r < m; ++r) {
    std::copy(A.begin() + static_cast<std::ptrdiff_t>(r * n), A.begin() + static_cast<std::ptrdiff_t>((r + 1) * n),
              t.begin() + static_cast<std::ptrdiff_t>(r * w));
    t[r * w + n + r] = 1.0, t[r * w + cols] = b[r], basis[r] = n + r;
  }
  std::copy(c.begin(), c.end(), obj.begin());
  constexpr double eps = 1e-12;  // a gain worth taking
  constexpr double tiny = 1e-9;  // the least pivot: smaller ones amplify rounding until the point is infeasible
  for (int pivot = 0; pivot < 5000; ++pivot) {
    // the steepest gain, or after many pivots the first (Bland's rule, which cannot cycle)
    std::size_t in = cols;
    for (std::size_t j = 0; j < cols; ++j)
      if (obj[j] > eps && (in == cols || (pivot < 500 && obj[j] > obj[in]))) {
        in = j;
        if (pivot >= 500) break;
      }
    if (in == cols) {
      std::vector<double> x(n, 0.0);
      for (std::size_t r = 0; r < m; ++r)
        if (basis[r] < n) x[basis[r]] = std::max(0.0, t[r * w + cols]);
      double value = 0.0;
      for (std::size_t j = 0; j < n; ++j) value += c[j] * x[j];
      for (std::size_t r = 0; r < m; ++r) {
        double lhs = 0.0;
        for (std::size_t j = 0; j < n; ++j) lhs += A[r * n + j] * x[j];
        if (lhs > b[r] + 1e-9 * (1.0 + std::abs(b[r]))) return -std::numeric_limits<double>::infinity();
      }
      if (point) *point = std::move(x);
      return value;
    }
    std::size_t out = m;
    double ratio = std::numeric_limits<double>::infinity();
    for (std::size_t r = 0; r < m; ++r) {
      const double v = t[r * w + in];
      if (v <= tiny) continue;
      const double q = t[r * w + cols] / v;
      if (q < ratio || (q == ratio && basis[r] < basis[out])) ratio = q, out = r;
    }
    if (out == m) return std::numeric_limits<double>::infinity();
    double* row = &t[out * w];
    const double p = row[in];
    nonzero.clear();  // the pivot row stays sparse in the covering LPs: update only where it is not zero
    for (std::size_t j = 0; j < w; ++j)
      if (row[j] != 0.0) row[j] /= p, nonzero.push_back(j);
    for (std::size_t r = 0; r < m; ++r)
      if (const double f = t[r * w + in]; r != out && f != 0.0)
        for (const std::size_t j : nonzero) t[r * w + j] -= f * row[j];
    const double f = obj[in];
    for (const std::size_t j : nonzero) obj[j] -= f * row[j];
    basis[out] = in;
  }
  return -std::numeric_limits<double>::infinity();
}

}  // namespace dynacp::solve
