"""verl 0.9.1's own ``verl/utils/seqlen_balancing.py``, loaded for tests without verl's package ``__init__`` (which
imports ray, tensordict, transformers and more).

The file is executed unchanged from the installed wheel (``pip install --no-deps verl==0.9.1``, scripts/setup.sh).
Its three imports from verl that the balancing functions do not need are given small stand-ins: ``DataProto`` (not
used by them), ``tensordict_utils.index_select_tensor_dict`` (row selection of a dict of tensors, what it does for a
TensorDict) and ``device.get_device_name`` (``"cpu"``). torch is its only other dependency.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Optional

import pytest

VERL_VERSION = "0.9.1"
_STUBS = ("verl", "verl.protocol", "verl.utils", "verl.utils.tensordict_utils", "verl.utils.device")


def verl_balancing_path() -> Optional[Path]:
    """Path of the installed ``verl/utils/seqlen_balancing.py`` (``find_spec`` of a top-level package runs none of it)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "utils" / "seqlen_balancing.py"
    return path if path.exists() else None


def _select(batch, idx):
    import torch

    index = torch.tensor(idx, dtype=torch.long)
    return {k: v.index_select(0, index) for k, v in batch.items()}


def load_verl_balancing() -> types.ModuleType:
    """verl's balancing module, or a skip (a failure under CI=true, where scripts/setup.sh must have installed it)."""
    path = verl_balancing_path()
    if path is None:
        msg = f"verl {VERL_VERSION} is not installed (pip install --no-deps verl=={VERL_VERSION}; scripts/setup.sh)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    saved = {name: sys.modules.get(name) for name in _STUBS}
    try:
        for name in _STUBS:
            sys.modules[name] = types.ModuleType(name)
        sys.modules["verl.protocol"].DataProto = type("DataProto", (), {})
        sys.modules["verl.utils.tensordict_utils"].index_select_tensor_dict = _select
        sys.modules["verl.utils.device"].get_device_name = lambda: "cpu"
        sys.modules["verl"].utils = sys.modules["verl.utils"]
        sys.modules["verl.utils"].tensordict_utils = sys.modules["verl.utils.tensordict_utils"]
        spec = importlib.util.spec_from_file_location("verl_seqlen_balancing_reference", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
    return module
