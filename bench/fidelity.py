"""Fluid vs request-level (DES) queueing engine on the Azure LLM 2023 traces.

For each trace (conv, code) and replica schedule, both engines serve the same requests and we compare
SLO attainment (fraction of requests within the SLO). Schedules:

- ``const@U``: a constant replica count sized for utilisation U. Integer replica counts only hit U
  approximately, so the trace's time axis is stretched/compressed (by the printed ``x`` factor) to make
  the mean utilisation exactly U — the burst structure is kept, only its speed changes.
- ``reactive``: replicas recomputed every minute from the previous minute's load, sized for
  ``--reactive-util`` (min 1), so bursts find the model under-provisioned for a minute.

Run:  .venv/bin/python bench/fidelity.py            (10 s ticks)
      .venv/bin/python bench/fidelity.py --dt 2
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.sim.des import DesEngine
from autoscaler.sim.queueing import FluidEngine, QueueEngine, Workload

DATA = Path("/work/shared/data/azure_llm_2023")


def read_trace(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t seconds from first request, context tokens, generated tokens), sorted by t."""
    with path.open(newline="") as f:
        rows = list(csv.reader(f))[1:]
    # Timestamps carry 7 fractional digits; numpy's datetime64 takes up to 9 (ns) once padded.
    stamps = np.array([r[0].replace(" ", "T").ljust(29, "0") for r in rows], dtype="datetime64[ns]")
    t = (stamps - stamps.min()).astype(np.int64) / 1e9
    ctx = np.array([int(r[1]) for r in rows], dtype=np.int64)
    gen = np.array([int(r[2]) for r in rows], dtype=np.int64)
    order = np.argsort(t, kind="stable")
    return t[order], ctx[order], gen[order]


@dataclass
class Case:
    trace: str
    schedule: str
    stretch: float  # time-axis factor applied to the trace
    replicas: np.ndarray  # per tick
    util: float  # mean offered load / capacity


def run_engine(engine: QueueEngine, dt: float, replicas: np.ndarray) -> tuple[float, float, float]:
    """Returns (attainment, p95 latency over the run, wall seconds)."""
    arrivals = 0.0
    within = 0.0
    t_start = time.perf_counter()
    routable = np.zeros(1, dtype=np.int64)
    for k, n in enumerate(replicas):
        routable[0] = n
        s = engine.step(k * dt, dt, routable)
        arrivals += float(s.arrivals[0])
        within += float(s.within_slo[0])
    wall = time.perf_counter() - t_start
    p95 = float(engine.latency_quantile(0.95)[0])
    return within / arrivals, p95, wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefill-s-per-1k", type=float, default=0.15, help="prefill s per 1k input tokens")
    ap.add_argument("--decode-s-per-token", type=float, default=0.020, help="decode seconds per output token")
    ap.add_argument("--concurrency", type=int, default=8, help="batch slots per replica")
    ap.add_argument("--slo-conv", type=float, default=1.0, help="TTFT SLO (s) for the conv trace")
    ap.add_argument("--slo-code", type=float, default=2.0, help="TTFT SLO (s) for the code trace")
    ap.add_argument("--metric", choices=("ttft", "e2e"), default="ttft")
    ap.add_argument("--utils", default="0.5,0.7,0.85", help="constant-schedule utilisations")
    ap.add_argument("--reactive-util", type=float, default=0.7, help="reactive schedule's target utilisation")
    ap.add_argument("--dt", type=float, default=10.0, help="tick seconds")
    ap.add_argument("--seeds", type=int, default=3, help="DES routing seeds to average")
    ap.add_argument("--substep", type=float, default=5.0, help="fluid: integration sub-step (s)")
    args = ap.parse_args(argv)

    c = args.concurrency
    dt = args.dt
    print(
        f"service: prefill {args.prefill_s_per_1k} s/1k tok, "
        f"decode {args.decode_s_per_token * 1e3:g} ms/tok, "
        f"concurrency {c}, {args.metric} SLO conv {args.slo_conv} s / code {args.slo_code} s, dt {dt:g} s, "
        f"DES seeds {args.seeds}"
    )
    header = (
        f"{'trace':5} {'schedule':12} {'x':>5} {'util':>5} {'rep':>6} {'fluid%':>8} {'DES%':>8} "
        f"{'sd':>5} {'diff pp':>8} {'p95 fl':>7} {'p95 DES':>7} {'fluid s':>7} {'DES s':>6}"
    )
    print(header)
    print("-" * len(header))
    worst = 0.0
    for trace, slo in (("conv", args.slo_conv), ("code", args.slo_code)):
        t, ctx, gen = read_trace(DATA / f"AzureLLMInferenceTrace_{trace}.csv")
        prefill = args.prefill_s_per_1k * ctx / 1000.0
        occ = prefill + args.decode_s_per_token * gen
        lat = prefill if args.metric == "ttft" else occ
        mean_s = float(occ.mean())
        duration = float(t[-1])
        load = len(t) / duration * mean_s  # offered Erlangs
        cases: list[Case] = []
        for u in (float(x) for x in args.utils.split(",")):
            n = max(1, round(load / (c * u)))
            stretch = load / (n * c * u)  # >1 slows the trace down
            ticks = math.ceil(duration * stretch / dt) + 1
            cases.append(Case(trace, f"const@{u:g}", stretch, np.full(ticks, n), u))
        # Reactive: every minute, size for the previous minute's load.
        minutes = math.ceil(duration / 60) + 1
        per_min = np.bincount((t // 60).astype(np.int64), weights=occ, minlength=minutes) / 60.0
        n_min = np.maximum(1, np.ceil(np.concatenate([[load], per_min[:-1]]) / (c * args.reactive_util)))
        ticks = math.ceil(duration / dt) + 1
        minute_of_tick = np.minimum((np.arange(ticks) * dt // 60).astype(np.int64), minutes - 1)
        sched = n_min[minute_of_tick].astype(np.int64)
        used = float(np.mean(sched))
        cases.append(Case(trace, "reactive", 1.0, sched, load / (used * c)))

        for case in cases:
            w = Workload.from_requests(
                (trace,), t * case.stretch, np.zeros(len(t), dtype=np.int64), occ, lat, c, slo, 95.0
            )
            fl, fl_p95, fl_wall = run_engine(FluidEngine(w, substep_s=args.substep), dt, case.replicas)
            des = [run_engine(DesEngine(w, seed=s), dt, case.replicas) for s in range(args.seeds)]
            d_att = float(np.mean([d[0] for d in des]))
            d_sd = float(np.std([d[0] for d in des]))
            d_p95 = float(np.mean([d[1] for d in des]))
            d_wall = float(np.mean([d[2] for d in des]))
            diff = 100 * (fl - d_att)
            worst = max(worst, abs(diff))
            const = case.schedule != "reactive"
            rep = f"{int(case.replicas[0])}" if const else f"{np.mean(case.replicas):.1f}"
            print(
                f"{trace:5} {case.schedule:12} {case.stretch:5.2f} {case.util:5.2f} {rep:>6} {100 * fl:8.2f} "
                f"{100 * d_att:8.2f} {100 * d_sd:5.2f} {diff:+8.2f} {fl_p95:7.2f} {d_p95:7.2f} "
                f"{fl_wall:7.3f} {d_wall:6.2f}"
            )
    print(f"worst |fluid - DES| = {worst:.2f} pp")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
