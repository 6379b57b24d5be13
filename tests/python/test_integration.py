"""Training-loop integration tests (CPU, gloo, multi-process; every multi-process run has a hard deadline).

Run: DYNACP_EXT_DIR=$PWD/build/python PYTHONPATH=$PWD/python python3 -m pytest tests/python/test_integration.py
"""

from __future__ import annotations

import ast
import datetime
import time
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import torch
import torch.distributed as dist
from gloo_workers import PG_TIMEOUT_S, run_raw, run_workers

import dynacp
from dynacp.integration import (
    DynamicCPDataIterator,
    Planner,
    allgather_kv_attention,
    finalize_grads,
    get_wrapper,
    gpt_flops,
    make_process_groups,
    masked_token_loss,
    megatron_packed_seq_params_class,
    padded_length,
    reduce_num_tokens,
    reference_attention,
    ring_attention_available,
    split_samples,
    wrap_data_iterator,
    zigzag_chunk_rows,
    zigzag_global_rows,
    zigzag_rows,
)
from dynacp.integration.layout import _python_zigzag_rows
from dynacp.integration.tiny_gpt import TinyGPT, TinyGPTConfig, microbatch_loss

RTOL = 1e-5

# Two global batches of 12 sequences on a pool of 4 ranks; capacity 16 tokens/rank forces CP degrees 1..4.
BATCHES = [
    [60, 45, 30, 20, 12, 8, 7, 5, 3, 33, 17, 9],
    [50, 3, 41, 16, 23, 1, 11, 36, 6, 19, 28, 4],  # fcp rings of 1-4 ranks once padded (issue 21)
]
CLUSTER = dict(num_ranks=4, ranks_per_node=4, activation_budget=16.0)
COST = dict(mem_per_token=1.0)
MODEL = TinyGPTConfig(vocab=53, hidden=16, heads=2, layers=2, max_positions=128)
LR = 0.5


# ---------------------------------------------------------------------------------------------------------------------
# harness


# ---------------------------------------------------------------------------------------------------------------------
# data and plans


