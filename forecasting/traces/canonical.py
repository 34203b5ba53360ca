"""The project's own two CSV formats (readable by any tool, ``.csv.gz`` accepted everywhere).

Request log::

    t,model[,input_tokens,output_tokens][,service_s][,<extra>...]

``t`` is seconds from the start of the trace (non-decreasing), ``service_s`` a measured service
time (empty cell = unknown -> NaN). Extra columns are kept as per-request arrays in ``meta[name]``.

Rate series::

    t,model,rate[,<extra>...]

``rate`` is requests/s over ``[t, t + step)``. Rows may come in any order across models but each
model's times must increase; the step is inferred and every model must lie on one common grid.
Missing points (or an empty ``rate`` cell) are NaN. Extra columns become ``meta[name]`` arrays of
the same ``(models, steps)`` shape as ``rates`` (ServeGen's ``cv`` travels this way).

Per-model side file ``<stem>.models.csv[.gz]`` next to either format (optional)::

    model,<key>,<key>.<stat>,...

A plain column ``key`` becomes ``meta[key] = {model: value}``; a dotted column ``key.stat`` becomes
``meta[key] = {model: {stat: value}}`` (e.g. ``duration_ms.mean``, ``duration_ms.p99`` -- the service
time priors of the Azure Functions trace). Writers emit it for such per-model dicts in ``meta``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from forecasting.traces._grid import ModelPoints, assemble
from forecasting.traces._io import (
    CsvTable,
    check_non_decreasing,
    floats,
    fmt_float,
    fmt_time,
    ints,
    is_gzip_path,
    open_text_write,
    read_csv,
    strip_suffixes,
)
from forecasting.traces.model import RateSeries, RequestLog, TraceFormatError

REQUEST_COLUMNS = ("t", "model", "input_tokens", "output_tokens", "service_s")
RATE_COLUMNS = ("t", "model", "rate")
SIDE_SUFFIX = ".models.csv"


# ---------------------------------------------------------------- shared pieces


def model_codes(table: CsvTable, idx: int) -> tuple[tuple[str, ...], np.ndarray]:
    """Model names in first-seen order and each row's index into them."""
    names = [v.strip() for v in table.column(idx)]
    if not all(names):
        i = next(i for i, v in enumerate(names) if not v)
        raise table.error(i, table.header[idx], "empty model name")
    arr = np.array(names)
    uniq, first, inv = np.unique(arr, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    remap = np.empty(len(order), dtype=np.int32)
    remap[order] = np.arange(len(order), dtype=np.int32)
    return tuple(str(u) for u in uniq[order]), remap[inv.ravel()]


def extra_column(table: CsvTable, idx: int) -> np.ndarray:
    """A column we do not interpret: float64 when every non-empty cell is a number, else str."""
    vals = table.column(idx)
    try:
        return np.array([v if v.strip() else "nan" for v in vals], dtype=np.float64)
    except ValueError:
        return np.array([v.strip() for v in vals])


def side_path(path: Path) -> Path | None:
    base = strip_suffixes(path)
    for suffix in (SIDE_SUFFIX, SIDE_SUFFIX + ".gz"):
        cand = path.with_name(base + suffix)
        if cand.is_file():
            return cand
    return None


def read_side(path: Path, models: tuple[str, ...]) -> dict[str, object]:
    """Per-model meta from ``<stem>.models.csv``; rows for models absent from the trace are ignored."""
    table = read_csv(path)
    mi = table.index("model")
    assert mi is not None
    names = [v.strip() for v in table.column(mi)]
    known = set(models)
    meta: dict[str, dict[str, object]] = {}
    for ci, col in enumerate(table.header):
        if ci == mi:
            continue
        values = extra_column(table, ci)
        key, _, stat = col.partition(".")
        target = meta.setdefault(key, {})
        for name, v in zip(names, values.tolist(), strict=True):
            if name not in known or v == "" or (isinstance(v, float) and v != v):
                continue
            if stat:
                entry = target.setdefault(name, {})
                if not isinstance(entry, dict):
                    raise TraceFormatError(str(path), 1, col, f"'{key}' is both a plain and a dotted column")
                entry[stat] = v
            else:
                target[name] = v
    return dict(meta)


def per_model_meta(meta: dict[str, object], models: tuple[str, ...]) -> dict[str, dict[str, object]]:
    """The meta entries that are ``{model: scalar}`` or ``{model: {stat: scalar}}`` dicts."""
    known = set(models)
    out: dict[str, dict[str, object]] = {}
    for key, value in meta.items():
        if isinstance(value, dict) and value and set(value) <= known and "." not in key:
            out[key] = value
    return out


def write_side(path: Path, meta: dict[str, object], models: tuple[str, ...]) -> Path | None:
    per_model = per_model_meta(meta, models)
    if not per_model:
        return None
    columns: list[tuple[str, str | None]] = []
    for key, value in per_model.items():
        stats: dict[str, None] = {}
        nested = False
        for v in value.values():
            if isinstance(v, dict):
                nested = True
                stats.update(dict.fromkeys(v))
        if nested:
            columns.extend((key, s) for s in stats)
        else:
            columns.append((key, None))
    suffix = SIDE_SUFFIX + (".gz" if is_gzip_path(path) else "")
    out = path.with_name(strip_suffixes(path) + suffix)
    with open_text_write(out) as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["model", *(k if s is None else f"{k}.{s}" for k, s in columns)])
        for m in models:
            row: list[str] = [m]
            for key, stat in columns:
                v = per_model[key].get(m)
                if stat is not None:
                    v = v.get(stat) if isinstance(v, dict) else None
                row.append(_cell(v))
            w.writerow(row)
    return out


