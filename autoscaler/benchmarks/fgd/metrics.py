"""The published metric: allocated GPU milli / capacity, binned by integer arrival %.

``analysis_allo_discrete.csv`` (``reference/fgd_protocol.md`` §3): arrive = round(arrived / cap %),
column k = the mean allocation % over the pod events with arrive == k (k-1, then k+1, if none),
rounded to 2 decimals. Unallocated GPUs at k = (100 - column k) x GPUs / 100.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

from autoscaler.benchmarks.fgd.sim import RunResult
from autoscaler.benchmarks.fgd.workload import MILLI

MAX_PCT = 130
REPORT_AT = (100, 130)

# Published policy labels in fgd_expected/ and ours.
EXPECTED_LABELS = {
    "random": "01-Random",
    "dotprod": "02-DotProd",
    "clustering": "03-GpuClustering",
    "packing": "04-GpuPacking",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
}


def alloc_curve(result: RunResult, max_pct: int = MAX_PCT) -> np.ndarray:
    """Allocation % per arrival % 0..max_pct (NaN where no event is near)."""
    cap = result.total_gpus * MILLI / 100.0
    arrive = np.round(result.arrived_milli / cap).astype(np.int64)
    alloc = result.used_milli / cap
    sums = np.bincount(np.clip(arrive, 0, max_pct + 1), weights=alloc, minlength=max_pct + 2)
    cnts = np.bincount(np.clip(arrive, 0, max_pct + 1), minlength=max_pct + 2)
    out = np.full(max_pct + 1, np.nan)
    for k in range(max_pct + 1):
        for j in (k, k - 1, k + 1):
            if 0 <= j <= max_pct + 1 and cnts[j] and not (j == max_pct + 1 and arrive.max() > max_pct + 1):
                out[k] = round(sums[j] / cnts[j], 2)
                break
    return out


def unallocated_gpus(alloc_pct: float, total_gpus: int) -> float:
    return (100.0 - alloc_pct) * total_gpus / 100.0


def load_expected(path: str | Path) -> dict[tuple[str, str], dict[int, np.ndarray]]:
    """``analysis_allo_discrete.csv`` -> {(trace, our policy name): {seed: curve 0..130}}."""
    ours = {v: k for k, v in EXPECTED_LABELS.items()}
    out: dict[tuple[str, str], dict[int, np.ndarray]] = defaultdict(dict)
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            pol = ours.get(rec["sc_policy"])
            if pol is None:
                continue
            curve = np.array([float(rec[str(k)]) if rec.get(str(k)) not in (None, "") else np.nan
                              for k in range(MAX_PCT + 1)])
            out[(rec["workload"], pol)][int(rec["seed"])] = curve
    return dict(out)
