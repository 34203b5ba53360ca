"""Lending idle reserved GPUs to preemptible training: slotwise with and without lending, and a static split.

Per trace, three runs side by side in one process, on one workload and one cluster (built exactly as
``slotwise simulate`` builds them), with a training backlog that always wants more GPUs (``--training``, default
the bundled best-effort pods of the Alibaba GPU trace):

- ``no lending``: slotwise as it is;
- ``lending``: slotwise with the decision core's lend stage (``--lending-mode``: ``pods`` lends whole idle nodes
  only, as the controller does in that mode, ``kueue`` single GPUs; ``--max-reclaim-s``, ``--warm-buffer-gpus``);
- ``static split``: slotwise on the cluster less N GPUs given to training up front and never preempted, N = the
  lending run's mean lent GPUs, rounded (the same total GPUs; training on a fixed share instead of a lent one).

Targets (issue 8), judged per trace:

- lending efficiency (lent / idle reserved GPU-hours, :mod:`autoscaler.sim.scorecard`) >= 0.7;
- >= 99 % of reclaims complete within ``maxReclaimSeconds`` and none is late by more than the grace period;
- with lending no more than 0.1 percentage points below the run without, both the SLO attainment (requests in
  model-minutes that met their percentile / all, ``slo_attainment``) and the requests within the latency target /
  all (``requests_within_latency``);
- training goodput reported against the static split (no target).

Windows (the defaults) are long enough to hold daily troughs where the trace has them, with the history before
them warm-starting the forecaster, as ``bench/tradeoff.py`` does: azure-llm-2023 the full slice after 0.25 h,
azure-functions-2019 6 h after 2 h, servegen-m-small 24 h after 24 h.

    .venv/bin/python bench/lending.py [--trace azure-llm-2023,azure-functions-2019,servegen-m-small]
        [--hours H] [--history-hours H] [--max-reclaim-s 120] [--warm-buffer-gpus 1] [--json lending.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

from autoscaler.policies import make_policy
from autoscaler.sim.defaults import model_specs
from autoscaler.sim.harness import default_cluster, load_cluster
from autoscaler.sim.run import SimConfig, simulate
from autoscaler.sim.scorecard import scorecard
from autoscaler.sim.training import BUNDLED, DEFAULT_CHECKPOINT_EVERY_S, DEFAULT_GRACE_S, load_training
from autoscaler.sim.workload import build_workload
from forecasting.traces import resolve_trace
from forecasting.traces.ops import head
from sharing.lending import LendingPolicy

# trace -> (history hours, simulated hours; None = the rest of the trace)
WINDOWS: dict[str, tuple[float, float | None]] = {
    "azure-llm-2023": (0.25, None),
    "azure-functions-2019": (2.0, 6.0),
    "servegen-m-small": (24.0, 24.0),
}
MIN_EFFICIENCY = 0.7
MIN_WITHIN_DEADLINE = 0.99
MAX_ATTAINMENT_DROP_PP = 0.1
RUNS = ("no lending", "lending", "static split")

ROWS = (  # (label, scorecard key, format)
    ("lending efficiency", "lending_efficiency", "{:.3f}"),
    ("lent GPU-h", "lent_gpu_hours", "{:.2f}"),
    ("idle reserved GPU-h", "idle_reserved_gpu_hours", "{:.2f}"),
    ("inference GPU-h", "gpu_hours", "{:.2f}"),
    ("reclaims", "reclaims", "{:d}"),
    ("reclaim p50 s", "reclaim_p50_s", "{:.1f}"),
    ("reclaim p99 s", "reclaim_p99_s", "{:.1f}"),
    ("% within deadline", "reclaims_within_deadline", "{:.2%}"),
    ("reclaims late", "reclaims_late", "{:d}"),
    ("worst overrun s", "reclaim_max_late_s", "{:.1f}"),
    ("training goodput GPU-h", "training_goodput_gpu_hours", "{:.2f}"),
    ("training lost GPU-h", "training_lost_gpu_hours", "{:.2f}"),
    ("SLO attainment: requests in SLO-meeting model-minutes", "slo_attainment", "{:.4%}"),
    ("requests within the latency target", "requests_within_latency", "{:.4%}"),
    ("unplaced replica-min", "unplaced_replica_minutes", "{:.1f}"),
)


def _fmt(fmt: str, v: Any) -> str:
    if v is None:
        return "-"
    return fmt.format(v)


def verdicts(cards: dict[str, dict[str, Any]], grace_s: float) -> dict[str, dict[str, Any]]:
    """The issue's targets for one trace's runs (pure: unit-tested on made-up cards)."""
    off, on = cards["no lending"], cards["lending"]
    out: dict[str, dict[str, Any]] = {}
    eff = on["lending_efficiency"]
    out["efficiency"] = {"value": eff, "target": f">= {MIN_EFFICIENCY}",
                         "verdict": "PASS" if eff >= MIN_EFFICIENCY else "FAIL"}
    within, overrun = on["reclaims_within_deadline"], on["reclaim_max_late_s"]
    if on["reclaims"] == 0:
        out["reclaims"] = {"value": None, "target": "no reclaims", "verdict": "PASS"}
    else:
        ok = within >= MIN_WITHIN_DEADLINE - 1e-12 and overrun <= grace_s + 1e-9
        out["reclaims"] = {"value": within, "worst_overrun_s": overrun,
                           "target": f">= {MIN_WITHIN_DEADLINE:.0%} within the deadline, none late by > {grace_s:g} s",
                           "verdict": "PASS" if ok else "FAIL"}
    drops = {k: (off[k] - on[k]) * 100.0 for k in ("requests_within_latency", "slo_attainment")}
    out["attainment"] = {"drop_pp": drops, "target": f"drop <= {MAX_ATTAINMENT_DROP_PP} pp (both measures)",
                         "verdict": "PASS" if all(d <= MAX_ATTAINMENT_DROP_PP + 1e-9 for d in drops.values())
                         else "FAIL"}
    static = cards.get("static split")
    if static is not None and static["training_goodput_gpu_hours"] > 0:
        ratio = on["training_goodput_gpu_hours"] / static["training_goodput_gpu_hours"]
        out["goodput_vs_static"] = {"value": ratio, "lending_gpu_hours": on["training_goodput_gpu_hours"],
                                    "static_gpu_hours": static["training_goodput_gpu_hours"],
                                    "static_attainment_drop_pp": (off["requests_within_latency"]
                                                                  - static["requests_within_latency"]) * 100.0,
                                    "verdict": "REPORTED"}
    else:
        out["goodput_vs_static"] = {"value": None, "verdict": "N/A (no static split: nothing was lent)"}
    return out


def run_trace(name: str, args: argparse.Namespace, jobs: tuple) -> dict[str, Any]:
    hist, hours = WINDOWS.get(name, (0.0, None))
    if args.history_hours is not None:
        hist = args.history_hours
    if args.hours is not None:
        hours = args.hours
    trace = resolve_trace(name)
    if hours is not None:
        trace = head(trace, (hist + hours) * 3600.0)
    workload = build_workload(trace, model_specs(trace), seed=args.seed, history_s=hist * 3600.0)
    base = SimConfig(tick_s=args.tick, mode=args.mode, seed=args.seed, training=jobs,
                     lending_prefer_open_nodes=getattr(args, "prefer_open_nodes", None),
                     lending_consolidate_removals=getattr(args, "consolidate_removals", None),
                     lending_device_anti_affinity=getattr(args, "device_anti_affinity", None) or None)
    nodes = load_cluster(args.cluster) if args.cluster else default_cluster(workload, base.tick_s, args.headroom)
    gpus = sum(n.gpu_count for n in nodes)
    knobs = {k: v for k, v in (("max_reclaim_s", args.max_reclaim_s), ("warm_buffer_gpus", args.warm_buffer_gpus))
             if v is not None}
    policy = LendingPolicy(enabled=True, mode=args.lending_mode, **knobs)
    print(f"\n== {name}: {len(workload.models)} models, {workload.duration_s / 3600:.2f} h after {hist:g} h history, "
          f"{gpus} GPUs (headroom {args.headroom:g}), {args.mode}, lending mode {policy.mode}, "
          f"max_reclaim_s={policy.max_reclaim_s:g}, warm_buffer_gpus={policy.warm_buffer_gpus:g}", flush=True)
    cards: dict[str, dict[str, Any]] = {}
    walls: dict[str, float] = {}

    def one(label: str, cfg: SimConfig) -> dict[str, Any]:
        t0 = time.perf_counter()
        res = simulate(workload, nodes, make_policy("slotwise"), dataclasses.replace(cfg, tick_s=min(
            cfg.tick_s, make_policy("slotwise").tick_s)))
        walls[label] = time.perf_counter() - t0
        card = scorecard(res)
        print(f"  {label}: {walls[label]:.1f} s", file=sys.stderr, flush=True)
        return card

    cards["no lending"] = one("no lending", base)
    cards["lending"] = one("lending", dataclasses.replace(base, lending=policy))
    n_static = int(round(cards["lending"]["lending"]["mean_lent_gpus"]))
    if n_static > 0:
        cards["static split"] = one("static split", dataclasses.replace(base, static_training_gpus=n_static))
    print_table(cards, n_static)
    v = verdicts(cards, max((j.grace_s for j in jobs), default=DEFAULT_GRACE_S))
    print_verdicts(v)
    return {"trace": name, "history_hours": hist, "hours": workload.duration_s / 3600.0, "gpus": gpus,
            "headroom": args.headroom if not args.cluster else None,
            "static_training_gpus": n_static, "lending_policy": dataclasses.asdict(policy), "wall_s": walls,
            "cards": {k: {kk: vv for kk, vv in c.items() if kk != "per_model"} for k, c in cards.items()},
            "verdicts": v}


def print_table(cards: dict[str, dict[str, Any]], n_static: int) -> None:
    labels = [k if k != "static split" else f"static split {n_static}" for k in cards]
    w = max(len(r[0]) for r in ROWS) + 2
    print(f"  {'':<{w}}" + "".join(f"{label:>18}" for label in labels))
    for label, key, fmt in ROWS:
        print(f"  {label:<{w}}" + "".join(f"{_fmt(fmt, c.get(key)):>18}" for c in cards.values()))


def print_verdicts(v: dict[str, dict[str, Any]]) -> None:
    e = v["efficiency"]
    print(f"  efficiency {e['value']:.3f} (target {e['target']}): {e['verdict']}")
    r = v["reclaims"]
    if r["value"] is None:
        print(f"  reclaims: none: {r['verdict']}")
    else:
        print(f"  reclaims {r['value']:.2%} within the deadline, worst overrun {r['worst_overrun_s']:.1f} s "
              f"(target {r['target']}): {r['verdict']}")
    a = v["attainment"]
    drops = ", ".join(f"{k} {d:+.3f} pp" for k, d in a["drop_pp"].items())
    print(f"  attainment drop with lending: {drops} (target {a['target']}): {a['verdict']}")
    g = v["goodput_vs_static"]
    if g["value"] is None:
        print(f"  goodput vs static split: {g['verdict']}")
    else:
        print(f"  goodput: lending {g['lending_gpu_hours']:.2f} GPU-h vs static split {g['static_gpu_hours']:.2f} "
              f"GPU-h = {g['value']:.2f}x (the static split costs {g['static_attainment_drop_pp']:+.3f} pp of "
              f"SLO attainment)")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=",".join(WINDOWS), help="bundled trace names, comma-separated")
    ap.add_argument("--hours", type=float, default=None, help="simulated hours (default: per trace, see above)")
    ap.add_argument("--history-hours", type=float, default=None, help="history hours (default: per trace)")
    ap.add_argument("--cluster", default=None, help="cluster spec or YAML (default: as slotwise simulate)")
    ap.add_argument("--headroom", type=float, default=3.0,
                    help="the default cluster's size: this times the GPUs every model's peak needs (as slotwise "
                         "simulate: 3); smaller leaves inference less idle capacity, so reclaims matter more")
    ap.add_argument("--mode", choices=("fluid", "des"), default="fluid")
    ap.add_argument("--tick", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lending-mode", choices=("pods", "kueue"), default="pods",
                    help="pods: whole idle nodes only (as the controller in pods mode); kueue: single GPUs")
    ap.add_argument("--max-reclaim-s", type=float, default=None)
    ap.add_argument("--warm-buffer-gpus", type=float, default=None)
    ap.add_argument("--training", default=BUNDLED, help="training job source (as slotwise simulate --training)")
    ap.add_argument("--checkpoint-every-s", type=float, default=DEFAULT_CHECKPOINT_EVERY_S)
    ap.add_argument("--training-grace-s", type=float, default=DEFAULT_GRACE_S)
    ap.add_argument("--prefer-open-nodes", action=argparse.BooleanOptionalAction, default=None,
                    help="pods mode: the packer prefers nodes that already hold something (keeps idle nodes whole; "
                         "default on in pods mode)")
    ap.add_argument("--consolidate-removals", action=argparse.BooleanOptionalAction, default=None,
                    help="pods mode: scale-down removes replicas on the least occupied nodes first (default on in "
                         "pods mode)")
    ap.add_argument("--device-anti-affinity", action="store_true",
                    help="pods mode: anti-affinity spreads a model's replicas over devices only, not nodes")
    ap.add_argument("--json", default=None, help="write every card and verdict here")
    args = ap.parse_args(argv)
    if args.hours is not None and not args.hours > 0:
        ap.error("--hours must be > 0")
    if not args.headroom > 0:
        ap.error("--headroom must be > 0")
    jobs = load_training(args.training, args.checkpoint_every_s, args.training_grace_s)
    t0 = time.perf_counter()
    print(f"lending bench: training {args.training} ({len(jobs)} jobs, checkpoint every {args.checkpoint_every_s:g} "
          f"s, grace {args.training_grace_s:g} s)")
    results = [run_trace(name.strip(), args, jobs) for name in args.trace.split(",") if name.strip()]
    print("\nsummary:")
    overall = True
    for r in results:
        states = {k: v["verdict"] for k, v in r["verdicts"].items()}
        overall &= all(s in ("PASS", "REPORTED") or s.startswith("N/A") for s in states.values())
        print(f"  {r['trace']:<22}" + "  ".join(f"{k} {s}" for k, s in states.items()))
    print(f"overall: {'PASS' if overall else 'FAIL'}  (wall {time.perf_counter() - t0:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"training": args.training, "results": results}, f, indent=2,
                      default=lambda x: None if isinstance(x, float) and not math.isfinite(x) else str(x))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
