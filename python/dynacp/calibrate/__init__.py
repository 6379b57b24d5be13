"""Measured cost: profile the hardware, fit the cost model, refit it online (docs/calibration.md).

* :func:`profile` (``dynacp calibrate profile``): micro-benchmarks through torch -> a profile file;
* :func:`fit` (``dynacp calibrate fit``): the whole cost model from a profile -> a cost preset file that
  ``dynacp.CostModel.load`` and every CLI ``--cost FILE`` read;
* :func:`import_distca`: the distca H100 CSV profiles as a profile;
* :mod:`dynacp.calibrate.online`: the training wrapper's online refit;
* :func:`cross_validate_attention`: leave-one-out errors of the attention fit in either model form;
* :func:`length_inversions`: rows measured slower than a longer document (no monotone form fits them);
* :mod:`dynacp.calibrate.proposed`: the earlier prototype of a richer form (a per-document table; not read by the C++
  model: the extended form of docs/cost_model.md replaced it).

torch is imported only by :func:`profile` and the online refit.
"""

from __future__ import annotations

from typing import Any

from dynacp.calibrate.distca import import_distca
from dynacp.calibrate.fileformat import (
    Profile,
    apply_links,
    load_cost,
    load_preset,
    load_profile,
    resolve_cost,
    save_preset,
    save_profile,
)
from dynacp.calibrate.fit import FitResult, TermFit, cross_validate_attention, fit, fit_to_file, length_inversions

__all__ = ["FitResult", "Profile", "TermFit", "apply_links", "cross_validate_attention", "fit", "fit_to_file", "import_distca",
           "length_inversions", "load_cost", "load_preset", "load_profile", "profile", "resolve_cost", "save_preset", "save_profile"]


def profile(*args: Any, **kwargs: Any) -> Profile:
    """Run the micro-benchmarks and return the profile (see :func:`dynacp.calibrate.profiler.run_profile`)."""
    from dynacp.calibrate.profiler import run_profile

    return run_profile(*args, **kwargs)
