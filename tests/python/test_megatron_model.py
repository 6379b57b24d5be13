"""A real megatron.core GPTModel trained through dynacp at any per-microbatch CP size (CPU, gloo, 4 processes).

Gradient equivalence: GPTModel (RoPE or learned-absolute positions, GQA 4/2 heads, 2 layers, fp32) built from
`gpt_layer_spec(get_gpt_layer_local_spec())` trains 3 SGD steps through Megatron-LM main's `wrap_data_iterator`
(dynacp's plan: rings of 1, 2, 3 and 4 ranks), Megatron's per-token loss, Megatron's DistributedDataParallel and
`finalize_model_grads`; every step's loss and every parameter's gradient equal a single-process reference over the
whole global batch -- the stock local spec (Megatron's DotProductAttention), one sequence per forward -- within 1e-5.
Also: TransformerEngine's attention kind (a stand-in with TE's method names) is pointed at every microbatch's ring on
every layer; clear errors for missing pieces; examples/megatron_gpt.py under torchrun.

Run: DYNACP_EXT_DIR=$PWD/build/python PYTHONPATH=$PWD/python python3 -m pytest -q tests/python/test_megatron_model.py
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gloo_workers import PG_TIMEOUT_S, run_workers
from megatron_testing import megatron_core_installed, require_megatron_core  # noqa: F401 (autouse fixture)
from script_loader import ROOT, load_script

RTOL = 1e-5
VOCAB = 64
CAPACITY = 8  # tokens one rank holds: the 4-rank pool takes rings of 1-4 ranks on these batches
BATCHES = [  # lengths of the 3 global batches (12 sequences, 3 per rank)
    [29, 21, 14, 9, 5, 3, 2, 7, 12, 4, 6, 1],
    [24, 3, 17, 10, 6, 1, 11, 15, 2, 8, 13, 4],
    [30, 8, 5, 19, 2, 9, 12, 3, 7, 16, 1, 6],
]
PER_RANK = 3
LR = 0.5
POSITIONS = ("rope", "learned_absolute")






def global_batch(step: int) -> list[dict]:
    """Deterministic samples of one global batch (a few loss-mask zeros), in pool-rank-major order."""
    g = torch.Generator().manual_seed(100 + step)
    out = []
    for n in BATCHES[step]:
        x = torch.randint(0, VOCAB, (n + 1,), generator=g)
        out.append({"tokens": x[:-1], "labels": x[1:], "loss_mask": (torch.rand(n, generator=g) > 0.15).float()})
    return out


def _example():
    return load_script("examples/megatron_gpt.py")


def _child_env() -> dict:
    """The environment of a child Python that imports the same dynacp as this process (the installed package in CI,
    the source tree with DYNACP_EXT_DIR locally)."""
    import dynacp

    path = [str(Path(dynacp.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _sgd(model: torch.nn.Module, grads: dict) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(grads[name], alpha=-LR)


# ---------------------------------------------------------------------------------------------------------------------
# the single-process reference: Megatron's own local spec, one sequence per forward


def reference_run(position_embedding_type: str, init: dict) -> list[dict]:
    """3 SGD steps of the stock-spec GPTModel over the whole global batches: per step the per-token loss and every
    parameter's gradient. Megatron's DotProductAttention forks the CUDA RNG tracker around its (zero) dropout, so the
    tracker is Megatron's no-op inference tracker, and its causal mask is passed explicitly (its default mask is
    created with device='cuda')."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    model = _example().build_model(position_embedding_type, VOCAB, 4 * CAPACITY, spec=get_gpt_layer_local_spec())
    model.load_state_dict(init)
    out = []
    for step in range(len(BATCHES)):
        model.zero_grad()
        loss_sum, count = 0.0, 0.0
        for s in global_batch(step):
            n = s["tokens"].numel()
            causal = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)[None, None]
            losses = model(s["tokens"][None], torch.arange(n)[None], causal, labels=s["labels"][None])
            loss_sum = loss_sum + (losses.reshape(-1) * s["loss_mask"]).sum()
            count += float(s["loss_mask"].sum())
        (loss_sum / count).backward()
        grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
        out.append({"loss": float(loss_sum.detach()) / count, "grads": grads})
        _sgd(model, grads)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# the dynacp run


