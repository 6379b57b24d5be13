"""The one shim Megatron-Core needs to train on a CPU-only torch (tests, CI, the example), and the import guard.

Megatron-Core asks ``torch.cuda.current_device()`` for a device in places that run on every training step, even when
the model was built with ``use_cpu_initialization=True``:

* ``RotaryEmbedding.get_emb`` (``models/common/embeddings/rotary_pos_embedding.py``) moves ``inv_freq`` to
  ``torch.cuda.current_device()`` whenever it is still on the CPU -- every forward on a CPU-only machine;
* ``DotProductAttention`` (the local spec's core attention) takes its score buffer from
  ``parallel_state.get_global_memory_buffer()``, whose ``get_tensor`` allocates on ``torch.cuda.current_device()``;
* ``DistributedDataParallel`` allocates its gradient buffers on ``torch.cuda.current_device()``.

On a CPU-only torch each of these raises ``AssertionError: Torch not compiled with CUDA enabled``. :func:`cpu_shim`
answers ``"cpu"`` for ``torch.cuda.current_device()`` while it is active, and nothing else: every other Megatron call
made on these paths runs on the CPU as it is. It does nothing when CUDA is available. Megatron's pipeline schedules
(``forward_backward_no_pipelining`` and the others) are *not* covered: they create their token counter with
``device="cuda"`` literally, so on the CPU :func:`~dynacp.integration.megatron_core.steps.forward_backward_per_token`
runs the same per-token steps (docs/integration.md).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

import torch

INSTALL = "pip install --no-deps megatron-core==0.16.1 'packaging>=24.2' (scripts/setup.sh does)"
"""How to install megatron-core the way CI does."""


def missing_megatron(what: str, exc: BaseException) -> ImportError:
    """The error raised when ``what`` needs megatron-core and it cannot be imported (naming the cause and the fix)."""
    return ImportError(f"{what} needs megatron-core (megatron.core), which is not importable "
                       f"({type(exc).__name__}: {exc}); install it with `{INSTALL}`")


def import_megatron_quietly() -> None:
    """Import ``megatron.core`` with its warnings about missing Transformer Engine / Apex silenced (they are
    expected on the CPU); ImportError from :func:`missing_megatron` when it is not importable."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import megatron.core  # noqa: F401
            import megatron.core.models.gpt  # noqa: F401
    except Exception as exc:  # ImportError, or megatron-core failing on import
        raise missing_megatron("dynacp's Megatron-Core model integration", exc) from exc


def _cpu_device() -> str:
    return "cpu"


@contextlib.contextmanager
def cpu_shim() -> Iterator[None]:
    """``torch.cuda.current_device()`` answers ``"cpu"`` inside the block when CUDA is not available (a no-op with
    CUDA). Wrap model construction, DDP wrapping and training in it on a CPU-only machine; see the module docstring
    for the three Megatron-Core calls it is for. Restores the original function on exit, also on error."""
    if torch.cuda.is_available():
        yield
        return
    saved = torch.cuda.current_device
    torch.cuda.current_device = _cpu_device  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.current_device = saved  # type: ignore[assignment]
