// Shelf layouts for pipelined plans (pp > 1). The giants - the sequences whose memory needs more than a node, at
// most tuning.shelf_giants of them - are split into shelves of one to three rings side by side on consecutive ranks
// (a lone ring at its fastest degree; two or three at the degrees, summing to the shelf's width, that make its
// slowest ring fastest), and every rank of the shelves' width runs them one after the other. Two shapes:
//   - full shelves: every giant in a shelf over the whole pool, when their least degrees sum to more than P;
//   - a column: the hardest giant alone on the first w ranks for the whole step (every w from its least degree up),
//     the others in shelves over the remaining P - w.
// Each rank runs one ring per shelf it is covered in, and the rings' 1F1B chain floor on the rank
// (one_f_one_b_chain_floor) is the layout's score there; layouts are ranked by their worst rank, and the best `keep`
// (distinct) are returned, each as its rings in run order with their places. Every order of up to
// tuning.shelf_orders shelves is tried (more: the rise-then-fall order of their times), with the rings of alternate
// shelves placed from either end of their ranks. `drop` > 0 leaves out the `drop` smallest giants (pipelined()
// places them like any ring). Empty for fewer than two giants or more than shelf_giants. Degrees and column widths
// step by P / shelf_stride_ranks ranks, rounded down (every one below that many ranks).
#include <algorithm>
#include <limits>
#include <numeric>

#include "builder.hpp"
#include "dynacp/solve/blocks/microbatch.hpp"
#include "dynacp/solve/blocks/partitions.hpp"

namespace dynacp::solve::dyn {

struct ShelfSearch {
  struct Shelf {
    double t = 0.0;
    std::vector<std::pair<std::size_t, int>> rings;  // (giant, degree), widest first
  };
  const Builder& b;
  int pp, P, stride;
  std::size_t keep;
  std::vector<std::size_t> giants;
  std::vector<std::vector<double>> T;  // T(giant, d) for d = 0..P (infinite below its least degree)
  // The best `keep` distinct layouts so far, by score and then by when they were found (what a stable sort of every
  // layout, repeats skipped, would keep); a layout that cannot enter them is dropped as soon as its score shows it.
  std::vector<std::pair<double, std::vector<Ring>>> top;
  std::vector<Ring> layout;  // scratch
  std::vector<int> cuts;
  std::vector<double> chain;
  OneFOneBScratch stages;

  int least(std::size_t g) const { return b.seqs_[giants[g]].dmin; }

  // The best degrees for a shelf of giants `members` on `width` ranks (false when their least degrees exceed it).
  bool best_shelf(const std::vector<std::size_t>& members, int width, Shelf& out) const {
    out = Shelf{std::numeric_limits<double>::infinity(), {}};
    const std::size_t a = members[0];
    if (members.size() == 1) {
      for (int d = least(a); d <= width; d += stride)
        if (T[a][d] < out.t) out = Shelf{T[a][d], {{a, d}}};
    } else if (members.size() == 2) {
      const std::size_t x = members[1];
      for (int d = least(a); d + least(x) <= width; d += stride)
        if (const double t = std::max(T[a][d], T[x][width - d]); t < out.t) out = Shelf{t, {{a, d}, {x, width - d}}};
    } else if (members.size() == 3) {
      const std::size_t x = members[1], y = members[2];
      for (int d = least(a); d + least(x) + least(y) <= width; d += stride)
        for (int e = least(x); d + e + least(y) <= width; e += stride)
          if (const double t = std::max({T[a][d], T[x][e], T[y][width - d - e]}); t < out.t)
            out = Shelf{t, {{a, d}, {x, e}, {y, width - d - e}}};
    }
    std::stable_sort(out.rings.begin(), out.rings.end(),
                     [](const auto& u, const auto& v) { return u.second > v.second; });
    return !out.rings.empty();
  }

  // A layout's score: ranks between consecutive ring edges run the same rings, so one rank of each such run. Stops
  // (returning a value above `cutoff`) as soon as one run exceeds `cutoff`.
  double score(const std::vector<Ring>& rings, double cutoff) {
    cuts.assign({0, P});
    for (const auto& r : rings) cuts.push_back(r.at), cuts.push_back(r.at + r.d);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    double worst = 0.0;
    for (std::size_t j = 0; j + 1 < cuts.size() && worst <= cutoff; ++j) {
      chain.clear();
      for (const auto& r : rings)
        if (r.at <= cuts[j] && cuts[j] < r.at + r.d) chain.push_back(r.t);
      if (!chain.empty()) worst = std::max(worst, one_f_one_b_chain_floor(chain, pp, b.cost().backward_ratio, stages));
    }
    return worst;
  }

  static bool same(const std::vector<Ring>& x, const std::vector<Ring>& y) {
    return std::equal(x.begin(), x.end(), y.begin(), y.end(),
                      [](const Ring& u, const Ring& v) { return u.seq == v.seq && u.d == v.d && u.at == v.at; });
  }

