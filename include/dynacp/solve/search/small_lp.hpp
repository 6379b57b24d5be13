// A dense simplex solver for the small linear programs of the lower bound (a few dozen variables and rows).
#pragma once
#include <vector>

namespace dynacp::solve {

/// max c x subject to A x <= b and x >= 0, for b >= 0 (so the origin is feasible). A is b.size() rows by
/// c.size() columns, row-major. The simplex method pivots on the steepest gain, then by Bland's rule (which cannot
/// cycle). Returns c x at a point it has checked to be feasible (written to *point when given), +infinity when the
/// program is unbounded, or -infinity when the solve does not settle (then nothing is proved). By weak duality the
/// value of a feasible point of a minimising program's dual is a floor on that program. Throws InvalidArgument on
/// mismatched sizes or a negative or non-finite b.
double small_lp_max(const std::vector<double>& A, const std::vector<double>& b, const std::vector<double>& c,
                    std::vector<double>* point = nullptr);

}  // namespace dynacp::solve
