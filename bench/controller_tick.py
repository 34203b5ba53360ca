"""What one live-controller tick costs in-process, for a large fleet: translating the informer caches into a
snapshot (``controller.read_view``: ``build_view`` and the pod templates) next to planning the tick (``plan_tick``:
``decide``, then the node-level actions -- MIG layouts, time-slicing, slot templates), as the controller does.

    python bench/controller_tick.py --models 1000 --pods-per-model 5 --nodes 500 --ticks 5

The Kubernetes objects are synthetic but shaped like the API serves them (Deployments with ``slotwise.io/*``
annotations, Ready pods bound to GPU nodes, nodes with GPU Feature Discovery labels: a third whole-GPU H100s,
a third H100s in MIG, a third L4s). The network is not included: the informers keep the caches between ticks.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from autoscaler.api.snapshot import MetricsWindow, ModelMetrics
from autoscaler.decision.config import build_core
from autoscaler.decision.node_actions import NodeActionState
from autoscaler.decision.state import fresh_state
from autoscaler.decision.tick import plan_tick
from autoscaler.live.controller import read_view
from autoscaler.policies import make_policy

T0 = "2026-11-30T10:00:00Z"


def _node(i: int) -> dict:
    kind = i % 3
    labels = {"nvidia.com/gpu.count": "8"}
    if kind == 0:
        labels["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3"
        capacity = {"nvidia.com/gpu": "8"}
    elif kind == 1:
        labels |= {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/mig.strategy": "mixed",
                   "nvidia.com/mig.config": "all-3g.40gb", "nvidia.com/mig.config.state": "success"}
        capacity = {"nvidia.com/mig-3g.40gb": "16"}
    else:
        labels["nvidia.com/gpu.product"] = "NVIDIA-L4"
        capacity = {"nvidia.com/gpu": "8"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{i}", "labels": labels},
            "spec": {}, "status": {"capacity": capacity, "allocatable": capacity}}


def synthetic_cluster(models: int, pods_per_model: int, nodes: int) -> tuple[list, list, list]:
    node_objs = [_node(i) for i in range(nodes)]
    deployments, pods = [], []
    placed = {"whole": 0, "mig": 0}  # round robin per pool: every GPU / instance takes at most one pod
    whole = [n for n in node_objs if "nvidia.com/gpu" in n["status"]["capacity"]]
    mig = [n for n in node_objs if "nvidia.com/mig-3g.40gb" in n["status"]["capacity"]]
    for m in range(models):
        name, ns = f"model-{m}", f"team-{m % 10}"
        on_mig = m % 2 == 1 and mig
        resource = "nvidia.com/mig-3g.40gb" if on_mig else "nvidia.com/gpu"
        ann = {"slotwise.io/slo-latency-ms": "500", "slotwise.io/service-time-ms": "80",
               "slotwise.io/max-replicas": "40", "slotwise.io/team": f"team-{m % 10}"}
        if on_mig:
            ann |= {"slotwise.io/gpu-memory-gib": "30", "slotwise.io/gpu-compute-share": "0.4"}
        labels = {"app": name}
        deployments.append({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{m}", "annotations": ann, "labels": labels},
            "spec": {"replicas": pods_per_model, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                         {"name": "server", "resources": {"limits": {resource: "1"}}}]}}},
        })
        pool, which = (mig, "mig") if on_mig else (whole, "whole")
        for k in range(pods_per_model):
            node = pool[placed[which] % len(pool)]["metadata"]["name"]
            placed[which] += 1
            pods.append({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{name}-{k}", "namespace": ns, "labels": labels, "creationTimestamp": T0},
                "spec": {"nodeName": node, "containers": [{"name": "server",
                                                            "resources": {"limits": {resource: "1"}}}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
            })
    return deployments, pods, node_objs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--pods-per-model", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--ticks", type=int, default=5)
    args = ap.parse_args()
    deployments, pods, nodes = synthetic_cluster(args.models, args.pods_per_model, args.nodes)
    rng = np.random.default_rng(0)
    state, nodes_state = fresh_state(), NodeActionState()
    # the controller's configuration (15 s metrics step, no lending)
    core = build_core(make_policy("slotwise"), report_every_decision=True, metric_lag_s=15.0)
    t_view, t_plan = [], []
    now = time.time()
    for tick in range(args.ticks):
        now += 10.0
        t0 = time.perf_counter()
        view = read_view(deployments, pods, nodes, now=now)
        t1 = time.perf_counter()
        window = MetricsWindow(now, 15.0, {
            k: ModelMetrics(rate=rng.gamma(4.0, 10.0, 60), in_flight=rng.gamma(4.0, 1.0, 60))
            for k, o in view.snapshot.models.items() if o.spec is not None
        })
        plan_tick(view.snapshot, window, state, core, nodes_state)
        t2 = time.perf_counter()
        if tick > 0:  # the first tick builds the forecaster and the learning state: reported apart
            t_view.append(t1 - t0)
            t_plan.append(t2 - t1)
        else:
            first = (t1 - t0, t2 - t1)
    print(f"cluster: {len(deployments)} models, {len(pods)} pods, {len(nodes)} nodes "
          f"({len(view.snapshot.inventory.devices)} GPUs); problems: {len(view.problems)}")
    print(f"first tick: translate {first[0] * 1e3:.0f} ms, plan {first[1] * 1e3:.0f} ms (state built)")
    print(f"{'per tick (median of ' + str(len(t_view)) + ')':<28}{'ms':>8}{'x plan':>10}")
    med_d = statistics.median(t_plan)
    for label, xs in (("translate (read_view)", t_view), ("plan (plan_tick)", t_plan)):
        med = statistics.median(xs)
        print(f"{label:<28}{med * 1e3:>8.1f}{med / med_d:>10.2f}")


if __name__ == "__main__":
    main()
