// The units family of dynacp's pipelined plans: rings of one fixed width whose microbatches follow the best split.
#pragma once
#include "dynacp/model/plan.hpp"

namespace dynacp::solve {

/// A pipelined plan (pp > 1, plain 1F1B) made of P / width units of `width` consecutive ranks inside one node.
/// Sequences are balanced onto the units by their rank-time at degree `width` (Karmarkar-Karp), and every
/// microbatch of a unit is one ring over all its ranks, so no unit waits for another and each unit's ranks run
/// one list. For each m in [1, min(32, 8 pp)] a unit packs its sequences, largest first, into the microbatch with
/// the most time left against the targets profile_i S / m (profile: one_f_one_b_profile(m, pp); S: the unit's
/// per-rank time at m microbatches) among those with token room, and keeps the m whose list has the least
/// one_f_one_b_makespan. Then, while it helps, one sequence moves from the slowest unit to one of the two fastest
/// (the move that lowers the slower of the two most; both re-packed for m within 1 of their counts). With
/// `equal_counts` all units take one m, the one with the least slowest unit, and nothing moves.
/// Returns an empty plan when the family does not apply: width does not divide ranks_per_node, some sequence
/// needs more than `width` ranks' memory, or (equal_counts) some unit cannot fill that many microbatches.
/// Throws InvalidArgument on width < 1 or pp < 1.
Plan profile_units(const Batch& batch, const Cluster& cluster, const CostModel& cost, int width, int pp,
                   bool equal_counts);

}  // namespace dynacp::solve
