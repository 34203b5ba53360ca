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
    "cost_usd",
    "idle_cost_usd",
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
    cost = cost_card(result)
    per_model = {}
    for i, name in enumerate(result.models):
        a = float(arrivals[i].sum())
        per_model[name] = {
            "requests": a,
            "late_requests": a - float(within[i].sum()),
            "slo_attainment": float(within[i].sum() / a) if a > 0 else 1.0,
            "slo_percentile": float(result.slo_percentile[i]),
            "p95_latency_s": _num(result.latency_p95_s[i]),
            "slo_latency_s": float(result.slo_latency_s[i]),
            "mean_replicas": float(result.minute_replicas[i].mean()) if result.minute_replicas.size else 0.0,
            **cost["per_model"].get(name, {}),
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
        "cost_usd": cost["total_usd"],
        "idle_cost_usd": cost["idle_usd"],
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
        "cost": {k: v for k, v in cost.items() if k != "per_model"},
    }


def cost_card(result: SimResult) -> dict[str, Any]:
    """Cost attribution of a run (scored time only, like ``gpu_hours``), priced with ``result.prices``.

    ``per_model``: team, namespace, GPU-equivalent hours by GPU kind and in total, and their cost;
    ``by_team``: the same summed per team; ``idle_gpu_hours_by_kind`` / ``idle_usd``: idle reserved capacity
    (free GPU-equivalents on nodes holding replicas). The models' GPU-hours sum to the run's ``gpu_hours``.
    """
    kinds = result.gpu_kinds
    held = result.model_gpu_seconds
    idle = result.idle_gpu_seconds
    if held is None or idle is None:
        held, idle = np.zeros((len(result.models), len(kinds))), np.zeros(len(kinds))
    prices = np.array([result.prices.get(k, 0.0) for k in kinds])
    hours = held / 3600.0
    usd = hours * prices[None, :]
    per_model: dict[str, dict[str, Any]] = {}
    by_team: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(result.models):
        team = result.teams[i] if result.teams else "default"
        row = {
            "team": team,
            "namespace": result.namespaces[i] if result.namespaces else "default",
            "gpu_hours": float(hours[i].sum()),
            "gpu_hours_by_kind": {k: float(hours[i, j]) for j, k in enumerate(kinds) if hours[i, j] > 0},
            "cost_usd": float(usd[i].sum()),
        }
        per_model[name] = row
        t = by_team.setdefault(team, {"gpu_hours": 0.0, "cost_usd": 0.0, "models": []})
        t["gpu_hours"] += row["gpu_hours"]
        t["cost_usd"] += row["cost_usd"]
        t["models"].append(name)
    idle_h = idle / 3600.0
    return {
        "currency": "USD",
        "hours": result.scored_s / 3600.0,
        "prices_usd_per_gpu_hour": {k: float(p) for k, p in zip(kinds, prices, strict=True)},
        "total_usd": float(usd.sum()),
        "gpu_hours": float(hours.sum()),
        "idle_gpu_hours_by_kind": {k: float(h) for k, h in zip(kinds, idle_h, strict=True)},
        "idle_gpu_hours": float(idle_h.sum()),
        "idle_usd": float((idle_h * prices).sum()),
        "lent_gpu_hours": 0.0,  # lending arrives with its own issue: nothing is lent yet
        "lent_usd": 0.0,
        "by_team": by_team,
        "per_model": per_model,
    }


def _num(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)
