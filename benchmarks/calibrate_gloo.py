"""Acceptance run of ``dynacp calibrate`` on this machine (docs/calibration.md, docs/benchmarks.md):

1. profile the tiny model on 2 gloo processes (CPU) and time it (``dynacp calibrate profile``'s defaults);
2. in the same run, interleaved with the profile's points (so both see the same machine load), 24 held-out random
   causal ring-attention microbatches (whole layers: linear + ring attention over gloo + MLP, forward + backward,
   all layers);
3. fit the cost model to the profile alone and compare its predictions with the held-out measurements.

    DYNACP_EXT_DIR=$PWD/build/python PYTHONPATH=$PWD/python python3 benchmarks/calibrate_gloo.py [--out DIR]

Prints the profile's wall time, the fit report, and the median / max relative error of the predictions with the
measurements' own noise (median relative interquartile range over 5 repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

import dynacp.calibrate as cal
from dynacp.calibrate.profiler import predict_rows, profile_with_holdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="calibrate-gloo", help="folder for profile.json, preset.json, check.json")
    ap.add_argument("--form", choices=("classic", "extended"), default="classic",
                    help="model form of the preset (the other form is fitted to the same profile and reported too)")
    ap.add_argument("--passes", type=int, default=5, help="passes sharing each point's timed runs (ProfileConfig."
                    "passes; default 5, 1: back to back as before)")
    ap.add_argument("--count", type=int, default=24, help="random microbatches to check (default 24)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"load average at the start (1 / 5 / 15 min): {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    t0 = time.perf_counter()
    prof, rows = profile_with_holdout(count=args.count, progress=False, passes=args.passes)
    wall = time.perf_counter() - t0
    cal.save_profile(prof, out / "profile.json")
    result = cal.fit_to_file(str(out / "profile.json"), str(out / "preset.json"), name="cpu-gloo-tiny",
                             form=args.form)
    print(f"profile + {len(rows)} held-out microbatches ({args.passes} passes): {wall:.1f} s wall ({prof.meta['device']}, {prof.meta['backend']}, world "
          f"{prof.meta['world_size']}, torch {prof.meta['torch']})")
    print(result.format())
    cost, links = cal.load_preset(out / "preset.json")
    for r, p in zip(rows, predict_rows(cost, links, rows, prof.meta["world_size"])):
        r["predicted"] = p
    rel = np.array([(r["predicted"] - r["measured"]) / r["measured"] for r in rows])
    noise = np.median([r["spread"] for r in rows])
    (out / "check.json").write_text(json.dumps(rows, indent=1) + "\n")
    other = "extended" if args.form == "classic" else "classic"
    alt = cal.fit(prof, form=other)
    rel_alt = np.array([(p - r["measured"]) / r["measured"]
                        for r, p in zip(rows, predict_rows(alt.cost, alt.links, rows, prof.meta["world_size"]))])
    for r, e in zip(rows, rel):
        print(f"  d={r['degree']} tokens={sum(r['lengths']):5d} docs={len(r['lengths']):2d} measured "
              f"{1e3 * r['measured']:8.1f} ms predicted {1e3 * r['predicted']:8.1f} ms error {100 * e:+6.1f}% "
              f"(spread {100 * r['spread']:.0f}%)")
    print(f"check ({args.form} form, the preset): {len(rows)} microbatches, median |relative error| "
          f"{100 * np.median(np.abs(rel)):.1f}%, max {100 * np.max(np.abs(rel)):.1f}%; measurement noise (median "
          f"relative IQR) {100 * noise:.1f}%")
    print(f"check ({other} form, same measurements): median |relative error| {100 * np.median(np.abs(rel_alt)):.1f}%, "
          f"max {100 * np.max(np.abs(rel_alt)):.1f}%")
    print(f"load average at the end (1 / 5 / 15 min): {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
