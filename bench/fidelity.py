"""Fluid vs request-level (DES) queueing engine on the Azure LLM 2023 traces.

For each trace (conv, code) and replica schedule, both engines serve the same requests and we compare
the share of requests within the latency target (the scorecard's ``requests_within_latency``). Schedules:

- ``const@U``: a constant replica count sized for utilisation U. Integer replica counts only hit U
  approximately, so the trace's time axis is stretched/compressed (by the printed ``x`` factor) to make
  the mean utilisation exactly U — the burst structure is kept, only its speed changes.
- ``reactive``: replicas recomputed every minute from the previous minute's load, sized for
  ``--reactive-util`` (min 1), so bursts find the model under-provisioned for a minute.

That is the *open-loop* table: both engines see the same replica schedule, so any gap is the engine's.

The *closed-loop* table is what the issue measures: the real simulator (``run_policies``) on the bundled
``azure-llm-2023`` trace with its default specs and cluster, once with ``mode="fluid"`` and once per DES
seed with ``mode="des"`` (mean over seeds). The policies react to the engine's own metrics (HPA and KPA
to in-flight requests), so the replica schedules can differ between modes; the GPU-hours columns show
where they did. ``replay`` re-serves the fluid run's exact schedule with the DES (same seeds), which
separates the engine's own error (fluid − replay) from the schedule's divergence (replay − DES).

Run:  .venv/bin/python bench/fidelity.py            (10 s ticks, both tables)
      .venv/bin/python bench/fidelity.py --dt 2
      .venv/bin/python bench/fidelity.py --tables closed --seeds 8
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

import autoscaler.sim.run as sim_run
from autoscaler.sim.des import DesEngine
from autoscaler.sim.fluid import FluidEngine
from autoscaler.sim.queueing import QueueEngine, TickStats, Workload

# ../shared/data next to the checkout, as in CI and the dev machines.
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "azure_llm_2023"


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


def open_loop(args: argparse.Namespace) -> float:
    """The open-loop table (fixed schedules); returns the worst |fluid - DES| in pp."""
    c = args.concurrency
    dt = args.dt
    print(
        f"### Open loop: fixed replica schedules\n\n"
        f"service: prefill {args.prefill_s_per_1k} s/1k tok, "
        f"decode {args.decode_s_per_token * 1e3:g} ms/tok, "
        f"concurrency {c}, {args.metric} SLO conv {args.slo_conv} s / code {args.slo_code} s, dt {dt:g} s, "
        f"DES seeds {args.seeds}\n"
    )
    print(
        "| trace | schedule | x | util | replicas | fluid % | DES % | DES sd | diff pp | p95 fluid s | p95 DES s "
        "| fluid wall s | DES wall s |"
    )
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
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
                f"| {trace} | {case.schedule} | {case.stretch:.2f} | {case.util:.2f} | {rep} | {100 * fl:.2f} "
                f"| {100 * d_att:.2f} | {100 * d_sd:.2f} | {diff:+.2f} | {fl_p95:.2f} | {d_p95:.2f} "
                f"| {fl_wall:.3f} | {d_wall:.2f} |"
            )
    print(f"\nopen loop: worst |fluid - DES| = {worst:.2f} pp\n")
    return worst


class _Recorder:
    """Wraps a queue engine and keeps the routable replicas it was asked to serve, tick by tick."""

    def __init__(self, engine: QueueEngine) -> None:
        self.engine = engine
        self.schedule: list[tuple[float, float, np.ndarray]] = []

    def step(self, t0: float, dt: float, routable: np.ndarray) -> TickStats:
        self.schedule.append((t0, dt, np.array(routable, dtype=np.int64)))
        return self.engine.step(t0, dt, routable)

    def latency_quantile(self, q: float) -> np.ndarray:
        return self.engine.latency_quantile(q)


def _replay(engine: QueueEngine, schedule: list[tuple[float, float, np.ndarray]]) -> tuple[np.ndarray, float]:
    """(attainment per model, overall attainment) of ``engine`` serving a recorded schedule."""
    arrivals = 0.0
    within = 0.0
    for t0, dt, routable in schedule:
        s = engine.step(t0, dt, routable)
        arrivals = arrivals + s.arrivals
        within = within + s.within_slo
    return within / arrivals, float(np.sum(within) / np.sum(arrivals))


def closed_loop(args: argparse.Namespace) -> float:
    """The closed-loop table (the real simulator per policy and mode); returns the worst |gap| in pp."""
    from autoscaler.sim.defaults import model_specs
    from autoscaler.sim.harness import POLICY_ORDER, default_cluster, run_policies
    from autoscaler.sim.run import SimConfig
    from autoscaler.sim.workload import build_workload
    from forecasting.traces import resolve_trace

    dt = args.dt
    trace = resolve_trace(args.trace)
    specs = model_specs(trace)
    w = build_workload(trace, specs)
    nodes = default_cluster(w, dt)
    policies = list(POLICY_ORDER)
    models = list(w.models)

    # Record each policy's own engine (run_policies also runs the oracle first for its GPU-hours baseline;
    # the last engine made is the policy's own).
    made: list[_Recorder] = []
    real_make = sim_run.make_engine

    def recording_make(mode: str, workload, tick: float, seed: int = 0) -> QueueEngine:  # type: ignore[no-untyped-def]
        rec = _Recorder(real_make(mode, workload, tick, seed=seed))
        made.append(rec)
        return rec

    def run(mode: str, seed: int) -> dict[str, tuple[dict, list]]:  # type: ignore[type-arg]
        out = {}
        for p in policies:
            made.clear()
            _, cards = run_policies(w, nodes, [p], SimConfig(tick_s=dt, mode=mode, seed=seed), quiet=True)
            out[p] = (cards[0], made[-1].schedule)
        return out

    sim_run.make_engine = recording_make
    try:
        t_start = time.perf_counter()
        fluid = run("fluid", 0)
        fluid_wall = time.perf_counter() - t_start
        t_start = time.perf_counter()
        des = [run("des", s) for s in range(args.seeds)]
        des_wall = (time.perf_counter() - t_start) / args.seeds
    finally:
        sim_run.make_engine = real_make

    print(
        f"### Closed loop: `slotwise simulate` on {args.trace} ({', '.join(models)}; default specs and "
        f"cluster), tick {dt:g} s, DES mean of {args.seeds} seeds\n"
    )
    print(
        "requests within the latency target in %; diff = fluid − DES in pp; replay = DES serving the fluid run's "
        "schedule; "
        f"wall: fluid {fluid_wall:.1f} s, DES {des_wall:.1f} s per seed (all policies)\n"
    )
    cols = [*models, "overall"]
    print(
        "| policy | "
        + " | ".join(f"{c} fluid | {c} DES | {c} diff | {c} replay" for c in cols)
        + " | GPU-h fluid | GPU-h DES |"
    )
    print("|---|" + "--:|" * (4 * len(cols) + 2))
    worst = 0.0
    for p in policies:
        card_f, sched = fluid[p]
        rep = [_replay(DesEngine(w.queue, seed=s), sched) for s in range(args.seeds)]
        cells = []
        for j, c in enumerate(cols):
            if c == "overall":
                f_att = card_f["requests_within_latency"]
                d_att = float(np.mean([d[p][0]["requests_within_latency"] for d in des]))
                r_att = float(np.mean([r[1] for r in rep]))
            else:
                f_att = card_f["per_model"][c]["requests_within_latency"]
                d_att = float(np.mean([d[p][0]["per_model"][c]["requests_within_latency"] for d in des]))
                r_att = float(np.mean([r[0][j] for r in rep]))
            diff = 100 * (f_att - d_att)
            worst = max(worst, abs(diff))
            cells.append(f"{100 * f_att:.2f} | {100 * d_att:.2f} | {diff:+.2f} | {100 * r_att:.2f}")
        gpu_d = float(np.mean([d[p][0]["gpu_hours"] for d in des]))
        print(f"| {p} | " + " | ".join(cells) + f" | {card_f['gpu_hours']:.2f} | {gpu_d:.2f} |")
    print(f"\nclosed loop: worst |fluid - DES| = {worst:.2f} pp\n")
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", default="open,closed", help="which tables: open, closed or both")
    ap.add_argument("--trace", default="azure-llm-2023", help="closed loop: bundled trace name")
    ap.add_argument("--prefill-s-per-1k", type=float, default=0.15, help="prefill s per 1k input tokens")
    ap.add_argument("--decode-s-per-token", type=float, default=0.020, help="decode seconds per output token")
    ap.add_argument("--concurrency", type=int, default=8, help="batch slots per replica")
    ap.add_argument("--slo-conv", type=float, default=1.0, help="TTFT SLO (s) for the conv trace")
    ap.add_argument("--slo-code", type=float, default=2.0, help="TTFT SLO (s) for the code trace")
    ap.add_argument("--metric", choices=("ttft", "e2e"), default="ttft")
    ap.add_argument("--utils", default="0.5,0.7,0.85", help="constant-schedule utilisations")
    ap.add_argument("--reactive-util", type=float, default=0.7, help="reactive schedule's target utilisation")
    ap.add_argument("--dt", type=float, default=10.0, help="tick seconds")
    ap.add_argument("--seeds", type=int, default=5, help="DES routing seeds to average")
    ap.add_argument("--substep", type=float, default=5.0, help="fluid: integration sub-step (s)")
    args = ap.parse_args(argv)
    tables = {x.strip() for x in args.tables.split(",")}
    worst = 0.0
    if "open" in tables:
        worst = max(worst, open_loop(args))
    if "closed" in tables:
        worst = max(worst, closed_loop(args))
    print(f"worst |fluid - DES| over both tables = {worst:.2f} pp")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
