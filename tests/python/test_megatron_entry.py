"""Megatron-LM main's sequence-packing entry point backed by dynacp (single process): main's signatures and tuple,
the scheduler_map / PackingSchedulerEnum registration (a stand-in of main's data_schedule module, and megatron-core
0.16.1's, which has neither), Megatron items as dynacp items, a microbatch as main's 7-tuple with its padding mask,
and the ring Megatron's rotary code sees (RingCPGroup) against the whole sequence's rotary.

The gloo runs through Megatron's registry dispatch and dynacp's wrap_data_iterator are in test_megatron_model.py.
Run: DYNACP_EXT_DIR=$PWD/build/python PYTHONPATH=$PWD/python python3 -m pytest -q tests/python/test_megatron_entry.py
"""

from __future__ import annotations

import copy
import enum
import inspect
import logging
import types

import pytest
import torch
from megatron_testing import megatron_core_installed  # noqa: F401 (autouse fixture)

from dynacp.integration import CPRing, make_packed_seq_params, padded_length, zigzag_global_rows, zigzag_rows
from dynacp.integration.layout import cumulative


def _params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


E = inspect.Parameter.empty

# Megatron-LM main (NVIDIA/Megatron-LM d98e8a6, megatron/core/datasets/data_schedule.py)
MAIN_WRAP = [("data_iterator", E), ("config", E), ("num_microbatches", E), ("pg_collection", None)]
MAIN_GET_BATCH = [("data_iterator", E), ("vpp_size", None), ("mtp_on_this_rank", False), ("vp_stage", None),
                  ("pg_collection", None)]
MAIN_SCHEDULER_INIT = ["self", "max_seqlen_per_dp_cp_rank", "cp_size", "dp_size",
                       "microbatch_group_size_per_vp_stage"]
MAIN_SCHEDULER_RUN = ["self", "data_iterator", "num_microbatches", "dp_group", "tp_group", "pp_group", "dp_cp_group",
                      "dev", "config"]


def test_main_signatures() -> None:
    from dynacp.integration import megatron_core as mc

    assert _params(mc.wrap_data_iterator) == MAIN_WRAP
    assert _params(mc.get_batch_on_this_rank_for_sequence_packing) == MAIN_GET_BATCH
    assert [n for n, _ in _params(mc.DynacpPackingScheduler.__init__)] == MAIN_SCHEDULER_INIT
    assert [n for n, _ in _params(mc.DynacpPackingScheduler.run)] == MAIN_SCHEDULER_RUN


def _microbatch(lengths: list[int], cp: int, rank: int) -> dict:
    """A dynacp microbatch of ``rank`` on a ring of ``cp`` (pool indices 0..cp-1), as the wrapper yields it; token
    values are the global rows of the padded layout (-1 on padding)."""
    padded = [padded_length(n, cp) for n in lengths]
    cu, cup = cumulative(lengths), cumulative(padded)
    rows = zigzag_rows(cu, cp, rank, cup)
    return {"ring": tuple(range(cp)), "cp_rank": rank, "cu_seqlens": cu, "cu_seqlens_padded": cup,
            "max_seqlen": max(padded), "tokens": rows.clamp_min(0), "labels": rows.clamp_min(0) + 1,
            "loss_mask": (rows >= 0).float(), "position_ids": rows.clamp_min(0), "sequence_ids": rows,
            "packed_seq_params": make_packed_seq_params(cu, cup, max(padded), cp, None, use_megatron=True),
            "cp_ring": CPRing(None, tuple(range(cp)), rank), "te": None}


