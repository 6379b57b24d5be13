"""PyTorch integration of the dynacp runtime (imports torch; the rest of dynacp does not).

* :func:`ring_attention` -- zigzag ring attention over a ring of ranks of one torch.distributed group (e.g. the DP x CP
  pool: no group per ring), as an autograd function. By default it runs the Python ring loop
  (:mod:`dynacp.torch.ring_loop`: double-buffered ``batch_isend_irecv``, fp32 LSE merge, dK/dV travelling the ring)
  with a block function of the FlashAttention contract: torch ops on CPU tensors (float32/float64, gloo), the aten
  FlashAttention-2 varlen kernels on CUDA tensors (bfloat16/float16, NCCL). ``loop="cpp"`` runs the C++ ring
  executor (Eigen kernels, or the reference CUDA kernels of ``dynacp._cuda``).
* :func:`zigzag_shard` / :func:`zigzag_gather` -- move packed THD tensors between the global and the zigzag layout.
* :func:`broadcast_packing` -- ship packing metadata to pipeline stages and tensor-parallel peers.
"""

from dynacp.torch import ring_loop
from dynacp.torch.ring import (
    broadcast_packing,
    decode_packing,
    encode_packing,
    ring_attention,
    zigzag_gather,
    zigzag_shard,
)

__all__ = [
    "broadcast_packing",
    "decode_packing",
    "encode_packing",
    "ring_loop",
    "ring_attention",
    "zigzag_gather",
    "zigzag_shard",
]
