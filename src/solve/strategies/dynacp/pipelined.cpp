// pp > 1 per-rank microbatch lists for a microbatch target mu (Builder::pipelined). Under 1F1B a rank whose
// microbatches take S seconds in all (all stages, forward and backward) and M at most finishes after about
// (S + (pp - 1) M) / pp (exact for equal microbatches; docs/strategies.md), so:
//   1. ring sequences (dmin > 1 or slower than mu on one rank) take the smallest degree that reaches mu (their
//      fastest degree, or the one within the target rule, if none does) and go, largest area first, onto the
//      node-contiguous ranks with the least estimate so far (`align`: with the fewest rings, then the least estimate);
//   2. the other sequences, longest work first, go to the rank with the least estimate, into its open microbatch
//      while that stays within mu and the token capacity, else into a new one;
//   3. a local search moves single sequences from the rank with the largest estimate to the smallest.
// A ring placed in round k runs at list index k on all its ranks (others run one of their own microbatches there),
// and the rank's own microbatches fill the other indices in the spec's order. The count rule then brings every rank
// to a count where the data allows; lead microbatches may run before a rank's first ring.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>

#include "builder.hpp"

namespace dynacp::solve::dyn {

std::vector<Ring> Builder::pipelined_rings(const TargetRule& target, double mu, std::vector<std::size_t>& shorts,
                                           bool tile) const {
  std::vector<Ring> rings;
  classify(order_, mu, 0, shorts, rings);
  const int rpn = cluster_.ranks_per_node, P = cluster_.num_ranks;
  for (auto& ring : rings) {
    if (ring.t > mu) {  // mu is out of reach: the smallest degree within the target rule
      ring.d = degree_for(seqs_[ring.seq], target.kind == TargetRule::Seconds ? target.value : target.value * ring.t);
      ring.t = time1(seqs_[ring.seq], ring.d);
    }
    if (tile && ring.d > rpn) {  // tile: a power-of-two number of whole nodes, so wide rings stack without gaps
      int nodes = 1;
      while (nodes * rpn < ring.d) nodes *= 2;
      ring.d = std::min(P, nodes * rpn);
      ring.t = time1(seqs_[ring.seq], ring.d);
    }
  }
  return rings;
}

std::vector<std::pair<std::size_t, int>> Builder::ring_set(const TargetRule& target, double mu, bool tile) const {
  std::vector<std::size_t> shorts;
  std::vector<std::pair<std::size_t, int>> sig;
  for (const auto& r : pipelined_rings(target, mu, shorts, tile)) sig.push_back({r.seq, r.d});
  return sig;
}

/// The state of one pipelined build, stage by stage (Builder::pipelined).
struct PipelinedBuild {
  struct Placed {
    std::vector<int> ranks;
    std::int64_t id;
    int round;  // its index in the microbatch list of every rank it runs on
    double t;   // its time
  };
  const Builder& b;
  const Pipe& spec;
  int pp, P, rpn;
  double c;
  int lead;
  std::vector<double> S, M, ring_s, ring_m;
  std::vector<Placed> ring_groups;
  std::vector<int> rings_on;
  std::vector<std::vector<Bin>> bins, pre;

  PipelinedBuild(const Builder& builder, const Pipe& s, int stages)
      : b(builder),
        spec(s),
        pp(stages),
        P(builder.cluster_.num_ranks),
        rpn(builder.cluster_.ranks_per_node),
        c(builder.cost_.group_overhead),
        lead(s.lead.kind == LeadRule::None ? 0 : s.lead.count),
        S(static_cast<std::size_t>(P), 0.0),
        M(static_cast<std::size_t>(P), 0.0),
        rings_on(static_cast<std::size_t>(P), 0),
        bins(static_cast<std::size_t>(P)),
        pre(static_cast<std::size_t>(P)) {}

