"""The two calibration files: the *profile* (what ``dynacp calibrate profile`` measured) and the *cost preset* (what
``dynacp calibrate fit`` writes and ``dynacp.CostModel.load`` / every CLI ``--cost FILE`` read). Both are JSON,
versioned, and checked on load: a bad file raises ValueError naming the file, the table, the row and the field.

Profile (``"format": "dynacp-profile"``, ``"version": 1``)::

    {"format": "dynacp-profile", "version": 1,
     "meta": {"device": "cpu" | CUDA name, "dtype": "float32", "torch": "2.x", "dynacp": "0.1.0",
              "backend": "gloo", "world_size": 2, "ranks_per_node": 2, "layers": 4, "step_factor": 1,
              "model": {...ModelConfig fields...}, "warmup": 1, "repeats": 5, "kv_bytes_per_token": 12288.0},
     "tables": {"group": {"columns": [...], "rows": [[...], ...]}, "attention": ..., "linear": ..., "p2p": ...}}

Tables and their columns (every time in seconds, a median over ``repeats``; ``spread`` is the relative
interquartile range, (q75 - q25) / median, a fraction):

* ``group``: ``lengths`` (the group's sequence lengths in tokens, ``"64+128"``), ``degree`` (CP ranks), ``mask``
  (``causal`` or ``full``), ``crosses_nodes`` (0/1), ``seconds`` (the group's whole training step of one
  microbatch: all layers, forward + backward, what ``CostModel.time`` predicts), ``spread``. The fit's main input.
* ``attention``: ``lengths``, ``degree``, ``mask``, ``seconds`` (one layer's attention, forward + backward, per
  rank), ``spread``.
* ``linear``: ``tokens`` (per rank), ``seconds`` (one layer's linear work, forward + backward), ``spread``.
* ``p2p``: ``group_size`` (ranks of the ring), ``crosses_nodes`` (0/1), ``bytes`` (one message), ``seconds`` (one
  ring hop: every rank sends ``bytes`` to its successor and receives from its predecessor), ``spread``.

A whole step is ``layers * step_factor`` layer passes (``step_factor`` 1 when the measured times include the
backward, 3 for forward-only data such as the distca files: backward ~ 2 x forward).

Cost preset (``"format": "dynacp-cost"``, ``"version": 3``)::

    {"format": "dynacp-cost", "version": 3,
     "cost": {...every CostModel field...},
     "links": {"intra_node_latency": s, "intra_node_bandwidth": B/s, "inter_node_latency": s,
               "inter_node_bandwidth": B/s}        (only the links the profile measured),
     "fit": {...the fit report...}, "meta": {...the profile's meta...}}

Version 2 added the extended model form's ``cost`` fields (``attn_pow_coef``, ``attn_log_coef``, ``doc_overhead``,
``doc_hop_overhead``, ``doc_solo_overhead``, ``comm_overlap``; docs/cost_model.md), version 3 ``node_overhead`` and
the hop tables ``intra_node_hops`` / ``inter_node_hops`` (lists of ``[ring size, latency s, bandwidth B/s]``).
Older files are still read: their missing fields keep their defaults (0, 1 for ``comm_overlap``, empty tables), the
model they were written for exactly; a file naming a field of a later version than it states, or a file of any other
version, is rejected with an error naming the file and the field. docs/calibration.md documents both files field
by field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

PROFILE_FORMAT = "dynacp-profile"
PROFILE_VERSION = 1
PRESET_FORMAT = "dynacp-cost"
PRESET_VERSION = 3
#: preset versions this dynacp reads
PRESET_VERSIONS = (1, 2, 3)
#: CostModel fields that exist from preset version 2 on (the extended form)
EXTENDED_FIELDS = ("attn_pow_coef", "attn_log_coef", "doc_overhead", "doc_hop_overhead", "doc_solo_overhead",
                   "comm_overlap")
#: CostModel fields that exist from preset version 3 on (the node overhead and the ring-size hop tables)
HOP_FIELDS = ("node_overhead", "intra_node_hops", "inter_node_hops")
#: the preset version that introduced each CostModel field not in version 1
FIELD_VERSION = {**{k: 2 for k in EXTENDED_FIELDS}, **{k: 3 for k in HOP_FIELDS}}
#: what each version added (for the error of an older file naming a newer field)
VERSION_ADDED = {2: "the extended model form", 3: "the node overhead and the hop tables"}

#: columns each profile table must have (extra columns are kept and ignored)
COLUMNS: dict[str, tuple[str, ...]] = {
    "group": ("lengths", "degree", "mask", "crosses_nodes", "seconds", "spread"),
    "attention": ("lengths", "degree", "mask", "seconds", "spread"),
    "linear": ("tokens", "seconds", "spread"),
    "p2p": ("group_size", "crosses_nodes", "bytes", "seconds", "spread"),
}
#: top-level fields of a profile file
PROFILE_FIELDS = ("format", "version", "meta", "tables")
#: the ``meta`` keys this package's writers set (the profiler, the distca import); the fit reads ``layers``,
#: ``step_factor``, ``kv_bytes_per_token`` and ``ranks_per_node`` (docs/calibration.md documents each)
META_KEYS = ("device", "dtype", "torch", "dynacp", "backend", "world_size", "ranks_per_node", "layers", "step_factor",
             "model", "warmup", "repeats", "passes", "max_tokens", "kv_bytes_per_token", "seconds", "source", "tp")
#: top-level fields of a cost preset file
PRESET_FIELDS = ("format", "version", "cost", "links", "fit", "meta")
#: Cluster fields a preset's ``links`` may set
LINK_FIELDS = ("intra_node_latency", "intra_node_bandwidth", "inter_node_latency", "inter_node_bandwidth")
MASKS = ("causal", "full")


@dataclass
class Profile:
    """A loaded profile: ``meta`` and one list of row dicts per table (see the module docstring)."""

    meta: dict[str, Any] = field(default_factory=dict)
    """Where and how it was measured: device, dtype, torch and dynacp versions, the model, layers, step_factor."""
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Table name -> rows (dicts keyed by column; ``lengths`` parsed to a list of ints)."""
    source: str = "<memory>"
    """The file it was read from (for error messages)."""

    def rows(self, table: str) -> list[dict[str, Any]]:
        return self.tables.get(table, [])

    @property
    def layer_passes(self) -> float:
        """Layer passes per whole step: ``layers * step_factor``."""
        return float(self.meta.get("layers", 1)) * float(self.meta.get("step_factor", 1))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "meta": self.meta, "tables": {}}
        for name, rows in self.tables.items():
            cols = list(COLUMNS.get(name, ()))
            for r in rows:
                cols += [k for k in r if k not in cols]
            out["tables"][name] = {"columns": cols, "rows": [[_cell(r.get(c)) for c in cols] for r in rows]}
        return out


