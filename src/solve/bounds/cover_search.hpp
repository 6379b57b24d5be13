// Internal to the cover term (bounds/cover.hpp): the search for the least feasible step over set partitions, orders
// and share graphs of the hardest sequences' units (cover_search.cpp), and the rank LP that prices a share graph
// (cover_lp.cpp).
//
// A plan puts the k hardest sequences in units (a unit: one group holding one or more of them - a set partition),
// each on d_u ranks with time >= T_u(d) (T_u nonincreasing: the fastest time on at most d ranks). Units sharing a
// rank run in one order on all the ranks they share (the plan's group order is acyclic, or the forwards would
// deadlock) and a unit's ops are joint nodes of all its ranks, so along units u1 < ... < uj of that order with each
// two consecutive ones sharing a rank, the chain of one_f_one_b_chain_floor holds: step >= chain_floor(T_u1, ...,
// T_uj). And units that pairwise share no rank sit on disjoint rings: their degrees sum to <= P. So a step S needs a
// partition, an order pi and a share graph H with every path of H along pi of chain floor <= S and every independent
// set of H of degrees summing to <= P. Each unit's degree is bounded below alone (the others at their fastest times)
// and above by the independent sets it is in; each path is then checked at those upper degrees. The other work must
// fit too: a rank of unit u runs at most C(S) - loss_u of it (the critical-sequence argument, for any microbatch,
// whatever else the rank runs), so the ranks of an independent set lose the sum of their losses, and a linear
// program over the kinds of rank (ranks_fit) prices the ranks each unit holds alone and those it shares. A unit of
// several sequences is priced by its group's time.
#pragma once
#include <algorithm>
#include <array>
#include <bit>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "dynacp/model/cluster.hpp"
#include "dynacp/solve/blocks/microbatch.hpp"
#include "dynacp/solve/bounds/cover.hpp"

namespace dynacp::solve::bounds {

// S-free structure for n units: for each order pi and path (a unit mask of >= 2, ordered by pi), the edges it needs
// (edge ids of its consecutive units) and the index of its ordered unit list (shared across orders).
struct Shape {
  std::vector<int> edge;                  // [a * n + b] -> edge id
  std::vector<std::vector<int>> need;     // [pi][path] -> edge mask (0: not a path)
  std::vector<std::vector<int>> key;      // [pi][path] -> index of the ordered path
  std::vector<std::vector<int>> ordered;  // [key] -> units in order
  std::vector<int> subsets;               // unit masks of >= 2 units, fewest first
};

/// The Shape of n units (every order pi of them).
Shape make_shape(int n);

inline int popcount(int mask) { return std::popcount(static_cast<unsigned>(mask)); }

// One search for the least feasible step (one object per cover_term call; not for concurrent use). The share-graph
// search is cover_search.cpp, the rank LP that prices a graph cover_lp.cpp.
class CoverSearch {
 public:
  CoverSearch(const Cluster& cluster, int pp, int k, const std::function<OtherWork(double)>& other,
              const ChainRoom& fluid_room, const GiantShares& shares);

  /// The least feasible step from `from` on (within the bisection's 1e-4), a bound.
  double solve(double from);

 private:
  static constexpr long kVisits = 50000;  // share graphs tried per step S, over all partitions and orders
  // The rank LP (ranks_fit): a unit's degree range is cut into up to kRanges ranges at equal steps of its time, each
  // range into up to kPieces pieces for the ranks it holds alone.
  static constexpr int kRanges = 8;                // degree ranges per giant, for the cliques of the fine LP
  static constexpr int kPieces = 3;                // pieces per range, for the ranks a giant holds alone
  static constexpr long kFits = 300;               // distinct rank LPs of each kind solved per step S
  static constexpr std::size_t kFineKinds = 2048;  // the most clique kinds of a fine LP
  // Work caps over the whole term (every step S), so that no batch takes long: LP tableau cells (rows x (rows +
  // columns), summed over the LPs solved) and share graphs tried. Past either, every check is granted (a relaxation,
  // still a bound). The 12 wlbllm, github and longcontext benchmark batches stay below both (at most 1.9e8 cells,
  // github 1, and 143,000 share graphs, longcontext 0).
  static constexpr double kCells = 2e8;
  static constexpr long kAllVisits = 400000;