def stand_in_data_schedule() -> types.ModuleType:
    """A stand-in for Megatron-LM main's megatron/core/datasets/data_schedule.py: its PackingSchedulerEnum and
    scheduler_map, and the dispatch of its wrap_data_iterator (which builds the scheduler from the registry with
    (max_seqlen_per_dp_cp_rank, cp_size, dp_size, microbatch_group_size_per_vp_stage) and returns its run(...))."""
    import enum

    from megatron.core import parallel_state as ps

    mod = types.ModuleType("stand_in_data_schedule")
    mod.PackingSchedulerEnum = enum.Enum("PackingSchedulerEnum", {"DP_BALANCED": "dp_balanced"})
    mod.scheduler_map = {mod.PackingSchedulerEnum.DP_BALANCED: object}

    def wrap_data_iterator(data_iterator, config, num_microbatches, pg_collection=None):
        dp_cp, dp = ps.get_data_parallel_group(with_context_parallel=True), ps.get_data_parallel_group()
        tp, pp = ps.get_tensor_model_parallel_group(), ps.get_pipeline_model_parallel_group()
        kind = mod.PackingSchedulerEnum[config.sequence_packing_scheduler.upper()]
        scheduler = mod.scheduler_map[kind](config.max_seqlen_per_dp_cp_rank, dp_cp.size() // dp.size(), dp.size(),
                                            None)
        return scheduler.run(data_iterator, num_microbatches, dp, tp, pp, dp_cp, "cpu", config)

    mod.wrap_data_iterator = wrap_data_iterator
    return mod


def _train(rank: int, position_embedding_type: str, schedule: types.ModuleType) -> tuple[list[dict], dict]:
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    import dynacp
    from dynacp.integration import Planner
    from dynacp.integration.megatron_core import (
        forward_backward_per_token,
        forward_step,
        global_loss,
        last_global_batch,
        wrap_data_iterator,
    )

    model = _example().build_model(position_embedding_type, VOCAB, 4 * CAPACITY)
    init = {k: v.detach().clone() for k, v in model.state_dict().items() if v is not None}
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
    config = model.config
    config.max_seqlen_per_dp_cp_rank = CAPACITY
    config.sequence_packing_scheduler = "dynacp"
    config.dynacp_planner = Planner(timeout=PG_TIMEOUT_S, cluster=dynacp.Cluster(
        num_ranks=4, ranks_per_node=4, tokens_per_rank=CAPACITY))
    stream = iter([s for step in range(len(BATCHES)) for s in global_batch(step)[rank * PER_RANK:][:PER_RANK]])
    steps = []
    for step in range(len(BATCHES)):
        # step 0 through the stand-in's registry dispatch (Megatron's own wrap_data_iterator), then dynacp's
        wrap = schedule.wrap_data_iterator if step == 0 else wrap_data_iterator
        it, num_mb, s1, s2 = wrap(stream, config, PER_RANK)
        ddp.zero_grad_buffer()
        reports = forward_backward_per_token(forward_step, it, ddp, num_mb)
        grads = {k: p.main_grad.detach().clone() for k, p in model.named_parameters()}
        batch = last_global_batch(stream)
        steps.append({"loss": global_loss(reports, ps.get_data_parallel_group(with_context_parallel=True)),
                      "grads": grads, "rings": sorted({len(r) for r in batch.rings}), "num_mb": num_mb,
                      "tuple": (type(num_mb).__name__, type(s1).__name__, type(s2).__name__, s1, s2)})
        _sgd(model, grads)
    return steps, init


def _worker(rank: int, world: int) -> dict:
    """One spawn for every gloo check (megatron-core's import dominates a spawn): the training runs, then the TE
    kind's run."""
    from dynacp.integration.megatron_core import cpu_shim, register_packing_scheduler

    with cpu_shim():
        from megatron.core import parallel_state as ps

        ps.initialize_model_parallel()
        schedule = stand_in_data_schedule()
        assert register_packing_scheduler(schedule)
        out = {}
        for pos in POSITIONS:
            steps, init = _train(rank, pos, schedule)
            out[pos] = {"steps": steps, "reference": reference_run(pos, init) if rank == 0 else None}
        out["te"] = _te_run(rank)
        return out


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    require_megatron_core()  # module-scoped fixtures run before the autouse one
    return run_workers(_worker, world=4, deadline=480)


