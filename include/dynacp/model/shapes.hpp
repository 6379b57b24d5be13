// CUDA-graph mode: the shapes a runtime captures ahead of time (PlanOptions::static_shapes).
//
// A runtime that replays captured CUDA graphs needs every microbatch group in one of a few fixed shapes: per-rank
// rows from a small set of buckets, a CP degree from a declared set, a bounded number of microbatch slots per rank
// and a bounded number of sequences per group (cu_seqlens of fixed length max_sequences + 1, empty tail entries).
// The solver plans under these constraints; the cost of the padding is a model fact, priced here in one place
// (StaticShapes::priced): padding rows are extra tokens for the linear term and the ring's KV traffic but add no
// attention work (docs/cost_model.md, "Static shapes").
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dynacp/model/plan.hpp"

namespace dynacp {

struct StaticShapes {
  /// Per-rank rows of one microbatch group, ascending, each a multiple of Cluster::seq_pad_multiple: every group's
  /// per-rank rows are padded up to the smallest bucket >= them; the largest bucket is the token capacity (it must
  /// be <= CostModel::token_capacity). Empty = no bucketing (rows as they are).
  std::vector<std::int64_t> token_buckets;
  /// Allowed CP degrees (ranks), ascending, each dividing the pool and including 1 (e.g. {1, 2, 4, 8}): every
  /// group's degree is one of them. Empty = any degree.
  std::vector<int> cp_sizes;
  /// Microbatch slots any rank takes part in per step (0 = unbounded).
  int max_microbatches = 0;
  /// Sequences per group (0 = unbounded); a group's cu_seqlens then has max_sequences + 1 entries.
  int max_sequences = 0;

  /// True when any field is set (CUDA-graph mode on).
  bool enabled() const {
    return !token_buckets.empty() || !cp_sizes.empty() || max_microbatches > 0 || max_sequences > 0;
  }
  /// The smallest bucket >= rows (rows itself when there are no buckets). Throws InvalidArgument naming rows and
  /// the buckets when rows exceed the largest.
  std::int64_t bucket_of(std::int64_t rows) const;
  /// The largest bucket, or `fallback` when there are none.
  std::int64_t max_bucket(std::int64_t fallback) const {
    return token_buckets.empty() ? fallback : token_buckets.back();
  }
  /// The largest allowed degree, or `fallback` when any degree is allowed.
  int max_cp(int fallback) const { return cp_sizes.empty() ? fallback : cp_sizes.back(); }
  /// True when degree d is allowed.
  bool allows_degree(int d) const;
  /// Throws InvalidArgument naming the bad field: buckets not ascending, not positive, not multiples of
  /// seq_pad_multiple or above the token capacity; cp_sizes not ascending, without 1, above or not dividing the pool;
  /// negative caps.
  void validate(const Cluster& cluster, const CostModel& cost) const;
  /// Throws InvalidArgument with the numbers when no plan of `batch` can meet the shapes: a sequence longer than the
  /// largest bucket x the largest CP size (once padded), more tokens than P x max_microbatches x the largest bucket,
  /// or more sequences than P x max_microbatches x max_sequences.
  void check_feasible(const Batch& batch, const Cluster& cluster, const CostModel& cost) const;
  /// Throws InvalidArgument naming the first group of `plan` outside the shapes (degree, rows, sequences) or the
  /// first rank over max_microbatches slots.
  void check_plan(const Plan& plan, const Batch& batch, const Cluster& cluster) const;

  /// The stats a group of per-rank `rows` on degree d is priced with: tokens raised by (bucket_of(rows) - rows) * d
  /// (padding rows: linear work and ring traffic, no attention). The one place padding is priced; identity without
  /// buckets and for rows above the largest bucket (such a plan is invalid under the shapes, but may be priced).
  GroupStats priced(GroupStats g, std::int64_t rows, int d) const {
    if (token_buckets.empty() || rows > token_buckets.back()) return g;
    g.tokens += (bucket_of(rows) - rows) * d;
    return g;
  }
  /// T of a placed group under these shapes (CostModel::group_time with priced stats).
  double group_time(const CostModel& cost, const Group& group, std::span<const GroupStats> single, const Batch& batch,
                    const Cluster& cluster) const;
  /// Padded rows the buckets add / all rows the ranks hold, over every group of `plan` (0 without buckets).
  double padding_fraction(const Plan& plan, const Batch& batch, const Cluster& cluster) const;

  std::string describe() const;
  bool operator==(const StaticShapes&) const = default;
};

}  // namespace dynacp