def make_global_batch(lengths: list[int], seed: int) -> list[dict]:
    """Sequences as sample dicts (tokens, labels, loss_mask with a few zeros, position_ids)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        x = torch.randint(0, MODEL.vocab, (n + 1,), generator=g)
        mask = (torch.rand(n, generator=g) > 0.15).float()
        out.append({"tokens": x[:-1], "labels": x[1:], "loss_mask": mask, "position_ids": torch.arange(n)})
    return out


def rank_share(samples: list, rank: int, world: int) -> list:
    per = len(samples) // world
    return samples[rank * per:(rank + 1) * per]


def split_slots_plan(lengths: np.ndarray) -> dynacp.Plan:
    """Variable-count plan: the fcp plan with every multi-rank group in a slot of its own and each rank's
    single-rank groups merged into one, so ranks run different numbers of microbatches (and sit out slots)."""
    base = dynacp.plan(lengths, cluster=dynacp.Cluster(**CLUSTER), cost=dynacp.CostModel(**COST), strategy="fcp")
    d = base.to_dict()
    groups = [g for slot in d["microbatches"] for g in slot]
    singles: dict[int, list[int]] = {}
    for g in groups:
        if len(g["ranks"]) == 1:
            singles.setdefault(g["ranks"][0], []).extend(g["sequences"])
    d["microbatches"] = [[g] for g in groups if len(g["ranks"]) > 1]
    d["microbatches"].append([{"ranks": [r], "sequences": seqs} for r, seqs in sorted(singles.items())])
    return dynacp.Plan.from_dict(d)


def make_planner(kind: str, **overrides) -> Planner:
    cluster, cost = dynacp.Cluster(**CLUSTER), dynacp.CostModel(**COST)
    if kind == "pad4":  # tensor-parallel sequence parallelism at tp = 4 pads to multiples of lcm(2, 4) * cp
        cluster.seq_pad_multiple = 4
        kind = "equal"
    if kind == "variable":
        return Planner(plan_fn=split_slots_plan, cluster=cluster, cost=cost, timeout=PG_TIMEOUT_S, **overrides)
    return Planner(strategy="fcp", cluster=cluster, cost=cost, count_policy=kind, timeout=PG_TIMEOUT_S, **overrides)


def _build_model() -> TinyGPT:
    torch.manual_seed(1234)
    return TinyGPT(MODEL)


# ---------------------------------------------------------------------------------------------------------------------
# workers (module level so spawn can import them)


def _train_worker(rank: int, world: int, kind: str, impl: str, steps: int, use_megatron: Optional[bool]) -> dict:
    # dynacp's ring attention runs on the pool group (no group per ring); the all-gather oracle needs ring groups
    groups = make_process_groups(timeout=datetime.timedelta(seconds=PG_TIMEOUT_S),
                                 cp_groups="pool" if impl == "ring" else "lazy")
    data = [make_global_batch(BATCHES[s], seed=s) for s in range(steps)]
    stream = iter([sample for batch in data for sample in rank_share(batch, rank, world)])
    model = _build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    planner = make_planner(kind)
    per_step = []
    for _step in range(steps):
        it, num_mb, s1, s2 = wrap_data_iterator(stream, planner=planner, groups=groups, num_samples=3,
                                                use_megatron=use_megatron)
        gb = get_wrapper(stream).last_batch
        opt.zero_grad()
        local_loss, local_count, mbs = 0.0, 0.0, []
        for mb in it:
            p = mb["packed_seq_params"]
            loss_sum, count = microbatch_loss(model, mb, impl=impl, cp_ring=mb["cp_ring"])
            loss_sum.backward()
            local_loss += float(loss_sum.detach())
            local_count += float(count)
            mbs.append({k: mb[k] for k in ("slot", "ring", "cp_rank", "tokens", "labels", "loss_mask",
                                           "position_ids", "sequence_ids", "cu_seqlens", "cu_seqlens_padded")}
                       | {"psp_type": type(p).__module__ + "." + type(p).__qualname__,
                          "local_cp_size": p.local_cp_size, "qkv_format": p.qkv_format,
                          "cp_group_size": None if p.cp_group is None else dist.get_world_size(p.cp_group),
                          "cp_group_rank": None if p.cp_group is None else dist.get_rank(p.cp_group)})
        total = reduce_num_tokens(local_count, groups)
        finalize_grads(model.parameters(), groups, gb.num_valid_tokens)
        grads = {n: q.grad.clone() for n, q in model.named_parameters()}
        opt.step()
        per_step.append({"num_mb": num_mb, "seqlen_sum": s1, "seqlen_sq_sum": s2, "digest": gb.digest,
                         "reduced_count": float(total), "num_valid_tokens": gb.num_valid_tokens,
                         "microbatches": mbs, "grads": grads, "plan_wait_s": gb.plan_wait_s,
                         "degrees": sorted({len(r) for r in gb.rings})})
    return {"steps": per_step, "params": {n: q.detach().clone() for n, q in model.named_parameters()}}


def reference_training(steps: int) -> tuple[list[dict], dict]:
    """Single-process reference: the whole global batch packed, per-token loss normalisation, SGD."""
    model = _build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    grads_per_step = []
    for s in range(steps):
        batch = make_global_batch(BATCHES[s], seed=s)
        cu = [0]
        for b in batch:
            cu.append(cu[-1] + b["tokens"].numel())
        cat = {k: torch.cat([b[k] for b in batch]) for k in batch[0]}
        opt.zero_grad()
        logits = model(cat["tokens"], cat["position_ids"], lambda q, k, v, cu=cu: reference_attention(q, k, v, cu))
        loss_sum, count = masked_token_loss(logits, cat["labels"], cat["loss_mask"])
        (loss_sum / count).backward()
        grads_per_step.append({n: q.grad.clone() for n, q in model.named_parameters()})
        opt.step()
    return grads_per_step, {n: q.detach().clone() for n, q in model.named_parameters()}


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def check_conservation(results: list[dict], step: int, lengths: list[int]) -> None:
    """Every (sequence, position) of the global batch appears exactly once across ranks, with its data."""
    batch = make_global_batch(lengths, seed=step)
    seen: dict[tuple[int, int], int] = {}
    for r, res in enumerate(results):
        for mb in res["steps"][step]["microbatches"]:
            cp = len(mb["ring"])
            assert mb["ring"][mb["cp_rank"]] == r, "cp_rank is the ring position of this rank"
            rows = 0
            for b in range(len(mb["cu_seqlens"]) - 1):
                rows += (mb["cu_seqlens_padded"][b + 1] - mb["cu_seqlens_padded"][b]) // cp
            assert mb["tokens"].numel() == rows, "local rows = padded tokens / cp"
            for j, sid in enumerate(mb["sequence_ids"].tolist()):
                if sid < 0:
                    assert float(mb["loss_mask"][j]) == 0.0, "padding rows carry no loss"
                    continue
                pos = int(mb["position_ids"][j])
                key = (sid, pos)
                seen[key] = seen.get(key, 0) + 1
                src = batch[sid]
                assert int(mb["tokens"][j]) == int(src["tokens"][pos])
                assert int(mb["labels"][j]) == int(src["labels"][pos])
                assert float(mb["loss_mask"][j]) == float(src["loss_mask"][pos])
    expected = {(s, p) for s, n in enumerate(lengths) for p in range(n)}
    assert set(seen) == expected, f"missing {len(expected - set(seen))}, unexpected {len(set(seen) - expected)}"
    dup = [k for k, c in seen.items() if c != 1]
    assert not dup, f"tokens trained more than once: {dup[:5]}"


# ---------------------------------------------------------------------------------------------------------------------
# single-process unit tests


INTEGRATION_DIR = Path(dynacp.__file__).parent / "integration"
MAX_FUNCTION_LINES, MAX_FILE_LINES = 80, 500  # the project's limits for python/dynacp/integration (docs/development.md)


def oversized(path: Path) -> list[str]:
    """Every function of ``path`` over MAX_FUNCTION_LINES lines, and the file itself when over MAX_FILE_LINES."""
    text = path.read_text()
    lines = text.count("\n")
    out = [f"{path.name}: {lines} lines"] if lines > MAX_FILE_LINES else []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                out.append(f"{path.name}:{node.lineno} {node.name}: {n} lines")
    return out


def test_integration_modules_keep_to_the_size_limits():
    files = sorted(INTEGRATION_DIR.rglob("*.py"))  # the megatron_core package included
    names = {f.name for f in files}
    assert {"wrapper.py", "model.py"} <= names and len(files) > 15
    assert [line for f in files for line in oversized(f)] == []


def test_the_size_check_catches_a_long_function(tmp_path):
    long = tmp_path / "long.py"
    long.write_text("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES + "\n")
    assert oversized(long) == [f"long.py:1 f: {MAX_FUNCTION_LINES + 1} lines"]


def test_zigzag_layout_partitions_every_sequence():
    for n in [0, 1, 5, 8, 13, 64]:
        for cp in [1, 2, 3, 4]:
            pl = padded_length(n, cp)
            assert pl >= n and pl % (2 * cp) == 0 and pl - n < 2 * cp
            if pl:
                rows = torch.cat([zigzag_chunk_rows(pl, cp, r) for r in range(cp)])
                assert sorted(rows.tolist()) == list(range(pl))
    rows = zigzag_global_rows([0, 8, 16], 2, 0)
    assert rows.tolist() == [0, 1, 6, 7, 8, 9, 14, 15]


def test_zigzag_rows_match_runtime():
    """The integration's zigzag rows are the runtime's (delegated when its extension is built)."""
    from dynacp import _core
    cu = [0, 5, 5, 12, 13, 40]
    for cp in [1, 2, 3, 4]:
        for r in range(cp):
            py = _python_zigzag_rows(cu, cp, r)
            assert torch.equal(zigzag_rows(cu, cp, r), py)
            if hasattr(_core, "zigzag_rows"):
                assert np.array_equal(np.asarray(_core.zigzag_rows(np.asarray(cu), cp, r, None)), py.numpy())


def test_split_samples_packed_and_defaults():
    item = {"tokens": torch.arange(10), "labels": torch.arange(10) + 1, "cu_seqlens": torch.tensor([0, 3, 10])}
    parts = split_samples(item)
    assert [p["tokens"].tolist() for p in parts] == [[0, 1, 2], list(range(3, 10))]
    assert parts[1]["position_ids"].tolist() == list(range(7))
    assert parts[0]["loss_mask"].tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(KeyError):
        split_samples({"tokens": torch.arange(3)})


def test_allgather_attention_cp1_matches_reference():
    torch.manual_seed(0)
    cu = [0, 5, 12]
    q, k, v = (torch.randn(12, 2, 4, dtype=torch.float64) for _ in range(3))
    ref = reference_attention(q, k, v, cu)
    # pad each sequence to the cp=1 layout (multiple of 2) and compare the real rows
    cup = [0, 6, 14]
    rows = torch.tensor([0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12])  # padded positions of real tokens
    def pad(x):
        y = torch.zeros(14, *x.shape[1:], dtype=x.dtype)
        y[rows] = x
        return y
    out = allgather_kv_attention(pad(q), pad(k), pad(v), cu, cup, None)
    torch.testing.assert_close(out[rows], ref)


def test_gpt_flops_uses_real_lengths():
    f = gpt_flops(100, 100 * 100, num_layers=1, hidden=8, vocab=10, backward=False)
    dense = 100 * (8 * 64 + 4 * 8 * 32) + 100 * 2 * 8 * 10
    assert f == pytest.approx(dense + 4 * 8 * 10000 * 0.5)
    # two sequences of 50 have less attention work than one of 100 at equal token count
    assert gpt_flops(100, 2 * 2500, num_layers=1, hidden=8, vocab=10) < gpt_flops(100, 10000, num_layers=1,
                                                                                 hidden=8, vocab=10)


# ---------------------------------------------------------------------------------------------------------------------
# multi-process tests


@pytest.fixture(scope="module")
def reference():
    return reference_training(steps=2)


_RUNS: dict = {}


def train_run(kind: str, impl: str = "allgather") -> tuple[list[dict], float]:
    """4-rank, 2-step training run, cached per (kind, impl); the equal-count run also exercises the megatron-core
    PackedSeqParams path when megatron-core is importable."""
    key = (kind, impl)
    if key not in _RUNS:
        use_megatron = True if (kind == "equal" and megatron_packed_seq_params_class() is not None) else False
        t0 = time.perf_counter()
        res = run_workers(_train_worker, world=4, kind=kind, impl=impl, steps=2, use_megatron=use_megatron)
        _RUNS[key] = (res, time.perf_counter() - t0)
    return _RUNS[key]


@pytest.mark.parametrize("kind", ["equal", "variable"])
def test_gradient_equivalence_and_token_conservation(kind, reference):
    """Tests 1, 2 and 4: two optimizer steps on a 4-rank pool equal the single-process reference (fp32, 1e-5
    relative), every token is trained exactly once, all ranks hold the same plan."""
    ref_grads, ref_params = reference
    results, elapsed = train_run(kind)
    for step, lengths in enumerate(BATCHES):
        infos = [r["steps"][step] for r in results]
        assert len({i["digest"] for i in infos}) == 1, "plans differ across ranks"
        assert set(infos[0]["degrees"]) >= {1, 2, 3, 4}, f"CP degrees exercised: {infos[0]['degrees']}"
        counts = [i["num_mb"] for i in infos]
        if kind == "variable":
            assert len(set(counts)) > 1 or step > 0, f"variable plan should give ranks different counts: {counts}"
        else:
            assert len(set(counts)) == 1, f"equal-count plan gave counts {counts}"
        assert infos[0]["seqlen_sum"] == sum(lengths) and infos[0]["seqlen_sq_sum"] == sum(n * n for n in lengths)
        assert infos[0]["reduced_count"] == infos[0]["num_valid_tokens"], "count reduced once over DP x CP"
        check_conservation(results, step, lengths)
        if kind == "equal":  # the variable run's hand-made plan merges each rank's singles past the budget on purpose
            check_rows_within_cap(results, step, pad=2)
        for name, ref in ref_grads[step].items():
            for r, info in enumerate(infos):
                err = _rel_err(info["grads"][name], ref)
                assert err < RTOL, f"step {step} rank {r} grad {name}: rel err {err:.2e}"
    for name, ref in ref_params.items():
        for r, res in enumerate(results):
            err = _rel_err(res["params"][name], ref)
            assert err < RTOL, f"rank {r} param {name}: rel err {err:.2e}"
    print(f"[{kind}] 4 ranks, 2 steps: counts {[r['steps'][0]['num_mb'] for r in results]}, {elapsed:.1f}s")


def check_rows_within_cap(results: list, step: int, pad: int) -> None:
    """Every microbatch a rank runs holds at most the token budget in rows, padding included (issue 21: the wrapper
    once built 98-102 rows against a 96-token budget), and pads each sequence to a multiple of pad x cp."""
    cap = int(CLUSTER["activation_budget"] / COST["mem_per_token"])
    for r, res in enumerate(results):
        for mb in res["steps"][step]["microbatches"]:
            cp = len(mb["ring"])
            assert mb["tokens"].numel() <= cap, f"rank {r} slot {mb['slot']}: {mb['tokens'].numel()} rows > {cap}"
            cu = mb["cu_seqlens_padded"]
            assert all((b - a) % (pad * cp) == 0 for a, b in zip(cu, cu[1:])), f"padding of {cu} on {cp} ranks"


def test_pad_multiple_four_trains_like_the_reference(reference):
    """Cluster.seq_pad_multiple = 4 (sequence parallelism at tp = 4): the planner counts and the wrapper builds rows
    padded to multiples of 4 x cp, every microbatch stays within the budget, gradients equal the reference."""
    ref_grads, _ = reference
    results, _ = train_run("pad4")
    for step in range(len(BATCHES)):
        check_rows_within_cap(results, step, pad=4)
        for name, ref in ref_grads[step].items():
            for r, res in enumerate(results):
                err = _rel_err(res["steps"][step]["grads"][name], ref)
                assert err < RTOL, f"step {step} rank {r} grad {name}: rel err {err:.2e}"


def _mismatch_worker(rank: int, world: int, bad_rank: int) -> str:
    groups = make_process_groups(timeout=datetime.timedelta(seconds=PG_TIMEOUT_S), cp_groups="lazy")
    stream = iter(rank_share(make_global_batch(BATCHES[0], seed=0), rank, world))
    planner = make_planner("equal", async_planning=False)
    if rank == bad_rank:
        planner.strategy = "packing"
    w = DynamicCPDataIterator(stream, planner=planner, groups=groups, num_samples=3)
    w.next_global_batch()
    return "no error"


def test_plan_mismatch_fails_everywhere_within_timeout():
    """Test 3: one rank with a different strategy -> every rank raises PlanMismatchError, none hangs."""
    t0 = time.perf_counter()
    results = run_raw(_mismatch_worker, world=4, deadline=60, bad_rank=2)
    elapsed = time.perf_counter() - t0
    for r, res in enumerate(results):
        assert not res["ok"], f"rank {r} did not notice the mismatch"
        assert res["type"] == "PlanMismatchError", f"rank {r}: {res['type']}: {res['error']}"
        assert "pool rank 2" in res["error"] and "packing" in res["error"]
    assert elapsed < 60


def _pp_tp_worker(rank: int, world: int, tp: int, pp: int) -> dict:
    groups = make_process_groups(tp_size=tp, pp_size=pp, timeout=datetime.timedelta(seconds=PG_TIMEOUT_S),
                                 cp_groups="lazy")
    pool = groups.pool_size
    has_data = groups.pp_rank == 0 and groups.tp_rank == 0
    lengths = [40, 9, 30, 3, 17, 12]
    samples = rank_share(make_global_batch(lengths, seed=7), groups.pool_index, pool)
    stream = iter(samples) if has_data else None
    cluster = dynacp.Cluster(num_ranks=pool, ranks_per_node=pool, activation_budget=24.0)
    planner = Planner(strategy="fcp", cluster=cluster, cost=dynacp.CostModel(**COST), timeout=PG_TIMEOUT_S)
    w = DynamicCPDataIterator(stream, planner=planner, groups=groups, num_samples=len(samples))
    batch = w.next_global_batch()
    out = []
    for mb in batch.microbatches:
        p = mb["packed_seq_params"]
        group_sum = None
        if p.cp_group is not None:  # the CP group is this stage's own and works
            t = torch.tensor([rank])
            dist.all_reduce(t, group=p.cp_group)
            group_sum = int(t)
        out.append({"ring": mb["ring"], "cu": p.cu_seqlens_q.tolist(), "cup": p.cu_seqlens_q_padded.tolist(),
                    "max": p.max_seqlen_q, "cp": p.local_cp_size, "group_sum": group_sum,
                    "tokens": None if mb["tokens"] is None else mb["tokens"].tolist()})
    return {"pp_rank": groups.pp_rank, "tp_rank": groups.tp_rank, "pool_index": groups.pool_index,
            "pool_ranks": groups.pool_ranks, "digest": batch.digest, "num_mb": batch.num_microbatches,
            "seqlen_sum": batch.seqlen_sum, "mbs": out}


@pytest.mark.parametrize("tp,pp", [(1, 2), (2, 1)])
def test_pp_metadata_and_tp_broadcast(tp, pp):
    """Test 4 (pp > 1): a stage without data gets the packing metadata and working CP groups; TP peers get the
    same tensors as TP rank 0."""
    results = run_workers(_pp_tp_worker, world=4, deadline=120, tp=tp, pp=pp)
    by_coord = {(r["pp_rank"], r["tp_rank"], r["pool_index"]): r for r in results}
    for (ppr, _tpr, idx), r in by_coord.items():
        lead = by_coord[(0, 0, idx)]
        assert r["digest"] == lead["digest"] and r["num_mb"] == lead["num_mb"] and r["seqlen_sum"] == 111
        for mb, ref in zip(r["mbs"], lead["mbs"]):
            assert (mb["ring"], mb["cu"], mb["cup"], mb["max"], mb["cp"]) == (
                ref["ring"], ref["cu"], ref["cup"], ref["max"], ref["cp"])
            if mb["group_sum"] is not None:
                assert mb["group_sum"] == sum(r["pool_ranks"][i] for i in mb["ring"])
            if ppr == 0:
                assert mb["tokens"] == ref["tokens"], "TP peers receive TP rank 0's tensors"
            else:
                assert mb["tokens"] is None, "stages without data get metadata only"


def test_megatron_packed_seq_params():
    """Test 5: with megatron-core importable, microbatches carry megatron.core PackedSeqParams."""
    if megatron_packed_seq_params_class() is None:
        import dynacp.integration.packed as packed
        print(f"SKIP reason: megatron-core not importable ({packed.MEGATRON_IMPORT_ERROR})")
        pytest.skip(f"megatron-core not importable: {packed.MEGATRON_IMPORT_ERROR}")
    results, _ = train_run("equal")
    n = 0
    for res in results:
        for mb in res["steps"][0]["microbatches"]:
            assert mb["psp_type"] == "megatron.core.packed_seq_params.PackedSeqParams"
            assert mb["qkv_format"] == "thd" and mb["local_cp_size"] == len(mb["ring"])
            if mb["local_cp_size"] > 1:
                assert mb["cp_group_size"] == len(mb["ring"]) and mb["cp_group_rank"] == mb["cp_rank"]
            n += 1
    assert n > 0


@pytest.mark.skipif(not ring_attention_available(), reason="dynacp.torch.ring_attention not available yet")
def test_gradient_equivalence_ring_attention(reference):
    """Test 1 with the runtime's ring attention instead of the all-gather oracle."""
    ref_grads, ref_params = reference
    results, _ = train_run("variable", impl="ring")
    for name, ref in ref_params.items():
        for r, res in enumerate(results):
            err = _rel_err(res["params"][name], ref)
            assert err < RTOL, f"rank {r} param {name}: rel err {err:.2e}"
