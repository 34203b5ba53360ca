"""Azure Functions 2019 per-minute invocation counts -> RateSeries (step 60 s, rate = count / 60).

Both layouts seen in the wild are read:

* ``HashOwner,HashApp,HashFunction,Trigger,1,2,...,1440`` (the dataset; subsets keep any minute range)
* ``HashFunction,...,minute_1,...,minute_N`` (other columns vary)

Count columns are recognised by name (an integer, optionally prefixed ``minute``/``minute_``); every
other column is per-function metadata and lands in ``meta[snake_case(column)] = {model: value}`` --
so the full hashes stay available (``meta["hash_function"]``) while model names stay short:
``fn-<first 8 hex of HashFunction>``, lengthened (or suffixed) only where two functions clash.

Companion files next to the invocations file are attached as service-time / memory priors:
``durations.csv`` (or the dataset's ``function_durations_percentiles.anon.dNN.csv``) ->
``meta["duration_ms"] = {model: {"mean", "count", "min", "max", "p0", "p1", ..., "p100"}}`` and
``memory.csv`` (or ``app_memory_percentiles.anon.dNN.csv``, per app) ->
``meta["memory_mb"] = {model: {"mean", "count", "p1", ..., "p100"}}``. They are joined on whichever
of HashOwner/HashApp/HashFunction both files have.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from forecasting.traces._io import CsvTable, floats, read_csv
from forecasting.traces.model import RateSeries, TraceFormatError

STEP_S = 60.0
KEY_COLUMNS = ("HashOwner", "HashApp", "HashFunction")
_COUNT = re.compile(r"^(?:minute_?)?(\d+)$", re.IGNORECASE)
_DAY = re.compile(r"\.(d\d+)\.", re.IGNORECASE)


def count_columns(header: list[str]) -> list[tuple[int, int]]:
    """``(column index, minute number)`` of every per-minute count column."""
    out = []
    for i, h in enumerate(header):
        m = _COUNT.match(h.strip())
        if m:
            out.append((i, int(m.group(1))))
    return out


def _snake(name: str) -> str:
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.strip())
    return re.sub(r"[^0-9a-zA-Z]+", "_", s).strip("_").lower() or "column"


def function_names(hashes: list[str]) -> list[str]:
    """``fn-<8 hex>``; functions whose prefixes clash get longer prefixes, identical hashes ``-2``..."""
    width = {h: 8 for h in hashes}
    while True:
        names = {h: h[: width[h]] for h in width}
        clash: dict[str, set[str]] = {}
        for h, n in names.items():
            clash.setdefault(n, set()).add(h)
        grow = [h for group in clash.values() if len(group) > 1 for h in group if width[h] < len(h)]
        if not grow:
            break
        for h in grow:
            width[h] += 4
    out, seen = [], {}
    for h in hashes:
        base = f"fn-{names[h]}"
        seen[base] = seen.get(base, 0) + 1
        out.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return out


def invocation_file(path: Path) -> Path:
    """A folder resolves to its single ``invocations*.csv[.gz]`` file."""
    if not path.is_dir():
        return path
    found = sorted(p for p in path.iterdir() if p.name.lower().startswith("invocations") and _is_csv(p) and p.is_file())
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise TraceFormatError(str(path), None, None, f"{what} invocations*.csv files in folder; name one")
    return found[0]


def _is_csv(p: Path) -> bool:
    return p.name.lower().endswith((".csv", ".csv.gz"))


def companion(path: Path, word: str) -> Path | None:
    """The ``word`` file (``duration``/``memory``) beside ``path``, same ``dNN`` day if it has one."""
    day = _DAY.search(path.name)
    cands = [
        p
        for p in path.parent.iterdir()
        if p != path
        and p.is_file()
        and _is_csv(p)
        and word in p.name.lower()
        and (day is None or f".{day.group(1).lower()}." in p.name.lower())
    ]
    if len(cands) > 1:
        # Prefer the plain name (``durations.csv``) when a folder holds variants of it.
        plain = [p for p in cands if p.name.lower().split(".")[0].startswith(word)]
        cands = plain if len(plain) == 1 else []
    return cands[0] if len(cands) == 1 else None


def read_azure_functions(path: str | Path) -> RateSeries:
    path = invocation_file(Path(path))
    table = read_csv(path, numeric=lambda head: [i for i, _ in count_columns(head)])
    if table.matrix is None:
        raise TraceFormatError(table.path, 1, None, "no per-minute count columns (named by minute number or minute_N)")
    fi = table.index("HashFunction")
    assert fi is not None
    minutes = [m for _, m in count_columns(table.matrix_columns)]
    for k in range(1, len(minutes)):
        if minutes[k] <= minutes[k - 1]:
            raise TraceFormatError(table.path, 1, table.matrix_columns[k], "minute columns must be in increasing order")
    counts = table.matrix
    bad = ~np.isfinite(counts) | (counts < 0)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        v = counts[r, c]
        raise table.error(int(r), table.matrix_columns[c], "negative count" if v < 0 else "not a finite count")

    hashes = [v.strip() for v in table.column(fi)]
    if not all(hashes):
        i = hashes.index("")
        raise table.error(i, "HashFunction", "missing value")
    models = tuple(function_names(hashes))
    first = minutes[0]
    rates = np.full((len(models), minutes[-1] - first + 1), np.nan)
    rates[:, np.array(minutes) - first] = counts / STEP_S

    meta: dict[str, object] = {"format": "azure-functions-2019", "first_minute": first}
    for ci, col in enumerate(table.header):
        meta[_snake(col)] = {m: r[ci].strip() for m, r in zip(models, table.rows, strict=True)}
    for word, key, stats in (
        ("duration", "duration_ms", _duration_stat),
        ("memory", "memory_mb", _memory_stat),
    ):
        side = companion(path, word)
        if side is not None:
            meta[key] = _join_stats(side, table, models, stats)
    return RateSeries(rates=rates, models=models, step_s=STEP_S, start_s=0.0, source=str(path), meta=meta)


def _duration_stat(col: str) -> str | None:
    fixed = {"average": "mean", "count": "count", "minimum": "min", "maximum": "max"}
    if col.lower() in fixed:
        return fixed[col.lower()]
    m = re.fullmatch(r"percentile_average_(\d+)", col, re.IGNORECASE)
    return f"p{m.group(1)}" if m else None


def _memory_stat(col: str) -> str | None:
    fixed = {"averageallocatedmb": "mean", "samplecount": "count"}
    if col.lower() in fixed:
        return fixed[col.lower()]
    m = re.fullmatch(r"averageallocatedmb_pct(\d+)", col, re.IGNORECASE)
    return f"p{m.group(1)}" if m else None


def _join_stats(
    side: Path, inv: CsvTable, models: tuple[str, ...], stat_of: Callable[[str], str | None]
) -> dict[str, dict[str, float]]:
    table = read_csv(side)
    keys = [k for k in KEY_COLUMNS if k in table.header and k in inv.header]
    if not keys:
        raise TraceFormatError(
            table.path, 1, None, f"none of the key columns {', '.join(KEY_COLUMNS)} shared with {inv.path}"
        )
    stat_cols = [(i, s) for i, h in enumerate(table.header) if (s := stat_of(h)) is not None]
    values = {s: floats(table, i, table.header[i], allow_empty=True, min_value=0.0) for i, s in stat_cols}
    kidx = [table.header.index(k) for k in keys]
    row_of: dict[tuple[str, ...], int] = {}
    for r, row in enumerate(table.rows):
        row_of.setdefault(tuple(row[i].strip() for i in kidx), r)  # first row wins on duplicates
    inv_idx = [inv.header.index(k) for k in keys]
    out: dict[str, dict[str, float]] = {}
    for model, row in zip(models, inv.rows, strict=True):
        r = row_of.get(tuple(row[i].strip() for i in inv_idx))
        if r is None:
            continue
        stats = {s: float(v[r]) for s, v in values.items() if not np.isnan(v[r])}
        if stats:
            out[model] = stats
    return out
