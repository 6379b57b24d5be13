"""The ring links from the profile's ``p2p`` table: one latency and bandwidth per link kind, and per ring size.

Every ``p2p`` row is one ring hop of ``bytes`` on a ring of ``group_size`` ranks, inside a node or across nodes
(``crosses_nodes``); its time is ``latency + bytes / bandwidth``. :func:`fit_links` fits

* per link kind, over all ring sizes: the Cluster's ``*_latency`` / ``*_bandwidth`` fields (the preset's ``links``);
* per link kind that was measured on at least two ring sizes (each with at least two message sizes): a *hop table*
  ``[[ring size, latency s, bandwidth B/s], ...]`` (``CostModel.intra_node_hops`` / ``inter_node_hops``), one fit
  per ring size made monotone in the size (latency non-decreasing, seconds per byte non-decreasing: pool adjacent
  violators weighted by the rows of each size), which the C++ model interpolates between the sizes
  (docs/cost_model.md, "Hop tables"). A kind measured on one ring size has no table: the model reads the Cluster's
  fields on every ring, as before.

:func:`hop_arrays` is the one place the calibration reads a ring's latency and bandwidth (through
``CostModel.hop_latency`` / ``hop_bandwidth``, the C++ model's own lookup); :func:`extra_nodes` the nodes a ring
spans beyond its first (``CostModel.nodes_spanned``), what ``node_overhead`` is paid on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dynacp.calibrate.lsq import isotonic_increasing, nonneg_relative_lsq

KINDS = ((False, "intra_node"), (True, "inter_node"))
"""(crosses_nodes, name) of the two link kinds, in the order the tables and the report list them."""


@dataclass
class LinkFit:
    """What :func:`fit_links` measured."""

    links: dict[str, float] = field(default_factory=dict)
    """Cluster link fields (``intra_node_latency`` in s, ``intra_node_bandwidth`` in B/s, ...) per kind measured."""
    hops: dict[str, list[list[float]]] = field(default_factory=dict)
    """``intra_node_hops`` / ``inter_node_hops`` -> ``[[ring size, latency s, bandwidth B/s], ...]`` (kinds
    measured on at least two ring sizes)."""
    predicted: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    """Per kind: (predicted, measured) seconds of its rows under what the model reads (the table, else the pooled
    fit): the report's ``link`` terms."""
    notes: list[str] = field(default_factory=list)


def _too_few(kind: str, got: int, source: str) -> ValueError:
    return ValueError(f"{source}: too few points to fit the {kind.replace('_', '-')} link term: table 'p2p' needs "
                      f"rows of at least 2 different message sizes, got {got}")


def _fit_one(rows: list[dict]) -> tuple[float, float]:
    """(latency s, seconds per byte) of ``t = latency + bytes * spb`` by non-negative relative least squares."""
    X = np.array([[1.0, r["bytes"]] for r in rows])
    t = np.array([r["seconds"] for r in rows])
    lat, spb = nonneg_relative_lsq(X, t)
    return float(lat), float(spb)


def fit_links(rows: list[dict], source: str) -> LinkFit:
    """Links and hop tables of the ``p2p`` rows (module docstring). Raises ValueError naming the file when a kind
    has fewer than 2 message sizes or its hop time does not grow with the message size."""
    out = LinkFit()
    for crosses, kind in KINDS:
        idx = [i for i, r in enumerate(rows) if r["crosses_nodes"] == crosses]
        if not idx:
            continue
        sel = [rows[i] for i in idx]
        if len({r["bytes"] for r in sel}) < 2:
            raise _too_few(kind, len({r["bytes"] for r in sel}), source)
        lat, spb = _fit_one(sel)
        if not spb > 0:
            raise ValueError(f"{source}: table 'p2p': the {kind} hop times do not grow with the message size; the "
                             "bandwidth is undefined (measure larger messages)")
        out.links[f"{kind}_latency"], out.links[f"{kind}_bandwidth"] = lat, 1.0 / spb
        table = _hop_table(sel, kind, out.notes)
        t = np.array([r["seconds"] for r in sel])
        if table:
            out.hops[f"{kind}_hops"] = table
            pred = np.array([_interp(table, r["group_size"], r["bytes"]) for r in sel])
        else:
            pred = np.array([lat + r["bytes"] * spb for r in sel])
        out.predicted[kind] = (pred, t)
    return out


def _interp(table: list[list[float]], size: int, nbytes: float) -> float:
    """A hop's seconds from the table at a ring size (as the C++ lookup: linear between points, clamped outside)."""
    s = np.array([p[0] for p in table])
    lat = np.interp(size, s, [p[1] for p in table])
    spb = np.interp(size, s, [1.0 / p[2] for p in table])
    return float(lat + nbytes * spb)


def _hop_table(rows: list[dict], kind: str, notes: list[str]) -> list[list[float]]:
    """The monotone per-ring-size table of one link kind, or [] when fewer than two ring sizes can be fitted."""
    sizes = sorted({int(r["group_size"]) for r in rows if r["group_size"] >= 2})
    fits, counts, skipped = [], [], []
    for s in sizes:
        sub = [r for r in rows if r["group_size"] == s]
        if len({r["bytes"] for r in sub}) < 2:
            skipped.append(s)
            continue
        lat, spb = _fit_one(sub)
        if not spb > 0:
            skipped.append(s)
            continue
        fits.append((s, lat, spb))
        counts.append(float(len(sub)))
    if skipped:
        notes.append(f"p2p {kind}: ring size(s) {skipped} left out of the hop table (fewer than 2 message sizes, or "
                     "times that do not grow with the message size)")
    if len(fits) < 2:
        return []
    lat = isotonic_increasing(np.array([f[1] for f in fits]), np.array(counts))
    spb = isotonic_increasing(np.array([f[2] for f in fits]), np.array(counts))
    if np.any(lat != np.array([f[1] for f in fits])) or np.any(spb != np.array([f[2] for f in fits])):
        notes.append(f"p2p {kind}: the per-ring-size fits were made monotone in the ring size (a larger ring measured "
                     "faster than a smaller one: pooled)")
    return [[float(s), float(a), float(1.0 / b)] for (s, _, _), a, b in zip(fits, lat, spb)]


def hop_arrays(cost: Any, cluster: Any, degrees: np.ndarray, crosses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the hop latency (s) and bandwidth (B/s) of a ring of ``degrees[i]`` ranks over the link
    ``crosses[i]`` picks: ``cost``'s hop table when it has one, else ``cluster``'s fields (the C++ lookup)."""
    lat = np.array([cost.hop_latency(int(d), bool(x), cluster) for d, x in zip(degrees, crosses)])
    bw = np.array([cost.hop_bandwidth(int(d), bool(x), cluster) for d, x in zip(degrees, crosses)])
    return lat, bw


def extra_nodes(cluster: Any, degrees: np.ndarray, crosses: np.ndarray) -> np.ndarray:
    """Per row, the nodes a ring of ``degrees[i]`` ranks spans beyond its first (``CostModel.nodes_spanned - 1``:
    0 inside a node, ``max(2, ceil(d / ranks_per_node)) - 1`` across nodes): what ``node_overhead`` is paid on."""
    from dynacp import _core

    return np.array([float(_core.CostModel.nodes_spanned(int(d), bool(x), cluster) - 1) if d > 1 else 0.0
                     for d, x in zip(degrees, crosses)])
