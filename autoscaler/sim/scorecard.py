"""The scorecard: the numbers every simulation reports (printed, and written as JSON)."""

from __future__ import annotations

from typing import Any

import numpy as np

from autoscaler.sim.run import SimResult

# The keys, in the order the table prints them.
COLUMNS = (
    "requests",
    "slo_attainment",
    "slo_windows_met",
    "slo_requests_met",
    "violating_requests",
    "gpu_hours",
    "gpu_hours_vs_oracle",
    "lent_gpu_hours",
    "scale_events",
    "unplaced_replica_minutes",
    "fragmentation",
    "sim_wall_s",
)


def scorecard(result: SimResult, oracle_gpu_hours: float | None = None) -> dict[str, Any]:
    arrivals = result.minute_arrivals
    within = result.minute_within
    total = float(arrivals.sum())
    attainment = float(within.sum() / total) if total > 0 else 1.0
    # A model-minute meets its SLO when at least the declared percentile of its requests were in time
    # (equivalently: the percentile latency is within the target). Minutes without requests do not count.
    has = arrivals > 0
    frac = np.divide(within, arrivals, out=np.ones_like(within), where=has)
    met = frac >= (result.slo_percentile[:, None] / 100.0) - 1e-9
    windows_met = float(met[has].mean()) if has.any() else 1.0
    # An SLO on a percentile is judged per window: a request is served within the SLO when its model-minute
    # met the declared percentile, and "violating" when that minute missed it (so a 95 % SLO is not
    # charged for the 5 % of requests it allows to be slow, but a missed minute charges all of its requests).
    violating = float(arrivals[has & ~met].sum())
    per_model = {}
    for i, name in enumerate(result.models):
        a = float(arrivals[i].sum())
        per_model[name] = {
            "requests": a,
            "slo_attainment": float(within[i].sum() / a) if a > 0 else 1.0,
            "p95_latency_s": _num(result.latency_p95_s[i]),
            "slo_latency_s": float(result.slo_latency_s[i]),
            "mean_replicas": float(result.minute_replicas[i].mean()) if result.minute_replicas.size else 0.0,
        }
    return {
        "policy": result.policy,
        "mode": result.mode,
        "requests": total,
        "slo_attainment": attainment,
        "slo_windows_met": windows_met,
        "slo_requests_met": 1.0 - violating / total if total > 0 else 1.0,
        "violating_requests": violating,
        "late_requests": total - float(within.sum()),
        "gpu_hours": result.gpu_hours,
        "gpu_hours_vs_oracle": (result.gpu_hours / oracle_gpu_hours) if oracle_gpu_hours else None,
        "lent_gpu_hours": 0.0,  # lending arrives with its own issue
        "scale_events": result.scale_events,
        "decisions_by_reason": result.reasons,
        "unplaced_replica_minutes": result.unplaced_replica_minutes,
        "fragmentation": result.fragmentation,
        "gpus_total": result.gpus_total,
        "sim_wall_s": result.sim_wall_s,
        "burn_in_s": result.burn_in_s,
        "invalid_models": result.invalid_models,
        "per_model": per_model,
    }


def _num(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)
