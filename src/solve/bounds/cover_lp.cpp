// The rank LP of the cover term's search (cover_search.hpp): whether the ranks a share graph gives each unit, alone
// and shared, hold the other work within the budget.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cover_search.hpp"
#include "dynacp/solve/search/small_lp.hpp"

namespace dynacp::solve::bounds {

// Rank by rank: a rank holding the units Q (a clique of H) runs their microbatches in the order pi, so the other work
// X on it obeys X - sum E <= ChainRoom(their times, S) (what fits beside them by the chain floor; work in a giant's
// own group hides at most its E) and X <= C(S) - sum (t - c - E): the rank loses C(S) - room of the capacity the
// other work needs. A giant u on d_u ranks in [deg_u, upper_u] (its rings' bounds) has some ranks to itself and
// shares the others, so the pool must hold, within P ranks, every unit's d_u ranks at a total loss <= the budget. The
// answer follows from the units, their degree ranges and the cliques of H in the order pi: a repeat (another share
// graph with the same cliques) is answered at once.
bool CoverSearch::ranks_fit(const Candidate& c) {
  const int n = c.n;
  std::vector<int> shape_id(c.part.begin(), c.part.end());
  shape_id.push_back(-1);
  for (int x = 0; x < n; ++x) shape_id.insert(shape_id.end(), {c.deg[x], upper_[x]});
  cliques_.clear();
  for (int Q = 1; Q < (1 << n); ++Q) {
    bool clique = true;
    for (int x = 0; x < n && clique; ++x) clique = !(Q >> x & 1) || (Q & ~(c.nbr[x] | 1 << x)) == 0;
    const bool lone = popcount(Q) == 1;
    if (!clique || (lone && c.single(std::countr_zero(static_cast<unsigned>(Q))))) continue;
    cliques_.push_back({Q, lone ? &lone_order_[std::countr_zero(static_cast<unsigned>(Q))] : &c.sh.ordered[c.key[Q]]});
    shape_id.push_back(-2);
    shape_id.insert(shape_id.end(), cliques_.back().second->begin(), cliques_.back().second->end());
  }
  if (const auto it = shaped_.find(shape_id); it != shaped_.end()) return it->second;
  const bool fit = price(c);
  shaped_.emplace(std::move(shape_id), fit);
  return fit;
}

// An LP relaxes the rank check: the degree range is cut into ranges at equal steps of the unit's time, and each range
// into pieces [d1, d2] (d_u >= d1 ranks, at most d2 of them alone, each losing no less than at the piece's best
// degree), a convex mix of pieces per giant, and ranks shared by several units priced at their best times (coarse).
// Where that fits, a fine LP prices each clique at one range per member and counts each range's ranks apart (a ring
// has one degree); a unit of several sequences keeps its whole degree range. Where the LP fails, any H that works
// shares more, so the search adds each pair that can chain within S at its best times.
bool CoverSearch::price(const Candidate& c) {
  if (!cut_ranges(c)) return false;
  const double C = c.work.capacity;
  // A primal point first: every unit on ranks of its own, each giant at its cheapest piece's least count (no shared
  // ranks); if that fits, so does the LP.
  {
    double ranks = 0.0, loss = 0.0;
    double least[8], d[8];
    std::fill(least, least + 8, std::numeric_limits<double>::infinity());
    for (const Piece& q : pieces_)
      if (q.d1 * q.loss < least[q.unit]) least[q.unit] = q.d1 * q.loss, d[q.unit] = q.d1;
    bool ok = true;
    for (int x = 0; x < c.n && ok; ++x) {
      if (!c.single(x)) {  // a unit of several: deg ranks at its range's loss
        int from[8], to[8];
        from[x] = c.deg[x], to[x] = upper_[x];
        const double r = room(c, lone_order_[x], from, to);
        ranks += c.deg[x], loss += c.deg[x] * (C - r), ok = r >= 0.0;
      } else {
        ranks += d[x], loss += least[x];
      }
    }
    if (ok && ranks <= P_ && loss <= c.work.budget) return true;
  }
  add_kinds(c, false);  // a coarse LP has at most 5 x 24 pieces + 26 cliques
  if (!lp_fits(c, false, solved_)) return false;
  // The fine LP only when its kinds stay few (else the coarse answer stands).
  if (!add_kinds(c, true)) return true;
  return lp_fits(c, true, solved_fine_);
}

// The room on a rank holding the units of `order` at degrees in [from[x], to[x]]; < 0 when they alone exceed S.
double CoverSearch::room(const Candidate& c, const std::vector<int>& order, const int* from, const int* to) {
  std::vector<int> id;
  for (int x : order) id.insert(id.end(), {c.part[x], from[x], to[x]});
  if (const auto it = rooms_.find(id); it != rooms_.end()) return it->second;
  chain_.clear();
  double hidden = 0.0, load = 0.0;
  for (int x : order) {
    const auto m = static_cast<std::size_t>(c.part[x]);
    chain_.push_back(curves_[m][to[x]]);
    double E = 0.0, l = std::numeric_limits<double>::infinity();
    for (int d = from[x]; d <= to[x]; ++d) E = std::max(E, shares_.hid[m][d]), l = std::min(l, shares_.load[m][d]);
    hidden += E, load += l;
  }
  double fluid = 0.0;
  if (!chain_.empty()) {  // the room beside a chain depends on its times alone: many ranges share them
    const auto [it, fresh] = fluids_.try_emplace(chain_, 0.0);
    if (fresh) it->second = fluid_room_(chain_, c.S);
    fluid = it->second;
  }
  const double C = c.work.capacity;
  const double r = chain_.empty() ? C : fluid < 0.0 ? -1.0 : std::min(fluid + hidden, C - load);
  rooms_.emplace(std::move(id), r);
  return r;
}

// Each single-sequence unit's degree range [deg, upper] cut into up to kRanges ranges at equal steps of its time (it
// falls fastest near the least degree), each into up to kPieces pieces that fit within S alone; false when some unit
// has none.
bool CoverSearch::cut_ranges(const Candidate& c) {
  ranges_.clear(), pieces_.clear();
  const double C = c.work.capacity;
  for (int x = 0; x < c.n; ++x) {
    of_[x].clear();
    if (!c.single(x)) continue;
    const int span = upper_[x] - c.deg[x] + 1, cuts = std::min(kRanges, span);
    const auto& tc = curves_[c.part[x]];
    std::vector<int> bound{c.deg[x]};
    for (int j = 1; j < cuts; ++j) {
      const double goal = tc[c.deg[x]] - (tc[c.deg[x]] - tc[upper_[x]]) * j / cuts;
      int d = bound.back() + 1;
      while (d <= upper_[x] && tc[d] > goal) ++d;
      if (d <= upper_[x]) bound.push_back(d);
    }
    bound.push_back(upper_[x] + 1);
    for (std::size_t j = 0; j + 1 < bound.size(); ++j) {
      const int d1 = bound[j], len = bound[j + 1] - d1;
      const int range = static_cast<int>(ranges_.size()), parts = std::min(kPieces, len);
      const std::size_t before = pieces_.size();
      for (int q = 0; q < parts; ++q) {
        int from[8], to[8];
        from[x] = d1 + len * q / parts, to[x] = d1 + len * (q + 1) / parts - 1;
        if (const double r = room(c, lone_order_[x], from, to); r >= 0.0)
          pieces_.push_back({x, from[x], to[x], range, C - r});
      }
      if (pieces_.size() > before) of_[x].push_back(range), ranges_.push_back({x, d1, d1 + len - 1});
    }
    if (of_[x].empty()) return false;
  }
  return true;
}

// The kinds of rank: each piece alone, and each clique. Coarse: a clique's units at their whole degree ranges (ver
// -1), a unit's ranks counted together. Fine: one kind per range of each single-sequence member, priced at that range,
// and a range's ranks counted apart (a unit's degree lies in one range). False: more than kFineKinds cliques.
bool CoverSearch::add_kinds(const Candidate& c, bool fine) {
  kinds_.clear();
  const double C = c.work.capacity;
  for (std::size_t q = 0; q < pieces_.size(); ++q) {
    Kind kd{1 << pieces_[q].unit, {}, pieces_[q].loss, static_cast<int>(q)};
    kd.ver.fill(-1);
    kinds_.push_back(kd);
  }
  const std::size_t lone = kinds_.size();
  for (const auto& [Q, order] : cliques_) {
    int from[8], to[8];
    std::vector<int> single;  // members that are single sequences
    for (int x : *order) {
      from[x] = c.deg[x], to[x] = upper_[x];
      if (c.single(x)) single.push_back(x);
    }
    std::vector<std::size_t> pick(fine ? single.size() : 0, 0);
    while (true) {
      Kind kd{Q, {}, 0.0, -1};
      kd.ver.fill(-1);
      for (std::size_t j = 0; j < pick.size(); ++j) {
        const int v = of_[single[j]][pick[j]];
        from[single[j]] = ranges_[v].d1, to[single[j]] = ranges_[v].d2, kd.ver[single[j]] = v;
      }
      if (const double r = room(c, *order, from, to); r >= 0.0) kd.loss = C - r, kinds_.push_back(kd);
      if (kinds_.size() - lone > kFineKinds) return false;
      std::size_t j = 0;
      while (j < pick.size() && ++pick[j] == of_[single[j]].size()) pick[j++] = 0;
      if (j == pick.size()) break;
    }
  }
  return true;
}

// Whether the covering LP fits the budget, through its dual: max sum_{x alone} c_x + sum_{x of several} deg_x a_x -
// P e subject to, per kind K, sum_{x in K} (A_x - B_v) - b_q - e <= loss_K (B_v fine only, v the range x is priced
// at; b_q for the kind of piece q alone), and per piece q of x in range v, c_x - d1 A_x + d2 (b_q + B_v) <= 0, where
// A_x is A_v (fine) or the unit's a_x (coarse). Primal: every unit takes a convex mix of pieces, its ranks number at
// least d1 of the mix (per range, fine), at most d2 of it hold the unit alone in piece q, and at most d2 hold it in
// range v (fine). Repeats (another order or share graph giving the same LP) are answered at once; past kFits distinct
// ones per step S of a kind the step is granted (a relaxation, still a bound).
bool CoverSearch::lp_fits(const Candidate& c, bool fine, long& spent) {
  const int n = c.n;
  std::vector<double> id{fine ? 1.0 : 0.0, static_cast<double>(n)};
  for (const Kind& kd : kinds_) {
    id.insert(id.end(), {static_cast<double>(kd.Q), kd.loss, static_cast<double>(kd.piece)});
    for (int x = 0; x < n; ++x)
      if (kd.Q >> x & 1) id.push_back(kd.ver[static_cast<std::size_t>(x)]);
  }
  id.push_back(-1.0);
  for (const Piece& q : pieces_) id.insert(id.end(), {1.0 * q.unit, 1.0 * q.d1, 1.0 * q.d2, 1.0 * q.range});
  for (int x = 0; x < n; ++x) id.push_back(c.single(x) ? -1.0 : c.deg[x]);
  if (const auto it = answers_.find(id); it != answers_.end()) return it->second;
  if (++spent > kFits) return true;
  // (the sizes below, ahead of the solve)
  const double size =
      static_cast<double>(kinds_.size() + pieces_.size()) *
      static_cast<double>(kinds_.size() + 2 * pieces_.size() + 2 * n + (fine ? 2 * ranges_.size() : 0) + 1);
  if ((cells_ += size) > kCells) return true;
  // columns: a_x, c_x (per unit), b_q (per piece), A_v, B_v (per range, fine only), e
  const std::size_t N = static_cast<std::size_t>(n), F = pieces_.size(), R = fine ? ranges_.size() : 0;
  const std::size_t cols = 2 * N + F + 2 * R + 1, e = cols - 1, rows = kinds_.size() + F;
  auto a_col = [&](int x, int v) {
    return fine ? 2 * N + F + static_cast<std::size_t>(v) : static_cast<std::size_t>(x);
  };
  auto big_b = [&](int v) { return 2 * N + F + R + static_cast<std::size_t>(v); };
  lp_a_.assign(rows * cols, 0.0), lp_b_.assign(rows, 0.0), lp_c_.assign(cols, 0.0);
  for (int x = 0; x < n; ++x) {
    if (c.single(x))
      lp_c_[N + static_cast<std::size_t>(x)] = 1.0;
    else
      lp_c_[static_cast<std::size_t>(x)] = c.deg[x];
  }
  lp_c_[e] = -static_cast<double>(P_);
  std::size_t r = 0;
  for (const Kind& kd : kinds_) {
    for (int x = 0; x < n; ++x) {
      if (!(kd.Q >> x & 1)) continue;
      const int v =
          kd.piece >= 0 ? pieces_[static_cast<std::size_t>(kd.piece)].range : kd.ver[static_cast<std::size_t>(x)];
      if (fine && v >= 0)
        lp_a_[r * cols + a_col(x, v)] = 1.0, lp_a_[r * cols + big_b(v)] = -1.0;
      else
        lp_a_[r * cols + static_cast<std::size_t>(x)] = 1.0;
    }
    if (kd.piece >= 0) lp_a_[r * cols + 2 * N + static_cast<std::size_t>(kd.piece)] = -1.0;
    lp_a_[r * cols + e] = -1.0, lp_b_[r++] = kd.loss;
  }
  for (std::size_t f = 0; f < F; ++f) {
    const Piece& q = pieces_[f];
    lp_a_[r * cols + a_col(q.unit, q.range)] = -q.d1;
    lp_a_[r * cols + 2 * N + f] = q.d2;
    if (fine) lp_a_[r * cols + big_b(q.range)] = q.d2;
    lp_a_[r * cols + N + static_cast<std::size_t>(q.unit)] = 1.0, lp_b_[r++] = 0.0;
  }
  const double budget = c.work.budget;
  const bool fit = small_lp_max(lp_a_, lp_b_, lp_c_) <= budget + 1e-9 * (1.0 + std::abs(budget));
  answers_.emplace(std::move(id), fit);
  return fit;
}

}  // namespace dynacp::solve::bounds
