"""Arbitration when GPUs run out (issue 9): slotwise's SLO-aware arbitration against static per-team partitions and
priority-only preemption (Kueue/KAI-style), side by side on one scenario, optionally swept over the surge size.

Per scenario (``--scenario``, default the shipped ``resource-tight-day``) and surge scale (``--surge-scale``: every
surge multiplier m of the scenario becomes 1 + (m - 1) x scale, so 1 = the file as shipped, 0 = no surge), three runs
with the same autoscaling policy (slotwise), cluster, teams and traffic, differing only in the arbitration mode:
``slo`` (slotwise), ``priority`` and ``partition`` (:mod:`autoscaler.decision.arbitration`). Printed per run, the
issue's
targets:

- the top-priority class's requests served in minutes that met their SLO (``>= 99.9 %``), and their raw share
  within the SLO latency;
- the SLO attainment summed over the models (each model once; higher than both baselines);
- replica-minutes refused while the refused model's team was inside its guarantee (0);
- shortfalls and preemptions without a recorded reason (0), and the preemptions by reason;
- the peak GPU demand (``autoscaler.sim.scenario.demand_gpus``) over the cluster's GPUs.

    .venv/bin/python bench/arbitration.py [--scenario resource-tight-day] [--surge-scale 0.6,0.8,1,1.2]
        [--json arbitration.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

import numpy as np

from autoscaler.policies import make_policy
from autoscaler.report.scenario import requests_in_slo_minutes, top_priority_models
from autoscaler.sim.harness import shipped_scenarios
from autoscaler.sim.run import simulate
from autoscaler.sim.scenario import Scenario, demand_gpus, load_scenario
from autoscaler.sim.scorecard import scorecard, team_card
from autoscaler.sim.workload import build_workload

MODES = ("slo", "priority", "partition")


def scaled(sc: Scenario, scale: float) -> Scenario:
    surges = tuple(dataclasses.replace(s, multiplier=1.0 + (s.multiplier - 1.0) * scale) for s in sc.surges)
    return dataclasses.replace(sc, surges=surges)


def run(sc: Scenario, mode: str) -> dict[str, Any]:
    workload = build_workload(sc.build_trace(), sc.specs, history_s=sc.history_h * 3600.0)
    cfg = sc.sim_config()
    cfg = dataclasses.replace(cfg, arbitration=dataclasses.replace(sc.arbitration, mode=mode))
    result = simulate(workload, sc.cluster, make_policy("slotwise"), cfg)
    card = scorecard(result)
    teams = team_card(result, sc.teams)["all"]
    top = top_priority_models({m.name: m.spec.priority for m in sc.models})
    rows = [result.models.index(m) for m in top]
    within = float(sum(np.sum(result.minute_within[i]) for i in rows))
    total = float(sum(np.sum(result.minute_arrivals[i]) for i in rows))
    demand = demand_gpus(workload, sc.cluster)
    peak = float(np.max(sum(demand.values()))) if demand else 0.0
    gpus = sum(n.gpu_count for n in sc.cluster)
    return {
        "mode": mode,
        "top_priority_models": top,
        "top_requests_in_slo_minutes": requests_in_slo_minutes(result, top),
        "top_requests_within_latency": within / total if total else None,
        "summed_slo_attainment": float(sum(v["slo_attainment"] for v in card["per_model"].values())),
        "per_model_slo_attainment": {m: v["slo_attainment"] for m, v in card["per_model"].items()},
        "refused_within_guarantee_replica_min": teams["refusals_within_guarantee"],
        "unreasoned": card["unreasoned"],
        "preemptions": card["preemptions"],
        "preemptions_by_reason": card["preemptions_by_reason"],
        "peak_demand_share": peak / gpus if gpus else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="resource-tight-day")
    ap.add_argument("--surge-scale", default="1", help="comma-separated; 1 = the scenario as shipped")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    path = args.scenario if os.path.exists(args.scenario) else shipped_scenarios().get(args.scenario, args.scenario)
    base = load_scenario(path)
    rows = []
    for scale in (float(x) for x in args.surge_scale.split(",")):
        sc = scaled(base, scale)
        for mode in MODES:
            r = run(sc, mode)
            r["surge_scale"] = scale
            rows.append(r)
            print(f"surge x{scale:g} peak {r['peak_demand_share']:.0%} {mode:9s} top-priority in SLO minutes "
                  f"{r['top_requests_in_slo_minutes']:.4%} (raw {r['top_requests_within_latency']:.4%})  summed "
                  "attainment "
                  f"{r['summed_slo_attainment']:.4f}  refused in guarantee "
                  f"{r['refused_within_guarantee_replica_min']:.1f}"
                  f"  unreasoned {r['unreasoned']}  preemptions {r['preemptions']} {r['preemptions_by_reason']}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scenario": base.name, "file": path, "runs": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