  double est(std::size_t r) const { return (S[r] + (pp - 1) * M[r]) / pp; }
  double bin_time(const Bin& x) const { return x.seqs.empty() ? 0.0 : x.work + c; }
  void refresh(std::size_t r) {
    S[r] = ring_s[r], M[r] = ring_m[r];
    for (const auto& x : bins[r]) S[r] += bin_time(x), M[r] = std::max(M[r], bin_time(x));
  }

  // 1. rings, largest area first (isolate: the slowest go first and keep their ranks from other rings). A rank's
  // placement key orders lexicographically by weights far above any estimate (seconds): reserved ranks last, then
  // (align) fewer rings first, then the least estimate.
  static constexpr double kPerRing = 1e6, kReserved = 1e12;
  void place_rings(std::vector<Ring> rings) {
    std::stable_sort(rings.begin(), rings.end(), [](const Ring& x, const Ring& y) { return x.t * x.d > y.t * y.d; });
    double slowest = 0.0;
    for (const auto& ring : rings) slowest = std::max(slowest, ring.t);
    auto critical = [&](const Ring& r) { return spec.isolate && r.t >= b.tuning_.isolate * slowest; };
    std::stable_partition(rings.begin(), rings.end(), critical);
    if (spec.fixed) rings.insert(rings.begin(), spec.fixed->begin(), spec.fixed->end());
    std::vector<double> key(static_cast<std::size_t>(P), 0.0);
    std::vector<char> reserved(static_cast<std::size_t>(P), 0);
    if (!rings.empty()) {
      NodePicker picker(P, rpn, b.rings_);
      for (const auto& ring : rings) {
        std::vector<int> ranks;
        if (ring.at >= 0)
          for (int r = ring.at; r < ring.at + ring.d; ++r) ranks.push_back(r);
        else
          ranks = picker.pick(ring.d, key);
        int round = 0;
        for (int r : ranks) round = std::max(round, rings_on[static_cast<std::size_t>(r)]);
        for (int r : ranks) {
          const auto u = static_cast<std::size_t>(r);
          S[u] += ring.t, M[u] = std::max(M[u], ring.t);
          rings_on[u] = round + 1;
          // align: ranks with fewer rings first (fewer rounds to fill with their own microbatches)
          if (critical(ring)) reserved[u] = 1;
          key[u] = (spec.align ? kPerRing * rings_on[u] : 0.0) + est(u) + (reserved[u] ? kReserved : 0.0);
        }
        for (int node = ranks.front() / rpn; node <= ranks.back() / rpn; ++node) picker.update(node, key);
        ring_groups.push_back({std::move(ranks), b.seqs_[ring.seq].id, round, ring.t});
      }
    }
    ring_s = S, ring_m = M;
  }

  // 2. shorts, longest work first, to the rank with the least estimate. Only a rank's last bin changes here, so
  // S and M are refreshed from the sum and the maximum over its earlier bins (kept as bins close), in refresh()'s
  // order of additions: the same values, without a pass over every bin per sequence.
  void pack_shorts(const std::vector<std::size_t>& shorts) {
    std::vector<double> closed_s(ring_s), closed_m(ring_m);  // over each rank's bins but its last
    for (int r = 0; r < P; ++r) {
      const auto u = static_cast<std::size_t>(r);
      for (std::size_t j = 0; j + 1 < bins[u].size(); ++j)
        closed_s[u] += bin_time(bins[u][j]), closed_m[u] = std::max(closed_m[u], bin_time(bins[u][j]));
    }
    LeastEstimate least(*this);
    for (std::size_t i : shorts) {
      const Seq& q = b.seqs_[i];
      const std::size_t r = least.top();
      auto& rb = bins[r];
      if (rb.empty() || rb.back().rows + q.rows1 > b.cap_ || bin_time(rb.back()) + q.work > spec.mu) {
        if (!rb.empty()) closed_s[r] += bin_time(rb.back()), closed_m[r] = std::max(closed_m[r], bin_time(rb.back()));
        rb.emplace_back();
      }
      b.add_to(rb.back(), i);
      S[r] = closed_s[r] + bin_time(rb.back()), M[r] = std::max(closed_m[r], bin_time(rb.back()));
      least.update(r);
    }
  }

