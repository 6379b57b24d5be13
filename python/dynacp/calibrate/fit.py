"""``dynacp calibrate fit``: the whole cost model from a profile, by least squares on relative error.

The model fitted is the one the C++ solver reads (docs/cost_model.md)::

    T(G,d) = T_compute + T_comm - phi * min(eta*a*sum s^2/d, T_comm)
    T_compute = (eta*a*sum s^2 + b*sum s)/d + c       (classic form; phi = 1: T = b*sum s/d + c + max(attn, T_comm))
    T_comm = (d-1) * (latency(d) + (sum s/d) * kv_bytes_per_token / bandwidth(d)) + c_node * (nodes(d) - 1)

* links from the ``p2p`` table (:mod:`dynacp.calibrate.links`): ``t = latency + bytes / bandwidth`` per link kind
  (the Cluster's fields) and, for a kind measured on several ring sizes, per ring size (the model's hop tables,
  monotone in the size: ``latency(d)``, ``bandwidth(d)``);
* a, b, c from the ``group`` table (whole-step times of whole groups) when it has rows, with the branch of the
  ``max`` decided by alternating fits (each fit is linear once the branch of every row is fixed); otherwise from the
  ``attention`` and ``linear`` tables (per layer), scaled by the profile's ``layers * step_factor``;
* ``kv_bytes_per_token`` by a one-dimensional search over the groups with d > 1 when their times depend on it;
  else (no ring in the profile, or the exchange always hidden behind attention) from the model's dimensions
  (``meta.kv_bytes_per_token``), or the base model's value;
* every term's error reported beside the table's measurement noise (its median ``spread``: :func:`table_noise`).

``form="extended"`` also fits the extended form's per-document terms (docs/cost_model.md, "Extended form"), added
to ``T_compute``::

    kp * sum eta s^1.5 / d + kl * sum eta s log2 s + n * (c_doc + c_hop (d - 1) + [d = 1] c_solo)     (n sequences)

and, on the ``group`` table, ``node_overhead`` c_node (a column inside the exchange, hidden with it, when the table
has rings across nodes) and ``comm_overlap`` phi (the share of the exchange attention hides; 1 in the classic form)
by a search over 0, 0.05, ..., 1; each column held at 0 when the profile cannot identify it (no group on one rank:
``c_solo``; no ring across nodes: ``c_node``; every group of one sequence: ``c_doc`` and the per-group ``c`` are the
same column, and ``c_doc`` takes it in the per-document ``attention`` table, ``c`` in the ``group`` table).
``form="classic"`` leaves them 0; ``form="auto"`` (the default) picks extended when the profile has enough points
(:func:`choose_form`) and says so.

The report gives the rms and max relative error per term (each table fitted by its own term of the model form) and
per length band (by the group's longest sequence), and the whole-group error of the model written out. A poor fit
(rms over 20 % or max over 50 %) is logged as a WARNING on the ``dynacp`` logger.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from dynacp.calibrate.fileformat import Profile, load_profile, save_preset
from dynacp.calibrate.links import extra_nodes, fit_links, hop_arrays
from dynacp.calibrate.lsq import nonneg_relative_lsq, relative_errors

logger = logging.getLogger("dynacp")

#: length bands of the report, by a group's longest sequence (tokens): (label, lo exclusive, hi inclusive)
BANDS = (("<=256", 0, 256), ("257-1K", 256, 1024), ("1K-4K", 1024, 4096), ("4K-16K", 4096, 16384),
         ("16K-64K", 16384, 65536), (">64K", 65536, float("inf")))
POOR_RMS = 0.20
"""A term whose rms relative error exceeds this is reported as a poor fit (WARNING)."""
POOR_MAX = 0.50
"""A term whose max relative error exceeds this is reported as a poor fit (WARNING)."""
FORMS = ("auto", "classic", "extended")
"""Model forms :func:`fit` accepts: ``auto`` (the default) picks ``extended`` when the profile has enough points for
it (:func:`choose_form`), else ``classic`` (docs/cost_model.md)."""
EXTENDED_MIN_ROWS = 27
"""``auto`` picks the extended form when the table its compute terms are fitted on (``group``, else ``attention``)
has at least this many rows (3 per coefficient of the extended form: a, b, c, five per-document terms and the node
overhead) ..."""
EXTENDED_MIN_SHAPES = 9
"""... of at least this many distinct shapes (degree, tokens, sequence count): one per coefficient."""
DOC_FIELDS = ("attn_pow_coef", "attn_log_coef", "doc_overhead", "doc_hop_overhead", "doc_solo_overhead")
"""The CostModel fields of the extended form's compute terms, in the order of :func:`extended_columns`."""
EXTENDED_FIELDS = DOC_FIELDS + ("node_overhead",)
"""Every fitted coefficient of the extended form beyond a, b, c (and phi), in the order of the fit's columns:
:data:`DOC_FIELDS`, then ``node_overhead`` (c_node, inside the exchange; fitted on a ``group`` table with rings
across nodes, else 0)."""
NODE = 8
"""Index of ``node_overhead`` in the extended form's coefficient vector [a, b, c, DOC_FIELDS..., c_node]."""


