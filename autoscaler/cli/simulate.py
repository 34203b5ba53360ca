"""``slotwise simulate``: run the controller on a simulated cluster under a trace and print a scorecard.

``--lending`` turns on the decision core's lend stage: idle reserved GPUs are lent to a backlog of preemptible
training jobs (``--training``) and reclaimed ahead of need; ``--static-training-gpus N`` is the baseline it is
compared with (N GPUs taken out of the inference pool for training up front). The scorecard then also shows the
lending numbers (:mod:`autoscaler.sim.scorecard`).

``--scenario FILE`` runs a scenario (teams, models, training, cluster, events; :mod:`autoscaler.sim.scenario`) and
prints the PoC scorecard per team and overall (:mod:`autoscaler.report.scenario`); ``--arbitration slo,priority,
partition`` runs it once per arbitration mode side by side. docs/scenarios.md has the file, the flags and every
number.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

from autoscaler.api.spec import SpecError
from autoscaler.decision.arbitration import ARBITRATION_MODES
from autoscaler.decision.config import DEFAULT_EXACT_BUDGET_S
from autoscaler.policies import POLICIES
from autoscaler.sim.defaults import model_specs
from autoscaler.sim.harness import (
    DEFAULT_TRACE,
    POLICY_ORDER,
    default_cluster,
    load_cluster,
    run_policies,
    run_variants,
    shipped_scenarios,
)
from autoscaler.sim.run import SimConfig
from autoscaler.sim.scorecard import COLUMNS, EPS, LABELS, LENDING_COLUMNS, ZERO_COLUMNS
from autoscaler.sim.training import BUNDLED, DEFAULT_CHECKPOINT_EVERY_S, DEFAULT_GRACE_S, load_training
from autoscaler.sim.workload import build_workload
from forecasting.traces import resolve_trace
from forecasting.traces.model import TraceFormatError
from forecasting.traces.ops import head
from sharing.lending import LendingPolicy


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="run the control loop on a simulated cluster driven by a trace")
    p.add_argument("--trace", default=DEFAULT_TRACE, help="bundled trace name or a trace file/folder")
    p.add_argument("--scenario", default=None, metavar="FILE|NAME",
                   help="a scenario file (teams, arbitration, models, training, cluster, events; docs/scenarios.md) "
                        f"or a shipped one ({', '.join(shipped_scenarios())}); replaces --trace, --models, "
                        "--cluster and the training options; --hours shortens it; prints the PoC scorecard per team")
    p.add_argument("--arbitration", default=None, metavar="MODES",
                   help=f"with --scenario: run each policy once per arbitration mode, side by side (a comma list of "
                        f"{', '.join(ARBITRATION_MODES)}; each with the scenario's teams and arbitration settings; "
                        f"default: the scenario's own mode)")
    p.add_argument("--from", dest="fmt", default=None, help="trace format (default: detected)")
    p.add_argument("--policy", default=None,
                   help=f"one of {', '.join(POLICY_ORDER)}, a comma list, or all (default: all; with --scenario: "
                        f"slotwise)")
    p.add_argument(
        "--cluster",
        default=None,
        help="cluster: a spec such as '16xH100-80GB:mig,8xL4' (GPU counts) or a YAML file (default: from the trace)",
    )
    p.add_argument("--models", default=None, help="models file (YAML/JSON) overriding the trace's default specs")
    p.add_argument("--declared-models", default=None,
                   help="models file the controller is told (its annotations and starting profiles), while the "
                        "engines serve the trace's specs with --models: what happens when the annotations are wrong")
    p.add_argument("--mode", choices=("fluid", "des"), default="fluid", help="simulator fidelity")
    p.add_argument("--tick", type=float, default=10.0,
                   help="simulator tick in seconds (a policy with a shorter tick gets its own)")
    p.add_argument("--hours", type=float, default=None, help="simulate only the first HOURS of the trace")
    p.add_argument("--history-hours", type=float, default=0.0,
                   help="the first HOURS of the trace are the controller's history (its forecaster is "
                        "warm-started from them, as from Prometheus in a cluster); only the rest is simulated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cold-start-slo", choices=("count", "exempt"), default="count",
                   help="requests that arrived while their model had no routable replica (cold-started): judged "
                        "against the SLO like any other (count, the default) or left out of the SLO accounting "
                        "(exempt, as some platforms do)")
    p.add_argument("--exact-budget", type=float, default=DEFAULT_EXACT_BUDGET_S, metavar="S",
                   help="the wall-clock safety cut, seconds, on placing a tick's new replicas again exactly (MILP, "
                        "bounded by a work limit) on a small MIG cluster, as the controller does (default "
                        f"{DEFAULT_EXACT_BUDGET_S}; 0: the packer only; also with --scenario)")
    p.add_argument("--json", default=None, help="write the scorecard(s) as JSON here")
    p.add_argument("--plot", default=None, help="write a PNG of load, replicas and latency vs SLO here")
    p.add_argument("--out", default=None,
                   help="report folder: writes scorecard.json and simulation.png there (with --scenario: "
                        "scorecard.json, report.html and report.png)")
    lend = p.add_argument_group(
        "lending idle GPUs to preemptible training",
        "With --lending every policy run (the oracle excepted: it is the GPU-hour reference) lends idle reserved "
        "GPUs to a backlog of training jobs that always wants more, and reclaims them ahead of need within "
        "--max-reclaim-s; the scorecard adds lent and idle reserved GPU-hours, lending efficiency, reclaim times "
        "and training goodput. --static-training-gpus is the baseline: a fixed split at the same total GPUs.",
    )
    default = LendingPolicy()
    lend.add_argument("--lending", action="store_true", help="lend idle reserved GPUs to preemptible training")
    lend.add_argument("--training", default=BUNDLED, metavar="FILE|NAME",
                      help=f"training jobs: an Alibaba GPU pod list (its best-effort GPU pods), a job list CSV "
                           f"(gpus,work_s[,name,checkpoint_every_s,grace_s,priority]) or a bundled source "
                           f"(default: {BUNDLED}, the best-effort pods of cluster-trace-gpu-v2023's default list)")
    lend.add_argument("--lending-mode", choices=("pods", "kueue"), default=None,
                      help=f"how the cluster is told (default {default.mode}): 'pods' lends whole idle nodes only "
                           f"(a node label cannot split a node), 'kueue' lends single GPUs (a quota)")
    lend.add_argument("--max-reclaim-s", type=float, default=None, metavar="S",
                      help=f"the reclaim contract (maxReclaimSeconds): decision to reclaim -> GPUs free; jobs whose "
                           f"grace period is longer never run on lent GPUs (default {default.max_reclaim_s:g})")
    lend.add_argument("--warm-buffer-gpus", type=float, default=None, metavar="N",
                      help=f"idle GPUs never lent, to absorb growth during a reclaim (default "
                           f"{default.warm_buffer_gpus:g}, or {default.warm_buffer_fraction:g} of the inference "
                           f"GPUs if more)")
    lend.add_argument("--checkpoint-every-s", type=float, default=DEFAULT_CHECKPOINT_EVERY_S, metavar="S",
                      help="checkpoint interval of training jobs whose source does not give one (an Alibaba pod "
                           "list never does; default %(default)g)")
    lend.add_argument("--training-grace-s", type=float, default=DEFAULT_GRACE_S, metavar="S",
                      help="termination grace period of training jobs whose source does not give one "
                           "(default %(default)g, Kubernetes' default)")
    lend.add_argument("--static-training-gpus", type=int, default=0, metavar="N",
                      help="baseline: N GPUs taken out of the inference pool up front for training that is never "
                           "preempted (a static split at the same total GPUs)")
    p.set_defaults(func=run)


def lending_config(args: argparse.Namespace) -> dict[str, Any]:
    """SimConfig's lending fields from the command line (checks that the lending knobs come with --lending)."""
    flags = {"mode": "--lending-mode", "max_reclaim_s": "--max-reclaim-s", "warm_buffer_gpus": "--warm-buffer-gpus"}
    knobs = {"mode": args.lending_mode, "max_reclaim_s": args.max_reclaim_s, "warm_buffer_gpus": args.warm_buffer_gpus}
    given = [flags[k] for k, v in knobs.items() if v is not None]
    if given and not args.lending:
        raise ValueError(f"{', '.join(given)} set lending knobs: add --lending")
    if args.static_training_gpus < 0:
        raise ValueError(f"--static-training-gpus must be >= 0, got {args.static_training_gpus}")
    out: dict[str, Any] = {}
    if args.lending:
        out["lending"] = LendingPolicy(enabled=True, **{k: v for k, v in knobs.items() if v is not None})
    out["static_training_gpus"] = args.static_training_gpus
    if args.lending or args.static_training_gpus:
        try:
            out["training"] = load_training(args.training, args.checkpoint_every_s, args.training_grace_s)
        except TraceFormatError as e:
            raise ValueError(f"bad training source: {e}") from e
    return out