  // The rank with the least estimate (ties: the lowest rank) as a tournament tree over the ranks: one pass up the
  // tree per changed estimate, the same choice a heap of (estimate, rank) pairs makes.
  struct LeastEstimate {
    const PipelinedBuild& pb;
    std::size_t leaves = 1;
    std::vector<double> key;        // per leaf: its rank's estimate (infinite past the last rank)
    std::vector<std::size_t> node;  // per tree node (1-based): the leaf with the least key below it
    explicit LeastEstimate(const PipelinedBuild& build) : pb(build) {
      const auto n = static_cast<std::size_t>(pb.P);
      while (leaves < n) leaves *= 2;
      key.assign(leaves, std::numeric_limits<double>::infinity());
      node.assign(2 * leaves, 0);
      for (std::size_t r = 0; r < n; ++r) key[r] = pb.est(r);
      for (std::size_t l = 0; l < leaves; ++l) node[leaves + l] = l;
      for (std::size_t v = leaves - 1; v >= 1; --v) node[v] = pick(node[2 * v], node[2 * v + 1]);
    }
    std::size_t pick(std::size_t a, std::size_t b) const { return key[b] < key[a] ? b : a; }  // a < b: ties to a
    std::size_t top() const { return node[1]; }
    void update(std::size_t r) {
      key[r] = pb.est(r);
      for (std::size_t v = (leaves + r) / 2; v >= 1; v /= 2) node[v] = pick(node[2 * v], node[2 * v + 1]);
    }
  };

  // 3. move one sequence from the rank with the largest estimate to the rank with the smallest; false if none helps
  bool move_once() {
    std::size_t hi = 0, lo = 0;
    for (std::size_t r = 1; r < S.size(); ++r) {
      if (est(r) > est(hi)) hi = r;
      if (est(r) < est(lo)) lo = r;
    }
    const double cur = est(hi);
    for (std::size_t bi = 0; bi < bins[hi].size(); ++bi)
      for (std::size_t k = 0; k < bins[hi][bi].seqs.size(); ++k) {
        const Seq& q = b.seqs_[bins[hi][bi].seqs[k]];
        // try the receiver's microbatch with the most room, else a new one
        auto& lb = bins[lo];
        std::size_t into = lb.size();
        for (std::size_t j = 0; j < lb.size(); ++j)
          if (lb[j].rows + q.rows1 <= b.cap_ && bin_time(lb[j]) + q.work <= spec.mu &&
              (into == lb.size() || lb[j].work < lb[into].work))
            into = j;
        // the estimates after the move, without performing it
        const double old_bt = bin_time(bins[hi][bi]);
        const double new_bt = bins[hi][bi].seqs.size() == 1 ? 0.0 : old_bt - q.work;
        double m_hi = std::max(ring_m[hi], new_bt);
        for (std::size_t j = 0; j < bins[hi].size(); ++j)
          if (j != bi) m_hi = std::max(m_hi, bin_time(bins[hi][j]));
        const double s_hi = S[hi] - old_bt + new_bt;
        const bool fresh = into == lb.size();
        const double into_bt = (fresh ? c : bin_time(lb[into])) + q.work;
        const double s_lo = S[lo] + q.work + (fresh ? c : 0.0);
        const double m_lo = std::max(M[lo], into_bt);
        if (std::max(s_hi + (pp - 1) * m_hi, s_lo + (pp - 1) * m_lo) / pp < cur - 1e-12) {
          if (fresh) lb.emplace_back();
          b.move_item(bins[hi][bi], k, lb[into]);
          refresh(hi), refresh(lo);
          std::erase_if(bins[hi], [](const Bin& x) { return x.seqs.empty(); });
          return true;
        }
      }
    return false;
  }