@dataclass
class TermFit:
    """Fit quality of one term (or of the whole-group model) over its samples."""

    term: str
    """``group`` (whole model on whole-group times), ``attention``, ``linear``, ``link intra-node``, ..."""
    samples: int
    rms: float
    """Root mean square relative error (a fraction)."""
    max: float
    """Largest absolute relative error (a fraction)."""
    bands: list[dict[str, Any]] = field(default_factory=list)
    """Per length band: ``{"band", "samples", "rms", "max"}`` (only bands with samples)."""
    noise: Optional[float] = None
    """The median ``spread`` of the term's rows (a fraction; None without spreads): an rms error near it is the
    measurement's noise, one far above it the model form's (:func:`table_noise`)."""

    @property
    def poor(self) -> bool:
        return self.rms > POOR_RMS or self.max > POOR_MAX


@dataclass
class FitResult:
    """What :func:`fit` returns: the model, the measured links and the report."""

    cost: Any
    """The fitted ``dynacp.CostModel``."""
    links: dict[str, float]
    """Measured Cluster link fields (``intra_node_latency`` in s, ``intra_node_bandwidth`` in B/s, ...)."""
    terms: list[TermFit]
    notes: list[str] = field(default_factory=list)
    """How each coefficient was obtained (fitted, from the model dimensions, kept from the base model)."""
    form: str = "classic"
    """The model form fitted: ``classic`` or ``extended`` (what ``form="auto"`` chose)."""
    form_reason: str = ""
    """Why that form: asked for, or the point counts ``auto`` compared (:func:`choose_form`)."""

    def report_dict(self) -> dict[str, Any]:
        return {"form": self.form, "form_reason": self.form_reason, "terms": [t.__dict__ for t in self.terms],
                "notes": list(self.notes)}

    def format(self) -> str:
        """The fit report as text (what ``dynacp calibrate fit`` prints)."""
        c = self.cost
        lines = [f"cost model '{c.name}': attn_coef a = {c.attn_coef:.4e} s/token^2, linear_coef b = "
                 f"{c.linear_coef:.4e} s/token, group_overhead c = {c.group_overhead:.4e} s, kv_bytes_per_token = "
                 f"{c.kv_bytes_per_token:.6g} B"]
        if c.extended:
            lines.append("  extended form: " + ", ".join(f"{k} = {getattr(c, k):.4e}" for k in EXTENDED_FIELDS)
                         + f" (s), comm_overlap = {c.comm_overlap:g} (see docs/cost_model.md)")
        for k, v in self.links.items():
            lines.append(f"  {k} = {v:.4e} {'B/s' if 'bandwidth' in k else 's'}")
        for k in ("intra_node_hops", "inter_node_hops"):
            if getattr(c, k):
                lines.append(f"  {k} (ring size: latency, bandwidth): " + ", ".join(
                    f"{int(p[0])}: {p[1]:.3e} s, {p[2]:.3e} B/s" for p in getattr(c, k)))
        lines.append(f"form: {self.form} ({self.form_reason})")
        lines.append(f"{'term':<20}{'samples':>8}{'rms rel err':>13}{'max rel err':>13}{'noise':>9}")
        for t in self.terms:
            flag = "  POOR" if t.poor else ""
            noise = "-" if t.noise is None else f"{100 * t.noise:.1f}%"
            lines.append(f"{t.term:<20}{t.samples:>8}{100 * t.rms:>12.1f}%{100 * t.max:>12.1f}%{noise:>9}{flag}")
            for b in t.bands:
                lines.append(f"  {b['band']:<18}{b['samples']:>8}{100 * b['rms']:>12.1f}%{100 * b['max']:>12.1f}%")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


# -- pieces -----------------------------------------------------------------------------------------------------------

def _eta(cost: Any, mask: str) -> float:
    return cost.full_factor if mask == "full" else cost.causal_factor


def table_noise(rows: list[dict]) -> Optional[float]:
    """The median ``spread`` of ``rows`` (the relative IQR of a point's runs, a fraction): the measurement noise the
    report sets beside each term's error; None when no row has one. The spread does not weight the fit: weighting
    each row by ``1 / spread^2`` (floored at a quarter of the median) did not predict held-out rows better on the
    shipped CPU profile (leave-one-out over its 46 groups, classic form: median 15.3 % vs 16.1 % unweighted, rms
    26.6 % vs 24.1 %, max 100.1 % vs 91.2 %): a point's median over passes already drops load bursts, and its IQR
    measures the bursts, not the median's error (docs/calibration.md, "Noise")."""
    spread = [float(r["spread"]) for r in rows if "spread" in r]
    return float(np.median(spread)) if spread else None


