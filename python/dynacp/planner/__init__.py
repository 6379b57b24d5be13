"""Parallel-configuration planner: enumerate (TP, PP, CP, EP, ETP, DP, VPP) layouts, price per-GPU memory and step
time analytically, explain every rejection, and (with a length distribution) predict each layout under dynacp's
per-batch scheduler. Pure Python; see docs/planner.md. ``dynacp.planner.validation`` checks it against published
H100 training runs.

    >>> import dynacp.planner as planner
    >>> table = planner.configs("llama3-8b", "h100-64", {"global_batch": 512, "seq_length": 8192})
    >>> print(table.format(top=5))
"""

from __future__ import annotations

from dynacp.planner.configs import ConfigTable, Row, configs, model_warnings
from dynacp.planner.efficiency import Efficiency
from dynacp.planner.enumerate import Candidate, check, divisors, enumerate_layouts
from dynacp.planner.memory import (
    MemoryBreakdown,
    ParamCounts,
    memory_breakdown,
    param_counts,
    params_per_gpu,
    stage_split,
)
from dynacp.planner.model import (
    RECOMPUTE_MODULES,
    BatchConfig,
    ClusterConfig,
    Layout,
    ModelConfig,
    PlannerOptions,
    recompute_module_options,
)
from dynacp.planner.presets import cluster_preset, model_preset, preset_names
from dynacp.planner.timing import TimeBreakdown, bubble_fractions, step_time, tp_message_volume

__all__ = [
    "BatchConfig", "Candidate", "ClusterConfig", "ConfigTable", "Efficiency", "Layout", "MemoryBreakdown",
    "ModelConfig",
    "ParamCounts", "PlannerOptions", "RECOMPUTE_MODULES", "Row", "TimeBreakdown", "bubble_fractions", "check",
    "cluster_preset", "configs",
    "divisors", "enumerate_layouts", "memory_breakdown", "model_preset", "model_warnings", "param_counts",
    "params_per_gpu", "preset_names", "recompute_module_options", "stage_split", "step_time", "tp_message_volume",
]
