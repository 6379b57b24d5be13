"""A self-contained HTML report of a comparison: one page, no scripts, no external files (images are inline PNG data
URIs, styles inline), so it opens offline and can be mailed as it is.

Sections: the run's metadata, the comparison table (every column explained), a Gantt chart per strategy of the
first batch, and a histogram of all the batches' sequence lengths.
"""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any, Dict, List, Optional

import numpy as np

from dynacp.commands.compare import COLUMNS, Comparison

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1300px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.92em; } th, td { padding: 4px 10px; border: 1px solid #ccc; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.failed td { color: #a00; } img { max-width: 100%; border: 1px solid #ddd; } dt { font-weight: 600; }
.note { color: #555; font-size: 0.9em; }
"""


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _fmt(key: str, v: Optional[float]) -> str:
    if v is None:
        return "n/a"
    if key == "gap_to_lower_bound":
        return f"{v:.1%}"
    if key in ("speedup_vs_packing", "max_over_mean_rank_time"):
        return f"{v:.3f}x" if key == "speedup_vs_packing" else f"{v:.3f}"
    if key == "peak_tokens_per_rank":
        return f"{int(v):d}"
    return f"{v:.1f}" if key != "median_solve_ms" else f"{v:.3f}"


def _table(result: Dict[str, Any]) -> str:
    head = "".join(f"<th title='{html.escape(text)}'>{html.escape(hdr)}</th>" for hdr, _, text in COLUMNS)
    rows = []
    for name, r in result["strategies"].items():
        if r["error"] is not None:
            rows.append(f"<tr class='failed'><td>{html.escape(name)}</td><td colspan='{len(COLUMNS)}'>failed: "
                        f"{html.escape(r['error'])}</td></tr>")
            continue
        cells = "".join(f"<td class='num'>{_fmt(key, r[key])}</td>" for _, key, _ in COLUMNS)
        rows.append(f"<tr><td>{html.escape(name)}</td>{cells}</tr>")
    lb = result["lower_bound_ms"]
    legend = "".join(f"<dt>{html.escape(hdr)} <code>{key}</code></dt><dd>{html.escape(text)}</dd>"
                     for hdr, key, text in COLUMNS)
    return (f"<table id='comparison'><thead><tr><th>strategy</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody>"
            f"</table><p class='note'>Lower bound (mean over batches): {'n/a' if lb is None else f'{lb:.1f} ms'}."
            f"</p><dl>{legend}</dl>")


def _metadata(meta: Dict[str, Any]) -> str:
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v if isinstance(v, str) else json.dumps(v))}"
                   "</td></tr>" for k, v in meta.items())
    return f"<table id='metadata'>{rows}</table>"


def render(cmp: Comparison, title: str = "dynacp report") -> str:
    """The HTML page of ``cmp`` (see the module doc)."""
    from dynacp.plots import gantt, histogram, settings_title

    meta = cmp.result["metadata"]
    settings = settings_title(meta)
    first = cmp.batches.batches[0].lengths
    charts: List[str] = []
    for name, plan in cmp.first_plans.items():
        fig = gantt({name: plan}, first, cmp.cluster, cmp.cost, pp=meta["pp"], vpp=meta["vpp"],
                    title=settings_title(meta, batch=0), figsize=(13.0, 4.8))
        charts.append(f"<h3>{html.escape(name)}</h3><img class='gantt' alt='Gantt chart of {html.escape(name)}' "
                      f"src='{_png(fig)}'>")
    all_lengths = np.concatenate([b.lengths for b in cmp.batches.batches])
    hist = _png(histogram(all_lengths, title=f"lengths of all {len(cmp.batches.batches)} batches"))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<link rel="icon" href="data:,"><style>{_STYLE}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p>{html.escape(settings)}. Step times and lower bounds are predicted by {html.escape(meta['times_predicted_by'])}.</p>
<h2>Comparison</h2>
{_table(cmp.result)}
<h2>Gantt charts of batch 0</h2>
<p class="note">Ranks on the y axis, predicted time on the x axis; colour = CP degree, dashed red line = lower bound;
with pipelines, hatched light bars are forward passes and solid bars backward passes (stage 0).</p>
{''.join(charts) or '<p>No strategy produced a plan.</p>'}
<h2>Sequence lengths</h2>
<img id="histogram" alt="histogram of sequence lengths" src="{hist}">
<h2>Run metadata</h2>
{_metadata(meta)}
</body></html>
"""