def _shapes(rows: list[dict]) -> int:
    return len({(r["degree"], sum(r["lengths"]), len(r["lengths"])) for r in rows})


def choose_form(profile: Profile) -> tuple[str, str]:
    """(form, why) for ``form="auto"``: ``extended`` when the table the compute terms are fitted on (``group``,
    else ``attention``) has at least :data:`EXTENDED_MIN_ROWS` rows of :data:`EXTENDED_MIN_SHAPES` distinct shapes
    (degree, tokens, sequence count), else ``classic``."""
    table = "group" if profile.rows("group") else "attention"
    rows = profile.rows(table)
    n, shapes = len(rows), _shapes(rows) if rows else 0
    enough = n >= EXTENDED_MIN_ROWS and shapes >= EXTENDED_MIN_SHAPES
    why = (f"form auto -> {'extended' if enough else 'classic'}: table '{table}' has {n} rows of {shapes} distinct "
           f"shapes (degree, tokens, sequences); the extended form needs at least {EXTENDED_MIN_ROWS} rows of "
           f"{EXTENDED_MIN_SHAPES} shapes")
    return ("extended" if enough else "classic"), why


def extended_columns(lengths: list[list[int]], degrees: np.ndarray, etas: np.ndarray) -> np.ndarray:
    """Per group (one row each), the extended form's compute terms per unit coefficient, in :data:`DOC_FIELDS` order:
    ``sum eta s^1.5 / d``, ``sum eta s log2 s``, ``n``, ``n (d - 1)``, ``n [d = 1]`` (n = sequences of the group)."""
    d = np.asarray(degrees, dtype=np.float64)
    n = np.array([float(len(x)) for x in lengths])
    pw = np.array([sum(float(s) ** 1.5 for s in x) for x in lengths]) * etas
    lg = np.array([sum(float(s) * np.log2(float(s)) for s in x) for x in lengths]) * etas
    return np.c_[pw / d, lg, n, n * (d - 1), n * (d == 1)]


def _term(term: str, pred: np.ndarray, meas: np.ndarray, longest: Optional[np.ndarray],
          noise: Optional[float] = None) -> TermFit:
    """Errors of ``pred`` against ``meas``, overall and per length band of ``longest`` (no bands when None), beside
    the table's ``noise`` (:func:`table_noise`)."""
    rel = relative_errors(pred, meas)
    bands = []
    for label, lo, hi in BANDS if longest is not None else ():
        sel = (longest > lo) & (longest <= hi)
        if sel.any():
            bands.append({"band": label, "samples": int(sel.sum()), "rms": float(np.sqrt(np.mean(rel[sel] ** 2))),
                          "max": float(np.max(np.abs(rel[sel])))})
    return TermFit(term, int(rel.size), float(np.sqrt(np.mean(rel ** 2))), float(np.max(np.abs(rel))), bands, noise)


def _too_few(term: str, table: str, need: str, got: int, source: str) -> ValueError:
    return ValueError(f"{source}: too few points to fit the {term} term: table '{table}' needs {need}, got {got}")


