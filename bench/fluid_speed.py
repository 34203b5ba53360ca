"""Cost of one FluidEngine.step for M models (target: <= ~250 µs for 50 models, so that a 14-day run
at 10 s ticks, 120,960 ticks, leaves room for the controller inside 2 minutes).

Run:  .venv/bin/python bench/fluid_speed.py [--models 50] [--ticks 20000] [--rate 1.0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.estimation.capacity import ServiceProfile
from autoscaler.sim.fluid import FluidEngine
from autoscaler.sim.queueing import Workload


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", type=int, default=50)
    ap.add_argument("--ticks", type=int, default=20_000)
    ap.add_argument("--dt", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=1.0, help="mean req/s per model (request-log case)")
    args = ap.parse_args(argv)
    m, ticks, dt = args.models, args.ticks, args.dt
    rng = np.random.default_rng(0)
    horizon = ticks * dt
    day = np.sin(2 * np.pi * np.arange(int(horizon / 60) + 1) * 60 / 86_400)
    conc = rng.integers(1, 33, m)
    mean = rng.uniform(0.2, 5.0, m)
    profiles = []
    for i in range(m):
        occ = rng.exponential(mean[i], 32)
        profiles.append(ServiceProfile(np.sort(occ), np.sort(occ) * 0.2, int(conc[i]), 2.0, 95.0))
    # Diurnal rates at ~60% utilisation of 4 replicas.
    base = 0.6 * 4 * conc / mean
    rates = base[:, None] * (1 + 0.5 * day[None, :])
    routable = np.full(m, 4, dtype=np.int64)

    def bench(w: Workload, label: str) -> None:
        eng = FluidEngine(w)
        t_start = time.perf_counter()
        for k in range(ticks):
            eng.step(k * dt, dt, routable)
        per = (time.perf_counter() - t_start) / ticks
        print(f"{label:44} {per * 1e6:7.1f} µs/step   -> 120,960 ticks: {per * 120_960:6.1f} s")

    bench(Workload.from_rates([f"m{i}" for i in range(m)], rates, 60.0, profiles), f"rate series, {m} models")
    n_req = rng.poisson(args.rate * m * horizon)
    t = np.sort(rng.random(n_req) * horizon)
    mi = rng.integers(0, m, n_req)
    occ = rng.exponential(mean[mi])
    w = Workload.from_requests([f"m{i}" for i in range(m)], t, mi, occ, occ * 0.2, conc, 2.0 + 4 * mean)
    bench(w, f"request log, {m} models x {args.rate:g} req/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
