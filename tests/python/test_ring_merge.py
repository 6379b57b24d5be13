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
    2x fewer bytes for every step kind with float32 block outputs (the CPU TorchBlock) and with bf16 ones except
    the gathered half step (1.9x: the bf16 -> fp32 conversion and the gather/scatter dominate)."""
    bench = _bench()
    small = {r["step"]: r for r in bench.byte_rows(64, 2, 4) if r["ob"] == "float32"}
    copy32 = small["step 0: diagonal block, every row (copy)"]
    assert copy32["after"] == 2 * 64 * 2 * 4 * 4 + 2 * 64 * 2 * 4  # out and lse: read the block's, write them
    for r in bench.byte_rows(4096, 32, 128):
        ratio = r["before"] / r["after"]
        assert ratio >= (1.9 if r["ob"] == "bfloat16" and "gathered" in r["step"] else 2.0), (r, ratio)


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
