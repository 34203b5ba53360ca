"""The runs behind ``slotwise frontier``: per trace, slotwise and HPA at their defaults and the oracle (through
:func:`autoscaler.sim.harness.run_policies`, as ``slotwise simulate`` runs them), then each swept baseline at each
target utilisation, all on the same workload and cluster; then the comparisons of :mod:`.compare`.

The workload and cluster are built as ``slotwise simulate`` builds them (``resolve_trace`` -> ``head`` ->
``model_specs`` -> ``build_workload`` -> ``default_cluster``); a case may first keep only some of the trace's models
(:func:`only_models`: the Azure LLM trace's conversation model alone is a deployment of its own, with a cluster sized
for it).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoscaler.benchmarks.frontier.compare import (
    MAX_RATIO,
    MIN_SAVING,
    Point,
    attainment_check,
    compare,
    defaults_check,
    off_curve,
)
from autoscaler.policies import make_policy
from autoscaler.sim.defaults import model_specs
from autoscaler.sim.harness import default_cluster, load_cluster, progress_bar, run_policies
from autoscaler.sim.run import SimConfig, simulate
from autoscaler.sim.scorecard import scorecard
from autoscaler.sim.workload import SimWorkload, build_workload
from forecasting.traces import resolve_trace
from forecasting.traces.model import RateSeries, RequestLog, Trace
from forecasting.traces.ops import head
from sharing.slots import NodeSpec

KNOB = "target_utilization"
BASELINES = ("hpa", "kpa", "predictive")
KNOBS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
QUICK_KNOBS = (0.3, 0.6, 0.9)
TARGET = ("the slotwise point lies below each baseline's GPU-hours-vs-violating-requests curve: at equal "
          f"violations >= {MIN_SAVING:.0%} fewer GPU-hours, or at equal GPU-hours <= {MAX_RATIO:.3g}x the "
          "violating requests")

# Per bundled trace, (history hours, simulated hours; None = the rest of the trace). The LLM hour is the demo's
# (``./quickstart.sh demo``: 15 min of history, the rest scored); Functions: 2 h of history, 2 h scored; ServeGen:
# day 1 history, day 2 scored. Measured on the 2-core dev VM, one run: LLM ~1 s; Functions HPA 13 s, slotwise 58 s;
# ServeGen HPA 24 s, slotwise 74 s (KPA's 2 s tick makes it the slowest baseline).
HOURS: dict[str, tuple[float, float | None]] = {
    "azure-llm-2023": (0.25, None),
    "azure-functions-2019": (2.0, 2.0),
    "servegen-m-small": (24.0, 24.0),
}


@dataclass(frozen=True)
class Case:
    """One trace of the benchmark: ``trace`` (a bundled name or a path), the models kept (None: all)."""

    trace: str
    models: tuple[str, ...] | None = None
    history_hours: float = 0.0
    hours: float | None = None

    @property
    def label(self) -> str:
        return self.trace if self.models is None else f"{self.trace}:{','.join(self.models)}"


def default_cases() -> list[Case]:
    """The issue's four bundled traces: Azure LLM 2023 code + conversation, conversation alone, Azure Functions
    500, ServeGen m-small."""
    return [case_for("azure-llm-2023"), case_for("azure-llm-2023:conv"), case_for("azure-functions-2019"),
            case_for("servegen-m-small")]


def case_for(text: str, history_hours: float | None = None, hours: float | None = None) -> Case:
    """``TRACE`` or ``TRACE:MODEL[,MODEL...]``; hours not given come from :data:`HOURS` (else all of the trace)."""
    split = ":" in text and not os.path.exists(text)  # a file whose name has a colon is a trace, not a filter
    trace, _, models = text.rpartition(":") if split else (text, "", "")
    names = tuple(m.strip() for m in models.split(",") if m.strip()) or None
    if split and not names:
        raise ValueError(f"--trace {text!r}: no model after ':' (TRACE:MODEL[,MODEL...])")
    h0, h1 = HOURS.get(trace.strip().lower().replace("_", "-"), (0.0, None))
    return Case(trace, names, h0 if history_hours is None else history_hours, h1 if hours is None else hours)


def only_models(trace: Trace, names: Sequence[str]) -> Trace:
    """The trace with only the models ``names`` (in the trace's order): each model's traffic unchanged."""
    missing = [n for n in names if n not in trace.models]
    if missing:
        raise ValueError(f"models not in the trace: {', '.join(missing)} (it has {', '.join(trace.models)})")
    keep = [i for i, m in enumerate(trace.models) if m in names]
    models = tuple(trace.models[i] for i in keep)
    if isinstance(trace, RateSeries):
        return dataclasses.replace(trace, rates=trace.rates[keep], models=models)
    assert isinstance(trace, RequestLog)
    mask = np.isin(trace.model_index, keep)
    remap = np.full(len(trace.models), -1, dtype=trace.model_index.dtype)
    remap[keep] = np.arange(len(keep), dtype=trace.model_index.dtype)

    def cut(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[mask]

    return dataclasses.replace(trace, t=trace.t[mask], model_index=remap[trace.model_index[mask]], models=models,
                               input_tokens=cut(trace.input_tokens), output_tokens=cut(trace.output_tokens),
                               service_s=cut(trace.service_s))


def prepare(case: Case, cfg: SimConfig, models_file: str | None = None, cluster: str | None = None,
            fmt: str | None = None) -> tuple[SimWorkload, list[NodeSpec]]:
    """The workload and cluster of ``case``, as ``slotwise simulate`` builds them."""
    trace = resolve_trace(case.trace, fmt)
    if case.models is not None:
        trace = only_models(trace, case.models)
    if case.hours is not None:
        trace = head(trace, (case.history_hours + case.hours) * 3600.0)
    workload = build_workload(trace, model_specs(trace, models_file), history_s=case.history_hours * 3600.0)
    nodes = load_cluster(cluster) if cluster else default_cluster(workload, cfg.tick_s)
    return workload, nodes


# ---------------------------------------------------------------------------------------------------------------
# Reading a scorecard: the one place that knows its field names (they are being renamed, issue 15).


def card_numbers(card: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers the benchmark reads from a scorecard. ``slo_attainment`` is the headline (requests in
    SLO-meeting model-minutes); a scorecard from before issue 15's rename has that as ``slo_requests_met`` (and
    ``slo_attainment`` was then the raw share within latency), so that name wins where it exists.
    ``gpu_hours_vs_lower_bound`` is None where the scorecard has no lower bound."""
    headline = card["slo_requests_met"] if "slo_requests_met" in card else card["slo_attainment"]
    return {
        "gpu_hours": float(card["gpu_hours"]),
        "violating_requests": float(card["violating_requests"]),
        "requests": float(card["requests"]),
        "slo_attainment": float(headline),
        "gpu_hours_vs_lower_bound": card.get("gpu_hours_vs_lower_bound"),
        "lower_bound_gpu_hours": card.get("lower_bound_gpu_hours"),
        "gpu_hours_vs_oracle": card.get("gpu_hours_vs_oracle"),
        "unplaced_replica_minutes": float(card.get("unplaced_replica_minutes") or 0.0),
        "sim_wall_s": float(card.get("sim_wall_s") or 0.0),
    }


# ---------------------------------------------------------------------------------------------------------------
# Running.

Job = tuple[str, float | None]  # (policy, knob); ("reference", None) = slotwise + HPA at defaults + the oracle
_CTX: tuple[SimWorkload, list[NodeSpec], SimConfig, bool] | None = None


def _init(workload: SimWorkload, nodes: list[NodeSpec], cfg: SimConfig, progress: bool = False) -> None:
    global _CTX
    _CTX = (workload, nodes, cfg, progress)


def default_knob(name: str) -> float:
    return float(getattr(make_policy(name), KNOB))


def sweep_jobs(baselines: Sequence[str], knobs: Sequence[float]) -> list[Job]:
    """The reference job, then every (baseline, knob) -- except HPA at its default target, which the reference's
    HPA-at-defaults run already is (same policy, same config)."""
    jobs: list[Job] = [("reference", None)]
    for name in baselines:
        make_policy(name, **{KNOB: knobs[0]})  # an unknown policy or knob fails here, before any run
        jobs += [(name, float(k)) for k in knobs if not (name == "hpa" and float(k) == default_knob("hpa"))]
    return jobs


def _run(job: Job) -> list[dict[str, Any]]:
    assert _CTX is not None, "worker not initialised"
    workload, nodes, cfg, progress = _CTX
    name, knob = job
    if name == "reference":
        results, cards = run_policies(workload, nodes, ["slotwise", "hpa", "oracle"], cfg, quiet=not progress)
        return [{"policy": r.policy, "knob": None, **card_numbers(c)} for r, c in zip(results, cards, strict=True)]
    policy = make_policy(name, **{KNOB: knob})
    # As run_variants runs a policy: the simulator's tick follows a policy with a shorter one.
    run_cfg = dataclasses.replace(cfg, tick_s=min(cfg.tick_s, policy.tick_s))
    bar, cb = progress_bar(f"simulating {name}@{knob:g}") if progress else (None, None)
    try:
        result = simulate(workload, nodes, policy, run_cfg, cb)
    finally:
        if bar is not None:
            bar.stop()
    return [{"policy": name, "knob": knob, **card_numbers(scorecard(result))}]


def run_jobs(jobs: Sequence[Job], workload: SimWorkload, nodes: list[NodeSpec], cfg: SimConfig, n_jobs: int = 1,
             log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every job's points (in job order), in ``n_jobs`` processes; ``log`` gets a line per finished job. With one
    process each run also shows its progress (the harness's bar, or lines when stderr is not a terminal)."""
    t0 = time.perf_counter()
    out: dict[int, list[dict[str, Any]]] = {}

    def done(i: int, pts: list[dict[str, Any]]) -> None:
        out[i] = pts
        if log is not None:
            name, knob = jobs[i]
            label = name if knob is None else f"{name}@{knob:g}"
            log(f"  [{len(out)}/{len(jobs)}, {time.perf_counter() - t0:.0f} s] {label}: " + "; ".join(
                f"{p['policy']} {p['gpu_hours']:.2f} GPU-h, {p['violating_requests']:,.0f} violating "
                f"({p['sim_wall_s']:.0f} s)" for p in pts))

    if n_jobs <= 1:
        _init(workload, nodes, cfg, progress=log is not None)
        for i, job in enumerate(jobs):
            done(i, _run(job))
    else:
        with ProcessPoolExecutor(max_workers=n_jobs, initializer=_init, initargs=(workload, nodes, cfg)) as ex:
            futures = {ex.submit(_run, job): i for i, job in enumerate(jobs)}
            for fut in as_completed(futures):
                done(futures[fut], fut.result())
    return [p for i in range(len(jobs)) for p in out[i]]


# ---------------------------------------------------------------------------------------------------------------
# From points to the case's result.


def evaluate(points: Sequence[dict[str, Any]], baselines: Sequence[str], knobs: Sequence[float]) -> dict[str, Any]:
    """The case's result from its points: per baseline its curve (its points at ``knobs``; HPA's at its default
    target is the reference run, see :func:`sweep_jobs`) and the comparison with slotwise's point; the defaults
    check against HPA; the attainment check."""
    ref = {p["policy"]: p for p in points if p["knob"] is None}
    sw, hpa, oracle = ref["slotwise"], ref["hpa"], ref.get("oracle")
    bound_h = sw.get("lower_bound_gpu_hours")
    oracle_h = oracle["gpu_hours"] if oracle else None
    rows = []
    for p in points:
        row = dict(p)
        if row.get("gpu_hours_vs_lower_bound") is None and bound_h:
            row["gpu_hours_vs_lower_bound"] = row["gpu_hours"] / bound_h
        if row.get("gpu_hours_vs_oracle") is None and oracle_h:
            row["gpu_hours_vs_oracle"] = row["gpu_hours"] / oracle_h
        rows.append(row)
    curves: dict[str, list[dict[str, Any]]] = {}
    for name in baselines:
        pts = [r for r in rows if r["policy"] == name and r["knob"] is not None]
        if name == "hpa" and default_knob("hpa") in [float(k) for k in knobs]:
            pts.append(next(r for r in rows if r["policy"] == "hpa" and r["knob"] is None) | {
                "knob": default_knob("hpa")})
        curves[name] = sorted(pts, key=lambda r: r["knob"])
    point = Point(sw["gpu_hours"], sw["violating_requests"])
    comparisons = {}
    for name, pts in curves.items():
        swept = [Point(r["gpu_hours"], r["violating_requests"], r["knob"]) for r in pts]
        c = compare(swept, point)
        for r, why in zip(pts, off_curve(swept, c.curve), strict=True):
            r["off_curve"] = why
        comparisons[name] = {k: v for k, v in dataclasses.asdict(c).items() if k != "curve"}
        comparisons[name]["curve_knobs"] = [q.knob for q in c.curve]
    d = defaults_check(point, Point(hpa["gpu_hours"], hpa["violating_requests"]))
    sw_row = next(r for r in rows if r["policy"] == "slotwise")
    a = attainment_check(sw["slo_attainment"], sw.get("gpu_hours_vs_lower_bound"), sw_row.get("gpu_hours_vs_oracle"))
    verdicts = [c["verdict"] for c in comparisons.values()]
    return {
        "reference_points": [r for r in rows if r["knob"] is None],
        "curves": curves,
        "comparisons": comparisons,
        "frontier_verdict": "PASS" if verdicts and all(v == "PASS" for v in verdicts) else "FAIL",
        "defaults_check": dataclasses.asdict(d) | {"hpa_default_target": default_knob("hpa")},
        "attainment_check": dataclasses.asdict(a),
    }
