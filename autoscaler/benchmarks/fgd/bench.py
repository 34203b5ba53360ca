"""The FGD-protocol benchmark: policies x traces x seeds, summarised as unallocated GPUs.

One run = one trace variant, one seed, one policy (:func:`run_one`); :func:`summarise` averages
over seeds at 100% and 130% arrival and puts the published means beside ours when given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoscaler.benchmarks.fgd import policies as P
from autoscaler.benchmarks.fgd.metrics import REPORT_AT, alloc_curve, load_expected, unallocated_gpus
from autoscaler.benchmarks.fgd.replay import has_replay, load_replay
from autoscaler.benchmarks.fgd.shipped import ShippedPolicy
from autoscaler.benchmarks.fgd.sim import Policy, simulate
from autoscaler.benchmarks.fgd.workload import (
    Arrival,
    Cluster,
    Pods,
    TargetShapes,
    random_arrival,
    read_cluster_csv,
    read_pods_csv,
    target_shapes,
)

POLICY_NAMES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd", "slotwise", "shipped", "shipped-nofrag",
                "shipped-nohost")


def make_policy(name: str, shapes: TargetShapes) -> Policy:
    makers: dict[str, Callable[[], Policy]] = {
        "random": P.RandomPolicy,
        "dotprod": P.DotProdPolicy,
        "clustering": P.ClusteringPolicy,
        "packing": P.PackingPolicy,
        "bestfit": P.BestFitPolicy,
        "fgd": lambda: P.FGDPolicy(shapes),
        # slotwise = the product's CostAwarePacker through the adapter (shipped.py), learning the target workload
        # from the arrivals (FGD's target shapes as the prior); "shipped" is the same policy under its older name
        "slotwise": lambda: ShippedPolicy(shapes=shapes, name="slotwise"),
        "shipped": lambda: ShippedPolicy(shapes=shapes),
        # ablations: no target workload (host stranding only), and neither
        "shipped-nofrag": ShippedPolicy,
        "shipped-nohost": lambda: ShippedPolicy(host_aware=False),
    }
    if name not in makers:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")
    return makers[name]()


def parse_seeds(text: str) -> list[int]:
    """``42-51``, ``42,45`` or a mix: ``42-44,50``."""
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if "-" in part[1:]:
            a, b = part.split("-", 1) if not part.startswith("-") else (part, "")
            lo, hi = int(a), int(b)
            if hi < lo:
                raise ValueError(f"bad seed range {part!r}")
            out.extend(range(lo, hi + 1))
        else:
            out.append(int(part))
    if not out:
        raise ValueError(f"no seeds in {text!r}")
    return out


def trace_stem(pods_path: str | Path) -> str:
    name = Path(pods_path).name
    for suf in (".csv.gz", ".csv"):
        if name.endswith(suf):
            return name[: -len(suf)]
    return name


@dataclass
class Experiment:
    """One trace variant, loaded once: cluster, pods, FGD target shapes, arrivals per seed."""

    trace: str
    cluster: Cluster
    pods: Pods
    shapes: TargetShapes
    arrivals: dict[int, Arrival]
    replayed: bool


def load_experiment(nodes_csv: str, pods_csv: str, seeds: list[int], replay_dir: str | None) -> Experiment:
    cluster = read_cluster_csv(nodes_csv)
    pods = read_pods_csv(pods_csv)
    stem = trace_stem(pods_csv)
    if replay_dir is not None and has_replay(replay_dir, stem):
        arrivals = load_replay(replay_dir, stem, pods, cluster, seeds)
        replayed = True
    else:
        # No replay for this variant (e.g. an unseen one): same protocol, numpy's RNG.
        arrivals = {s: random_arrival(pods, len(cluster), cluster.total_gpus, s) for s in seeds}
        replayed = False
    return Experiment(stem, cluster, pods, target_shapes(pods), arrivals, replayed)


def run_one(exp: Experiment, policy: str, seed: int) -> dict[str, Any]:
    res = simulate(exp.cluster, exp.pods, exp.arrivals[seed], make_policy(policy, exp.shapes))
    curve = alloc_curve(res)
    return {
        "trace": exp.trace,
        "policy": policy,
        "seed": seed,
        "replayed": exp.replayed,
        "pods": len(res.placed),
        "failed": res.failed,
        "seconds": round(res.seconds, 3),
        "total_gpus": res.total_gpus,
        "alloc_pct": {str(k): float(curve[k]) for k in REPORT_AT},
        "unallocated_gpus": {str(k): round(unallocated_gpus(float(curve[k]), res.total_gpus), 1) for k in REPORT_AT},
        "curve": [None if np.isnan(x) else float(x) for x in curve],
    }


def summarise(runs: list[dict[str, Any]], expected_csv: str | None = None) -> list[dict[str, Any]]:
    """Mean over seeds per (trace, policy), with the published means (same seeds) when available."""
    expected = load_expected(expected_csv) if expected_csv else {}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["trace"], r["policy"]), []).append(r)
    out = []
    for (trace, policy), rs in sorted(groups.items()):
        row: dict[str, Any] = {"trace": trace, "policy": policy, "seeds": sorted(r["seed"] for r in rs)}
        total = rs[0]["total_gpus"]
        for k in REPORT_AT:
            vals = [r["unallocated_gpus"][str(k)] for r in rs]
            row[f"unalloc_{k}"] = round(float(np.mean(vals)), 1)
            row["seconds_mean"] = round(float(np.mean([r["seconds"] for r in rs])), 2)
            exp = expected.get((trace, policy), {})
            ev = [unallocated_gpus(float(exp[s][k]), total) for s in row["seeds"] if s in exp]
            if ev and len(ev) == len(rs):
                row[f"published_{k}"] = round(float(np.mean(ev)), 1)
                diff = row[f"unalloc_{k}"] - row[f"published_{k}"]
                row[f"within_{k}"] = bool(abs(diff) <= max(0.05 * row[f"published_{k}"], 15.0))
        out.append(row)
    return out