  // Lead microbatches of rank r: `lead` bins packed (largest first) from its own sequences, each of about `unit`
  // (Fraction) or rising geometrically by the profile ratio towards `unit` (Profile; a bin that nothing fits takes
  // the rank's lightest sequence). The rest stay in their bins.
  void take_leads(int r, double u) {
    auto& rb = bins[static_cast<std::size_t>(r)];
    const bool profile = spec.lead.kind == LeadRule::Profile;
    std::vector<std::pair<std::size_t, std::size_t>> items;  // (bin, position), largest work first
    for (std::size_t j = 0; j < rb.size(); ++j)
      for (std::size_t k = 0; k < rb[j].seqs.size(); ++k) items.push_back({j, k});
    std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
      return b.seqs_[rb[x.first].seqs[x.second]].work > b.seqs_[rb[y.first].seqs[y.second]].work;
    });
    auto seq_of = [&](std::size_t i) { return rb[items[i].first].seqs[items[i].second]; };
    std::vector<char> taken(items.size(), 0);
    for (int l = 0; l < lead; ++l) {
      Bin nb;
      double room = (profile ? u * std::pow(spec.lead.value, lead - l) : u) - c;
      for (std::size_t i = 0; i < items.size(); ++i) {
        const Seq& q = b.seqs_[seq_of(i)];
        if (taken[i] || q.work > room || nb.rows + q.rows1 > b.cap_) continue;
        b.add_to(nb, seq_of(i));
        room -= q.work, taken[i] = 1;
      }
      for (std::size_t i = items.size(); profile && nb.seqs.empty() && i-- > 0;)
        if (!taken[i]) b.add_to(nb, seq_of(i)), taken[i] = 1;  // the lightest left (items are heaviest first)
      if (!nb.seqs.empty()) pre[static_cast<std::size_t>(r)].push_back(std::move(nb));
    }
    std::vector<Bin> rest(rb.size());
    for (std::size_t i = 0; i < items.size(); ++i)
      if (!taken[i]) b.add_to(rest[items[i].first], seq_of(i));
    for (auto& x : rest) std::sort(x.seqs.begin(), x.seqs.end());
    std::erase_if(rest, [](const Bin& x) { return x.seqs.empty(); });
    rb = std::move(rest);
  }

  // Every rank of a first-round ring runs `lead` microbatches of its own before it (Fraction: lead_frac x the ring's
  // time / lead each; Profile: every rank, rising towards its first-round ring's time, else mu). The ring then sits
  // inside the rank's list rather than first (a shorter pipeline fill), and its ranks reach it together (equal
  // prefixes). The ring moves only if every first-round ring rank got its `lead` microbatches.
  void add_leads() {
    if (lead <= 0) {
      lead = 0;
      return;
    }
    const bool profile = spec.lead.kind == LeadRule::Profile;
    std::vector<double> unit(static_cast<std::size_t>(P), profile ? spec.mu : -1.0);
    for (const auto& g : ring_groups)
      if (g.round == 0)
        for (int r : g.ranks) unit[static_cast<std::size_t>(r)] = profile ? g.t : spec.lead.value * g.t / lead;
    for (int r = 0; r < P; ++r)
      if (unit[static_cast<std::size_t>(r)] >= 0) take_leads(r, unit[static_cast<std::size_t>(r)]);
    bool ok = true;
    for (const auto& g : ring_groups)
      for (int r : g.ranks)
        if (g.round == 0 && static_cast<int>(pre[static_cast<std::size_t>(r)].size()) != lead) ok = false;
    if (!ok) {
      for (int r = 0; r < P; ++r)
        for (auto& x : pre[static_cast<std::size_t>(r)]) bins[static_cast<std::size_t>(r)].push_back(std::move(x));
      for (auto& p : pre) p.clear();
      lead = 0;
    }
  }

  // Order RiseThenFall permutes the rounds (the same on every rank, so rings stay aligned) into the shape of the best
  // split of a pipeline's work: light rounds rising, then falling.
  void permute_rounds() {
    int rounds = 0;
    for (const auto& g : ring_groups) rounds = std::max(rounds, g.round + 1);
    std::vector<int> slot_of(static_cast<std::size_t>(rounds));
    std::iota(slot_of.begin(), slot_of.end(), 0);
    if (spec.order == OwnOrder::RiseThenFall && lead == 0 && rounds > 1) {
      std::vector<double> weight(static_cast<std::size_t>(rounds), 0.0);
      for (const auto& g : ring_groups)
        weight[static_cast<std::size_t>(g.round)] = std::max(weight[static_cast<std::size_t>(g.round)], g.t);
      const auto seq = rise_then_fall(weight, pp);
      for (std::size_t i = 0; i < seq.size(); ++i) slot_of[seq[i]] = static_cast<int>(i);
    }
    for (auto& g : ring_groups) g.round = slot_of[static_cast<std::size_t>(g.round)];
  }

  // The lightest sequence of every bin with two or more, as (work, rank, bin, position): the set's first entry is
  // the one a scan of all ranks, bins and positions in order (strict <) would find. Built on the first grow().
  using Light = std::tuple<double, int, std::size_t, std::size_t>;
  std::set<Light> lights;
  std::vector<std::vector<std::optional<Light>>> light_of;  // per rank, per bin: its entry in `lights`
  bool indexed = false;

  void index_bin(int o, std::size_t j) {
    auto& e = light_of[static_cast<std::size_t>(o)][j];
    if (e) lights.erase(*e);
    e.reset();
    const Bin& x = bins[static_cast<std::size_t>(o)][j];
    if (x.seqs.size() < 2) return;
    std::size_t best = 0;
    for (std::size_t k = 1; k < x.seqs.size(); ++k)
      if (b.seqs_[x.seqs[k]].work < b.seqs_[x.seqs[best]].work) best = k;
    e = Light{b.seqs_[x.seqs[best]].work, o, j, best};
    lights.insert(*e);
  }

  void index_all() {
    light_of.assign(static_cast<std::size_t>(P), {});
    for (int o = 0; o < P; ++o) {
      light_of[static_cast<std::size_t>(o)].resize(bins[static_cast<std::size_t>(o)].size());
      for (std::size_t j = 0; j < bins[static_cast<std::size_t>(o)].size(); ++j) index_bin(o, j);
    }
    indexed = true;
  }

  // One more own microbatch for rank r: split off the lightest sequence of a multi-sequence microbatch (this rank's
  // own, else anyone's), else take the lightest microbatch of the rank with the most to spare; false if none can.
  bool grow(int r, const std::vector<int>& need) {
    if (!indexed) index_all();
    const auto u = static_cast<std::size_t>(r);
    auto& rb = bins[u];
    std::optional<Light> pick;  // this rank's own lightest first, else anyone's
    for (const auto& e : light_of[u])
      if (e && (!pick || *e < *pick)) pick = e;
    if (!pick && !lights.empty()) pick = *lights.begin();
    if (pick) {
      const auto [w, from, fb, fk] = *pick;
      Bin fresh;
      b.move_item(bins[static_cast<std::size_t>(from)][fb], fk, fresh);
      index_bin(from, fb);
      rb.push_back(std::move(fresh));
      light_of[u].emplace_back();
      return true;
    }
    int donor = -1, most = 1;
    for (int o = 0; o < P; ++o) {
      const auto v = static_cast<std::size_t>(o);
      const int spare = static_cast<int>(bins[v].size()) - std::max(need[v], 0);
      if (o != r && spare > most) donor = o, most = spare;
    }
    if (donor < 0) return false;
    auto& db = bins[static_cast<std::size_t>(donor)];
    const auto light =
        std::min_element(db.begin(), db.end(), [](const Bin& x, const Bin& y) { return x.work < y.work; });
    // no bin anywhere holds two sequences (else the split above), so no entry of `lights` moves with these bins
    light_of[static_cast<std::size_t>(donor)].erase(light_of[static_cast<std::size_t>(donor)].begin() +
                                                    (light - db.begin()));
    rb.push_back(std::move(*light));
    db.erase(light);
    light_of[u].emplace_back();
    index_bin(r, rb.size() - 1);
    return true;
  }

  // A rank needs one microbatch of its own for every list index before its last ring that holds no ring of it.
  void fill_needs() {
    std::vector<int> need(static_cast<std::size_t>(P), 0), last(static_cast<std::size_t>(P), -1);
    for (const auto& g : ring_groups)
      for (int r : g.ranks) last[static_cast<std::size_t>(r)] = std::max(last[static_cast<std::size_t>(r)], g.round);
    for (int r = 0; r < P; ++r)
      if (last[static_cast<std::size_t>(r)] >= 0)
        need[static_cast<std::size_t>(r)] =
            last[static_cast<std::size_t>(r)] + 1 + lead - static_cast<int>(pre[static_cast<std::size_t>(r)].size());
    for (const auto& g : ring_groups)
      for (int r : g.ranks) --need[static_cast<std::size_t>(r)];
    for (int r = 0; r < P; ++r)
      while (static_cast<int>(bins[static_cast<std::size_t>(r)].size()) < need[static_cast<std::size_t>(r)])
        if (!grow(r, need)) break;
  }

  // Per-rank lists: a ring of round k sits at index k + lead, the same on all its ranks, so no two ranks of a group
  // reach it at different 1F1B positions; a first-round ring's ranks run their lead microbatches before it. The
  // rank's own microbatches fill the other indices in the spec's order (docs/strategies.md).
  // What a rank runs at one list index: nothing yet, one of its own bins, a ring, or one of its lead bins.
  enum class Entry { Free, Own, Ring, Lead };
  Plan emit() const {
    std::vector<std::vector<std::pair<Entry, std::size_t>>> lists(static_cast<std::size_t>(P));  // (what, index)
    for (int r = 0; r < P; ++r)
      for (std::size_t j = 0; j < pre[static_cast<std::size_t>(r)].size(); ++j)
        lists[static_cast<std::size_t>(r)].push_back({Entry::Lead, j});
    for (std::size_t g = 0; g < ring_groups.size(); ++g)
      for (int r : ring_groups[g].ranks) {
        auto& l = lists[static_cast<std::size_t>(r)];
        const auto at = static_cast<std::size_t>(ring_groups[g].round + lead);
        if (l.size() <= at) l.resize(at + 1, {Entry::Free, 0});
        l[at] = {Entry::Ring, g};
      }
    for (int r = 0; r < P; ++r) {
      std::vector<double> w;
      for (const auto& x : bins[static_cast<std::size_t>(r)]) w.push_back(x.work);
      const std::vector<std::size_t> seq = own_order(w, spec.order, pp);
      auto& l = lists[static_cast<std::size_t>(r)];
      std::size_t k = 0;
      for (auto& slot : l)
        if (slot.first == Entry::Free && k < seq.size()) slot = {Entry::Own, seq[k++]};
      while (k < seq.size()) l.push_back({Entry::Own, seq[k++]});
    }
    std::vector<Group> groups;  // in run order, laid out in slots at the end (no pricing needed)
    std::size_t longest = 0;
    for (const auto& l : lists) longest = std::max(longest, l.size());
    for (std::size_t at = 0; at < longest; ++at)
      for (int r = 0; r < P; ++r) {
        const auto& l = lists[static_cast<std::size_t>(r)];
        if (at >= l.size()) continue;
        const auto [what, index] = l[at];
        if (what == Entry::Own || what == Entry::Lead) {
          std::vector<std::int64_t> ids =
              b.ids_of((what == Entry::Own ? bins : pre)[static_cast<std::size_t>(r)][index]);
          std::sort(ids.begin(), ids.end());
          groups.push_back({{r}, std::move(ids)});
        } else if (what == Entry::Ring && ring_groups[index].ranks.front() == r) {
          groups.push_back({ring_groups[index].ranks, {ring_groups[index].id}});
        }
      }
    return lay_out_groups(std::move(groups));
  }
};

