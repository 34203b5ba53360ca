"""GPU-hours vs SLO-violating requests: the trade-off curves of the baselines, and where slotwise lies.

Each swept policy (``hpa``, ``kpa``, ``predictive``) runs at every value of its main knob,
``target_utilization``; ``slotwise`` and the ``oracle`` run once. All runs share one workload and one
cluster (built exactly as ``slotwise simulate`` builds them). A run gives a point (GPU-hours,
violating requests), where violating requests = the scorecard's ``violating_requests``: the requests of
the model-minutes that missed their declared percentile (an SLO on a percentile is judged per window;
whole numbers, the fluid engine's expected counts rounded by the scorecard). ``late`` (requests beyond the
latency bound, which a 95 % SLO allows 5 % of) is recorded next to it.

Target: *the slotwise point lies below every curve — at equal GPU-hours at most 1/3 of their violating
requests, or at equal violations at least 25 % fewer GPU-hours.* Per swept policy the curve is its
sweep points joined piecewise linearly in order of GPU-hours, read at slotwise's GPU-hours (violation
ratio slotwise/curve) and at slotwise's violations (GPU-hour saving 1 - slotwise/curve); a value outside
the curve's range is reported as such, never extrapolated. See :func:`verdict`.

    .venv/bin/python bench/tradeoff.py [--trace azure-llm-2023] [--hours H] [--mode fluid|des] [--tick 10]
        [--jobs 1] [--policies hpa,kpa,predictive] [--knobs 0.4,0.5,0.6,0.7,0.8,0.9]
        [--json tradeoff.json] [--plot tradeoff.png]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from itertools import pairwise
from typing import Any

from autoscaler.benchmarks.frontier.compare import json_safe
from autoscaler.policies import POLICIES, make_policy
from autoscaler.sim.defaults import model_specs
from autoscaler.sim.harness import DEFAULT_TRACE, default_cluster, load_cluster, run_policies
from autoscaler.sim.run import SimConfig, SimResult, simulate
from autoscaler.sim.scorecard import scorecard
from autoscaler.sim.workload import SimWorkload, build_workload
from forecasting.traces import resolve_trace
from forecasting.traces.ops import head
from sharing.slots import NodeSpec

KNOB = "target_utilization"
DEFAULT_POLICIES = ("hpa", "kpa", "predictive")
DEFAULT_KNOBS = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
MAX_VIOLATION_RATIO = 1 / 3
MIN_GPU_HOUR_SAVING = 0.25
TARGET = (
    "the slotwise point lies below every curve: at equal GPU-hours at most 1/3 of their violating requests, "
    "or at equal violations at least 25% fewer GPU-hours"
)

# ---------------------------------------------------------------------------------------------------
# The verdict: pure functions of the points (unit-tested in tests/benchmarks/test_tradeoff.py).

Point = tuple[float, float]  # (gpu_hours, violating requests)


def _sorted(curve: Sequence[Point]) -> list[Point]:
    return sorted((float(x), float(y)) for x, y in curve)


def y_at_x(curve: Sequence[Point], x: float) -> float | None:
    """The curve's violations at GPU-hours ``x`` (piecewise linear in order of GPU-hours), or None when
    ``x`` is outside the curve's GPU-hour range. Where several segments cover ``x`` (equal GPU-hours at two
    knobs) the lowest value is taken: the baseline's best, so a PASS never rests on that choice."""
    pts = _sorted(curve)
    if not pts or not pts[0][0] <= x <= pts[-1][0]:
        return None
    if len(pts) == 1:
        return pts[0][1]
    best: float | None = None
    for (x0, y0), (x1, y1) in pairwise(pts):
        if not x0 <= x <= x1:
            continue
        y = min(y0, y1) if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        best = y if best is None else min(best, y)
    return best


def x_at_y(curve: Sequence[Point], y: float) -> float | None:
    """The fewest GPU-hours at which the curve (piecewise linear in order of GPU-hours) has ``y`` violating
    requests, or None when ``y`` is outside the curve's range of violations. A curve need not be monotone
    (noise, rate limits): of all crossings the cheapest is taken, again the baseline's best."""
    pts = _sorted(curve)
    if not pts:
        return None
    ys = [p[1] for p in pts]
    if not min(ys) <= y <= max(ys):
        return None
    if len(pts) == 1:
        return pts[0][0]
    best: float | None = None
    for (x0, y0), (x1, y1) in pairwise(pts):
        if not min(y0, y1) <= y <= max(y0, y1):
            continue
        x = min(x0, x1) if y1 == y0 else x0 + (x1 - x0) * (y - y0) / (y1 - y0)
        best = x if best is None else min(best, x)
    return best


