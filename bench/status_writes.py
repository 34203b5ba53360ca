"""How often the actuator writes status and Events under a steady, noisy load: writes per model per hour.

    python bench/status_writes.py --models 20 --minutes 10 --tick-s 10

What runs: a REAL kube-apiserver + etcd (``tests/realparts/kube.py``, ``running_kube_apiserver``; the cached
binary, see that module) behind the project's fault proxy (``tests/realparts/faultproxy.py``), which counts every
request that reaches the server. The models are real Deployments in it (``slotwise.io/*`` annotations, 4
replicas each); their pods are synthetic (a bare apiserver runs none), Ready on synthetic GPU nodes. Every tick
(``--tick-s`` of a fake clock) the controller's own pipeline decides -- ``read_view`` over the Deployments as the
server serves them (so the status annotations written so far are in the view, as in the informer cache) and the
synthetic pods, then ``plan_tick`` with slotwise's policy on a steady load with noise (Gaussian, ``--noise`` of
the mean, per 15 s sample) -- and :class:`KubeActuator` applies the plan's scale, status and Event
actions (``ScaleModel``, ``UpdateStatus``, ``Shortfall``); the synthetic pods follow each scale written at once.

The first ``--warmup-minutes`` are not counted: the fleet settles to the load there (scale-downs wait out
their stabilization window). Printed, per model per hour of the fake clock: decisions (``UpdateStatus``
actions), status PATCHes (of Deployments), Event writes (create or count bump), scale writes, other writes and
all requests.

Before/after: the script uses only ``KubeActuator(api, ActuatorConfig(), clock=...)`` and ``apply(plan, view)``,
so it runs unchanged on code before issue 16 (``git worktree add /tmp/before <sha>``, then
``PYTHONPATH=/tmp/before python bench/status_writes.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from realparts.faultproxy import FaultProxy
from realparts.kube import running_kube_apiserver

from autoscaler.api.plan import Plan, ScaleModel, Shortfall, UpdateStatus
from autoscaler.api.snapshot import MetricsWindow, ModelMetrics
from autoscaler.decision.config import build_core
from autoscaler.decision.node_actions import NodeActionState
from autoscaler.decision.state import fresh_state
from autoscaler.decision.tick import plan_tick
from autoscaler.live.controller import read_view
from autoscaler.live.kube.actuator import ActuatorConfig, KubeActuator
from autoscaler.policies import make_policy

NAMESPACES = 4
REPLICAS = 4
SERVICE_TIME_S = 0.08
T0 = "2026-11-30T10:00:00Z"


def _deployment(name: str) -> dict:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"slotwise.io/slo-latency-ms": "500", "slotwise.io/service-time-ms": "80",
                                     "slotwise.io/max-replicas": "40", "slotwise.io/cold-start-seconds": "60"}},
        "spec": {"replicas": REPLICAS, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                     {"name": "server", "image": "registry.invalid/vllm:bench",
                      "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
    }


def _nodes(models: int) -> list[dict]:
    gpus = models * REPLICAS * 3  # room to grow: no shortfall from capacity
    return [{"apiVersion": "v1", "kind": "Node",
             "metadata": {"name": f"bench-node-{i}", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                                                 "nvidia.com/gpu.count": "8"}},
             "spec": {}, "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}}
            for i in range((gpus + 7) // 8)]


def _pods(models: list[tuple[str, str]], replicas: dict[str, int]) -> list[dict]:
    """Ready pods, as many as each model's scale says (the cluster follows at once: no cold start to wait)."""
    pods = []
    for m, (ns, name) in enumerate(models):
        for k in range(min(replicas[f"{ns}/{name}"], REPLICAS * 3)):
            slot = m * REPLICAS * 3 + k
            pods.append({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{name}-{k}", "namespace": ns, "labels": {"app": name},
                             "creationTimestamp": T0},
                "spec": {"nodeName": f"bench-node-{slot // 8}",
                         "containers": [{"name": "server", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
            })
    return pods


def _kind(method: str, path: str) -> str | None:
    if method in ("GET", "HEAD"):
        return None
    if "/events" in path:
        return "event"
    if path.endswith("/scale"):
        return "scale"
    if "/deployments/" in path and method == "PATCH":
        return "status"
    return "other"


async def run(args: argparse.Namespace, apiserver) -> dict[str, float]:
    async with FaultProxy(apiserver.url, ca_file=apiserver.ca_file) as proxy, \
            ApiClient(proxy.client_configuration(apiserver.token)) as api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        models = [(f"bench-{m % NAMESPACES}", f"model-{m}") for m in range(args.models)]
        for n in sorted({ns for ns, _ in models}):
            await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}})
        for ns, name in models:
            await apps.create_namespaced_deployment(ns, _deployment(name))
        nodes = _nodes(len(models))
        replicas = {f"{ns}/{name}": REPLICAS for ns, name in models}
        rng = np.random.default_rng(args.seed)
        core_config = build_core(make_policy("slotwise"), report_every_decision=True, metric_lag_s=15.0)
        state, node_state = fresh_state(), NodeActionState()
        now = [time.time()]
        actuator = KubeActuator(api, ActuatorConfig(), clock=lambda: now[0])
        mean_rps = 0.7 * REPLICAS / SERVICE_TIME_S  # 70% busy at the current replicas: a steady state
        warmup = int(args.warmup_minutes * 60 / args.tick_s)
        ticks = int(args.minutes * 60 / args.tick_s)
        mark, decisions = 0, 0
        for tick in range(warmup + ticks):
            if tick == warmup:  # the fleet has found its size for the load: count from here
                mark, decisions = len(proxy.requests), 0
            now[0] += args.tick_s
            listed = await apps.list_deployment_for_all_namespaces()
            served = [api.sanitize_for_serialization(d) for d in listed.items
                      if d.metadata.namespace.startswith("bench-")]
            view = read_view(served, _pods(models, replicas), nodes, now=now[0])
            window = MetricsWindow(now[0], 15.0, {
                k: ModelMetrics(rate=(r := np.clip(rng.normal(mean_rps, args.noise * mean_rps, 60), 0.0, None)),
                                in_flight=r * SERVICE_TIME_S)
                for k, o in view.snapshot.models.items() if o.spec is not None})
            plan = plan_tick(view.snapshot, window, state, core_config, node_state)
            acted = [a for a in plan.actions if isinstance(a, ScaleModel | UpdateStatus | Shortfall)]
            decisions += sum(1 for a in acted if isinstance(a, UpdateStatus))
            report = await actuator.apply(Plan(plan.now, acted), view)
            for a in acted:
                if isinstance(a, ScaleModel) and any(line.startswith(f"scale {a.model}:") for line in report.applied):
                    replicas[a.model] = a.replicas
        counts = Counter(_kind(r.method, r.path) for r in proxy.requests[mark:])
        hours = ticks * args.tick_s / 3600.0
        per = args.models * hours
        return {"decisions": decisions / per, "status PATCHes": counts["status"] / per,
                "Event writes": counts["event"] / per, "scale writes": counts["scale"] / per,
                "other writes": counts["other"] / per, "requests (all)": (len(proxy.requests) - mark) / per}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--minutes", type=float, default=10.0, help="measured, of the fake clock")
    ap.add_argument("--warmup-minutes", type=float, default=5.0,
                    help="first, not counted: the fleet settles to the load (scale-downs wait out stabilization)")
    ap.add_argument("--tick-s", type=float, default=10.0)
    ap.add_argument("--noise", type=float, default=0.1, help="standard deviation of the load, share of the mean")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with running_kube_apiserver() as apiserver:
        got = asyncio.run(run(args, apiserver))
    print(f"{args.models} models, {args.minutes:g} min (after {args.warmup_minutes:g} min warm-up) at one "
          f"decision per {args.tick_s:g} s, steady load with {args.noise:.0%} noise")
    print(f"{'per model per hour':<28}{'count':>10}")
    for label, value in got.items():
        print(f"{label:<28}{value:>10.1f}")


if __name__ == "__main__":
    main()
