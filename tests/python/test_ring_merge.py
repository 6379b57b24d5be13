"""The ring loop's LSE merge (copy at the first block, two-pass merge after) against the merge it replaced, its
byte counts (benchmarks/ring_merge.py), the row ranges it slices, and the FlashAttention op schemas FlashBlock
calls: the installed torch's and the recorded texts of torch 2.11 and 2.13."""

from __future__ import annotations

import numpy as np
import pytest
from script_loader import load_script

torch = pytest.importorskip("torch")
from dynacp.torch import ring_loop  # noqa: E402

# Recorded from torchgen/packaged/ATen/native/native_functions.yaml of the torch 2.11.0 wheel
# (torch-2.11.0-cp312-cp312-manylinux_2_28_aarch64.whl, torch.version.git_version 70d99e998b4955e0049d13a98d77ae1b14db1f45).
TORCH_2_11_FORWARD = (
    "aten::_flash_attention_forward(Tensor query, Tensor key, Tensor value, Tensor? cum_seq_q, Tensor? cum_seq_k, "
    "SymInt max_q, SymInt max_k, float dropout_p, bool is_causal, bool return_debug_mask, *, float? scale=None, "
    "SymInt? window_size_left=None, SymInt? window_size_right=None, Tensor? seqused_k=None, "
    "Tensor? alibi_slopes=None) -> (Tensor output, Tensor softmax_logsumexp, Tensor rng_state, Tensor unused, "
    "Tensor debug_attn_mask)")
TORCH_2_11_BACKWARD = (
    "aten::_flash_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, "
    "Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p, "
    "bool is_causal, Tensor rng_state, Tensor unused, *, float? scale=None, SymInt? window_size_left=None, "
    "SymInt? window_size_right=None) -> (Tensor, Tensor, Tensor)")
# Printed by torch 2.13.0+cpu (torch.ops.aten._flash_attention_forward.default._schema): two more keywords.
TORCH_2_13_FORWARD = TORCH_2_11_FORWARD.replace(
    "Tensor? alibi_slopes=None)", "Tensor? alibi_slopes=None, Tensor? block_table=None, int? num_splits=None)")
TORCH_2_13_BACKWARD = TORCH_2_11_BACKWARD
RECORDED = {"2.11": (TORCH_2_11_FORWARD, TORCH_2_11_BACKWARD), "2.13": (TORCH_2_13_FORWARD, TORCH_2_13_BACKWARD)}


def _bench():
    return load_script("benchmarks/ring_merge.py")


