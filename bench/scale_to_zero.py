"""Scale to zero on a long tail of small models: GPU-hours against a floor of one, and the curve of cold-started
requests vs warm idle GPU-hours for slotwise's learned keep-alive and the two baselines (issue 18).

Every run is the same sizing policy (``--policy``, slotwise by default) on the same workload and cluster, built as
``slotwise simulate`` builds them; only the models' scale-to-zero annotations differ:

- ``floor-1``: ``min-replicas: 1`` (the default today): the reference the GPU-hour target is measured against;
- ``learned``: ``min-replicas: 0``, ``keep-alive: learned`` at each ``cold-start-worth-seconds`` of ``--worth``
  (the shipped default among them, marked);
- ``hybrid``: ``keep-alive: hybrid`` (Shahrad et al., ATC'20) at each histogram range ``keep-alive-seconds`` of
  ``--ranges`` (the paper's 4 h among them);
- ``fixed``: ``keep-alive: fixed`` at each ``keep-alive-seconds`` of ``--keep-alives`` (Knative's grace, KEDA's
  cooldown, Azure's 10 minutes then);
- ``learned event``: the shipped learned keep-alive with another cost of a scale event (the controller's
  ``ZeroConfig.scale_event_s``, its hysteresis; 0: none) at each of ``--scale-event-s`` (issue 30).

A run is a point (``warm_idle_gpu_hours``, ``cold_started_requests``): the GPU-hours of replicas held while their
model had no request, and the requests that arrived at zero replicas and waited for a cold start (the scorecard's
fields, docs/scorecard.md). The targets:

1. the shipped configuration (``learned`` at the default worth) uses at most half the GPU-hours of ``floor-1``;
2. at equal warm idle GPU-hours, learned has fewer cold-started requests than hybrid: each hybrid point against the
   learned curve (its points joined piecewise linearly in order of idle GPU-hours, never extrapolated);
3. (issue 30) the shipped configuration makes at most twice the scale events of fixed at its warm idle GPU-hours
   (the fixed curve, the same piecewise linear reading, at the shipped run's idle GPU-hours).

    .venv/bin/python bench/scale_to_zero.py [--trace azure-functions-2019] [--history-hours 2] [--hours 4]
        [--jobs 1] [--worth 30,100,300,1000,3000] [--ranges 600,1800,3600,14400]
        [--keep-alives 60,300,600,1800,3600] [--scale-event-s 0,150] [--json s2z.json]
        [--plot docs/img/scale_to_zero_curve.png]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from itertools import pairwise
from typing import Any

from autoscaler.api.spec import ModelSpec
from autoscaler.benchmarks.frontier.compare import json_safe
from autoscaler.benchmarks.frontier.sweep import Case, prepare
from autoscaler.policies import make_policy
from autoscaler.sim import run as sim_run
from autoscaler.sim.run import SimConfig, simulate
from autoscaler.sim.scorecard import scorecard
from autoscaler.sim.workload import SimWorkload
from sharing.slots import NodeSpec

MAX_GPU_HOUR_SHARE = 0.5
MAX_EVENTS_VS_FIXED = 2.0
Point = tuple[float, float]  # (warm idle GPU-hours, cold-started requests)
# (label, keep-alive policy or "floor-1", knob[, the scale event's cost: ZeroConfig.scale_event_s, None: shipped])
Variant = tuple[str, str, float | None] | tuple[str, str, float | None, float | None]


def cold_at(curve: Sequence[Point], idle: float) -> float | None:
    """The curve's cold-started requests at ``idle`` warm idle GPU-hours (piecewise linear in order of idle
    GPU-hours), None outside the curve's range (nothing is extrapolated). Where several segments cover ``idle``
    the lowest value counts."""
    pts = sorted(curve)
    if not pts or not pts[0][0] <= idle <= pts[-1][0]:
        return None
    if len(pts) == 1:
        return pts[0][1]
    best: float | None = None
    for (x0, y0), (x1, y1) in pairwise(pts):
        if x0 <= idle <= x1:
            y = min(y0, y1) if x1 == x0 else y0 + (y1 - y0) * (idle - x0) / (x1 - x0)
            best = y if best is None else min(best, y)
    return best


def versus(curve: Sequence[Point], rivals: Sequence[Point]) -> list[dict[str, Any]]:
    """Each rival point against ``curve`` at the rival's idle GPU-hours: the curve's cold starts there and the
    ratio curve / rival (< 1: the curve has fewer cold-started requests at equal idle GPU-hours)."""
    out = []
    for idle, cold in rivals:
        at = cold_at(curve, idle)
        ratio = None if at is None else (at / cold if cold > 0 else (math.inf if at > 0 else 1.0))
        out.append({"idle_gpu_hours": idle, "rival_cold": cold, "curve_cold": at, "ratio": ratio})
    return out


def at_fixed(rows: Sequence[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    """The fixed keep-alive's curve read at ``run``'s warm idle GPU-hours (piecewise linear, never extrapolated):
    its scale events and cold-started requests there, and ``run``'s over them (None outside fixed's range)."""
    fixed = [r for r in rows if r["keep_alive"] == "fixed"]
    idle = run["warm_idle_gpu_hours"]
    events = cold_at([(r["warm_idle_gpu_hours"], r["scale_events"]) for r in fixed], idle)
    cold = cold_at([(r["warm_idle_gpu_hours"], r["cold_started_requests"]) for r in fixed], idle)

    def ratio(x: float, at: float | None) -> float | None:
        return None if at is None else (x / at if at > 0 else (math.inf if x > 0 else 1.0))

    return {"idle_gpu_hours": idle, "events": events, "cold": cold,
            "events_ratio": ratio(run["scale_events"], events), "cold_ratio": ratio(run["cold_started_requests"], cold)}


def with_keep_alive(spec: ModelSpec, variant: Variant) -> ModelSpec:
    _, policy, knob = variant[:3]
    if policy == "floor-1":
        return spec.with_(min_replicas=max(spec.min_replicas, 1))
    changes: dict[str, Any] = {"min_replicas": 0, "keep_alive": policy}
    if knob is not None:
        changes["cold_start_worth_s" if policy == "learned" else "keep_alive_s"] = float(knob)
    return spec.with_(**changes)


_CTX: tuple[SimWorkload, list[NodeSpec], SimConfig, str] | None = None


def _init(workload: SimWorkload, nodes: list[NodeSpec], cfg: SimConfig, policy: str) -> None:
    global _CTX
    _CTX = (workload, nodes, cfg, policy)


def _run(variant: Variant) -> dict[str, Any]:
    assert _CTX is not None, "worker not initialised"
    workload, nodes, cfg, name = _CTX
    specs = {m: (s if not isinstance(s, ModelSpec) else with_keep_alive(s, variant))
             for m, s in workload.specs.items()}
    policy = make_policy(name)
    run_cfg = dataclasses.replace(cfg, tick_s=min(cfg.tick_s, policy.tick_s))
    event_s = variant[3] if len(variant) > 3 else None
    with _scale_event_cost(event_s):
        result = simulate(dataclasses.replace(workload, specs=specs), nodes, policy, run_cfg)
    card = scorecard(result)
    return {
        "label": variant[0], "keep_alive": variant[1], "knob": variant[2],
        "gpu_hours": card["gpu_hours"], "warm_idle_gpu_hours": card["warm_idle_gpu_hours"],
        "cold_started_requests": card["cold_started_requests"],
        "cold_start_wait_mean_s": card.get("cold_start_wait_mean_s"),
        "requests": card["requests"], "slo_attainment": card["slo_attainment"],
        "requests_within_latency": card["requests_within_latency"], "scale_events": card["scale_events"],
        "scale_events_by_reason": card.get("scale_events_by_reason"), "scale_event_s": event_s,
        "sim_wall_s": card["sim_wall_s"],
    }


@contextlib.contextmanager
def _scale_event_cost(event_s: float | None) -> Iterator[None]:
    """The simulator's decision core with ``ZeroConfig.scale_event_s = event_s`` for the run (None: the shipped
    one). The simulator builds its core as the controller does (``sim_core``); only this setting is changed."""
    if event_s is None:
        yield
        return
    orig = sim_run.sim_core

    def core(policy: Any, cfg: SimConfig) -> Any:
        c = orig(policy, cfg)
        return dataclasses.replace(c, zero=dataclasses.replace(c.zero, scale_event_s=float(event_s)))

    sim_run.sim_core = core
    try:
        yield
    finally:
        sim_run.sim_core = orig


def variants(worth: Sequence[float], ranges: Sequence[float], keep_alives: Sequence[float],
             event_costs: Sequence[float] = ()) -> list[Variant]:
    out: list[Variant] = [("floor-1", "floor-1", None), ("learned (default)", "learned", None)]
    out += [(f"learned worth {w:g}s", "learned", w) for w in worth]
    out += [(f"learned event {e:g}s", "learned", None, e) for e in event_costs]
    out += [(f"hybrid range {r:g}s", "hybrid", r) for r in ranges]
    out += [(f"fixed {k:g}s", "fixed", k) for k in keep_alives]
    return out


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, style in (("learned", "o-"), ("hybrid", "s--"), ("fixed", "^:")):
        pts = sorted((r["warm_idle_gpu_hours"], r["cold_started_requests"]) for r in rows
                     if r["keep_alive"] == policy and r["knob"] is not None)
        if pts:
            ax.plot(*zip(*pts, strict=True), style, label=policy)
    for r in rows:
        if r["label"] == "learned (default)":
            ax.plot(r["warm_idle_gpu_hours"], r["cold_started_requests"], "k*", ms=12, label="learned, shipped default")
    ax.set_xlabel("warm idle GPU-hours (replicas held, no request)")
    ax.set_ylabel("cold-started requests")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Scale to zero: cold starts vs idle GPU-hours")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="azure-functions-2019")
    ap.add_argument("--history-hours", type=float, default=2.0)
    ap.add_argument("--hours", type=float, default=4.0)
    ap.add_argument("--policy", default="slotwise")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--worth", default="30,100,300,1000,3000")
    ap.add_argument("--ranges", default="600,1800,3600,14400")
    ap.add_argument("--keep-alives", default="60,300,600,1800,3600")
    ap.add_argument("--scale-event-s", default="", help="learned at the default worth with these scale-event costs")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    args = ap.parse_args(argv)
    cfg = SimConfig()
    workload, nodes = prepare(Case(args.trace, history_hours=args.history_hours, hours=args.hours), cfg)
    todo = variants(_floats(args.worth), _floats(args.ranges), _floats(args.keep_alives), _floats(args.scale_event_s))
    t0 = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs, initializer=_init, initargs=(workload, nodes, cfg, args.policy)) as ex:
            rows = list(ex.map(_run, todo))
    else:
        _init(workload, nodes, cfg, args.policy)
        rows = []
        for v in todo:
            rows.append(_run(v))
            print(f"  {v[0]}: done ({rows[-1]['sim_wall_s']:.0f} s)", file=sys.stderr, flush=True)
    wall = time.perf_counter() - t0
    by = {r["label"]: r for r in rows}
    floor, shipped = by["floor-1"], by["learned (default)"]
    share = shipped["gpu_hours"] / floor["gpu_hours"] if floor["gpu_hours"] > 0 else math.nan
    # (the learned curve: the shipped scale-event cost only, over its worth)
    learned = [(r["warm_idle_gpu_hours"], r["cold_started_requests"]) for r in rows
               if r["keep_alive"] == "learned" and r["scale_event_s"] is None]
    hybrid = [(r["warm_idle_gpu_hours"], r["cold_started_requests"]) for r in rows if r["keep_alive"] == "hybrid"]
    fixed = [(r["warm_idle_gpu_hours"], r["cold_started_requests"]) for r in rows if r["keep_alive"] == "fixed"]
    vs_hybrid, vs_fixed = versus(learned, hybrid), versus(learned, fixed)

    print(f"{args.trace}: {args.hours:g} h simulated after {args.history_hours:g} h of history, policy {args.policy}, "
          f"{len(workload.specs)} models, wall {wall:.0f} s")
    print(f"{'run':24s} {'GPU-h':>8s} {'idle GPU-h':>10s} {'cold-started':>12s} {'of requests':>11s} "
          f"{'SLO att.':>8s} {'scale ev.':>9s}")
    for r in rows:
        frac = r["cold_started_requests"] / r["requests"] if r["requests"] else 0.0
        print(f"{r['label']:24s} {r['gpu_hours']:8.1f} {r['warm_idle_gpu_hours']:10.2f} "
              f"{r['cold_started_requests']:12.0f} {frac:11.2e} {r['slo_attainment']:8.4f} {r['scale_events']:9d}")
    ok1 = share <= MAX_GPU_HOUR_SHARE
    print(f"target 1: shipped (learned, default) GPU-hours / floor-1 = {share:.3f} (<= {MAX_GPU_HOUR_SHARE}): "
          f"{'PASS' if ok1 else 'FAIL'}")
    compared = [c for c in vs_hybrid if c["ratio"] is not None]
    ok2 = bool(compared) and all(c["ratio"] < 1.0 for c in compared)
    for name, cmp in (("hybrid", vs_hybrid), ("fixed", vs_fixed)):
        for c in cmp:
            at = "outside learned's range" if c["curve_cold"] is None else (
                f"learned {c['curve_cold']:.0f} ({c['ratio']:.2f}x)")
            print(f"  vs {name} at {c['idle_gpu_hours']:.2f} idle GPU-h: {name} {c['rival_cold']:.0f} "
                  f"cold-started, {at}")
    print(f"target 2: fewer cold-started requests than hybrid at equal idle GPU-hours "
          f"({len(compared)} of {len(vs_hybrid)} hybrid points comparable): {'PASS' if ok2 else 'FAIL'}")
    churn = at_fixed(rows, shipped)
    for r in rows:
        if r["keep_alive"] == "learned" and r is not shipped:
            c = at_fixed(rows, r)
            if c["events"] is not None:
                print(f"  {r['label']} at {c['idle_gpu_hours']:.2f} idle GPU-h: {r['scale_events']} scale events "
                      f"({c['events_ratio']:.2f}x fixed's {c['events']:.0f}), {r['cold_started_requests']:.0f} "
                      f"cold-started ({c['cold_ratio']:.2f}x fixed's {c['cold']:.0f})")
    if churn["events"] is None:
        print("target 3: scale events of the shipped run vs fixed at its idle GPU-hours: outside fixed's range")
    else:
        print(f"target 3: shipped scale events {shipped['scale_events']} vs fixed's {churn['events']:.0f} at "
              f"{churn['idle_gpu_hours']:.2f} idle GPU-h = {churn['events_ratio']:.2f}x (<= {MAX_EVENTS_VS_FIXED:g}), "
              f"cold-started {churn['cold_ratio']:.2f}x fixed's: "
              f"{'PASS' if churn['events_ratio'] <= MAX_EVENTS_VS_FIXED else 'FAIL'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(json_safe({"rows": rows, "gpu_hour_share": share, "vs_hybrid": vs_hybrid, "vs_fixed": vs_fixed,
                                 "shipped_vs_fixed": churn, "wall_s": wall}), f, indent=1)
    if args.plot:
        _plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