Plan Builder::pipelined(const Pipe& spec, int pp) const {
  std::vector<std::size_t> shorts;
  std::vector<Ring> rings = pipelined_rings(spec.target, spec.mu, shorts, spec.tile);
  if (spec.fixed) {  // their sequences leave the ring and short lists; they go first
    auto is_fixed = [&](std::size_t seq) {
      return std::any_of(spec.fixed->begin(), spec.fixed->end(), [&](const Ring& f) { return f.seq == seq; });
    };
    std::erase_if(rings, [&](const Ring& r) { return is_fixed(r.seq); });
    std::erase_if(shorts, is_fixed);
  }
  PipelinedBuild pb(*this, spec, pp);
  pb.place_rings(std::move(rings));
  pb.pack_shorts(shorts);
  for (int round = 0; round < pb.P; ++round)
    if (!pb.move_once()) break;
  pb.add_leads();
  std::vector<int> fixed = pb.rings_on;
  for (int r = 0; r < pb.P; ++r)
    fixed[static_cast<std::size_t>(r)] += static_cast<int>(pb.pre[static_cast<std::size_t>(r)].size());
  if (spec.count.kind != CountRule::Free) equalize_counts(pb.bins, fixed, spec.count);
  pb.permute_rounds();
  pb.fill_needs();
  return pb.emit();
}