@pytest.mark.parametrize("position_embedding_type", POSITIONS)
def test_gpt_model_trains_like_the_single_process_reference(runs, position_embedding_type) -> None:
    reference = runs[0][position_embedding_type]["reference"]
    runs = [r[position_embedding_type]["steps"] for r in runs]
    sizes, worst = set(), 0.0
    for step, lengths in enumerate(BATCHES):
        sizes.update(runs[0][step]["rings"])
        assert all(r[step]["rings"] == runs[0][step]["rings"] for r in runs), "ranks disagree on the plan"
        # Megatron-LM main's 4-tuple: (iterator, int, float, float), sums over the real lengths
        assert runs[0][step]["tuple"] == ("int", "float", "float", float(sum(lengths)),
                                          float(sum(n * n for n in lengths)))
        for r, run in enumerate(runs):
            assert run[step]["loss"] == pytest.approx(reference[step]["loss"], rel=RTOL), (step, r)
            for name, ref in reference[step]["grads"].items():
                err = _rel_err(run[step]["grads"][name], ref)
                assert err < RTOL, f"{position_embedding_type} step {step} rank {r} grad {name}: rel err {err:.2e}"
                worst = max(worst, err)
    assert sizes == {1, 2, 3, 4}, f"ring sizes seen: {sorted(sizes)}"
    print(f"[{position_embedding_type}] ring sizes {sorted(sizes)}, microbatches/rank per step "
          f"{[[r[s]['num_mb'] for r in runs] for s in range(len(BATCHES))]}, worst gradient rel err {worst:.1e}")


# ---------------------------------------------------------------------------------------------------------------------
# kind="te": TransformerEngine's attention pointed at each microbatch's ring, on every layer


class StandInTEAttention(torch.nn.Module):
    """TransformerEngine's DotProductAttention as Megatron's TE spec uses it: constructed with Megatron's core-attention
    arguments, a class-level ``cp_stream``, ``set_context_parallel_group(cp_group, cp_global_ranks, cp_stream,
    cp_comm_type)``; its forward records what it was last set to (TE itself cannot be installed here)."""

    cp_stream = "stand-in stream"
    calls: list = []

    def __init__(self, config, layer_number, attn_mask_type, attention_type, **_):
        super().__init__()
        self.layer_number = layer_number
        self.current = None

    def set_context_parallel_group(self, cp_group, cp_global_ranks, cp_stream, cp_comm_type):
        self.current = (None if cp_group is None else dist.get_process_group_ranks(cp_group), list(cp_global_ranks),
                        cp_stream, cp_comm_type)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        StandInTEAttention.calls.append((self.layer_number, self.current, packed_seq_params.local_cp_size))
        return query.reshape(query.shape[0], -1) * 0


