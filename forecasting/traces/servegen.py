"""ServeGen (alibaba/ServeGen) per-client window traces -> RateSeries, one model per client.

A folder holds ``chunk-<id>-trace.csv`` files without header, one row per window::

    t_s,rate_req_per_s,cv,iat_dist,param1,param2

``iat_dist`` names the inter-arrival distribution fitted in that window (``Gamma``, ``Weibull``,
empty when the client is idle). The window length is inferred from the times. Besides the rates,
``meta`` keeps, shaped ``(clients, windows)`` like ``rates``: ``cv`` (inter-arrival coefficient of
variation -- burstiness), ``iat_dist`` (str) and ``iat_param1`` / ``iat_param2``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from forecasting.traces._grid import ModelPoints, assemble
from forecasting.traces._io import CsvTable, floats, is_number, read_csv, sniff_header
from forecasting.traces.model import RateSeries, TraceFormatError

COLUMNS = ("t_s", "rate_req_per_s", "cv", "iat_dist", "param1", "param2")
META_NAMES = {"cv": "cv", "iat_dist": "iat_dist", "param1": "iat_param1", "param2": "iat_param2"}
_CHUNK = re.compile(r"^chunk-(.+)-trace\.csv(\.gz)?$", re.IGNORECASE)


def chunk_files(path: Path) -> list[tuple[str, Path]]:
    """``(client id, file)`` pairs; numeric ids sort numerically so client-2 precedes client-10."""
    if path.is_dir():
        found = [(m.group(1), p) for p in path.iterdir() if p.is_file() and (m := _CHUNK.match(p.name))]
        if not found:
            raise TraceFormatError(str(path), None, None, "no chunk-<id>-trace.csv files in folder")
    else:
        m = _CHUNK.match(path.name)
        found = [(m.group(1) if m else path.name.split(".")[0], path)]
    return sorted(found, key=lambda x: (0, int(x[0]), "") if x[0].isdigit() else (1, 0, x[0]))


def _read_chunk(path: Path) -> CsvTable:
    head = sniff_header(path)
    # Tolerate a header line someone added (first cell not a number); the dataset itself has none.
    has_header = head is not None and not is_number(head[0])
    table = read_csv(path, header=has_header, names=None if has_header else COLUMNS)
    if len(table.header) != len(COLUMNS):
        raise TraceFormatError(
            table.path,
            1,
            None,
            f"expected {len(COLUMNS)} fields ({','.join(COLUMNS)}), got {len(table.header)}",
        )
    table.header = list(COLUMNS)
    return table


def read_servegen(path: str | Path) -> RateSeries:
    path = Path(path)
    points = []
    models = []
    for client, f in chunk_files(path):
        table = _read_chunk(f)
        t = floats(table, 0, "t_s", min_value=0.0)
        rate = floats(table, 1, "rate_req_per_s", min_value=0.0)
        cv = floats(table, 2, "cv", allow_empty=True, min_value=0.0)
        p1 = floats(table, 4, "param1", allow_empty=True)
        p2 = floats(table, 5, "param2", allow_empty=True)
        dist = np.array([r[3].strip() for r in table.rows])
        bad = np.array([bool(d) and not d.isidentifier() for d in dist.tolist()])
        if bad.any():
            i = int(np.argmax(bad))
            raise table.error(i, "iat_dist", f"not a distribution name: {table.rows[i][3]!r}")
        name = f"client-{client}"
        models.append(name)
        points.append(
            ModelPoints(
                model=name,
                t=t,
                rate=rate,
                table=table,
                rows=np.arange(len(t)),
                extras={"cv": cv, "iat_dist": dist, "iat_param1": p1, "iat_param2": p2},
            )
        )
    grid = assemble(points, str(path), t_field="t_s")
    meta: dict[str, object] = {"format": "servegen", **grid.extras}
    return RateSeries(
        rates=grid.rates,
        models=tuple(models),
        step_s=grid.step_s,
        start_s=grid.start_s,
        source=str(path),
        meta=meta,
    )