@dataclass
class _Groups:
    """The group table as arrays."""

    S2: np.ndarray     # sum eta s^2
    S: np.ndarray      # sum s
    d: np.ndarray
    cross: np.ndarray
    t: np.ndarray
    longest: np.ndarray
    ext: Optional[np.ndarray] = None  # extended_columns of the rows (None: classic form)
    ext_fixed: tuple[int, ...] = ()   # extended columns the rows cannot identify (held at 0)
    overlap: float = 1.0               # comm_overlap phi: the share of min(attention, exchange) hidden
    extra: Optional[np.ndarray] = None  # known seconds of each row (fixed extended terms; the online refit)
    nodes: Optional[np.ndarray] = None  # extended form: extra nodes each ring spans (the c_node column; None: none)

    @classmethod
    def of(cls, rows: list[dict], cost: Any, form: str = "classic", cluster: Any = None) -> _Groups:
        """The arrays of ``rows``; with ``form="extended"`` also the extended columns and, given ``cluster`` (its
        ranks per node), the extra nodes each ring spans."""
        etas = np.array([_eta(cost, r["mask"]) for r in rows])
        d = np.array([float(r["degree"]) for r in rows])
        g = cls(etas * np.array([sum(float(x) ** 2 for x in r["lengths"]) for r in rows]),
                np.array([float(sum(r["lengths"])) for r in rows]), d,
                np.array([bool(r["crosses_nodes"]) for r in rows]), np.array([r["seconds"] for r in rows]),
                np.array([float(max(r["lengths"])) for r in rows]))
        if form == "extended":
            g.ext = extended_columns([r["lengths"] for r in rows], d, etas)
            # one sequence per group everywhere: c_doc is the per-group c (kept in c here)
            g.ext_fixed = (2,) if np.all(g.ext[:, 2] == 1.0) else ()
            if cluster is not None:
                g.nodes = extra_nodes(cluster, d, g.cross)
        return g

    def columns(self, hidden: np.ndarray) -> np.ndarray:
        """The design matrix: [S2/d (times 1 - phi where the exchange is not hidden), S/d, 1] + the extended
        columns (T = max(attn, comm) + (1 - phi) min(attn, comm) + the rest)."""
        X = np.c_[self.S2 / self.d * np.where(hidden, 1.0, 1.0 - self.overlap), self.S / self.d, np.ones_like(self.t)]
        if self.ext is not None:
            X = np.c_[X, self.ext]
        if self.nodes is not None:  # c_node is part of the exchange: hidden like it
            X = np.c_[X, self.nodes * np.where(hidden, 1.0 - self.overlap, 1.0)]
        return X

    def offset(self, hidden: np.ndarray, comm: np.ndarray) -> np.ndarray:
        """The known seconds of each row for a fixed branch: the unhidden part of the exchange."""
        known = np.where(hidden, (1.0 - self.overlap) * comm, comm)
        return known if self.extra is None else known + self.extra

    def total_comm(self, coef: np.ndarray, comm: np.ndarray) -> np.ndarray:
        """The exchange of each row: ``comm`` (the hops) plus c_node per extra node spanned."""
        return comm if self.nodes is None else comm + coef[NODE] * self.nodes

    def predict(self, coef: np.ndarray, comm: np.ndarray) -> np.ndarray:
        comm = self.total_comm(coef, comm)
        attn = coef[0] * self.S2 / self.d
        base = (coef[1] * self.S / self.d + coef[2] + np.maximum(attn, comm)
                + (1.0 - self.overlap) * np.minimum(attn, comm))
        if self.extra is not None:
            base = base + self.extra
        return base if self.ext is None else base + self.ext @ coef[3:NODE]

    def comm(self, kvb: float, lat: np.ndarray, bw: np.ndarray) -> np.ndarray:
        return np.where(self.d > 1, (self.d - 1) * (lat + self.S / self.d * kvb / bw), 0.0)


