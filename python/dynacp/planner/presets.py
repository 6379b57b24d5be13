"""Built-in model and cluster presets, stored as JSON files in ``presets/`` next to this module.

Each file is ``{"kind": "model" | "cluster", "description": ..., "config": {...}}``; ``config`` holds the fields of
:class:`~dynacp.planner.model.ModelConfig` or :class:`~dynacp.planner.model.ClusterConfig`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Type, TypeVar, Union

from dynacp.planner.model import ClusterConfig, ModelConfig

C = TypeVar("C", ModelConfig, ClusterConfig)

PRESET_DIR = Path(__file__).resolve().parent / "presets"


def _all() -> Dict[str, Dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(PRESET_DIR.glob("*.json"))}


def preset_names(kind: str) -> List[str]:
    """Names of the presets of ``kind`` ('model' or 'cluster')."""
    return [n for n, d in _all().items() if d["kind"] == kind]


def describe(name: str) -> str:
    """The preset's description (where its numbers come from)."""
    presets = _all()
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(presets)}")
    return presets[name]["description"]


def model_preset(name: str) -> ModelConfig:
    """A built-in model: llama3-8b, llama3-70b, seed-35b-moe, qwen3.5-35b-a3b."""
    d = _all().get(name)
    if d is None or d["kind"] != "model":
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(preset_names('model'))}")
    return ModelConfig.from_dict(d["config"], f"model preset {name}")


def cluster_preset(name: str) -> ClusterConfig:
    """A built-in cluster: seed-40xh20, h100-64, h100-512."""
    d = _all().get(name)
    if d is None or d["kind"] != "cluster":
        raise ValueError(f"unknown cluster preset {name!r}; known: {', '.join(preset_names('cluster'))}")
    return ClusterConfig.from_dict(d["config"], f"cluster preset {name}")


def _resolve(cls: Type[C], preset: Callable[[str], C], spec: Union[str, Path, Dict[str, Any], C]) -> C:
    """A ``cls`` from itself (validated), a dict, a JSON file path or a preset name (``preset``)."""
    if isinstance(spec, cls):
        spec.validate()
        return spec
    if isinstance(spec, dict):
        return cls.from_dict(spec)
    if Path(spec).suffix == ".json" or Path(spec).exists():
        return cls.load(spec)
    return preset(str(spec))


def resolve_model(spec: Union[str, Path, Dict[str, Any], ModelConfig]) -> ModelConfig:
    """A ModelConfig from itself, a dict, a JSON file path or a preset name."""
    return _resolve(ModelConfig, model_preset, spec)


def resolve_cluster(spec: Union[str, Path, Dict[str, Any], ClusterConfig]) -> ClusterConfig:
    """A ClusterConfig from itself, a dict, a JSON file path or a preset name."""
    return _resolve(ClusterConfig, cluster_preset, spec)
