"""Cost model and calibration: presets are reproducible from the public profiles."""

from __future__ import annotations

import csv

import pytest

import dynacp
from dynacp import _core


def test_presets_name_their_source() -> None:
    for name in dynacp.preset_names():
        m = dynacp.preset(name)
        assert m.name == name and m.source
    assert "rms relative error" in dynacp.preset("bytescale-fig6a").source
    with pytest.raises(ValueError, match="known presets"):
        dynacp.preset("nope")


def test_h100_preset_is_the_fit_of_the_shared_profile(shared_data) -> None:
    rows = [r for r in csv.DictReader(open(shared_data / "profiles" / "h100_compute-attn-H100.csv")) if r["tp"] == "1"]
    lengths = [[int(r["L"])] for r in rows]
    degrees = [int(r["cp"]) for r in rows]
    seconds = [float(r["duration_per_doc"]) * 1e-3 for r in rows]
    fit, rep = _core.fit_compute(dynacp.CostModel(), lengths, degrees, seconds)
    preset = dynacp.preset("h100-distca")
    assert fit.attn_coef * 96 == pytest.approx(preset.attn_coef, rel=1e-4)
    assert rep.samples == 44 and 0.10 < rep.rms_relative_error < 0.20


def test_link_fit_on_nccl_tests(shared_data) -> None:
    rows = [r for r in csv.DictReader(open(shared_data / "profiles" / "h100_nccl_perf.csv"))
            if r["op"] == "all_gather" and r["ngpu"] == "2"]
    nbytes = [float(r["size_bytes"]) / 2 for r in rows]
    seconds = [float(r["t_us_out"]) * 1e-6 for r in rows]
    lat, bw, rep = _core.fit_link(nbytes, seconds)
    cluster = dynacp.Cluster()
    assert bw == pytest.approx(cluster.intra_node_bandwidth, rel=0.02)
    assert lat == pytest.approx(cluster.intra_node_latency, rel=0.05)


def test_time_is_monotone_in_tokens_and_mask() -> None:
    cost, cluster = dynacp.CostModel(), dynacp.Cluster()
    t_short = cost.time([4096], 2, cluster)
    t_long = cost.time([8192], 2, cluster)
    t_full = cost.time([8192], 2, cluster, dynacp.Mask.FULL)
    assert t_short < t_long < t_full
    # packed sequences pay sum s^2, not (sum s)^2
    assert cost.time([4096, 4096], 1, cluster) < cost.time([8192], 1, cluster)
    assert cost.time([8192], 9, cluster) > cost.time([8192], 9, cluster, crosses_nodes=False)


def test_hop_tables_default_to_the_clusters_links() -> None:
    """Without hop tables every ring reads the Cluster's link fields (the classic T_comm); with one, the table's value
    at the ring size, and T changes only on that link."""
    cluster = dynacp.Cluster(num_ranks=16, ranks_per_node=8)
    cost = dynacp.CostModel()
    assert not cost.has_hop_tables and cost.intra_node_hops == [] and cost.node_overhead == 0.0
    for d in (2, 5, 8, 16):
        assert cost.hop_latency(d, False, cluster) == cluster.intra_node_latency
        assert cost.hop_bandwidth(d, True, cluster) == cluster.inter_node_bandwidth
    slow = dynacp.CostModel(inter_node_hops=[[16, 1e-3, 1e9]])
    lengths = [4096, 1000]
    assert slow.time(lengths, 8, cluster) == cost.time(lengths, 8, cluster)  # inside a node: unchanged
    assert slow.time(lengths, 16, cluster) > cost.time(lengths, 16, cluster)