def _case(seed: int, tokens: int = 40, heads: int = 3, dim: int = 5, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(tokens, heads, dim, generator=g, dtype=dtype)
    lse = torch.randn(tokens, heads, generator=g, dtype=dtype) * 4
    lse[::7, 1] = float("-inf")  # rows not reached yet
    return g, out, lse


@pytest.mark.parametrize("everything", [True, False])
def test_merge_equals_the_merge_it_replaced(everything):
    """Within 1e-12 in fp64 (1e-6 in fp32), with -inf block rows (skipped) and accumulator rows not reached yet."""
    bench = _bench()
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        g, out, lse = _case(1, dtype=dtype)
        idx = torch.arange(out.shape[0]) if everything else torch.tensor([0, 3, 4, 5, 9, 10, 11, 12, 30, 39])
        ob = torch.randn(len(idx), 3, 5, generator=g, dtype=dtype)
        lb = torch.randn(len(idx), 3, generator=g, dtype=dtype) * 4
        lb[1::3, 0] = float("-inf")
        want_o, want_l = out.clone(), lse.clone()
        bench.merge_before(want_o, want_l, idx, ob, lb, everything)
        runs = ring_loop.row_runs(idx.numpy())
        for r in (None, runs):
            got_o, got_l = out.clone(), lse.clone()
            ring_loop.merge_block(got_o, got_l, idx, ob, lb, everything, first=False, runs=r)
            assert torch.equal(torch.isinf(got_l), torch.isinf(want_l))
            fin = torch.isfinite(want_l)
            assert float((got_l[fin] - want_l[fin]).abs().max()) <= tol
            assert float((got_o - want_o).abs().max()) <= tol * (1 + float(want_o.abs().max()))


def test_first_block_is_a_copy_and_equals_merging_into_empty_accumulators():
    bench = _bench()
    g = torch.Generator().manual_seed(2)
    idx = torch.tensor([2, 3, 4, 8, 9])
    ob, lb = torch.randn(5, 2, 4, generator=g).bfloat16(), torch.randn(5, 2, generator=g)
    want_o, want_l = torch.zeros(10, 2, 4), torch.full((10, 2), float("-inf"))
    bench.merge_before(want_o, want_l, idx, ob, lb)
    for runs in (None, ring_loop.row_runs(idx.numpy())):
        got_o, got_l = torch.zeros(10, 2, 4), torch.full((10, 2), float("-inf"))
        ring_loop.merge_block(got_o, got_l, idx, ob, lb, first=True, runs=runs)
        assert torch.equal(got_o, want_o) and torch.equal(got_l, want_l)


def test_row_runs():
    assert ring_loop.row_runs(np.array([3, 4, 5, 9, 10, 12])) == ((3, 6), (9, 11), (12, 13))
    assert ring_loop.row_runs(np.arange(7)) == ((0, 7),)
    assert ring_loop.row_runs(np.array([1, 3, 5]), max_runs=2) is None
    assert ring_loop.row_runs(np.array([], dtype=np.int64)) is None


def test_specs_mark_first_reaching_blocks():
    """Step 0 reaches every valid row first (a copy); later steps merge; the first blocks cover every row when
    there is no padding, so the forward skips the zero / -inf initialisation."""
    cu = np.array([0, 16, 32, 48], dtype=np.int64)
    for rank in range(4):
        specs = ring_loop.build_specs(cu, cu, 4, rank, [True, False, True], torch.device("cpu"))
        assert all(s.first for s in specs[0]) and not any(s.first for step in specs[1:] for s in step)
        assert sum(s.q_idx.numel() for s in specs[0]) == 12
        assert all(s.q_runs is not None for step in specs for s in step)  # 3 documents: at most 6 ranges


def test_counted_bytes_per_step_before_and_after():
    """An exact count on a small shape (T = 64, H = 2, D = 4; 4 bytes a float32), then, at H = 32, D = 128, at least
    2x fewer bytes for every step kind with float32 block outputs (the CPU TorchBlock) and with bf16 ones (the
    FlashBlock's), the half step of many documents included (its rows are merged in place through indexed ops)."""
    bench = _bench()
    small = {r["step"]: r for r in bench.byte_rows(64, 2, 4) if r["ob"] == "float32"}
    copy32 = small["step 0: diagonal block, every row (copy)"]
    assert copy32["after"] == 2 * 64 * 2 * 4 * 4 + 2 * 64 * 2 * 4  # out and lse: read the block's, write them
    rows = bench.byte_rows(4096, 32, 128)
    assert len(rows) == 8
    for r in rows:
        ratio = r["before"] / r["after"]
        assert ratio >= 2.0, (r, ratio)
        if "indexed" in r["step"]:
            assert ratio >= (2.4 if r["ob"] == "bfloat16" else 2.05), (r, ratio)


def test_scattered_rows_are_merged_in_place_without_moving_full_rows():
    """The merge of rows in more than ``max_runs`` ranges moves no ``[n, H, D]`` row through a gather or a scatter
    and makes no fp32 copy of a bf16 block output: its only full-size ops are the in-place ``index_reduce_`` and
    ``index_add_`` and the product ``w * ob`` (read in bf16); the indexed ops it issues touch ``[n, H]`` rows."""
    bench = _bench()
    tokens, heads, dim = 256, 4, 8
    _, after = bench.step_functions(bench.STEPS[3], tokens, heads, dim, torch.bfloat16, "meta")
    counter = bench.count(after)
    full = tokens // 2 * heads * dim * 4  # the merged rows of out, fp32
    big = [(name, r, w) for name, r, w in counter.ops if max(r, w) >= full]
    assert [name for name, _, _ in big] == ["index_reduce_", "mul", "index_add_"], counter.ops
    assert dict((n, (r, w)) for n, r, w in big)["mul"][0] < full  # reads the bf16 block output
    assert not [op for op in counter.ops if op[0] in ("index_select", "_to_copy", "lerp_")
                and max(op[1], op[2]) >= full], counter.ops


def test_indexed_merge_of_a_bf16_block_equals_the_merge_it_replaced():
    """The in-place indexed merge with bf16 block outputs into fp32 accumulators, against the old merge, within
    1e-6 (relative to the largest value), with -inf block rows and rows not reached yet."""
    bench = _bench()
    g, out, lse = _case(4, tokens=200, dtype=torch.float32)
    idx = torch.arange(1, 200, 2)  # 100 rows in 100 ranges: no runs
    assert ring_loop.row_runs(idx.numpy()) is None
    ob = torch.randn(len(idx), 3, 5, generator=g).bfloat16()
    lb = torch.randn(len(idx), 3, generator=g) * 4
    lb[::5, 2] = float("-inf")
    want_o, want_l = out.clone(), lse.clone()
    bench.merge_before(want_o, want_l, idx, ob, lb)
    got_o, got_l = out.clone(), lse.clone()
    ring_loop.merge_block(got_o, got_l, idx, ob, lb)
    assert torch.equal(torch.isinf(got_l), torch.isinf(want_l))
    fin = torch.isfinite(want_l)
    assert float((got_l[fin] - want_l[fin]).abs().max()) <= 1e-6
    assert float((got_o - want_o).abs().max()) <= 1e-6 * (1 + float(want_o.abs().max()))
    untouched = torch.ones(200, dtype=torch.bool)
    untouched[idx] = False
    assert torch.equal(got_o[untouched], out[untouched]) and torch.equal(got_l[untouched], lse[untouched])
    # deterministic mode (where CUDA's index_reduce_ would raise): the gather-lerp-scatter, the same values
    det_o, det_l = out.clone(), lse.clone()
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        ops = [name for name, _, _ in bench.count(lambda: ring_loop.merge_block(det_o, det_l, idx, ob, lb)).ops]
    finally:
        torch.use_deterministic_algorithms(was)
    assert "index_reduce_" not in ops and "lerp_" in ops
    assert float((det_o - got_o).abs().max()) <= 1e-6 * (1 + float(want_o.abs().max()))
    assert torch.equal(det_l, got_l)


def test_flash_schemas_of_torch_2_11_and_2_13_and_the_installed_one():
    parse = torch._C.parse_schema
    for version, (fwd, bwd) in RECORDED.items():
        assert ring_loop.flash_schema_problem(parse(fwd), parse(bwd)) is None, version
    fwd, bwd = ring_loop.installed_flash_schemas()
    assert ring_loop.flash_schema_problem(fwd, bwd) is None, (str(fwd), str(bwd))
    installed = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if installed in RECORDED:  # the recorded text is exactly what this torch prints
        assert (str(fwd), str(bwd)) == RECORDED[installed]
    changed = TORCH_2_11_BACKWARD.replace("Tensor rng_state, Tensor unused, *", "Tensor rng_state, *")
    assert "positional arguments" in ring_loop.flash_schema_problem(parse(TORCH_2_11_FORWARD), parse(changed))
    no_scale = TORCH_2_11_FORWARD.replace("float? scale=None, ", "")
    assert "scale" in ring_loop.flash_schema_problem(parse(no_scale), parse(TORCH_2_11_BACKWARD))


class _StatefulBlock:
    """TorchBlock whose forward returns a state object per call; the backward asserts it gets that same object."""

    name = "stateful"

    def __init__(self):
        self.inner, self.issued, self.seen = ring_loop.TorchBlock(), [], []

    def forward(self, q, k, v, spec, scale):
        token = object()
        self.issued.append(token)
        return (*self.inner.forward(q, k, v, spec, scale), token)

    def backward(self, dout, q, k, v, out, lse, spec, scale, state=None):
        self.seen.append(state)
        return self.inner.backward(dout, q, k, v, out, lse, spec, scale)


def test_backward_gets_the_state_its_forward_returned():
    cu = np.array([0, 24, 40], dtype=np.int64)
    g = torch.Generator().manual_seed(3)
    block = _StatefulBlock()
    for cp in (1, 2):
        shards = [tuple(torch.randn(40 // cp, 2, 8, generator=g) for _ in range(4)) for _ in range(cp)]
        block.issued.clear(), block.seen.clear()
        ring_loop.local_ring_attention(shards, cu, [True, False], block)
        assert len(block.issued) == len(block.seen) > 0
        assert {id(s) for s in block.seen} == {id(s) for s in block.issued}  # each forward's own, once each
    with pytest.raises(RuntimeError, match="rng_state, unused"):
        ring_loop.FlashBlock.backward(None, None, None, None, None, None, None, None, 1.0)


def test_ring_of_many_documents_takes_the_indexed_merge_and_matches_the_fp64_reference():
    """40 short documents (odd lengths: padding rows): the back-half blocks' q rows form more than ``max_runs``
    ranges, so the forward merges them in place through indexed ops; out matches the dense fp64 reference within
    1e-5 + 1e-5|ref| on every rank at CP 2 and 3, and padding rows stay exactly 0 / -inf."""
    from test_ring_loop import reference

    from dynacp import _core
    from dynacp.torch import zigzag_shard

    lengths = [3 + (7 * i) % 11 for i in range(40)]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flags = [i % 5 != 1 for i in range(len(lengths))]
    g = torch.Generator().manual_seed(5)
    t = int(cu[-1])
    q = torch.randn(t, 4, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(t, 2, 8, generator=g, dtype=torch.float64) for _ in range(2))
    ref = reference(q, k, v, cu, flags, 8 ** -0.5)
    for cp in (2, 3):
        cu_p = _core.zigzag_layout(cu, cp, None)
        specs = [ring_loop.build_specs(cu, cu_p, cp, r, flags, torch.device("cpu")) for r in range(cp)]
        assert any(s.q_runs is None and not s.q_all and not s.first for rank in specs for step in rank for s in step)
        shards = [tuple(zigzag_shard(x.float(), cu, cp, r) for x in (q, k, v)) for r in range(cp)]
        for r, (out, lse) in enumerate(ring_loop.local_ring_attention(shards, cu, flags, ring_loop.TorchBlock(),
                                                                      backward=False)):
            pad = torch.from_numpy(_core.zigzag_rows(cu, cp, r, None)) < 0
            want = zigzag_shard(ref, cu, cp, r)
            err = (out.double() - want).abs() - (1e-5 + 1e-5 * want.abs())
            assert float(err[~pad].max()) <= 0, (cp, r, float(err[~pad].max()))
            assert bool(torch.all(out[pad] == 0)) and bool(torch.all(lse[pad] == float("-inf")))
