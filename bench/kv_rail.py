"""What the KV rail does where the engines' KV cache binds: slotwise and HPA with the rail and without, side by side.

The simulator's engines hold a KV cache when a spec declares ``kv-cache-tokens`` (a request log with token counts:
the Azure LLM trace): a replica runs as many requests at once as their KV fits, at most its declared concurrency, and
reports the cache's use (``autoscaler/sim/queueing.py``, ``Workload.with_kv_cache``). The controller is told the
declared concurrency, not the fit; it reads the cache's use as it would vLLM's ``kv_cache_usage_perc`` (and with the
running gauge learns the batch the cache admits: ``autoscaler/estimation/batch.py``), and the KV rail
(``autoscaler/decision/scaledown.py``: no scale-down while the cache is at or above ``kv_saturation``, one replica
more while it is and the queue grows) acts on it. Per KV capacity (tokens per replica, for every model of the trace)
and policy: GPU-hours, x the lower bound, violating requests, the headline SLO attainment, how many decisions the
rail made (reason ``kv_saturated``) and what each model's engines run at once.

    .venv/bin/python bench/kv_rail.py [--trace azure-llm-2023] [--history-hours 0.25] [--kv 32000,16000,10000]
        [--policies slotwise,hpa] [--mode fluid|des] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from autoscaler.api.plan import Reason
from autoscaler.api.spec import ModelSpec
from autoscaler.policies import make_policy
from autoscaler.sim.defaults import model_specs
from autoscaler.sim.harness import DEFAULT_TRACE, default_cluster
from autoscaler.sim.lower_bound import lower_bound
from autoscaler.sim.run import SimConfig, simulate
from autoscaler.sim.scorecard import scorecard
from autoscaler.sim.workload import build_workload
from forecasting.traces import resolve_trace

RAIL_ON = 0.9  # the controller's default kv_saturation


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default=DEFAULT_TRACE)
    p.add_argument("--history-hours", type=float, default=0.25)
    p.add_argument("--kv", default="32000,16000,10000", help="KV-cache tokens per replica, comma-separated")
    p.add_argument("--policies", default="slotwise,hpa")
    p.add_argument("--mode", default="fluid", help="fluid or des (the engine)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    trace = resolve_trace(args.trace, None)
    base = model_specs(trace, None)
    rows: list[dict[str, Any]] = []
    for kv in (int(x) for x in args.kv.split(",")):
        specs = {m: s.with_(kv_cache_tokens=kv) if isinstance(s, ModelSpec) else s for m, s in base.items()}
        workload = build_workload(trace, specs, history_s=args.history_hours * 3600.0)
        fits = dict(zip(workload.models, workload.queue.concurrency.tolist(), strict=True))
        declared = {m: s.concurrency for m, s in specs.items() if isinstance(s, ModelSpec)}
        nodes = default_cluster(workload, SimConfig().tick_s)
        bound = lower_bound(workload, nodes, SimConfig())
        print(f"kv-cache-tokens {kv}: requests at once per replica {fits} (declared {declared}); "
              f"lower bound {bound.gpu_hours:.2f} GPU-h", flush=True)
        for name in args.policies.split(","):
            for rail in (RAIL_ON, None):
                r = simulate(workload, nodes, make_policy(name), SimConfig(mode=args.mode, kv_saturation=rail))
                card = scorecard(r, None, lower_bound_gpu_hours=bound.gpu_hours, attainable=bound.attainable)
                row = {"kv_cache_tokens": kv, "policy": name, "kv_saturation": rail, "fits": fits,
                       "gpu_hours": card["gpu_hours"], "vs_lower_bound": card["gpu_hours_vs_lower_bound"],
                       "violating_requests": card["violating_requests"], "slo_attainment": card["slo_attainment"],
                       "rail_decisions": r.decisions.get(Reason.KV_SATURATED.value, 0),
                       "scale_events": card["scale_events"]}
                rows.append(row)
                label = f"{name} rail {'on ' if rail is not None else 'off'}"
                print(f"  {label:18s} GPU-h {row['gpu_hours']:7.2f} ({row['vs_lower_bound']:.3f}x bound)  violating "
                      f"{row['violating_requests']:7,d}  in SLO {row['slo_attainment']:.4f}  "
                      f"rail decisions {row['rail_decisions']:5d}  events {row['scale_events']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trace": args.trace, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