def verdict(
    curve: Sequence[Point],
    point: Point,
    max_ratio: float = MAX_VIOLATION_RATIO,
    min_saving: float = MIN_GPU_HOUR_SAVING,
) -> dict[str, Any]:
    """Compare ``point`` (slotwise's GPU-hours, violations) with one policy's ``curve``.

    Returns ``violation_ratio`` (point's violations / the curve's at the point's GPU-hours) with
    ``curve_violations``, ``gpu_hour_saving`` (1 - point's GPU-hours / the curve's at the point's
    violations) with ``curve_gpu_hours``, ``notes`` (why a comparison is missing), and ``verdict``:
    PASS when either criterion holds (ratio <= ``max_ratio`` or saving >= ``min_saving``), FAIL when
    at least one comparison was possible and none holds, N/A when the point is outside the curve's range
    both ways (nothing is extrapolated).
    """
    gh, v = float(point[0]), float(point[1])
    notes: list[str] = []
    out: dict[str, Any] = {"curve_violations": None, "violation_ratio": None,
                           "curve_gpu_hours": None, "gpu_hour_saving": None}
    pts = _sorted(curve)
    if not pts:
        return out | {"notes": ["empty curve"], "verdict": "N/A"}
    cv = y_at_x(pts, gh)
    if cv is None:
        notes.append(f"{gh:.4g} GPU-h is outside the curve's {pts[0][0]:.4g}-{pts[-1][0]:.4g} GPU-h")
    else:
        out["curve_violations"] = cv
        if cv > 0:
            out["violation_ratio"] = v / cv
        elif v > 0:
            out["violation_ratio"] = math.inf
        else:
            notes.append("no violations on either side at equal GPU-hours: no ratio")
    cg = x_at_y(pts, v)
    if cg is None:
        ys = [p[1] for p in pts]
        notes.append(f"{v:.4g} violating is outside the curve's {min(ys):.4g}-{max(ys):.4g}")
    else:
        out["curve_gpu_hours"] = cg
        out["gpu_hour_saving"] = 1.0 - gh / cg if cg > 0 else None
    ratio, saving = out["violation_ratio"], out["gpu_hour_saving"]
    ok_ratio = ratio is not None and ratio <= max_ratio + 1e-12
    ok_saving = saving is not None and saving >= min_saving - 1e-12
    if ok_ratio or ok_saving:
        out["verdict"] = "PASS"
    elif ratio is None and saving is None:
        if gh <= pts[0][0] and v <= min(p[1] for p in pts):
            notes.append("the point is cheaper and has fewer violations than every sweep point (not quantified)")
        out["verdict"] = "N/A"
    else:
        out["verdict"] = "FAIL"
    out["notes"] = notes
    return out


# ---------------------------------------------------------------------------------------------------
# Running the simulations.

_CTX: tuple[SimWorkload, list[NodeSpec], SimConfig] | None = None


def _init(workload: SimWorkload, nodes: list[NodeSpec], cfg: SimConfig) -> None:
    global _CTX
    _CTX = (workload, nodes, cfg)


def _point(result: SimResult, knob: float | None) -> dict[str, Any]:
    card = scorecard(result)
    return {
        "policy": result.policy,
        "knob": knob,
        "gpu_hours": result.gpu_hours,
        "violating": card["violating_requests"],
        "late": card["late_requests"],
        "requests": card["requests"],
        "slo_attainment": card["slo_attainment"],
        "requests_within_latency": card["requests_within_latency"],
        "slo_minutes_met": card["slo_minutes_met"],
        "unplaced_replica_minutes": result.unplaced_replica_minutes,
        "scale_events": result.scale_events,
        "sim_wall_s": result.sim_wall_s,
    }


def _run(job: tuple[str, float | None]) -> list[dict[str, Any]]:
    """One job: a swept policy at one knob value, or ("reference", None) = slotwise + oracle."""
    assert _CTX is not None, "worker not initialised"
    workload, nodes, cfg = _CTX
    name, knob = job
    if name == "reference":
        results, _ = run_policies(workload, nodes, ["slotwise", "oracle"], cfg, quiet=True)
        return [_point(r, None) for r in results]
    policy = make_policy(name, **{KNOB: knob})
    # The simulator tick follows a policy with a shorter one, as run_policies does (it takes no knobs).
    tick = min(cfg.tick_s, policy.tick_s)
    return [_point(simulate(workload, nodes, policy, dataclasses.replace(cfg, tick_s=tick)), knob)]


def sweep_jobs(policies: Sequence[str], knobs: Sequence[float]) -> tuple[list[tuple[str, float | None]], list[str]]:
    """The jobs to run and a message per skipped policy (not registered, or no such knob)."""
    jobs: list[tuple[str, float | None]] = [("reference", None)]
    skipped: list[str] = []
    for name in policies:
        if name not in POLICIES:
            skipped.append(f"skipping {name}: not a registered policy (registered: {', '.join(sorted(POLICIES))})")
            continue
        try:
            for k in knobs:
                make_policy(name, **{KNOB: k})
        except ValueError as e:
            skipped.append(f"skipping {name}: {e}")
            continue
        jobs += [(name, k) for k in knobs]
    return jobs, skipped