def test_microbatch_as_mains_seven_tuple_with_padding_mask() -> None:
    from megatron.core.packed_seq_params import PackedSeqParams

    from dynacp.integration.megatron_core import get_batch_on_this_rank_for_sequence_packing

    # lengths 5 and 2 on a 2-rank ring: padded 8 and 4; rank 1 holds chunks 1 and 2 of each: rows 2-5 of the first
    # (5 is padding) and rows 1-2 of the second (2 is padding), i.e. packed rows 2, 3, 4, -, 6, -
    mb = _microbatch([5, 2], cp=2, rank=1)
    tokens, labels, loss_mask, attention_mask, position_ids, p, padding = \
        get_batch_on_this_rank_for_sequence_packing(iter([mb]))
    assert tokens.tolist() == [[2, 3, 4, 0, 6, 0]] and labels.tolist() == [[3, 4, 5, 1, 7, 1]]
    assert padding.tolist() == [[False, False, False, True, False, True]] and padding.dtype == torch.bool
    assert loss_mask.tolist() == [[1.0, 1.0, 1.0, 0.0, 1.0, 0.0]] and attention_mask is None
    assert position_ids.shape == (1, 6) and position_ids.dtype == torch.int64
    assert isinstance(p, PackedSeqParams) and p.qkv_format == "thd"
    assert p.cu_seqlens_q.tolist() == [0, 5, 7] and p.cu_seqlens_q_padded.tolist() == [0, 8, 12]
    assert p.cu_seqlens_q.dtype == torch.int32 and p.max_seqlen_q == 8
    assert (p.local_cp_size, p.cp_rank, p.cp_ring.index) == (2, 1, 1)
    with pytest.raises(ValueError, match="data_iterator is None"):
        get_batch_on_this_rank_for_sequence_packing(None)


def stand_in_module(with_map: bool = True) -> types.ModuleType:
    """Megatron-LM main's data_schedule as far as registration reads it: PackingSchedulerEnum and scheduler_map."""
    mod = types.ModuleType("stand_in_data_schedule")
    mod.PackingSchedulerEnum = enum.Enum("PackingSchedulerEnum", {"DP_BALANCED": "dp_balanced"})
    if with_map:
        mod.scheduler_map = {mod.PackingSchedulerEnum.DP_BALANCED: "DpBalancedScheduler"}
    return mod


def test_registration_in_a_stand_in_scheduler_map() -> None:
    from dynacp.integration.megatron_core import DynacpPackingScheduler, register_packing_scheduler

    mod = stand_in_module()
    old = mod.PackingSchedulerEnum
    assert register_packing_scheduler(mod)
    new = mod.PackingSchedulerEnum
    assert [m.name for m in new] == ["DP_BALANCED", "DYNACP"] and new("dynacp") is new.DYNACP
    # main's dispatch: scheduler_map[PackingSchedulerEnum[config.sequence_packing_scheduler.upper()]]
    assert mod.scheduler_map[mod.PackingSchedulerEnum["dynacp".upper()]] is DynacpPackingScheduler
    assert mod.scheduler_map[new.DP_BALANCED] == mod.scheduler_map[old.DP_BALANCED] == "DpBalancedScheduler"
    assert register_packing_scheduler(mod) and mod.PackingSchedulerEnum is new  # idempotent
    sched = mod.scheduler_map[new.DYNACP](4096, 1, 8, None)  # the arguments main's wrap_data_iterator passes
    assert (sched.max_seqlen_per_dp_cp_rank, sched.cp_size, sched.dp_size) == (4096, 1, 8)
    assert sched.get_required_sample_keys() == ["tokens", "labels"]
    with pytest.raises(ValueError, match="context_parallel_size must be 1, got cp_size=2"):
        DynacpPackingScheduler(4096, 2, 4, None)
    with pytest.raises(ValueError, match="max_seqlen_per_dp_cp_rank"):
        DynacpPackingScheduler(None, 1, 4, None)


def test_registration_falls_back_where_there_is_no_scheduler_map(caplog) -> None:
    from megatron.core.datasets import data_schedule

    from dynacp.integration.megatron_core import register_packing_scheduler

    assert not hasattr(data_schedule, "scheduler_map")  # megatron-core 0.16.1
    with caplog.at_level(logging.INFO, logger="dynacp"):
        assert register_packing_scheduler() is False
    assert "no scheduler_map" in caplog.text and not hasattr(data_schedule, "scheduler_map")
    mod = stand_in_module(with_map=False)
    assert register_packing_scheduler(mod) is False and [m.name for m in mod.PackingSchedulerEnum] == ["DP_BALANCED"]