def _te_run(rank: int) -> list[dict]:
    """The TE kind with the stand-in on per-ring groups (``cp_groups="lazy"``), forward only: what each layer was set
    to for each microbatch, by RingSelfAttention and by set_te_context_parallel."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    import dynacp
    from dynacp.integration import Planner, make_process_groups
    from dynacp.integration.megatron_core import gpt_layer_spec, megatron_inputs, set_te_context_parallel
    from dynacp.integration.megatron_core import wrap_data_iterator as main_wrap

    spec = gpt_layer_spec(get_gpt_layer_local_spec(), kind="te", te_module=StandInTEAttention)
    model = _example().build_model("rope", VOCAB, 4 * CAPACITY, spec=spec)
    config = model.config
    config.max_seqlen_per_dp_cp_rank = CAPACITY
    config.dynacp_groups = make_process_groups(cp_groups="lazy", timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    config.dynacp_planner = Planner(timeout=PG_TIMEOUT_S, cluster=dynacp.Cluster(
        num_ranks=4, ranks_per_node=4, tokens_per_rank=CAPACITY))
    stream = iter(global_batch(0)[rank * PER_RANK:][:PER_RANK])
    it, _, _, _ = main_wrap(stream, config, PER_RANK)
    seen = []
    for mb in it:
        StandInTEAttention.calls = []
        x = megatron_inputs(mb)
        model(x["input_ids"], x["position_ids"], None, labels=x["labels"], packed_seq_params=x["packed_seq_params"])
        manual = set_te_context_parallel(model, mb, cp_stream="manual stream")
        seen.append({"ring": [config.dynacp_groups.pool_ranks[i] for i in mb["ring"]], "calls": StandInTEAttention.calls,
                     "manual": [(m.current[1], m.current[2]) for m in model.modules()
                                if isinstance(m, StandInTEAttention)], "set": manual})
    return seen


def test_te_kind_points_every_attention_module_at_each_microbatchs_ring(runs) -> None:
    sizes = set()
    for seen in (r["te"] for r in runs):
        assert seen, "every rank runs microbatches"
        for mb in seen:
            ring = mb["ring"]
            sizes.add(len(ring))
            assert [c[0] for c in mb["calls"]] == [1, 2], "both layers ran"
            for _, (group_ranks, global_ranks, stream, comm), cp in mb["calls"]:
                assert global_ranks == ring and cp == len(ring)
                assert group_ranks == (ring if len(ring) > 1 else None)  # the ring's own group, in ring order
                assert stream == StandInTEAttention.cp_stream and comm == "p2p"
            assert mb["set"] == 2 and mb["manual"] == [(ring, "manual stream")] * 2
    assert sizes == {1, 2, 3, 4}


# ---------------------------------------------------------------------------------------------------------------------
# errors naming the missing piece


def test_missing_megatron_core_is_named() -> None:
    code = ("import sys; sys.modules['megatron'] = None\n"
            "import dynacp.integration.megatron_core as mc\n"
            "try:\n    mc.gpt_layer_spec\nexcept ImportError as e:\n    print('ERR', e)\n")
    env = _child_env()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120).stdout
    assert "ERR" in out and "needs megatron-core" in out and "pip install --no-deps megatron-core==0.16.1" in out


def test_unsupported_mask_type_and_spec_without_core_attention_slot() -> None:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
    from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

    from dynacp.integration.megatron_core import (
        DynacpCoreAttention,
        RingSelfAttention,
        core_attention_spec,
        gpt_layer_spec,
    )

    spec = get_gpt_layer_local_spec()
    spec.submodules.self_attention.params["attn_mask_type"] = AttnMaskType.arbitrary
    with pytest.raises(ValueError, match="attn_mask_type.*'arbitrary'"):
        gpt_layer_spec(spec)
    no_slot = ModuleSpec(module=TransformerLayer, submodules=TransformerLayerSubmodules())
    with pytest.raises(ValueError, match="layer spec 1 has no self_attention.submodules.core_attention slot"):
        gpt_layer_spec(TransformerBlockSubmodules(layer_specs=[get_gpt_layer_local_spec(), no_slot]))
    with pytest.raises(ValueError, match="multi-latent and cross attention are not supported"):
        gpt_layer_spec(get_gpt_layer_local_spec(multi_latent_attention=True))
    block = gpt_layer_spec(TransformerBlockSubmodules(layer_specs=[get_gpt_layer_local_spec()] * 2))
    assert [s.submodules.self_attention.module for s in block.layer_specs] == [RingSelfAttention] * 2
    assert [s.submodules.self_attention.submodules.core_attention.module for s in block.layer_specs] == [
        DynacpCoreAttention] * 2
    with pytest.raises(ValueError, match="kind must be one of"):
        core_attention_spec("flash")
    with pytest.raises(RuntimeError, match="needs TransformerEngine"):
        core_attention_spec("te")
    cfg = types.SimpleNamespace(attention_dropout=0.0)
    with pytest.raises(ValueError, match="'causal_bottom_right'"):
        DynacpCoreAttention(cfg, 1, AttnMaskType.causal_bottom_right)
    with pytest.raises(ValueError, match="attention_dropout=0.0"):
        DynacpCoreAttention(types.SimpleNamespace(attention_dropout=0.1), 1, AttnMaskType.causal)
    core = DynacpCoreAttention(cfg, 1, AttnMaskType.causal)
    q = torch.zeros(4, 2, 8)
    with pytest.raises(ValueError, match="THD packed_seq_params"):
        core(q, q, q, None, packed_seq_params=None)


# ---------------------------------------------------------------------------------------------------------------------
# the example


def test_megatron_example_runs_under_torchrun() -> None:
    env = _child_env()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", "examples/megatron_gpt.py",
           "--steps", "2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    steps = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and all("loss" in s and "ring sizes" in s for s in steps), proc.stdout
    losses = [float(s.split("loss")[1].split()[0]) for s in steps]
    assert all(0 < v < 10 for v in losses)