def _cell(v: Any) -> Any:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (list, tuple)):
        return "+".join(str(int(x)) for x in v)
    return v


def format_lengths(lengths: Any) -> str:
    """``[64, 128]`` -> ``"64+128"`` (the profile's spelling of a group's lengths)."""
    return _cell(list(lengths))


def _where(source: str, table: str, row: Optional[int] = None, column: Optional[str] = None) -> str:
    s = f"{source}: table '{table}'"
    if row is not None:
        s += f", row {row}"
    if column is not None:
        s += f", column '{column}'"
    return s


def _number(v: Any, where: str, *, positive: bool = False, integer: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{where}: expected a number, got {v!r}")
    x = float(v)
    if not math.isfinite(x):
        raise ValueError(f"{where}: {v!r} is not a finite number (NaN or infinite times cannot be fitted)")
    if x < 0 or (positive and x == 0):
        raise ValueError(f"{where}: {v!r} must be {'> 0' if positive else '>= 0'}")
    if integer and x != int(x):
        raise ValueError(f"{where}: {v!r} must be an integer")
    return x


def parse_lengths(v: Any, where: str) -> list[int]:
    """``"64+128"``, ``64`` or ``[64, 128]`` -> ``[64, 128]`` (every length a positive integer)."""
    if isinstance(v, str):
        parts = [p for p in v.replace(" ", "").split("+") if p]
        try:
            vals: list[Any] = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"{where}: lengths {v!r} must be positive integers joined by '+'") from None
    elif isinstance(v, (list, tuple)):
        vals = list(v)
    else:
        vals = [v]
    if not vals:
        raise ValueError(f"{where}: a group needs at least one sequence length")
    return [int(_number(x, where, positive=True, integer=True)) for x in vals]


