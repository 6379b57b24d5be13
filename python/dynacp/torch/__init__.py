"""PyTorch integration of the dynacp runtime (imports torch; the rest of dynacp does not).

* :func:`ring_attention` -- zigzag ring attention over a torch.distributed group, as an autograd function that runs
  the C++ ring loop with the C++ CPU kernels (float32/float64 CPU tensors, gloo groups) or the CUDA kernels of
  ``dynacp._cuda`` (float32/bfloat16/float16 CUDA tensors, NCCL groups).
* :func:`zigzag_shard` / :func:`zigzag_gather` -- move packed THD tensors between the global and the zigzag layout.
* :func:`broadcast_packing` -- ship packing metadata to pipeline stages and tensor-parallel peers.
"""

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
    "ring_attention",
    "zigzag_gather",
    "zigzag_shard",
]
