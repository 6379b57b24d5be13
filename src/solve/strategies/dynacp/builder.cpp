// The Builder's shared parts: per-sequence facts, degree rules, the rank picker and the small bin helpers.
#include "builder.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "dynacp/model/error.hpp"

namespace dynacp::solve::dyn {

NodePicker::NodePicker(int P, int rpn, const RingSet* rings)
    : rpn_(rpn), nodes_(P / rpn), sorted_(static_cast<std::size_t>(P / rpn)) {
  if (rings != nullptr) rings_.emplace(*rings, P, rpn);
  if (nodes_ > kScanNodes) kth_.resize(static_cast<std::size_t>(rpn));
  for (int n = 0; n < nodes_; ++n) {
    for (int j = 0; j < rpn; ++j) sorted_[static_cast<std::size_t>(n)].push_back({0.0, n * rpn + j});
    for (auto& k : kth_) k.insert({0.0, n});
  }
}

int NodePicker::earliest(int d) const {
  if (!kth_.empty()) return kth_[static_cast<std::size_t>(d - 1)].begin()->second;
  int best = 0;  // the least (d-th free time, node), as the sets order them
  for (int n = 1; n < nodes_; ++n)
    if (sorted_[static_cast<std::size_t>(n)][static_cast<std::size_t>(d - 1)].first <
        sorted_[static_cast<std::size_t>(best)][static_cast<std::size_t>(d - 1)].first)
      best = n;
  return best;
}

std::vector<int> NodePicker::pick(int d, const std::vector<double>& free) const {
  if (rings_ && d > 1)
    if (std::vector<int> ring = rings_->pick(d); !ring.empty()) return ring;
  std::vector<int> out;
  if (d <= rpn_) {
    const int node = earliest(d);
    for (int j = 0; j < d; ++j)
      out.push_back(sorted_[static_cast<std::size_t>(node)][static_cast<std::size_t>(j)].second);
  } else {
    const int k = std::min(nodes_, (d + rpn_ - 1) / rpn_);
    int best = 0;
    double best_t = 0;
    std::vector<double> window;
    for (int first = 0; first + k <= nodes_; ++first) {  // window start time = its d-th earliest free rank
      window.clear();
      for (int n = first; n < first + k; ++n)
        for (const auto& [t, r] : sorted_[static_cast<std::size_t>(n)]) window.push_back(t);
      std::nth_element(window.begin(), window.begin() + (d - 1), window.end());
      const double t = window[static_cast<std::size_t>(d - 1)];
      if (first == 0 || t < best_t) best = first, best_t = t;
    }
    std::vector<std::pair<double, int>> cand;
    for (int r = best * rpn_; r < (best + k) * rpn_; ++r) cand.push_back({free[static_cast<std::size_t>(r)], r});
    if (static_cast<int>(cand.size()) < d)
      for (int r = 0; r < static_cast<int>(free.size()); ++r)
        if (r < best * rpn_ || r >= (best + k) * rpn_) cand.push_back({free[static_cast<std::size_t>(r)], r});
    std::stable_sort(cand.begin(), cand.end());
    for (int j = 0; j < d; ++j) out.push_back(cand[static_cast<std::size_t>(j)].second);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void NodePicker::update(int node, const std::vector<double>& free) {
  if (rings_) rings_->update(node, free);
  auto& s = sorted_[static_cast<std::size_t>(node)];
  for (std::size_t k = 0; k < kth_.size(); ++k) kth_[k].erase({s[k].first, node});
  for (auto& [t, r] : s) t = free[static_cast<std::size_t>(r)];
  std::sort(s.begin(), s.end());
  for (std::size_t k = 0; k < kth_.size(); ++k) kth_[k].insert({s[k].first, node});
}

std::vector<std::size_t> rise_then_fall(const std::vector<double>& w, int pp) {
  std::vector<std::size_t> by(w.size());
  std::iota(by.begin(), by.end(), std::size_t{0});
  std::stable_sort(by.begin(), by.end(), [&](std::size_t x, std::size_t y) { return w[x] < w[y]; });
  const std::size_t q = std::min<std::size_t>(static_cast<std::size_t>(std::max(pp - 1, 0)), w.size() / 4);
  std::vector<std::size_t> out(by.begin(), by.begin() + static_cast<std::ptrdiff_t>(q));
  for (std::size_t i = by.size(); i > q; --i) out.push_back(by[i - 1]);
  return out;
}

std::vector<std::size_t> own_order(const std::vector<double>& w, OwnOrder order, int pp) {
  if (order == OwnOrder::RiseThenFall) return rise_then_fall(w, pp);
  std::vector<std::size_t> by(w.size());
  std::iota(by.begin(), by.end(), std::size_t{0});
  std::stable_sort(by.begin(), by.end(), [&](std::size_t x, std::size_t y) { return w[x] < w[y]; });
  std::vector<std::size_t> out(by.size());
  if (order == OwnOrder::HeaviestFirst) {
    std::reverse_copy(by.begin(), by.end(), out.begin());
  } else {
    std::size_t lo = 0, hi = by.size();
    for (std::size_t i = 0; i < by.size(); ++i) out[i % 2 == 0 ? lo++ : --hi] = by[i];
  }
  return out;
}

Builder::Builder(const Batch& b, const Cluster& c, const CostModel& m, const DynacpTuning& tuning, const RingSet* rings,
                 const StaticShapes* shapes)
    : batch_(b),
      cluster_(c),
      cost_(m),
      tuning_(tuning),
      rings_(rings != nullptr && rings->empty() ? nullptr : rings),
      shapes_(shapes != nullptr && !shapes->token_buckets.empty() ? shapes : nullptr) {
  cap_ = cost_.token_capacity(cluster_);
  if (rings_ != nullptr) {
    allowed_sizes_ = rings_->sizes();
    allowed_sizes_.insert(allowed_sizes_.begin(), 1);
  }
  // Sequences of one length and mask share every field but the id (piece_minima alone takes a few dozen cost
  // evaluations): each distinct pair is computed once and copied. (The map is only looked up, never iterated.)
  std::unordered_map<std::int64_t, std::size_t> first_of[2];  // per mask: length -> its first sequence's index
  for (std::size_t i = 0; i < b.size(); ++i) {
    const auto [it, fresh] = first_of[b.mask(i) == Mask::Full ? 1 : 0].try_emplace(b.lengths[i], seqs_.size());
    if (!fresh) {
      Seq q = seqs_[it->second];
      q.id = static_cast<std::int64_t>(i);
      seqs_.push_back(q);
      continue;
    }
    const double eta = cost_.eta(b.mask(i));
    Seq q{static_cast<std::int64_t>(i), b.lengths[i], eta, cost_.work(b.lengths[i], b.mask(i)),
          cost_.min_degree(b.lengths[i], cluster_)};
    q.rows1 = cluster_.padded_rows(q.len, 1);
    q.lo[0] = q.dmin, q.lo[1] = std::max(q.dmin, cluster_.ranks_per_node + 1);
    GroupStats g;
    g.add(q.len, q.eta);
    const auto arg = cost_.piece_minima(g, q.dmin, cluster_);
    q.arg[0] = arg[0], q.arg[1] = arg[1];
    q.t1 = time1(q, 1);
    seqs_.push_back(q);
  }
  // longest work first, ties by index: sorted as contiguous (-work, index) keys, the same order without a random
  // read of seqs_ per comparison
  std::vector<std::pair<double, std::size_t>> keys(seqs_.size());
  for (std::size_t i = 0; i < seqs_.size(); ++i) keys[i] = {-seqs_[i].work, i};
  std::sort(keys.begin(), keys.end());
  order_.resize(seqs_.size());
  for (std::size_t k = 0; k < keys.size(); ++k) order_[k] = keys[k].second;
  for (const auto& q : seqs_) ring_t1_.push_back(q.dmin > 1 ? std::numeric_limits<double>::infinity() : q.t1);
}

double Builder::time1(const Seq& s, int d) const {
  GroupStats g;
  g.add(s.len, s.eta);
  if (shapes_ != nullptr) g = shapes_->priced(g, cluster_.padded_rows(s.len, d), d);  // its bucket's padding
  return cost_.time(g, d, cluster_);
}

int Builder::first_within(const Seq& s, int k, double tau) const {
  int a = s.lo[k], z = s.arg[k];
  while (a < z) {
    const int m = a + (z - a) / 2;
    if (time1(s, m) <= tau)
      z = m;
    else
      a = m + 1;
  }
  return a;
}

// T(s, d) falls to arg[k] on each piece and rises after it (degree_for's binary search relies on the first half),
// so among the allowed degrees of a piece the smallest within tau is the first one at or after the smallest degree
// within tau, and the fastest is an allowed neighbour of arg[k]: O(log) cost evaluations, not one per allowed size.
int Builder::allowed_degree_for(const Seq& s, double tau) const {
  const int hi[2] = {cluster_.ranks_per_node, cluster_.num_ranks};
  int best = 0;
  double best_t = 0.0;
  for (int k = 0; k < 2; ++k) {
    if (s.arg[k] == 0) continue;
    const auto first = std::lower_bound(allowed_sizes_.begin(), allowed_sizes_.end(), s.lo[k]);
    const auto last = std::upper_bound(first, allowed_sizes_.end(), hi[k]);
    if (first == last) continue;
    if (time1(s, s.arg[k]) <= tau) {
      const int a = first_within(s, k, tau);
      if (const auto it = std::lower_bound(first, last, a); it != last && time1(s, *it) <= tau) return *it;
    }
    const auto up = std::lower_bound(first, last, s.arg[k]);
    for (auto it : {up == first ? last : up - 1, up}) {
      if (it == last) continue;
      const double t = time1(s, *it);
      if (best == 0 || t < best_t || (t == best_t && *it < best)) best = *it, best_t = t;
    }
  }
  return best > 0 ? best : s.dmin;  // (no allowed degree holds it: project() names the missing ring)
}

int Builder::degree_for(const Seq& s, double tau) const {
  if (rings_ != nullptr) return allowed_degree_for(s, tau);
  int best = 0;
  for (int k = 0; k < 2; ++k) {
    if (s.arg[k] == 0) continue;
    if (time1(s, s.arg[k]) <= tau) return first_within(s, k, tau);
    if (best == 0 || time1(s, s.arg[k]) < time1(s, best)) best = s.arg[k];
  }
  return best;
}

double Builder::upper_tau() const {
  double t = 0;
  for (const auto& s : seqs_) t = std::max(t, time1(s, s.dmin));
  return t;
}

double Builder::total_work() const {
  double w = 0;
  for (const auto& q : seqs_) w += q.work;
  return w;
}

bool Builder::has_wide_rings() const {
  for (const auto& q : seqs_)
    if (q.dmin > cluster_.ranks_per_node) return true;
  return false;
}

double Builder::largest_work() const { return order_.empty() ? 0.0 : seqs_[order_.front()].work; }

std::vector<std::pair<std::size_t, int>> Builder::signature(double tau) const {
  std::vector<std::pair<std::size_t, int>> sig;
  for (std::size_t i = 0; i < ring_t1_.size(); ++i)  // = seqs_[i].dmin > 1 || seqs_[i].t1 > tau, read compactly
    if (ring_t1_[i] > tau) sig.push_back({i, degree_for(seqs_[i], tau)});
  return sig;
}

// Splits `ids` (longest work first) into short sequences (one rank, within tau) and rings with their degree for
// tau, the rings sorted by `ring_order`: 0 largest area T d, 1 longest, 2 widest.
void Builder::classify(const std::vector<std::size_t>& ids, double tau, int ring_order,
                       std::vector<std::size_t>& shorts, std::vector<Ring>& rings) const {
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const std::size_t i = ids[k];
    if (k + kAhead < ids.size()) __builtin_prefetch(&seqs_[ids[k + kAhead]]);
    const Seq& q = seqs_[i];
    if (q.dmin == 1 && q.t1 <= tau) {
      shorts.push_back(i);
    } else {
      const int d = degree_for(q, tau);
      rings.push_back({i, d, time1(q, d)});
    }
  }
  std::stable_sort(rings.begin(), rings.end(), [ring_order](const Ring& a, const Ring& b) {
    if (ring_order == 1) return a.t > b.t;
    if (ring_order == 2) return a.d != b.d ? a.d > b.d : a.t > b.t;
    return a.t * a.d > b.t * b.d;
  });
}

// Splits a group in two by two-way LPT over its sequences, longest work first (ties: lower index).
std::pair<Bin, Bin> Builder::halve(const Bin& all) const {
  std::vector<std::size_t> ids = all.seqs;
  std::stable_sort(ids.begin(), ids.end(), [&](std::size_t x, std::size_t y) {
    return seqs_[x].work != seqs_[y].work ? seqs_[x].work > seqs_[y].work : x < y;
  });
  Bin a, b;
  for (std::size_t i : ids) add_to(a.work <= b.work ? a : b, i);
  return {std::move(a), std::move(b)};
}

void Builder::add_to(Bin& b, std::size_t i) const {
  b.seqs.push_back(i), b.rows += seqs_[i].rows1, b.work += seqs_[i].work;
}

void Builder::move_item(Bin& from, std::size_t k, Bin& to) const {
  const Seq& s = seqs_[from.seqs[k]];
  to.seqs.push_back(from.seqs[k]);
  to.rows += s.rows1, to.work += s.work;
  from.seqs.erase(from.seqs.begin() + static_cast<std::ptrdiff_t>(k));
  from.rows -= s.rows1, from.work -= s.work;
}

std::vector<std::int64_t> Builder::ids_of(const Bin& b) const {
  std::vector<std::int64_t> ids;
  for (std::size_t i : b.seqs) ids.push_back(seqs_[i].id);
  return ids;
}

}  // namespace dynacp::solve::dyn
