"""Simulator speed: 14 days x 50 models at 10 s ticks, fluid mode, the whole control loop, one core.

The 50 models are ServeGen m-small's 43 real clients (14 days of 10-minute rates) plus 7 of them again,
shifted by one day so they are not copies in phase. Prints wall time and cost per tick.

    .venv/bin/python bench/sim_speed.py [--days 14] [--models 50] [--policy slotwise] [--digest]

``--digest`` also prints a sha256 of the run's per-minute arrays (arrivals, within, replicas, desired, latency,
GPU-seconds) and its GPU-hours: two commits whose digests match decided the same (the check that a speed-up changed
no decision).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import time

import numpy as np

from autoscaler.policies import make_policy
from autoscaler.sim.defaults import model_specs
from autoscaler.sim.harness import default_cluster
from autoscaler.sim.run import SimConfig, simulate
from autoscaler.sim.workload import build_workload
from forecasting.traces import resolve_trace
from forecasting.traces.ops import head


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--days", type=float, default=14.0)
    ap.add_argument("--models", type=int, default=50)
    ap.add_argument("--policy", default="slotwise")
    ap.add_argument("--tick", type=float, default=10.0)
    ap.add_argument("--digest", action="store_true", help="print a sha256 of the per-minute arrays")
    args = ap.parse_args()

    base = resolve_trace("servegen-m-small")
    rates, names = base.rates, list(base.models)
    day = int(round(86400 / base.step_s))
    extra = args.models - len(names)
    if extra > 0:
        shifted = np.roll(rates[:extra], day, axis=1)
        rates = np.concatenate([rates, shifted])
        names += [f"{n}-shifted" for n in names[:extra]]
    trace = dataclasses.replace(base, rates=rates[: args.models], models=tuple(names[: args.models]), meta={})
    trace = head(trace, args.days * 86400)
    specs = model_specs(trace)
    workload = build_workload(trace, specs)
    nodes = default_cluster(workload, args.tick)
    policy = make_policy(args.policy)
    t0, c0 = time.perf_counter(), time.process_time()
    result = simulate(workload, nodes, policy, SimConfig(tick_s=args.tick))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ticks = int(np.ceil(workload.duration_s / args.tick))
    print(f"models={len(workload.models)} days={workload.duration_s / 86400:.1f} tick={args.tick:g}s "
          f"ticks={ticks} GPUs={sum(n.gpu_count for n in nodes)} policy={args.policy}")
    # CPU time is what one core spent; wall time also counts waiting for a core on a shared machine.
    print(f"cpu={cpu:.1f}s  wall={wall:.1f}s  per_tick={cpu / ticks * 1e6:.0f}us  "
          f"per_model_tick={cpu / ticks / len(workload.models) * 1e6:.1f}us  sim_wall_s={result.sim_wall_s:.1f}")
    if args.digest:
        h = hashlib.sha256()
        for a in (result.minute_arrivals, result.minute_within, result.minute_replicas, result.minute_desired,
                  result.minute_latency, result.minute_gpu_s):
            h.update(np.ascontiguousarray(a).tobytes())
        print(f"digest={h.hexdigest()[:16]}  gpu_hours={result.gpu_hours:.4f}  scale_events={result.scale_events}")


if __name__ == "__main__":
    main()