def _solve_branch(g: _Groups, hidden: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """[a, b, c] for a fixed branch per row, by least squares on the log-symmetric relative error
    ``(p - t)^2 / (p t)`` (relative least squares, then 4 reweightings by t / p): plain relative least squares is
    biased low under noise (it penalises a prediction above a fast measurement more than one below a slow one)."""
    X = g.columns(hidden)
    fixed = ([0] if not hidden.any() and g.overlap == 1.0 else []) + [3 + j for j in g.ext_fixed]
    if g.nodes is not None and not g.nodes.any():
        fixed.append(NODE)  # no ring across nodes: c_node is not identified
    weights = None
    for _ in range(5):
        coef = nonneg_relative_lsq(X, g.t, weights=weights, offset=offset, fixed_zero=fixed)
        weights = g.t / np.maximum(X @ coef + offset, 1e-12 * g.t)
    return coef


def _fit_abc(g: _Groups, comm: np.ndarray) -> tuple[np.ndarray, float]:
    """(a, b, c) of T = b S/d + c + max(a S2/d, comm) and its error (sum of squared log ratios); the branch of every
    row is fixed, fitted and re-decided until it no longer changes (at most 50 rounds; deterministic)."""
    hidden = np.ones(g.t.size, dtype=bool)  # start: every exchange hidden behind attention
    coef = np.zeros(3 if g.ext is None else NODE if g.nodes is None else NODE + 1)
    for _ in range(50):
        coef = _solve_branch(g, hidden, g.offset(hidden, comm))
        now = coef[0] * g.S2 / g.d >= g.total_comm(coef, comm)
        if np.array_equal(now, hidden):
            break
        hidden = now
    pred = np.maximum(g.predict(coef, comm), 1e-12 * g.t)
    return coef, float(np.sum(np.log(pred / g.t) ** 2))


def _link_arrays(g: _Groups, cost: Any, cluster: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per group row, the hop latency and bandwidth its ring reads (``cost``'s hop tables, else ``cluster``'s)."""
    return hop_arrays(cost, cluster, g.d, g.cross)


def fit_causal_factor(rows: list[dict], base: Any, comm_of: Any, form: str = "classic",
                      cluster: Any = None) -> tuple[float, bool]:
    """The causal mask factor eta (relative to full_factor) that fits the groups best, on a grid of 0.25 to 1.5 in
    steps of 0.05, when the groups hold both masks; else ``base.causal_factor``. Returns (eta, fitted)."""
    if len({r["mask"] for r in rows}) < 2:
        return float(base.causal_factor), False
    best = (float("inf"), float(base.causal_factor))
    trial = base.__class__(**dict(base.to_dict()))
    for eta in np.round(np.arange(0.25, 1.5001, 0.05), 2):
        trial.causal_factor = float(eta)
        g = _Groups.of(rows, trial, form, cluster)
        err = _fit_abc(g, comm_of(g))[1]
        if err < best[0] - 1e-12:
            best = (err, float(eta))
    return best[1], True


def _search_kvb(g: _Groups, lat: np.ndarray, bw: np.ndarray, kv_default: float
                ) -> tuple[np.ndarray, float, bool]:
    """(a, b, c), kv_bytes_per_token and whether it was fitted: a grid over 1 B to 1 GB, refined by golden section
    in log(kv_bytes_per_token); the default is kept unless the fit improves by more than 1 %."""
    def at(kvb: float) -> tuple[np.ndarray, float]:
        return _fit_abc(g, g.comm(kvb, lat, bw))

    coef, err = at(kv_default)
    grid = np.geomspace(1.0, 1e9, 91)  # the max of two branches is not smooth: search, do not differentiate
    i = int(np.argmin([at(float(kvb))[1] for kvb in grid]))
    lo, hi = np.log(grid[max(i - 1, 0)]), np.log(grid[min(i + 1, grid.size - 1)])
    phi = (np.sqrt(5) - 1) / 2
    for _ in range(80):
        m1, m2 = hi - phi * (hi - lo), lo + phi * (hi - lo)
        if at(float(np.exp(m1)))[1] <= at(float(np.exp(m2)))[1]:
            hi = m2
        else:
            lo = m1
    kvb = float(np.exp((lo + hi) / 2))
    c, e = at(kvb)
    if e >= err * 0.99 or e >= err - 1e-12:  # the groups barely depend on it (exchange hidden): keep the default
        return coef, kv_default, False
    return c, kvb, True


def _search_overlap(g: _Groups, comm: np.ndarray) -> float:
    """comm_overlap phi (extended form): the best of 0, 0.05, ..., 1 for the groups (ties: the larger phi)."""
    best = (float("inf"), 1.0)
    for phi in np.round(np.arange(1.0, -0.0001, -0.05), 2):
        g.overlap = float(phi)
        err = _fit_abc(g, comm)[1]
        if err < best[0] - 1e-12:
            best = (err, float(phi) + 0.0)  # + 0.0: the grid's last point is -0.0
    return best[1]


def _fit_groups(profile: Profile, base: Any, cluster: Any, kv_default: float,
                form: str = "classic") -> tuple[np.ndarray, float, str]:
    """(a, b, c), kv_bytes_per_token and a note on where the mask factor and kv_bytes_per_token came from; sets
    ``base.causal_factor`` when the groups hold both masks. The mask factor and kv_bytes_per_token are searched in
    turn, twice (each search fits a, b, c at every point it tries)."""
    rows = profile.rows("group")
    need = 3 if form == "classic" else 8
    keys = {(r["degree"], sum(r["lengths"])) + ((len(r["lengths"]),) if form == "extended" else ()) for r in rows}
    if len(rows) < need or len(keys) < need:
        raise _too_few("compute (a, b, c)" if form == "classic" else "compute (extended form)", "group",
                       f"at least {need} rows of different degree, tokens or sequence count", len(rows),
                       profile.source)
    lat, bw = _link_arrays(_Groups.of(rows, base), base, cluster)
    ring = any(r["degree"] > 1 for r in rows)
    kvb, kv_fitted, eta_fitted = kv_default, False, False
    for _ in range(2 if ring else 1):
        base.causal_factor, eta_fitted = fit_causal_factor(rows, base, lambda g, kv=kvb: g.comm(kv, lat, bw), form,
                                                           cluster)
        g = _Groups.of(rows, base, form, cluster)
        if ring and form == "extended":
            g.overlap = base.comm_overlap = _search_overlap(g, g.comm(kvb, lat, bw))
        coef = _fit_abc(g, g.comm(kvb, lat, bw))[0]
        if ring:
            coef, kvb, kv_fitted = _search_kvb(g, lat, bw, kv_default)
    note = f"causal_factor {base.causal_factor:g} fitted on groups of both masks; " if eta_fitted else ""
    if not ring:
        note += "kv_bytes_per_token from the model dimensions (no group with degree > 1)"
    elif not kv_fitted:
        note += ("kv_bytes_per_token from the model dimensions (the measured groups' times do not identify it: the "
                 "exchange is hidden or negligible)")
    else:
        note += "kv_bytes_per_token fitted on the groups with degree > 1"
    return coef, kvb, note


def attention_design(rows: list[dict], base: Any, form: str = "classic") -> tuple[np.ndarray, list[int]]:
    """The design matrix of ``attention`` rows (per layer, per rank) and the columns held at 0: [eta sum s^2 / d,
    sum s / d, 1] (a, b, c), then with ``form="extended"`` the :func:`extended_columns` (kp, kl, c_doc, c_hop,
    c_solo). A table of single documents measures a per-document floor: c_doc takes it and c is held at 0."""
    etas = np.array([_eta(base, r["mask"]) for r in rows])
    d = np.array([float(r["degree"]) for r in rows])
    X = np.c_[etas * np.array([sum(float(x) ** 2 for x in r["lengths"]) for r in rows]) / d,
              np.array([float(sum(r["lengths"])) for r in rows]) / d, np.ones(len(rows))]
    if form != "extended":
        return X, []
    ext = extended_columns([r["lengths"] for r in rows], d, etas)
    return np.c_[X, ext], ([2] if np.all(ext[:, 2] == 1.0) else [])


def length_inversions(rows: list[dict]) -> list[int]:
    """Indices of single-document ``attention`` (or ``group``) rows measured slower than a longer single document of
    the same degree and mask.

    No model the lower bound accepts can fit such a row together with its longer neighbour: every term of the form is
    non-decreasing in the length (docs/cost_model.md, "The bound under the extended form", property 4), so one of the
    two is mispredicted by at least ``(t_short - t_long) / (t_short + t_long)``. The fit report names them; on the
    H100 file they are the 128-token documents at cp >= 2 (docs/calibration.md)."""
    best: dict[tuple[int, str, int], float] = {}
    for r in rows:
        if len(r["lengths"]) == 1:
            key = (int(r["degree"]), str(r["mask"]), int(r["lengths"][0]))
            best[key] = min(best.get(key, float("inf")), float(r["seconds"]))
    out = []
    for i, r in enumerate(rows):
        if len(r["lengths"]) != 1:
            continue
        d, m, s = int(r["degree"]), str(r["mask"]), int(r["lengths"][0])
        if any(k[0] == d and k[1] == m and k[2] > s and t < r["seconds"] for k, t in best.items()):
            out.append(i)
    return out


def _inversion_note(rows: list[dict], table: str) -> Optional[str]:
    bad = length_inversions(rows)
    if not bad:
        return None
    shown = ", ".join(f"{rows[i]['lengths'][0]} tokens at degree {rows[i]['degree']}" for i in bad[:8])
    more = f" and {len(bad) - 8} more" if len(bad) > 8 else ""
    return (f"table '{table}': {len(bad)} row(s) measured slower than a longer document of the same degree ({shown}"
            f"{more}); no model form the lower bound accepts is non-monotone in length, so these rows keep an error "
            "of at least half their excess")


def _fit_components(profile: Profile, base: Any, form: str = "classic") -> tuple[np.ndarray, list[TermFit]]:
    """(a, b, c) of a whole step (then the extended coefficients, with ``form="extended"``) from the per-layer
    attention and linear tables."""
    att, lin = profile.rows("attention"), profile.rows("linear")
    need = 3 if form == "classic" else 8
    if len(att) < need or len({(sum(r["lengths"]), r["degree"]) for r in att}) < need:
        raise _too_few("attention" if form == "classic" else "attention (extended form)", "attention",
                       f"at least {need} rows of different lengths or degrees", len(att), profile.source)
    Xa, fixed = attention_design(att, base, form)
    ta = np.array([r["seconds"] for r in att])
    ca = nonneg_relative_lsq(Xa, ta, fixed_zero=fixed)
    terms = [_term("attention", Xa @ ca, ta, np.array([float(max(r["lengths"])) for r in att]), table_noise(att))]
    cl = np.zeros(ca.size)
    if lin:
        if len({r["tokens"] for r in lin}) < 2:
            raise _too_few("linear", "linear", "rows of at least 2 different token counts", len(lin), profile.source)
        Xl = np.array([[0.0, float(r["tokens"]), 1.0] for r in lin])
        tl = np.array([r["seconds"] for r in lin])
        cl[:3] = nonneg_relative_lsq(Xl, tl)
        terms.append(_term("linear", Xl @ cl[:3], tl, np.array([float(r["tokens"]) for r in lin]), table_noise(lin)))
    return (ca + cl) * profile.layer_passes, terms


def fit(profile: Union[Profile, str, Path], base: Any = None, *, name: str = "calibrated",
        cluster: Any = None, form: str = "auto") -> FitResult:
    """Fit the cost model, its hop tables and the links to a profile (the module docstring has every step).

    The model is ``T = T_compute + T_comm - phi min(T_attn, T_comm)`` with ``T_comm = (d - 1) (latency(d) + (sum s /
    d) kv_bytes_per_token / bandwidth(d))`` (latency and bandwidth per link kind and ring size d: the hop tables when
    the ``p2p`` table measured several ring sizes of a kind, else one value per kind) and, by form,

    * ``"classic"``: ``T_compute = (eta a sum s^2 + b sum s) / d + c`` and phi = 1 (the extended coefficients of
      ``base`` are set to 0);
    * ``"extended"``: also ``kp sum eta s^1.5 / d + kl sum eta s log2 s + n (c_doc + c_hop (d - 1) + [d = 1]
      c_solo)`` and, on a ``group`` table, ``c_node (nodes(d) - 1)`` in the exchange and phi in [0, 1]
      (docs/cost_model.md, "Extended form"); when the classic solution fits the groups better it is kept (it is
      the extended form's with those terms 0);
    * ``"auto"`` (the default): ``extended`` when the table the compute terms are fitted on has enough points for it
      (:func:`choose_form`), else ``classic``; the choice and why are logged (INFO on the ``dynacp`` logger) and
      kept in ``FitResult.form`` / ``form_reason``.

    Each term's error is reported beside its table's noise (the median ``spread``, :func:`table_noise`); the spread
    does not weight the fit.

    Args:
        profile: a :class:`~dynacp.calibrate.fileformat.Profile` or the path of a profile file.
        base: the CostModel whose other fields (mask factors, memory) are kept (default ``dynacp.CostModel()``).
        name: the fitted model's ``name``.
        cluster: where link values not in the profile come from, and the ranks per node when the profile's meta
            has none (default ``dynacp.Cluster()``).
        form: ``"auto"``, ``"classic"`` or ``"extended"`` (above).

    Raises ValueError (naming the file and table) when a table has too few points to fit its term.
    """
    from dynacp import _core

    if form not in FORMS:
        raise ValueError(f"dynacp.calibrate.fit: form must be one of {FORMS}, got {form!r}")
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    form, why = choose_form(prof) if form == "auto" else (form, f"form {form} (asked for)")
    logger.info("dynacp calibrate fit of %s: %s", prof.source, why)
    base = _core.CostModel(**dict(base.to_dict())) if base is not None else _core.CostModel()
    for k in EXTENDED_FIELDS:  # the groups are fitted from scratch in the form asked for
        setattr(base, k, 0.0)
    base.comm_overlap = 1.0
    measured = fit_links(prof.rows("p2p"), prof.source)
    for kind in ("intra_node", "inter_node"):
        if f"{kind}_latency" in measured.links:  # a measured kind: its table (or none) comes from the profile
            setattr(base, f"{kind}_hops", measured.hops.get(f"{kind}_hops", []))
    links = measured.links
    cluster = _fit_cluster(prof, cluster, links)
    terms = [_term(f"link {kind.replace('_', '-')}", *measured.predicted[kind], None, table_noise(
        [r for r in prof.rows("p2p") if r["crosses_nodes"] == (kind == "inter_node")])) for kind in
        ("intra_node", "inter_node") if kind in measured.predicted]
    kv_default = float(prof.meta.get("kv_bytes_per_token", base.kv_bytes_per_token))
    notes = list(measured.notes)
    if prof.rows("group"):
        cost, note, err = _group_model(prof, base, cluster, links, kv_default, form)
        if form == "extended":  # the classic solution is one of the extended form's (its terms 0): keep the better
            classic, c_note, c_err = _group_model(prof, base, cluster, links, kv_default, "classic")
            if c_err.rms < err.rms:
                cost, err = classic, c_err
                note = (c_note + "; the extended fit's whole-group rms error was above the classic form's, so the "
                        "classic coefficients are kept (the extended terms 0)")
        if prof.rows("attention"):  # the per-layer tables' own fit, with the mask factor the groups gave
            base.causal_factor = cost.causal_factor
            terms += _fit_components(prof, base, form)[1]
    else:
        abc, comp_terms = _fit_components(prof, base, form)
        terms += comp_terms
        cost, err = _model_of(base, abc, kv_default), None
        note = "kv_bytes_per_token from the model dimensions (the profile has no group table)"
    notes.append(note)
    notes += [n for n in (_inversion_note(prof.rows(t), t) for t in ("attention", "group")) if n]
    if not links:
        notes.append("links: the profile has no p2p table; the Cluster's link fields are not changed")
    cost.name = name
    result = FitResult(cost, links, terms, notes, form, why)
    if err is not None:
        result.terms.insert(0, err)
    cost.source = (f"dynacp calibrate fit of {prof.source} ({prof.meta.get('device', '?')}, "
                   f"{prof.meta.get('dtype', '?')}, {form} form): " + ", ".join(
                       f"{t.term} rms {100 * t.rms:.1f}% max {100 * t.max:.1f}%" for t in result.terms))
    _warn_poor(result, prof.source)
    return result


def _model_of(base: Any, coef: np.ndarray, kvb: float) -> Any:
    """A copy of ``base`` with a, b, c (and the extended coefficients, when ``coef`` has them) and kv_bytes_per_token."""
    from dynacp import _core

    cost = _core.CostModel(**dict(base.to_dict()))
    cost.attn_coef, cost.linear_coef, cost.group_overhead = (float(x) for x in coef[:3])
    for k, v in zip(EXTENDED_FIELDS, coef[3:]):
        setattr(cost, k, float(v))
    cost.kv_bytes_per_token = kvb
    return cost


def _group_model(profile: Profile, base: Any, cluster: Any, links: dict[str, float], kv_default: float,
                 form: str) -> tuple[Any, str, TermFit]:
    """The model fitted on the ``group`` table in ``form`` (from a copy of ``base``), its note and its whole-group
    error."""
    from dynacp import _core

    start = _core.CostModel(**dict(base.to_dict()))
    coef, kvb, note = _fit_groups(profile, start, cluster, kv_default, form)
    cost = _model_of(start, coef, kvb)
    return cost, note, group_error(profile, cost, links, cluster)


def _fit_cluster(profile: Profile, cluster: Any, links: dict[str, float]) -> Any:
    """The Cluster the fit prices the profile's rings on: ``cluster`` (default ``Cluster()``) with the measured
    links, the profile's ``meta.ranks_per_node`` when it states one, and enough ranks for its largest ring."""
    from dynacp import _core
    from dynacp.calibrate.fileformat import apply_links

    cl = _core.Cluster(**dict(cluster.to_dict())) if cluster is not None else _core.Cluster()
    if "ranks_per_node" in profile.meta:
        cl.ranks_per_node = int(profile.meta["ranks_per_node"])
    dmax = max([r["degree"] for r in profile.rows("group")] + [cl.num_ranks])
    cl.num_ranks = cl.ranks_per_node * -(-dmax // cl.ranks_per_node)
    return apply_links(cl, links)


def _warn_poor(result: FitResult, source: str) -> None:
    for t in result.terms:
        if t.poor:
            logger.warning("dynacp calibrate fit: poor fit of the %s term on %s: rms relative error %.1f%%, max "
                           "%.1f%% over %d samples (limits %.0f%% / %.0f%%); check the profile's noise (spread) "
                           "and whether the hardware follows the model form (docs/calibration.md)", t.term,
                           source, 100 * t.rms, 100 * t.max, t.samples, 100 * POOR_RMS, 100 * POOR_MAX)


def group_error(profile: Profile, cost: Any, links: dict[str, float], cluster: Any = None) -> TermFit:
    """Whole-group relative error of ``cost`` (through the C++ ``CostModel.time``, hop tables and node overhead
    included) on the profile's group table, on ``cluster`` (its ranks per node; default ``Cluster()``) with
    ``links`` set and the profile's ``meta.ranks_per_node`` when it states one."""
    from dynacp import _core

    rows = profile.rows("group")
    cl = _fit_cluster(profile, cluster, links)
    mask = {"causal": _core.Mask.CAUSAL, "full": _core.Mask.FULL}
    pred = np.array([cost.time(r["lengths"], r["degree"], cl, mask[r["mask"]], r["crosses_nodes"]) for r in rows])
    return _term("group", pred, np.array([r["seconds"] for r in rows]),
                 np.array([float(max(r["lengths"])) for r in rows]), table_noise(rows))


def fit_to_file(profile: Union[Profile, str, Path], out: Union[str, Path], base: Any = None,
                name: str = "calibrated", form: str = "auto", cluster: Any = None) -> FitResult:
    """:func:`fit` (``cluster``: where link values the profile does not measure come from), then write the preset
    file ``out`` (read by ``dynacp.CostModel.load`` and ``--cost FILE``)."""
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    result = fit(prof, base, name=name, form=form, cluster=cluster)
    save_preset(out, result.cost, result.links, result.report_dict(), prof.meta)
    return result


def cross_validate_attention(rows: list[dict], base: Any = None, form: str = "extended") -> np.ndarray:
    """Leave-one-out relative errors (fractions, signed) of the ``attention`` fit of :func:`fit` in ``form``: each
    row predicted by the fit (``attention_design`` + non-negative relative least squares) of all the others."""
    from dynacp import _core

    base = base if base is not None else _core.CostModel()
    X, fixed = attention_design(rows, base, form)
    t = np.array([r["seconds"] for r in rows])
    errors = np.empty(t.size)
    for i in range(t.size):
        keep = np.arange(t.size) != i
        coef = nonneg_relative_lsq(X[keep], t[keep], fixed_zero=fixed)
        errors[i] = (X[i] @ coef - t[i]) / t[i]
    return errors