def test_megatron_items_become_dynacp_items() -> None:
    from dynacp.integration.megatron_core import megatron_items

    a = {"tokens": torch.arange(3)[None], "labels": torch.arange(1, 4)[None], "max_seqlen": torch.tensor([3])}
    b = {"tokens": torch.arange(10, 12), "labels": torch.arange(11, 13)}
    varlen = {"tokens": torch.arange(6), "labels": torch.arange(6), "original_seq_len": torch.tensor([4]),
              "padded_seq_len": torch.tensor([6])}
    packed = {"tokens": torch.arange(5), "labels": torch.arange(5), "cu_seqlens": torch.tensor([0, 2, 5])}
    items = list(megatron_items(iter([a, [a, b], varlen, packed])))
    assert items[0]["tokens"].tolist() == [0, 1, 2] and "max_seqlen" not in items[0]  # collate dim dropped
    assert items[1]["tokens"].tolist() == [0, 1, 2, 10, 11] and items[1]["cu_seqlens"].tolist() == [0, 3, 5]
    assert items[2]["tokens"].tolist() == [0, 1, 2, 3] and set(items[2]) == {"tokens", "labels"}
    assert items[3]["cu_seqlens"].tolist() == [0, 2, 5]
    with pytest.raises(ValueError, match="mixes packed samples"):
        list(megatron_items(iter([[a, packed]])))


def test_megatrons_rotary_sees_the_microbatch_ring() -> None:
    """Megatron's own THD rotary code on a rank's zigzag rows, with the attention's CP group a RingCPGroup bound to
    the microbatch, equals the rotary of the whole sequences taken at those rows, for every ring size and rank."""
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from dynacp.integration.megatron_core import RingCPGroup, cpu_shim, ring_packed_seq_params

    config = types.SimpleNamespace(apply_rope_fusion=False, rotary_interleaved=False, multi_latent_attention=False,
                                   mrope_section=None)
    one = types.SimpleNamespace(size=lambda: 1, rank=lambda: 0, name="static CP group")
    view = RingCPGroup(one)
    lengths = [13, 5, 1]
    with cpu_shim():
        rotary = RotaryEmbedding(kv_channels=8, rotary_percent=1.0, use_cpu_initialization=True)
        for cp in (1, 2, 3, 4):
            cup = cumulative([padded_length(n, cp) for n in lengths])
            freqs = rotary(max(b - a for a, b in zip(cup[:-1], cup[1:])), packed_seq=True)
            whole = torch.randn(cup[-1], 2, 8, generator=torch.Generator().manual_seed(cp))
            expected = apply_rotary_pos_emb(whole, freqs, config, cu_seqlens=torch.tensor(cup), cp_group=one)
            for rank in range(cp):
                rows = zigzag_global_rows(cup, cp, rank)
                p = ring_packed_seq_params(_microbatch(lengths, cp, rank), "cpu")
                with view.bind(p):
                    assert (view.size(), view.rank()) == (cp, rank)
                    got = apply_rotary_pos_emb(whole[rows], freqs, config, cu_seqlens=p.cu_seqlens_q_padded,
                                               cp_group=view)
                torch.testing.assert_close(got, expected[rows], rtol=0, atol=0)
    assert (view.size(), view.rank(), view.name) == (1, 0, "static CP group")  # unbound: the wrapped group
    bare = copy.deepcopy(RingCPGroup(None))  # models get deep-copied; a view without a group is one rank
    assert (bare.size(), bare.rank()) == (1, 0)


def test_core_attention_in_one_process_is_per_document_gqa_attention() -> None:
    """DynacpCoreAttention on a ring of one rank without torch.distributed: per document, causal or full, GQA (4
    query heads on 2 key/value heads), softmax scale as given -- against torch's scaled_dot_product_attention."""
    from megatron.core.transformer.enums import AttnMaskType

    from dynacp.integration.megatron_core import DynacpCoreAttention, ring_packed_seq_params

    lengths = [5, 1, 3]  # padded (multiples of 2 on one rank) to 6, 2, 4: 12 rows
    mb = _microbatch(lengths, cp=1, rank=0)
    p, cup = ring_packed_seq_params(mb, "cpu"), mb["cu_seqlens_padded"]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(12, h, 8, generator=g) for h in (4, 2, 2))
    for mask, causal in ((AttnMaskType.causal, True), (AttnMaskType.no_mask, False)):
        core = DynacpCoreAttention(types.SimpleNamespace(attention_dropout=0.0), 1, mask, softmax_scale=0.3)
        out = core(q, k, v, None, packed_seq_params=p)
        assert out.shape == (12, 32)
        for a, n in zip(cup[:-1], lengths):
            qs, ks, vs = (t[a:a + n].transpose(0, 1) for t in (q, k, v))
            want = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=0.3,
                                                                    enable_gqa=True).transpose(0, 1)
            torch.testing.assert_close(out[a:a + n].reshape(n, 4, 8), want, rtol=1e-5, atol=1e-6)
