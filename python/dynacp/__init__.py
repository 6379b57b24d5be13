"""dynacp: load balancing for variable-length LLM training over DP x CP rank pools.

The C++ core (``dynacp._core``) holds the cost model, the solvers and the CPU runtime; this package is the glue:
configs, the planning API, the CLI, plots and the PyTorch integration.
"""

from __future__ import annotations

import os as _os

# Development builds: `DYNACP_EXT_DIR=<cmake build>/python` makes the freshly built extension importable
# without installing (see docs/development.md).
if _os.environ.get("DYNACP_EXT_DIR"):
    __path__.append(_os.environ["DYNACP_EXT_DIR"])  # type: ignore[name-defined]  # noqa: F821

from dynacp import log as _log  # noqa: E402,F401  # the `dynacp` logger first: the core logs into it from import on
from dynacp._core import (  # noqa: E402
    Cluster,
    CostModel,
    CountPolicy,
    DynacpTuning,
    Group,
    LocalSearchTuning,
    Mask,
    Plan,
    PlanOptions,
    Predicted,
    StaticShapes,
    dynacp_families,
    preset,
    preset_names,
    strategy_names,
)
from dynacp.api import lower_bound, plan, predict  # noqa: E402
from dynacp.balance import balance, balance_lower_bound  # noqa: E402
from dynacp.calibrate.fileformat import load_cost as _load_cost  # noqa: E402
from dynacp.planner import configs  # noqa: E402
from dynacp.planner.layout_cost import LayoutCost, layout_cost  # noqa: E402
from dynacp.shapes import default_static_shapes  # noqa: E402

# dynacp.CostModel.load(path): a cost preset file written by `dynacp calibrate fit` (docs/calibration.md)
CostModel.load = staticmethod(_load_cost)  # type: ignore[attr-defined]

__version__ = "0.1.0"

__all__ = [
    "Cluster",
    "CostModel",
    "CountPolicy",
    "DynacpTuning",
    "Group",
    "LayoutCost",
    "LocalSearchTuning",
    "Mask",
    "Plan",
    "PlanOptions",
    "Predicted",
    "StaticShapes",
    "balance",
    "balance_lower_bound",
    "configs",
    "default_static_shapes",
    "dynacp_families",
    "layout_cost",
    "lower_bound",
    "plan",
    "predict",
    "preset",
    "preset_names",
    "strategy_names",
]
