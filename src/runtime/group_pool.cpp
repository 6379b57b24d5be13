#include "dynacp/runtime/group_pool.hpp"

#include <algorithm>
#include <sstream>

#include "dynacp/model/error.hpp"

namespace dynacp::runtime {

std::vector<int> CpGroupPool::power_of_two_sizes(int max_size) {
  if (max_size < 1) invalid("largest CP size must be >= 1, got ", max_size);
  std::vector<int> out;
  for (int s = 1; s <= max_size; s *= 2) out.push_back(s);
  return out;
}

std::vector<std::vector<int>> CpGroupPool::tiling(int P, int R, int s) {
  if (P < 1 || R < 1 || P % R != 0) invalid("ranks_per_node (", R, ") must be positive and divide the pool (", P, ")");
  if (s < 1 || s > P) invalid("CP size ", s, " must be between 1 and the pool size ", P);
  std::vector<std::vector<int>> out;
  auto contiguous = [&](const std::vector<int>& ranks) {
    for (std::size_t i = 0; i + static_cast<std::size_t>(s) <= ranks.size(); i += static_cast<std::size_t>(s))
      out.emplace_back(ranks.begin() + static_cast<std::ptrdiff_t>(i),
                       ranks.begin() + static_cast<std::ptrdiff_t>(i) + s);
  };
  if (s >= R) {
    std::vector<int> all(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) all[static_cast<std::size_t>(r)] = r;
    contiguous(all);
    return out;
  }
  std::vector<int> leftover;
  for (int node = 0; node < P / R; ++node) {
    std::vector<int> ranks;
    for (int j = 0; j < R; ++j) ranks.push_back(node * R + j);
    contiguous(ranks);
    for (int j = R / s * s; j < R; ++j) leftover.push_back(node * R + j);
  }
  contiguous(leftover);
  return out;
}

CpGroupPool::CpGroupPool(Comm& world, int ranks_per_node, std::vector<int> cp_sizes) : world_(world) {
  std::sort(cp_sizes.begin(), cp_sizes.end());
  cp_sizes.erase(std::unique(cp_sizes.begin(), cp_sizes.end()), cp_sizes.end());
  if (cp_sizes.empty()) invalid("a CP group pool needs at least one CP size");
  sizes_ = cp_sizes;
  for (int s : sizes_) {
    const auto tiles = tiling(world.size(), ranks_per_node, s);
    int color = kNoColor, key = 0;
    for (std::size_t g = 0; g < tiles.size(); ++g) {
      const auto it = std::find(tiles[g].begin(), tiles[g].end(), world.rank());
      if (it != tiles[g].end()) color = static_cast<int>(g), key = static_cast<int>(it - tiles[g].begin());
    }
    std::unique_ptr<Comm> mine;
    if (s > 1) {
      mine = world.split(color, key);
      if (mine) mine->barrier();  // warm-up: connections are made now, not in the first microbatch
    }
    for (std::size_t g = 0; g < tiles.size(); ++g)
      groups_.push_back({tiles[g], static_cast<int>(g) == color ? std::move(mine) : nullptr});
  }
}

const CpGroup& CpGroupPool::find(std::span<const int> ranks) const {
  for (const auto& g : groups_)
    if (std::equal(g.ranks.begin(), g.ranks.end(), ranks.begin(), ranks.end())) return g;
  std::ostringstream os;
  os << "CP group [";
  for (std::size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << "] is not in the pool (sizes";
  for (int s : sizes_) os << ' ' << s;
  os << "; groups start at multiples of their size inside a node); build the pool with this size or use view() "
        "for a P2P-only ring";
  throw InvalidArgument(os.str());
}

const CpGroup& CpGroupPool::find(int first_rank, int size) const {
  for (const auto& g : groups_)
    if (g.ranks.front() == first_rank && static_cast<int>(g.ranks.size()) == size) return g;
  invalid("no CP group of size ", size, " starting at rank ", first_rank,
          " in the pool; pre-build the size or use view() for a P2P-only ring");
}

std::unique_ptr<Comm> CpGroupPool::view(std::vector<int> ranks) const {
  return make_group_view(world_, std::move(ranks));
}

int CpGroupPool::num_communicators() const {
  return static_cast<int>(
      std::count_if(groups_.begin(), groups_.end(), [](const CpGroup& g) { return g.comm != nullptr; }));
}

int CpGroupPool::total_communicators() const {
  return static_cast<int>(
      std::count_if(groups_.begin(), groups_.end(), [](const CpGroup& g) { return g.ranks.size() > 1; }));
}

}  // namespace dynacp::runtime
