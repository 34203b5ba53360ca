"""What each part of slotwise's sizing buys: the policy with one knob changed at a time, side by side on one trace.

Every variant runs on the same workload and cluster (built exactly as ``slotwise simulate`` builds them), with HPA at
its defaults and the lower bound (:mod:`autoscaler.sim.lower_bound`) of the same run as references. A variant is
``name:knob=value;knob=value`` with :class:`autoscaler.policies.slo.SloPolicy`'s knobs (``slotwise`` alone: the
shipped defaults). Prints per variant GPU-hours, x the lower bound, violating requests, the headline SLO attainment
and the GPU-hours per model; ``--json`` writes the same.

    .venv/bin/python bench/sizing_ablation.py [--trace azure-llm-2023] [--history-hours 0.25] [--hours H]
        [--variants "slotwise,slotwise:burstiness=False,slotwise:scale_down_stabilization_s=120"] [--json out.json]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from typing import Any

from autoscaler.policies import make_policy
from autoscaler.sim.defaults import model_specs
from autoscaler.sim.harness import DEFAULT_TRACE, default_cluster
from autoscaler.sim.lower_bound import lower_bound
from autoscaler.sim.run import SimConfig, simulate
from autoscaler.sim.scorecard import scorecard
from autoscaler.sim.workload import build_workload
from forecasting.traces import resolve_trace
from forecasting.traces.ops import head

DEFAULT_VARIANTS = (
    "slotwise",
    "slotwise:burstiness=False",
    "slotwise:deflate_poisson=False",
    "slotwise:burst_memory_s=1e-9",
    "slotwise:scale_down_stabilization_s=120.0",
    "slotwise:drain_s=60.0",
    "slotwise:down_margin=1.0",
)


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``name:k=v;k=v`` -> (policy name, knobs); values are Python literals (``False``, ``60.0``)."""
    name, _, rest = text.partition(":")
    knobs: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(";"))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"variant {text!r}: {item!r} is not knob=value")
        knobs[key.strip()] = ast.literal_eval(value.strip())
    return name.strip(), knobs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace", default=DEFAULT_TRACE)
    p.add_argument("--history-hours", type=float, default=0.25)
    p.add_argument("--hours", type=float, default=None)
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    trace = resolve_trace(args.trace, None)
    if args.hours is not None:
        trace = head(trace, (args.history_hours + args.hours) * 3600.0)
    workload = build_workload(trace, model_specs(trace, None), history_s=args.history_hours * 3600.0)
    cfg = SimConfig()
    nodes = default_cluster(workload, cfg.tick_s)
    bound = lower_bound(workload, nodes, cfg)
    print(f"{args.trace}: {len(workload.models)} models, {workload.duration_s / 3600:.1f} h, "
          f"{sum(n.gpu_count for n in nodes)} GPUs; lower bound {bound.gpu_hours:.2f} GPU-h", flush=True)
    rows = []
    for text in ["hpa", *args.variants.split(",")]:
        name, knobs = parse_variant(text)
        t0 = time.process_time()
        r = simulate(workload, nodes, make_policy(name, **knobs), cfg)
        card = scorecard(r, None, lower_bound_gpu_hours=bound.gpu_hours, attainable=bound.attainable)
        row = {"variant": text, "gpu_hours": card["gpu_hours"], "vs_lower_bound": card["gpu_hours_vs_lower_bound"],
               "violating_requests": card["violating_requests"], "slo_attainment": card["slo_attainment"],
               "scale_events": card["scale_events"],
               "per_model_gpu_hours": {m: pm["gpu_hours"] for m, pm in card["per_model"].items()},
               "cpu_s": time.process_time() - t0}
        rows.append(row)
        models = "" if len(row["per_model_gpu_hours"]) > 4 else "  " + " ".join(
            f"{m} {h:.2f}" for m, h in row["per_model_gpu_hours"].items())
        print(f"{text:45s} GPU-h {row['gpu_hours']:9.2f} ({row['vs_lower_bound']:.3f}x bound)  violating "
              f"{row['violating_requests']:9,d}  in SLO {row['slo_attainment']:.4f}  "
              f"events {row['scale_events']:,d}{models}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trace": args.trace, "lower_bound_gpu_hours": bound.gpu_hours, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