def check_row(table: str, row: dict[str, Any], source: str, index: int) -> dict[str, Any]:
    """Validate and normalise one row of ``table`` (raises ValueError naming file, table, row and column)."""
    out = dict(row)
    for col in COLUMNS[table]:
        if col not in row:
            raise ValueError(f"{_where(source, table, index)}: missing column '{col}'")
        w = _where(source, table, index, col)
        v = row[col]
        if col == "lengths":
            out[col] = parse_lengths(v, w)
        elif col == "mask":
            if v not in MASKS:
                raise ValueError(f"{w}: mask must be one of {MASKS}, got {v!r}")
        elif col in ("degree", "group_size", "tokens"):
            out[col] = int(_number(v, w, positive=True, integer=True))
        elif col == "crosses_nodes":
            out[col] = bool(_number(v, w, integer=True))
        elif col in ("seconds", "bytes"):
            out[col] = _number(v, w, positive=True)
        else:  # spread
            out[col] = _number(v, w)
    return out


def profile_from_json(data: Any, source: str = "<memory>") -> Profile:
    """A :class:`Profile` from its parsed JSON (ValueError naming the first problem)."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a profile is a JSON object, got {type(data).__name__}")
    if data.get("format") != PROFILE_FORMAT:
        raise ValueError(f"{source}: field 'format' is {data.get('format')!r}, expected {PROFILE_FORMAT!r} (is this a "
                         "dynacp profile? distca CSV files are read by dynacp.calibrate.import_distca)")
    if data.get("version") != PROFILE_VERSION:
        raise ValueError(f"{source}: field 'version' is {data.get('version')!r}; this dynacp reads profile version "
                         f"{PROFILE_VERSION} (re-run `dynacp calibrate profile` with this version)")
    tables = data.get("tables")
    if not isinstance(tables, dict):
        raise ValueError(f"{source}: field 'tables' must be an object of tables")
    prof = Profile(meta=dict(data.get("meta") or {}), source=source)
    for name, tab in tables.items():
        if name not in COLUMNS:
            raise ValueError(f"{source}: unknown table '{name}'; known: {', '.join(COLUMNS)}")
        cols, rows = tab.get("columns"), tab.get("rows")
        if not isinstance(cols, list) or not isinstance(rows, list):
            raise ValueError(f"{_where(source, name)}: needs 'columns' (a list) and 'rows' (a list of lists)")
        missing = [c for c in COLUMNS[name] if c not in cols]
        if missing:
            raise ValueError(f"{_where(source, name)}: missing column(s) {missing}; columns are {cols}")
        out = []
        for i, r in enumerate(rows):
            if not isinstance(r, list) or len(r) != len(cols):
                raise ValueError(f"{_where(source, name, i)}: expected {len(cols)} cells, got {r!r}")
            out.append(check_row(name, dict(zip(cols, r)), source, i))
        prof.tables[name] = out
    return prof


def _read_json(path: Union[str, Path], what: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} file {p} does not exist")
    try:
        # NaN in a file is read (json accepts it) and then rejected by the row checks, naming the row
        return json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}") from None


def load_profile(path: Union[str, Path]) -> Profile:
    """Read and check a profile file written by :func:`save_profile` / ``dynacp calibrate profile``."""
    return profile_from_json(_read_json(path, "profile"), str(path))


def save_profile(profile: Profile, path: Union[str, Path]) -> None:
    """Write ``profile`` as JSON (stable key order, so equal profiles give equal files)."""
    Path(path).write_text(json.dumps(profile.to_json(), indent=1, sort_keys=True) + "\n")


# -- cost presets --------------------------------------------------------------------------------------------------

def preset_to_json(cost: Any, links: Optional[dict[str, float]] = None, fit: Optional[dict] = None,
                   meta: Optional[dict] = None) -> dict[str, Any]:
    """The preset JSON of a ``dynacp.CostModel`` and measured links."""
    return {"format": PRESET_FORMAT, "version": PRESET_VERSION, "cost": dict(cost.to_dict()),
            "links": dict(links or {}), "fit": fit or {}, "meta": meta or {}}


def save_preset(path: Union[str, Path], cost: Any, links: Optional[dict[str, float]] = None,
                fit: Optional[dict] = None, meta: Optional[dict] = None) -> None:
    """Write a cost preset file (read back by :func:`load_preset` and ``dynacp.CostModel.load``)."""
    Path(path).write_text(json.dumps(preset_to_json(cost, links, fit, meta), indent=1, sort_keys=True) + "\n")


def preset_from_json(data: Any, source: str = "<memory>") -> tuple[Any, dict[str, float]]:
    """``(CostModel, links)`` from a parsed preset (ValueError naming the file and field)."""
    from dynacp import _core

    if not isinstance(data, dict) or data.get("format") != PRESET_FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{source}: field 'format' is {got!r}, expected {PRESET_FORMAT!r} (a cost preset written by "
                         "`dynacp calibrate fit`)")
    version = data.get("version")
    if isinstance(version, bool) or version not in PRESET_VERSIONS:
        raise ValueError(f"{source}: field 'version' is {version!r}; this dynacp reads cost presets of version "
                         f"{', '.join(map(str, PRESET_VERSIONS[:-1]))} or {PRESET_VERSIONS[-1]} (re-run `dynacp calibrate fit` with this version)")
    fields = data.get("cost")
    if not isinstance(fields, dict):
        raise ValueError(f"{source}: field 'cost' must be an object of CostModel fields")
    cost = _core.CostModel()
    known = set(cost._fields)
    for k, v in fields.items():
        if k not in known:
            raise ValueError(f"{source}: field 'cost.{k}' is not a CostModel field; fields: {sorted(known)}")
        need = FIELD_VERSION.get(k, 1)
        if version < need:
            raise ValueError(f"{source}: field 'cost.{k}' needs preset version {need} ({VERSION_ADDED[need]}), but "
                             f"the file says version {version}; set 'version' to {need}")
        if k.endswith("_hops"):
            v = _hop_points(v, f"{source}: field 'cost.{k}'")
        elif k not in ("name", "source"):
            v = _number(v, f"{source}: field 'cost.{k}'")
        setattr(cost, k, v)
    try:
        cost.validate()
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    links: dict[str, float] = {}
    for k, v in (data.get("links") or {}).items():
        if k not in LINK_FIELDS:
            raise ValueError(f"{source}: field 'links.{k}' is not a link field; fields: {list(LINK_FIELDS)}")
        links[k] = _number(v, f"{source}: field 'links.{k}'", positive="bandwidth" in k)
    return cost, links


def _hop_points(v: Any, where: str) -> list[list[float]]:
    """A hop table of a preset: a list of ``[ring size, latency s, bandwidth B/s]`` (ValueError naming the point;
    the order and monotonicity are checked by ``CostModel.validate``)."""
    if not isinstance(v, list):
        raise ValueError(f"{where}: expected a list of [ring size, latency s, bandwidth B/s] points, got {v!r}")
    out = []
    for i, p in enumerate(v):
        if not isinstance(p, list) or len(p) != 3:
            raise ValueError(f"{where}[{i}]: expected [ring size, latency s, bandwidth B/s], got {p!r}")
        out.append([_number(x, f"{where}[{i}]") for x in p])
    return out


def load_preset(path: Union[str, Path]) -> tuple[Any, dict[str, float]]:
    """``(dynacp.CostModel, links)`` of a cost preset file; ``links`` maps Cluster link fields to values (apply
    them with :func:`apply_links`)."""
    return preset_from_json(_read_json(path, "cost preset"), str(path))


def apply_links(cluster: Any, links: dict[str, float]) -> Any:
    """Set the measured link latencies/bandwidths of a preset on ``cluster`` (in place; returns it)."""
    for k, v in links.items():
        setattr(cluster, k, float(v))
    return cluster


def load_cost(path: Union[str, Path]) -> Any:
    """``dynacp.CostModel.load(path)``: the CostModel of a cost preset file (its links: :func:`load_preset`)."""
    return load_preset(path)[0]


def resolve_cost(spec: str) -> tuple[Any, dict[str, float]]:
    """A CLI ``--cost`` value: a built-in preset name or a preset file -> ``(CostModel, links)``."""
    from dynacp import _core

    if spec in _core.preset_names() or spec == "default":
        return _core.preset(spec), {}
    if Path(spec).suffix == ".json" or Path(spec).exists():
        return load_preset(spec)
    return _core.preset(spec), {}  # raises ValueError listing the known presets
