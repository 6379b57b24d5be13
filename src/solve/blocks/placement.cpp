#include "dynacp/solve/blocks/placement.hpp"

#include <algorithm>
#include <numeric>

#include "dynacp/model/error.hpp"

namespace dynacp::solve {

std::vector<std::vector<int>> place_groups(const std::vector<int>& degrees, const Cluster& cluster) {
  const int rpn = cluster.ranks_per_node;
  const int nodes = cluster.num_nodes();
  long long total = 0;
  for (int d : degrees) {
    if (d < 1) invalid("cannot place a group of degree ", d);
    total += d;
  }
  if (total > cluster.num_ranks) invalid("groups need ", total, " ranks but the pool has ", cluster.num_ranks);

  // Free ranks of node k are the suffix [k*rpn + used[k], (k+1)*rpn).
  std::vector<int> used(static_cast<std::size_t>(nodes), 0);
  std::vector<std::vector<int>> out(degrees.size());
  std::vector<std::size_t> order(degrees.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return degrees[a] > degrees[b]; });

  auto take = [&](std::vector<int>& ring, int node, int n) {
    for (int j = 0; j < n; ++j) ring.push_back(node * rpn + used[static_cast<std::size_t>(node)]++);
  };
  for (std::size_t gi : order) {
    int need = degrees[gi];
    auto& ring = out[gi];
    if (need > rpn) {
      // Whole empty nodes, contiguous from the front, then the remainder best-fit.
      for (int k = 0; k < nodes && need >= rpn; ++k)
        if (used[static_cast<std::size_t>(k)] == 0) take(ring, k, rpn), need -= rpn;
    }
    if (need > 0) {
      int best = -1;
      for (int k = 0; k < nodes; ++k) {
        const int freek = rpn - used[static_cast<std::size_t>(k)];
        if (freek >= need && (best < 0 || freek < rpn - used[static_cast<std::size_t>(best)])) best = k;
      }
      if (best >= 0) {
        take(ring, best, need);
      } else {
        // Spread over the nodes with the most free ranks (fewest nodes), ties by node index.
        std::vector<int> idx(static_cast<std::size_t>(nodes));
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
          return used[static_cast<std::size_t>(a)] < used[static_cast<std::size_t>(b)];
        });
        for (int k : idx) {
          const int n = std::min(need, rpn - used[static_cast<std::size_t>(k)]);
          take(ring, k, n);
          need -= n;
          if (need == 0) break;
        }
      }
    }
    std::sort(ring.begin(), ring.end());
  }
  return out;
}

}  // namespace dynacp::solve