  // Offers a layout to `top`: kept when it beats the worst kept (ties go to the earlier) and repeats none of them.
  void offer(const std::vector<Ring>& rings) {
    if (keep == 0) return;
    const bool full = top.size() == keep;
    admit(score(rings, full ? top.back().first : std::numeric_limits<double>::infinity()), rings);
  }
  // offer() of a layout whose score `t` is known (or, when above the worst kept, known to be so).
  void admit(double t, const std::vector<Ring>& rings) {
    if (top.size() == keep && !(t < top.back().first)) return;
    auto at = std::upper_bound(top.begin(), top.end(), t, [](double v, const auto& e) { return v < e.first; });
    // a repeat has the same score, so it sits among the equal scores just before `at`
    for (auto it = at; it != top.begin() && std::prev(it)->first == t; --it)
      if (same(std::prev(it)->second, rings)) return;
    top.insert(at, {t, rings});
    if (top.size() > keep) top.pop_back();
  }

  // Every order of `shelves` (up to shelf_orders; more: rise then fall of their times) on the ranks [offset,
  // offset + width), after the rings `before`, alternate shelves placed from either end or all from the start.
  void lay_out(const std::vector<Shelf>& shelves, int offset, int width, const std::vector<Ring>& before) {
    std::vector<std::size_t> order(shelves.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    const bool all_orders = shelves.size() <= static_cast<std::size_t>(b.tuning_.shelf_orders);
    if (!all_orders) {
      std::vector<double> w;
      for (const auto& sh : shelves) w.push_back(sh.t);
      order = rise_then_fall(w, pp);
    }
    do {
      for (bool alternate : {false, true}) {
        layout.assign(before.begin(), before.end());
        for (std::size_t k = 0; k < order.size(); ++k) {
          const Shelf& sh = shelves[order[k]];
          int at = offset, used = 0;
          for (const auto& [g, d] : sh.rings) used += d;
          if (alternate && k % 2 == 1) at = offset + width - used;
          for (const auto& [g, d] : sh.rings) layout.push_back({giants[g], d, T[g][d], at}), at += d;
        }
        offer(layout);
      }
    } while (all_orders && std::next_permutation(order.begin(), order.end()));
  }

  // Every grouping of `members` into shelves (set_partitions) on the ranks [offset, offset + width).
  void shelve(const std::vector<std::size_t>& members, int offset, int width, const std::vector<Ring>& before) {
    for (const auto& blocks : set_partitions(static_cast<int>(members.size()))) {
      std::vector<Shelf> shelves(blocks.size());
      bool ok = true;
      for (std::size_t k = 0; k < blocks.size() && ok; ++k) {
        std::vector<std::size_t> block;
        for (std::size_t g = 0; g < members.size(); ++g)
          if (blocks[k] >> g & 1) block.push_back(members[g]);
        ok = best_shelf(block, width, shelves[k]);
      }
      if (ok) lay_out(shelves, offset, width, before);
    }
  }

  std::vector<std::vector<Ring>> best() {
    std::vector<std::vector<Ring>> out;
    for (auto& [worst, rings] : top) out.push_back(std::move(rings));
    return out;
  }
};

std::vector<std::vector<Ring>> Builder::pipelined_shelves(int pp, std::size_t keep, std::size_t drop,
                                                          const ParallelFor& parallel) const {
  const int P = cluster_.num_ranks, rpn = cluster_.ranks_per_node;
  ShelfSearch s{*this, pp, P, std::max(1, P / tuning_.shelf_stride_ranks), keep, {}, {}, {}, {}, {}, {}, {}};
  for (std::size_t i : order_)
    if (seqs_[i].dmin > rpn) s.giants.push_back(i);
  if (s.giants.size() > static_cast<std::size_t>(tuning_.shelf_giants)) return {};  // the plain builds place them
  s.giants.resize(s.giants.size() > drop ? s.giants.size() - drop : 0);
  if (s.giants.size() < 2) return {};
  const std::size_t n = s.giants.size();
  s.T.assign(n, std::vector<double>(static_cast<std::size_t>(P) + 1, std::numeric_limits<double>::infinity()));
  for (std::size_t g = 0; g < n; ++g)
    for (int d = s.least(g); d <= P; ++d) s.T[g][d] = time1(seqs_[s.giants[g]], d);
  std::vector<std::size_t> all(n);
  std::iota(all.begin(), all.end(), std::size_t{0});
  int crowd = 0;
  for (std::size_t g = 0; g < n; ++g) crowd += s.least(g);
  const std::vector<std::size_t> rest(all.begin() + 1, all.end());
  int widest = 0;  // beside the column, the others need at least their widest least degree
  for (std::size_t g : rest) widest = std::max(widest, s.least(g));
  // The searches in order: the full shelves (width 0 here), then a column of each width. Each keeps its own best
  // layouts; offering them to one list in search order, each search's best first, keeps what one search over all
  // would: a stable sort of every layout, repeats skipped (a layout outside its own search's best is outside all).
  std::vector<int> widths;
  if (crowd > P) widths.push_back(0);
  for (int w = s.least(0); P - w >= widest; w += s.stride) widths.push_back(w);
  std::vector<ShelfSearch> parts(widths.size(), s);
  auto search = [&](std::size_t k) {
    const int w = widths[k];
    if (w == 0)
      parts[k].shelve(all, 0, P, {});
    else
      parts[k].shelve(rest, w, P - w, {Ring{s.giants[0], w, s.T[0][w], 0}});
  };
  run_tasks(parallel, widths.size(), search);
  for (const auto& part : parts)
    for (const auto& [t, rings] : part.top) s.admit(t, rings);
  return s.best();
}

}  // namespace dynacp::solve::dyn
