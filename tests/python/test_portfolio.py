"""dynacp's portfolio from Python: tuning, families, threads, time limit and Ctrl-C."""

from __future__ import annotations

import _thread
import json
import threading
import time

import numpy as np
import pytest

import dynacp


def long_tailed(n: int, seed: int, cap: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.minimum(rng.lognormal(7.5, 1.4, n).astype(np.int64) + 1, cap)


def test_tuning_defaults_round_trip_and_reject_unknown_fields():
    t = dynacp.DynacpTuning()
    assert t.mu_grid >= 2 and t.skip_families == []
    t.local_search = dynacp.LocalSearchTuning(kicks=7)
    again = dynacp.DynacpTuning(**t.to_dict())

    def plain(x):  # nested configs as dicts
        return {k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in x.to_dict().items()}

    assert plain(again) == plain(t) and again.local_search.kicks == 7
    with pytest.raises(ValueError, match="local_search.kicks is -1"):
        dynacp.plan([100, 200], tuning=dynacp.DynacpTuning(local_search=dynacp.LocalSearchTuning(kicks=-1)))
    with pytest.raises(ValueError, match="has no field 'mu_gird'"):
        dynacp.DynacpTuning(mu_gird=4)
    with pytest.raises(ValueError, match="DynacpTuning.mu_grid is 1"):
        dynacp.DynacpTuning(mu_grid=1).validate()
    with pytest.raises(ValueError, match="known families: tau-scan"):
        dynacp.plan([100, 200], tuning=dynacp.DynacpTuning(skip_families=["nope"]))


def test_family_is_reported_and_survives_to_dict():
    lengths = long_tailed(200, 1, 60_000)
    p = dynacp.plan(lengths, dynacp.Cluster(num_ranks=16, ranks_per_node=4, tokens_per_rank=8192), pp=4)
    assert p.family in dynacp.dynacp_families()
    d = p.to_dict()
    assert d["family"] == p.family and d["partial"] is False
    assert dynacp.Plan.from_dict(d).family == p.family
    assert dynacp.plan(lengths, strategy="packing").family == ""


def test_threads_do_not_change_the_plan():
    cluster = dynacp.Cluster(num_ranks=32, ranks_per_node=8, tokens_per_rank=8192)
    for seed, pp in [(2, 1), (3, 4)]:
        lengths = long_tailed(300, seed, 8192 * 16)
        digests = {dynacp.plan(lengths, cluster, pp=pp, threads=t).digest() for t in (1, 2, 4)}
        assert len(digests) == 1


def test_time_limit_marks_the_plan_partial():
    lengths = long_tailed(512, 4, 16384 * 32)
    p = dynacp.plan(lengths, pp=4, time_limit=1e-6, tight_bound=False)
    assert p.partial
    p.validate(lengths, dynacp.Cluster(), dynacp.CostModel())
    with pytest.raises(ValueError, match="time_limit must be > 0"):
        dynacp.plan(lengths, time_limit=0)


def test_ctrl_c_interrupts_a_long_solve_within_half_a_second():
    # 1,024 ranks, pp = 4, GBS 16,384, one thread: a solve of seconds on this machine (GBS 8,192 came to about half a
    # second once the search got faster, and the interrupt then landed after it)
    cluster = dynacp.Cluster(num_ranks=1024, ranks_per_node=8, tokens_per_rank=16384)
    lengths = long_tailed(16384, 5, 16384 * 64)
    fired = {}

    def interrupt():
        fired["at"] = time.perf_counter()
        _thread.interrupt_main()

    timer = threading.Timer(0.5, interrupt)
    finished = None
    timer.start()
    try:
        dynacp.plan(lengths, cluster, pp=4, tight_bound=False, threads=1)
        finished = time.perf_counter()
        time.sleep(5)  # the interrupt lands here if the solve was too quick
    except KeyboardInterrupt:
        raised = time.perf_counter()
    timer.cancel()
    assert finished is None, "the solve ended before the interrupt: use a larger batch"
    assert raised - fired["at"] < 0.5


def test_cli_solver_options_and_families_in_compare_json(tmp_path, capsys):
    from dynacp.cli import main

    out = tmp_path / "plan.json"
    assert main(["plan", "--dist", "wikipedia", "--gbs", "64", "--ranks", "16", "--pp", "4", "--threads", "1",
                 "--time-limit", "30", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["family"] in dynacp.dynacp_families() and doc["partial"] is False
    capsys.readouterr()
    assert main(["compare", "--batches", "2", "--gbs", "64", "--ranks", "16", "--json", "--threads", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    wins = result["strategies"]["dynacp"]["batches_won_by_family"]
    assert sum(wins.values()) == 2 and set(wins) <= set(dynacp.dynacp_families())
    assert result["strategies"]["packing"]["batches_won_by_family"] == {}
    assert main(["plan", "--gbs", "8", "--time-limit", "0", "--out", str(out)]) == 2


def test_the_portfolio_example_runs(capsys) -> None:
    """examples/portfolio.py runs as written; its faster-inter-node pool is won by the cross-node family."""
    import runpy
    from pathlib import Path

    runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "portfolio.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "same plan True" in out and "partial True" in out
    assert "with family cross-node" in out