  struct Range {  // a giant's degree lies in [d1, d2]
    int unit, d1, d2;
  };
  struct Piece {  // a piece [d1, d2] of range `range`: ranks the giant holds alone lose `loss` each
    int unit, d1, d2, range;
    double loss;
  };
  struct Kind {  // ranks that hold the units of Q: one piece alone (piece >= 0), or a clique of H with each single
                 // sequence priced at range ver[x] (fine) or at its whole degree range (coarse, -1)
    int Q;
    std::array<int, 8> ver;
    double loss;
    int piece;
  };
  // A share graph to price at step S: the n units of `part` at degrees [deg[x], upper_[x]], neighbours nbr[x] in H,
  // paths ordered by `key` (one order pi of shape `sh`).
  struct Candidate {
    int n;
    const std::vector<int>& part;
    const std::vector<int>& deg;
    const Shape& sh;
    const std::vector<int>& key;
    const int* nbr;
    double S;
    const OtherWork& work;
    bool single(int x) const { return popcount(part[x]) == 1; }  // a unit of one sequence
  };

  // time[d] for d = 0..P: the fastest time on at most d ranks (infinite below the least degree)
  std::vector<double> curve(int members) const {
    std::vector<double> t = shares_.time[static_cast<std::size_t>(members)];
    for (int d = 1; d <= P_; ++d) t[d] = std::min(t[d - 1], t[d]);
    return t;
  }
  static int least(const std::vector<double>& t, double S) {  // least d with t[d] <= S, or P + 1
    const auto it = std::partition_point(t.begin(), t.end(), [&](double x) { return x > S; });
    return static_cast<int>(it - t.begin());
  }
  double chain_floor(const std::vector<double>& times) const { return one_f_one_b_chain_floor(times, pp_); }

  // One partition's search at one step S (search()): its units' least and fastest degrees, the least degree of each
  // unit on each ordered path (worked out when a share graph first holds that path) and the scratch of one graph.
  struct Part {
    int n;
    const std::vector<int>& part;
    const Shape& sh;
    double S;
    const OtherWork& work;
    std::vector<int> lo;
    std::vector<double> best;
    std::vector<int> req;  // [path * n + unit]; -1: not yet worked out; P + 1: the path can never be that short
    std::vector<int> deg, indep;
    std::vector<double> times;
    int nbr[8] = {};
  };
  // What one share graph H says: it works (the step fits), no graph above it works, or grow it by an edge inside
  // one of `breaks` (or, with `grow`, any pair that can chain within S).
  enum class Outcome { Works, Prune, Grow };
  struct Verdict {
    int breaks[8] = {}, nbreaks = 0;
    bool grow = false;
  };

  bool feasible(double S);
  bool search(const std::vector<int>& part, double S, const OtherWork& work);
  void path_req(Part& p, int q);
  Outcome examine(Part& p, std::size_t o, int H, Verdict& v);
  bool stuck(Part& p, std::size_t o, int H, Verdict& v);
  void grow_graph(const Part& p, std::size_t o, int H, const Verdict& v, std::vector<char>& seen,
                  std::vector<int>& stack) const;
  bool ranks_fit(const Candidate& c);
  bool price(const Candidate& c);
  double room(const Candidate& c, const std::vector<int>& order, const int* from, const int* to);
  bool cut_ranges(const Candidate& c);
  bool add_kinds(const Candidate& c, bool fine);
  bool lp_fits(const Candidate& c, bool fine, long& spent);

  const int P_, pp_, k_;
  const std::function<OtherWork(double)>& other_;
  const ChainRoom& fluid_room_;
  const GiantShares& shares_;
  std::vector<std::vector<int>> partitions_;
  std::vector<std::vector<double>> curves_;  // [unit mask] -> curve
  std::vector<Shape> shapes_;                // [n - 1]
  std::vector<int> lone_order_[8];           // {x}: a lone unit's order
  // per step S
  std::map<std::vector<int>, double> rooms_;      // (unit, from, to) per unit in order -> room
  std::map<std::vector<double>, double> fluids_;  // the times of a chain -> the fluid room beside it
  std::map<std::vector<double>, bool> answers_;   // the LP's data -> fits
  std::map<std::vector<int>, bool> shaped_;       // units, degree ranges and cliques -> fits
  long solved_ = 0, solved_fine_ = 0;             // coarse and fine LPs solved
  long visits_ = 0;                               // share graphs tried
  // over the whole term
  double cells_ = 0.0;
  long all_visits_ = 0;
  // scratch of the candidate being priced
  int upper_[8] = {};
  std::vector<std::pair<int, const std::vector<int>*>> cliques_;  // (Q, its units in the order pi)
  std::vector<int> of_[8];                                        // the ranges of each single-sequence unit
  std::vector<Range> ranges_;
  std::vector<Piece> pieces_;
  std::vector<Kind> kinds_;
  std::vector<double> lp_a_, lp_b_, lp_c_, chain_;
};

}  // namespace dynacp::solve::bounds