// Brings every rank's microbatch count (its rings plus its bins) towards the rule's count: splits the heaviest bin
// with two or more sequences (two-way LPT) while below, merges the two lightest bins that fit one rank while above.
void Builder::equalize_counts(std::vector<std::vector<Bin>>& bins, const std::vector<int>& rings_on,
                              const CountRule& rule) const {
  for (std::size_t r = 0; r < bins.size(); ++r) {
    auto& rb = bins[r];
    auto n = [&] { return static_cast<int>(rb.size()) + rings_on[r]; };
    if (n() == 0) continue;  // a rank with nothing to run keeps it that way
    const int step = rule.n;
    const int count = rule.kind == CountRule::Exactly ? rule.n : std::max(step, (n() + step / 2) / step * step);
    while (n() < count) {
      std::size_t heavy = rb.size();
      for (std::size_t j = 0; j < rb.size(); ++j)
        if (rb[j].seqs.size() >= 2 && (heavy == rb.size() || rb[j].work > rb[heavy].work)) heavy = j;
      if (heavy == rb.size()) break;
      auto [a, b] = halve(rb[heavy]);
      rb[heavy] = std::move(a);
      rb.push_back(std::move(b));
    }
    while (n() > count && rb.size() >= 2) {
      std::stable_sort(rb.begin(), rb.end(), [](const Bin& a, const Bin& b) { return a.work < b.work; });
      std::size_t x = rb.size(), y = rb.size();
      for (std::size_t i = 0; i < rb.size() && x == rb.size(); ++i)
        for (std::size_t j = i + 1; j < rb.size(); ++j)
          if (rb[i].rows + rb[j].rows <= cap_) {
            x = i, y = j;
            break;
          }
      if (x == rb.size()) break;
      for (std::size_t i : rb[y].seqs) rb[x].seqs.push_back(i);
      rb[x].rows += rb[y].rows, rb[x].work += rb[y].work;
      rb.erase(rb.begin() + static_cast<std::ptrdiff_t>(y));
    }
  }
}

}  // namespace dynacp::solve::dyn