def _policies(arg: str | None) -> list[str]:
    arg = arg or "all"
    names = list(POLICY_ORDER) if arg == "all" else [x.strip() for x in arg.split(",") if x.strip()]
    bad = [n for n in names if n not in POLICIES]
    if bad:
        raise ValueError(f"unknown policy {', '.join(bad)} (known: {', '.join(sorted(POLICIES))})")
    return names


def arbitration_modes(arg: str) -> list[str]:
    """``--arbitration``'s comma list, checked (each mode once, in the order given)."""
    modes = [x.strip() for x in arg.split(",") if x.strip()]
    bad = [m for m in modes if m not in ARBITRATION_MODES]
    if bad or not modes:
        shown = ", ".join(repr(m) for m in bad) if bad else repr(arg)
        raise ValueError(f"--arbitration: unknown mode {shown} (known: {', '.join(ARBITRATION_MODES)}; "
                         "a comma list such as slo,priority,partition)")
    dup = sorted({m for m in modes if modes.count(m) > 1})
    if dup:
        raise ValueError(f"--arbitration: mode {', '.join(dup)} given twice")
    return modes


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if abs(v) < EPS:
            return "0"  # float noise is 0 (the JSON stores it as 0 too)
        if abs(v) < 0.01:
            return f"{v:.2e}"
        return f"{v:.4f}" if abs(v) < 10 else f"{v:,.1f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def table_rows(cards: list[dict[str, Any]]) -> list[tuple[str, str, list[str]]]:
    """``(label, field, cells)`` per printed row, the headline first: the label says what the number is, the field
    is its name in the JSON (``--json``) and in ``slotwise report``."""
    keys = COLUMNS + (LENDING_COLUMNS if any(c.get("lending") is not None for c in cards) else ())
    if any(c.get("cold_started_requests") or c.get("cold_start_slo") == "exempt" for c in cards):
        keys += ZERO_COLUMNS
    return [(LABELS.get(k, k), k, [_money(c.get(k)) if k.endswith("_usd") else _fmt(c.get(k)) for c in cards])
            for k in keys]


