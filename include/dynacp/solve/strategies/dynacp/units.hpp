// The units family of dynacp's pipelined plans: rings of one fixed width whose microbatches follow the best split.
#pragma once
#include "dynacp/model/plan.hpp"

namespace dynacp::solve {

/// A pipelined plan (pp > 1) made of units: blocks of consecutive ranks, inside one node or of whole
/// nodes, whose every microbatch is one ring over the whole block (or split into rings on its halves, below). Units
/// share no group, so none waits for another and each unit's list can be scored on its own.
///
/// - Giants (`giants` > 0): the `giants` sequences slowest at their best degree, each at least target / 2 there,
///   get blocks of their own at the end of the pool, one after the other: the multiple of `width` ranks that
///   minimises max(the giant's time there, min_m h(m, pp) (W + m c) / pp) with W the per-rank work of the later
///   giants and the other sequences spread over the ranks left.
/// - The other ranks form units of `width`; the other sequences are balanced onto them by their rank-time at degree
///   `width` (Karmarkar-Karp).
/// - Each unit, for every m in [1, min(32, 8 pp)], packs its sequences (largest first) into the microbatch with the
///   most time left against profile_i S / m (profile: one_f_one_b_profile(m, pp); S: the unit's per-rank time at
///   m microbatches) among those with token room, and keeps the m with the least one_f_one_b_makespan.
/// - Variable counts: while it helps (at most once per unit), one of the 4 sequences of the slowest unit whose work
///   is nearest half the gap moves to one of the two fastest units that have the memory for it, both re-packed for m
///   within 1 of their counts. Equal counts: all units take the one m with the least slowest unit; nothing moves.
/// - Split: a microbatch of several sequences becomes two rings on the halves of its unit (recursively) where that
///   is faster, and is scored by its slowest piece.
/// - Interleaving (vpp > 1): every count is a multiple of pp (m steps by pp, moves re-pack within pp of the count);
///   the lists are still packed and scored as plain 1F1B, a proxy (dynacp scores the plan with the simulator).
///
/// Returns an empty plan when the family does not apply: width neither divides ranks_per_node nor is a multiple of
/// it dividing P, some non-giant needs more than `width` ranks' memory, a giant is lighter than target / 2 or its
/// block leaves no unit, or no count (a multiple of pp under vpp > 1; one for all units under equal counts) suits every
/// unit. Throws InvalidArgument on width, pp or vpp < 1 or giants < 0.
Plan profile_units(const Batch& batch, const Cluster& cluster, const CostModel& cost, int width, int pp,
                   bool equal_counts, int giants = 0, double target = 0.0, int vpp = 1);

}  // namespace dynacp::solve
