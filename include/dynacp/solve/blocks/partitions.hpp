// Set partitions of a few items, for the searches that try every way of grouping them.
#pragma once
#include <algorithm>
#include <vector>

namespace dynacp::solve {

/// Every set partition of items 0..k-1 (k <= 30), each as its blocks' member masks, in the fixed order of restricted
/// growth strings: blocks numbered by their first item, partitions from all items in one block to every item alone.
/// Bell(k) partitions (k = 7: 877); k = 0 gives one empty partition.
inline std::vector<std::vector<int>> set_partitions(int k) {
  std::vector<std::vector<int>> partitions;
  if (k <= 0) return {{}};
  std::vector<int> rgs(static_cast<std::size_t>(k), 0);
  while (true) {
    const int count = *std::max_element(rgs.begin(), rgs.end()) + 1;
    std::vector<int> masks(static_cast<std::size_t>(count), 0);
    for (int i = 0; i < k; ++i) masks[static_cast<std::size_t>(rgs[i])] |= 1 << i;
    partitions.push_back(std::move(masks));
    int i = k - 1;
    for (; i > 0; --i)
      if (rgs[i] <= *std::max_element(rgs.begin(), rgs.begin() + i)) break;
    if (i == 0) break;
    ++rgs[i];
    std::fill(rgs.begin() + i + 1, rgs.end(), 0);
  }
  return partitions;
}

}  // namespace dynacp::solve