def _money(v: Any) -> str:
    return "-" if v is None else f"{v:,.2f}"


def print_table(cards: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("JSON field", style="dim")
    for c in cards:
        table.add_column(c["policy"], justify="right")
    for label, key, cells in table_rows(cards):
        table.add_row(label, key, *cells)
    Console(width=max(120, 80 + 14 * len(cards))).print(table)


def json_doc(trace: str, mode: str, tick_s: float, nodes: list[Any], training: str | None,
             cards: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``--json`` writes: the run's setting and ``results``, a list of scorecards (one per policy, also for
    one policy), each with the fields of :mod:`autoscaler.sim.scorecard`."""
    return {
        "trace": trace,
        "mode": mode,
        "tick_s": tick_s,
        "cluster": [n.__dict__ | {"labels": dict(n.labels)} for n in nodes],
        "training": training,
        "results": list(cards),
    }


def write_json(doc: dict[str, Any], path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, default=str)


def run_scenario(args: argparse.Namespace) -> int:
    """``--scenario``: the scenario's policy (slotwise unless --policy) once per arbitration mode (the scenario's
    own, or each of --arbitration), each run labelled ``policy/mode``; prints the PoC scorecard
    (:mod:`autoscaler.report.scenario`) and writes it with --json / --out."""
    import numpy as np

    from autoscaler.report.scenario import Run, build_doc, print_tables, write_json, write_report
    from autoscaler.sim.scenario import demand_gpus, load_scenario
    from autoscaler.sim.scorecard import team_card

    names = _policies(args.policy or "slotwise")
    modes = arbitration_modes(args.arbitration) if args.arbitration is not None else None
    if args.models or args.declared_models or args.cluster or args.trace != DEFAULT_TRACE:
        raise ValueError("--scenario declares the models, the trace and the cluster: drop --trace/--models/"
                         "--declared-models/--cluster")
    if args.lending or args.static_training_gpus:
        raise ValueError("--scenario declares the training backlog (its 'training' key): drop --lending and "
                         "--static-training-gpus")
    if args.history_hours:
        raise ValueError("--scenario declares its history (its 'history' key): drop --history-hours")
    if not args.tick > 0:
        raise ValueError(f"--tick must be a positive number of seconds, got {args.tick}")
    if args.hours is not None and not args.hours > 0:
        raise ValueError(f"--hours must be positive, got {args.hours}")
    path = args.scenario if os.path.exists(args.scenario) else shipped_scenarios().get(args.scenario, args.scenario)
    sc = load_scenario(path)
    hours = args.hours if args.hours is not None else sc.duration_h
    workload = build_workload(sc.build_trace(hours), sc.specs, history_s=sc.history_h * 3600.0)
    end_s = hours * 3600.0
    cfg = sc.sim_config(hours, tick_s=args.tick, mode=args.mode, seed=args.seed,
                        exact_budget_s=args.exact_budget)
    runs = [Run(f"{p}/{m}", p, m) for p in names for m in (modes or [sc.arbitration.mode])]
    variants = [(r.label, r.policy, dataclasses.replace(
        cfg, arbitration=dataclasses.replace(sc.arbitration, mode=r.arbitration))) for r in runs]
    results, cards = run_variants(workload, sc.cluster, variants, cfg)
    for c, r in zip(cards, runs, strict=True):
        c["arbitration"] = r.arbitration
    gpus = sum(n.gpu_count for n in sc.cluster)
    meta = {"scenario": sc.name, "file": path, "description": sc.description, "mode": args.mode,
            "tick_s": args.tick, "seed": args.seed, "hours": hours, "gpus": gpus,
            "request_timeout_s": sc.request_timeout_s, "arbitration": _policy_doc(sc.arbitration),
            "teams": [dataclasses.asdict(t) for t in sc.teams]}
    specs = {m.name: m.spec for m in sc.models}
    doc = build_doc(meta=meta, runs=runs, results=results, cards=cards,
                    team_cards=[team_card(r, sc.teams) for r in results],
                    priorities={n: s.priority for n, s in specs.items()},
                    cold_starts={n: s.cold_start_s for n, s in specs.items()},
                    surges=[s for s in sc.fired_surges() if s["at_s"] < end_s])
    demand = demand_gpus(workload, sc.cluster)
    total = sum(demand.values()) if demand else np.zeros(1)
    doc["demand"] = {"peak_gpus": float(np.max(total)), "mean_gpus": float(np.mean(total)),
                     "peak_share": float(np.max(total)) / gpus if gpus else None,
                     "per_team_peak_gpus": {t: float(np.max(v)) for t, v in demand.items()}}
    print_tables(doc, f"slotwise simulate — scenario {sc.name} ({len(workload.models)} models, {len(sc.teams)} "
                      f"teams, {hours:g} h, {gpus} GPUs, {args.mode}; demand: peak {np.max(total):.1f} GPUs = "
                      f"{np.max(total) / max(gpus, 1):.0%}, mean {np.mean(total):.1f})")
    if args.json:
        write_json(doc, args.json)
        print(f"wrote {args.json}")
    if args.out:
        for p in write_report(doc, args.out).values():
            print(f"wrote {p}")
    if args.plot:
        from autoscaler.sim.plot import plot_results

        plot_results(results, args.plot, workload=workload)
        print(f"wrote {args.plot}")
    return 0


def _policy_doc(policy: Any) -> dict[str, Any]:
    d = dataclasses.asdict(policy)
    d["teams"] = [dataclasses.asdict(t) for t in policy.teams]
    return d


def _clock(s: float) -> str:
    return f"{int(s // 3600):02d}:{int(s % 3600 // 60):02d}"


def run(args: argparse.Namespace) -> int:
    if args.scenario:
        return run_scenario(args)
    if args.arbitration is not None:
        raise ValueError("--arbitration needs --scenario (the teams whose quotas it arbitrates)")
    names = _policies(args.policy)
    lending = lending_config(args)
    if not args.tick > 0:
        raise ValueError(f"--tick must be a positive number of seconds, got {args.tick}")
    if args.hours is not None and not args.hours > 0:
        raise ValueError(f"--hours must be positive, got {args.hours}")
    if not args.history_hours >= 0:
        raise ValueError(f"--history-hours must be >= 0, got {args.history_hours}")
    trace = resolve_trace(args.trace, args.fmt)
    if args.hours is not None:
        trace = head(trace, (args.history_hours + args.hours) * 3600.0)
    specs = model_specs(trace, args.models)
    for name, s in specs.items():
        if isinstance(s, SpecError):
            print(f"slotwise: model {name} left unmanaged: {s}", file=sys.stderr)
    declared = model_specs(trace, args.declared_models) if args.declared_models else None
    for name, s in (declared or {}).items():
        if isinstance(s, SpecError):
            print(f"slotwise: model {name} left unmanaged (its declared spec): {s}", file=sys.stderr)
    workload = build_workload(trace, specs, history_s=args.history_hours * 3600.0, declared=declared)
    cfg = SimConfig(tick_s=args.tick, mode=args.mode, seed=args.seed, cold_start_slo=args.cold_start_slo,
                    exact_budget_s=args.exact_budget, **lending)
    nodes = load_cluster(args.cluster) if args.cluster else default_cluster(workload, cfg.tick_s)
    results, cards = run_policies(workload, nodes, names, cfg)
    gpus = sum(n.gpu_count for n in nodes)
    from autoscaler.report.headline import headline

    print("\n".join(headline(cards)), end="\n\n")  # first what it costs at the SLO; the table has every number
    print_table(cards, f"slotwise simulate — {args.trace} ({len(workload.models)} models, "
                       f"{workload.duration_s / 3600:.1f} h, {gpus} GPUs, {args.mode})")
    json_path, plot_path = args.json, args.plot
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        json_path = json_path or os.path.join(args.out, "scorecard.json")
        plot_path = plot_path or os.path.join(args.out, "simulation.png")
    doc = json_doc(args.trace, args.mode, args.tick, nodes,
                   args.training if (args.lending or args.static_training_gpus) else None, cards)
    if json_path:
        write_json(doc, json_path)
        print(f"wrote {json_path}")
    if plot_path:
        from autoscaler.sim.plot import plot_results

        plot_results(results, plot_path, workload=workload)
        print(f"wrote {plot_path}")
    return 0