def run_all(
    jobs: Sequence[tuple[str, float | None]], workload: SimWorkload, nodes: list[NodeSpec], cfg: SimConfig, n_jobs: int
) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = []

    def done(job: tuple[str, float | None], pts: list[dict[str, Any]]) -> None:
        label = job[0] if job[1] is None else f"{job[0]}@{job[1]:g}"
        print(f"  done {label}: " + "; ".join(f"{p['policy']} {p['gpu_hours']:.2f} GPU-h, "
                                              f"{p['violating']:.0f} violating" for p in pts), file=sys.stderr)
        points.extend(pts)

    if n_jobs <= 1:
        _init(workload, nodes, cfg)
        for job in jobs:
            done(job, _run(job))
    else:
        with ProcessPoolExecutor(max_workers=n_jobs, initializer=_init, initargs=(workload, nodes, cfg)) as ex:
            futures = {ex.submit(_run, job): job for job in jobs}
            for fut in as_completed(futures):
                done(futures[fut], fut.result())
    order = {name: i for i, (name, _) in enumerate(jobs)}
    points.sort(key=lambda p: (p["knob"] is not None, order.get(p["policy"], -1), p["knob"] or 0.0))
    return points


# ---------------------------------------------------------------------------------------------------
# Output.


def curves(points: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        if p["knob"] is not None:
            out.setdefault(p["policy"], []).append(p)
    return {k: sorted(v, key=lambda p: p["gpu_hours"]) for k, v in out.items()}


def print_table(points: Sequence[dict[str, Any]], oracle_h: float | None) -> None:
    head_ = (f"{'policy':<12}{'knob':>6}{'GPU-h':>10}{'vs oracle':>11}{'violating':>12}{'requests':>11}"
             f"{'SLO att':>9}{'unplaced min':>14}{'scale ev':>10}{'wall s':>8}")
    print(head_)
    print("-" * len(head_))
    for p in points:
        knob = "-" if p["knob"] is None else f"{p['knob']:g}"
        vs = f"{p['gpu_hours'] / oracle_h:.3f}" if oracle_h else "-"
        print(f"{p['policy']:<12}{knob:>6}{p['gpu_hours']:>10.2f}{vs:>11}{p['violating']:>12,.0f}"
              f"{p['requests']:>11,.0f}{p['slo_attainment']:>9.4f}{p['unplaced_replica_minutes']:>14.1f}"
              f"{p['scale_events']:>10,}{p['sim_wall_s']:>8.1f}")


def _describe(name: str, v: dict[str, Any], point: Point) -> str:
    parts = []
    if v["violation_ratio"] is not None:
        parts.append(f"at {point[0]:.2f} GPU-h the curve has {v['curve_violations']:,.0f} violating -> ratio "
                     f"{v['violation_ratio']:.3f} (need <= {MAX_VIOLATION_RATIO:.3f})")
    if v["gpu_hour_saving"] is not None:
        parts.append(f"at {point[1]:,.0f} violating the curve needs {v['curve_gpu_hours']:.2f} GPU-h -> saving "
                     f"{v['gpu_hour_saving']:.1%} (need >= {MIN_GPU_HOUR_SAVING:.0%})")
    parts += v["notes"]
    return f"  {name:<11} {v['verdict']:<5} " + "; ".join(parts)


def plot(points: Sequence[dict[str, Any]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    for name, pts in curves(points).items():
        xs = [p["gpu_hours"] for p in pts]
        ys = [p["violating"] for p in pts]
        (line,) = ax.plot(xs, ys, marker="o", lw=1.5, label=f"{name} ({KNOB} sweep)")
        for p in pts:
            ax.annotate(f"{p['knob']:g}", (p["gpu_hours"], p["violating"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=8, color=line.get_color())
    marks = {"slotwise": ("*", "black", 220), "oracle": ("X", "tab:red", 120)}
    for p in points:
        if p["knob"] is None and p["policy"] in marks:
            m, c, s = marks[p["policy"]]
            ax.scatter([p["gpu_hours"]], [p["violating"]], marker=m, color=c, s=s, zorder=5, label=p["policy"])
    # Log y when every run has violations; symlog (linear below 1) when one has none.
    scale = "log" if all(p["violating"] > 0 for p in points) else "symlog"
    if scale == "log":
        ax.set_yscale("log")
    else:
        ax.set_yscale("symlog", linthresh=1.0)
    ax.set_xlabel("GPU-hours")
    ax.set_ylabel(f"SLO-violating requests ({scale})")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _floats(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("expected at least one value")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=DEFAULT_TRACE, help="bundled trace name or a trace file/folder")
    ap.add_argument("--from", dest="fmt", default=None, help="trace format (default: detected)")
    ap.add_argument("--models", default=None, help="models file overriding the trace's default specs")
    ap.add_argument("--cluster", default=None, help="cluster spec or YAML (default: as slotwise simulate)")
    ap.add_argument("--hours", type=float, default=None, help="only the first HOURS of the trace")
    ap.add_argument("--history-hours", type=float, default=0.0,
                    help="the first HOURS warm-start the forecaster and are not simulated (as slotwise simulate)")
    ap.add_argument("--mode", choices=("fluid", "des"), default="fluid")
    ap.add_argument("--tick", type=float, default=10.0,
                    help="simulator tick in seconds (a policy with a shorter tick gets its own)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="simulations run in parallel processes")
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help="swept policies, comma-separated")
    ap.add_argument("--knobs", type=_floats, default=list(DEFAULT_KNOBS), help=f"{KNOB} values, comma-separated")
    ap.add_argument("--json", default=None, help="write points and verdicts here")
    ap.add_argument("--plot", default=None, help="write the trade-off PNG here")
    args = ap.parse_args(argv)
    if not args.tick > 0:
        ap.error("--tick must be > 0")
    if args.hours is not None and not args.hours > 0:
        ap.error("--hours must be > 0")
    if args.jobs < 1:
        ap.error("--jobs must be >= 1")

    t0 = time.perf_counter()
    trace = resolve_trace(args.trace, args.fmt)
    if args.hours is not None:
        trace = head(trace, (args.history_hours + args.hours) * 3600.0)
    specs = model_specs(trace, args.models)
    workload = build_workload(trace, specs, seed=args.seed, history_s=args.history_hours * 3600.0)
    cfg = SimConfig(tick_s=args.tick, mode=args.mode, seed=args.seed)
    nodes = load_cluster(args.cluster) if args.cluster else default_cluster(workload, cfg.tick_s)
    gpus = sum(n.gpu_count for n in nodes)
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    jobs, skipped = sweep_jobs(policies, args.knobs)
    for msg in skipped:
        print(msg)
    print(f"tradeoff: trace={args.trace} models={len(workload.models)} hours={workload.duration_s / 3600:.2f} "
          f"mode={args.mode} tick={args.tick:g}s seed={args.seed} GPUs={gpus} "
          f"policies={','.join(sorted({j[0] for j in jobs} - {'reference'})) or '-'} "
          f"{KNOB}={','.join(f'{k:g}' for k in args.knobs)} runs={len(jobs) - 1 + 2} jobs={args.jobs}")

    points = run_all(jobs, workload, nodes, cfg, args.jobs)
    ref = {p["policy"]: p for p in points if p["knob"] is None}
    oracle_h = ref["oracle"]["gpu_hours"] if "oracle" in ref else None
    for p in points:
        p["gpu_hours_vs_oracle"] = p["gpu_hours"] / oracle_h if oracle_h else None
    print()
    print_table(points, oracle_h)
    sw = ref["slotwise"]
    point = (sw["gpu_hours"], sw["violating"])
    verdicts = {}
    print(f"\ntarget: {TARGET}")
    print(f"slotwise point: {point[0]:.2f} GPU-h, {point[1]:,.0f} violating requests")
    for name, pts in curves(points).items():
        v = verdict([(p["gpu_hours"], p["violating"]) for p in pts], point)
        verdicts[name] = v
        print(_describe(name, v, point))
    states = [v["verdict"] for v in verdicts.values()]
    overall = "PASS" if states and all(s == "PASS" for s in states) else ("FAIL" if "FAIL" in states else "N/A")
    print(f"overall: {overall} (below every curve: all swept policies must PASS)")
    wall = time.perf_counter() - t0
    print(f"wall {wall:.1f}s")

    title = (f"{args.trace}, {workload.duration_s / 3600:.3g} h, {args.mode}, {gpus} GPUs: "
             f"GPU-hours vs SLO-violating requests")
    if args.json:
        doc = {
            "trace": args.trace,
            "hours": workload.duration_s / 3600,
            "mode": args.mode,
            "tick_s": args.tick,
            "seed": args.seed,
            "gpus": gpus,
            "cluster": [n.__dict__ | {"labels": dict(n.labels)} for n in nodes],
            "knob": KNOB,
            "knobs": args.knobs,
            "skipped": skipped,
            "target": TARGET,
            "points": points,
            "verdicts": verdicts,
            "overall": overall,
            "wall_s": wall,
        }
        with open(args.json, "w") as f:
            json.dump(json_safe(doc), f, indent=2, default=str)
        print(f"wrote {args.json}")
    if args.plot:
        plot(points, args.plot, title)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