def _pad(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "U":
        return np.concatenate([a, np.full((a.shape[0], 1), "", dtype=a.dtype)], axis=1)
    return np.concatenate([a.astype(np.float64), np.full((a.shape[0], 1), np.nan)], axis=1)


def _cell(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, (float, int, np.floating, np.integer)) and not isinstance(v, bool):
        return fmt_float(float(v))
    return str(v)


# ---------------------------------------------------------------- request log


def read_requests(path: str | Path) -> RequestLog:
    path = Path(path)
    table = read_csv(path)
    ti = table.index("t")
    mi = table.index("model")
    assert ti is not None and mi is not None
    t = floats(table, ti, "t", min_value=0.0)
    check_non_decreasing(table, t, "t")
    models, codes = model_codes(table, mi)
    tokens: dict[str, np.ndarray | None] = {}
    for name in ("input_tokens", "output_tokens"):
        idx = table.index(name, required=False)
        tokens[name] = None if idx is None else ints(table, idx, name, min_value=0)
    si = table.index("service_s", required=False)
    service = None if si is None else floats(table, si, "service_s", allow_empty=True, min_value=0.0)
    meta: dict[str, object] = {}
    for ci, col in enumerate(table.header):
        if col not in REQUEST_COLUMNS:
            meta[col] = extra_column(table, ci)
    side = side_path(path)
    if side is not None:
        meta.update(read_side(side, models))
    return RequestLog(
        t=t,
        model_index=codes,
        models=models,
        input_tokens=tokens["input_tokens"],
        output_tokens=tokens["output_tokens"],
        service_s=service,
        source=str(path),
        meta=meta,
    )


def write_requests(log: RequestLog, path: str | Path, *, t_decimals: int | None = 6) -> Path:
    """Write ``log`` as a canonical request CSV (``.gz`` -> gzip'd). Times are rounded to
    ``t_decimals`` (microseconds by default: finer than any trace we read, and it keeps files small).
    1-D meta arrays with one value per request are written as extra columns."""
    path = Path(path)
    n = len(log)
    if not n:
        raise ValueError(f"{path}: refusing to write an empty request log (readers reject it)")
    cols: list[tuple[str, list[str]]] = [
        ("t", [fmt_time(x, t_decimals) for x in log.t.tolist()]),
        ("model", [log.models[i] for i in log.model_index.tolist()]),
    ]
    if log.input_tokens is not None:
        cols.append(("input_tokens", [str(x) for x in log.input_tokens.tolist()]))
    if log.output_tokens is not None:
        cols.append(("output_tokens", [str(x) for x in log.output_tokens.tolist()]))
    if log.service_s is not None:
        cols.append(("service_s", [fmt_float(x) for x in log.service_s.tolist()]))
    for key, value in log.meta.items():
        if isinstance(value, np.ndarray) and value.ndim == 1 and len(value) == n and key not in REQUEST_COLUMNS:
            cols.append((key, [_cell(x) for x in value.tolist()]))
    with open_text_write(path) as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow([c for c, _ in cols])
        w.writerows(zip(*(v for _, v in cols), strict=True))
    write_side(path, log.meta, log.models)
    return path


# ---------------------------------------------------------------- rate series


def read_rates(path: str | Path) -> RateSeries:
    path = Path(path)
    table = read_csv(path)
    ti = table.index("t")
    mi = table.index("model")
    ri = table.index("rate")
    assert ti is not None and mi is not None and ri is not None
    t = floats(table, ti, "t", min_value=0.0)
    rate = floats(table, ri, "rate", allow_empty=True, min_value=0.0)
    models, codes = model_codes(table, mi)
    extra = {col: extra_column(table, ci) for ci, col in enumerate(table.header) if col not in RATE_COLUMNS}
    order = np.argsort(codes, kind="stable")  # groups rows by model, keeping file order inside
    bounds = np.searchsorted(codes[order], np.arange(len(models) + 1))
    points = []
    for m, name in enumerate(models):
        rows = order[bounds[m] : bounds[m + 1]]
        points.append(
            ModelPoints(
                model=name,
                t=t[rows],
                rate=rate[rows],
                table=table,
                rows=rows,
                extras={k: v[rows] for k, v in extra.items()},
            )
        )
    grid = assemble(points, str(path))
    meta: dict[str, object] = dict(grid.extras)
    side = side_path(path)
    if side is not None:
        meta.update(read_side(side, models))
    return RateSeries(
        rates=grid.rates,
        models=models,
        step_s=grid.step_s,
        start_s=grid.start_s,
        source=str(path),
        meta=meta,
    )


def write_rates(series: RateSeries, path: str | Path) -> Path:
    """Write ``series`` densely, time-major (NaN -> empty ``rate`` cell, so gaps survive a round
    trip). ``meta`` arrays shaped like ``rates`` become extra columns; per-model dicts go to the
    ``<stem>.models.csv`` side file. A single-step series gets a trailing empty step so that the
    step length is still in the file."""
    path = Path(path)
    n_models, n_steps = series.rates.shape
    if not n_models or not n_steps:
        raise ValueError(f"{path}: refusing to write an empty rate series (the format cannot express it)")
    extras = {
        k: v
        for k, v in series.meta.items()
        if isinstance(v, np.ndarray) and v.shape == series.rates.shape and k not in RATE_COLUMNS
    }
    rates = series.rates
    if n_steps == 1:
        # One time point per model would leave the step unknowable to the reader; a trailing
        # all-missing step records it (it reads back as NaN, the format's "no data").
        rates = np.concatenate([rates, np.full((n_models, 1), np.nan)], axis=1)
        extras = {k: _pad(v) for k, v in extras.items()}
        n_steps = 2
    # Times are rounded to nanoseconds so start + k*step float noise does not leak into the text.
    times = [fmt_time(series.start_s + k * series.step_s, 9) for k in range(n_steps)]
    rate_text = [[fmt_float(x) for x in row] for row in rates.tolist()]
    extra_text = {k: [[_cell(x) if x == x else "" for x in row] for row in v.tolist()] for k, v in extras.items()}
    with open_text_write(path) as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow([*RATE_COLUMNS, *extras])
        for k in range(n_steps):
            for m in range(n_models):
                w.writerow([times[k], series.models[m], rate_text[m][k], *(extra_text[e][m][k] for e in extras)])
    write_side(path, series.meta, series.models)
    return path
