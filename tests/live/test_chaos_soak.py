"""Chaos soak (issue 30): the controller against the REAL kube-apiserver through the fault proxy, with randomized
faults, while a scripted model-server load runs; the guarantees of docs/kubernetes.md "What slotwise guarantees"
asserted on every write the apiserver saw.

Each seed plays rounds of ~2 s, each round one fault drawn by the seed: latency, 429/500/503 answers, timeouts (a
black-holed apiserver), dropped watches, paused watches, lease loss (the controller's renewals black-holed until a
second elector takes the Lease, which then steps down), partial scrapes (a model's window flagged partial, its rate
halved: what a target that stops answering looks like), a GPU node NotReady, another writer scaling a model's
Deployment, and a load change. The controller runs its own loop (``Controller.run``) with a 1 s tick and a 2 s
scale-down window, so scale-downs do happen inside the soak.

What is asserted, over the whole soak:

- **no decrease from a different starting point**: every scale write that lowers a workload's replicas (compared with
  the value at the resourceVersion the write names, from a watch on the Deployments) was planned from that value
  (the plan of the tick that wrote it read the same ``spec.replicas``);
- **no write after deposition**: no write of the controller (anything but a GET or the Lease) lands while the other
  elector holds the Lease;
- **no eviction from an earlier term**: every eviction lands in the term that planned it (the tick's plan holds a
  reclaim of the evicted pod's node and was made after the controller last acquired); this soak lends nothing, so
  any eviction at all is a failure of this check;
- **no model left without its floor**: no Deployment's ``spec.replicas`` goes below the model's ``min-replicas``, in
  any version the watch saw.

Seeds: ``SLOTWISE_CHAOS_SEEDS`` (``"7"``, ``"1,5"``, ``"1-20"``; default ``1,2``, about a minute each), each printed
with the failure. ``SLOTWISE_CHAOS_ROUNDS`` sets the rounds per seed (default 30).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.rest import ApiException
from realparts.clusterplay import ClusterPlay, create_gpu_node
from realparts.faultproxy import FaultProxy, SeenRequest
from realparts.scripted import ScriptedLoad
from realparts.scripted import deployment as _deployment

from autoscaler.api.plan import Plan, ScaleModel
from autoscaler.api.snapshot import MetricsWindow, ModelMetrics
from autoscaler.api.spec import ModelSpec
from autoscaler.live.controller import Controller, ControllerSettings
from autoscaler.live.kube.client import TimeoutApiClient, request_timeout_for
from autoscaler.live.kube.leader import LeaderElector
from autoscaler.live.kube.objects import ClusterView

pytest_plugins = ("realparts.kube",)

LEASE_S, RENEW_S, RETRY_S = 4.0, 3.0, 0.5
ROUND_S = 2.0
FLOORS = {"m0": 1, "m1": 2, "m2": 1, "m3": 0}  # each model's min-replicas (m3 may go to zero)
FAULTS = ("latency", "errors", "timeouts", "drop-watches", "pause-watches", "lease-loss", "partial", "notready",
          "other-writer", "load")


def _seeds() -> list[int]:
    raw = os.environ.get("SLOTWISE_CHAOS_SEEDS", "1,2")
    out: list[int] = []
    for part in raw.split(","):
        lo, _, hi = part.strip().partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _lease(r: SeenRequest) -> bool:
    return "/leases" in r.path


def _write(r: SeenRequest) -> bool:
    return r.method not in ("GET", "HEAD") and not _lease(r)


class ChaosLoad(ScriptedLoad):
    """The scripted load, with some models' windows partial (their rate halved, as when half the targets stop
    answering and their series leave the sums)."""

    def __init__(self, rates: Mapping[str, float], **kw: object) -> None:
        super().__init__(rates, **kw)  # type: ignore[arg-type]
        self.partial: set[str] = set()

    async def window(self, now: float, models: Mapping[str, ModelSpec]) -> MetricsWindow:
        got = await super().window(now, models)
        out = dict(got.models)
        for key in self.partial & set(out):
            m = out[key]
            out[key] = ModelMetrics(rate=m.rate * 0.5, in_flight=m.in_flight * 0.5,
                                    partial="1 of 2 scrape targets not answering (up == 0)")
        return MetricsWindow(now=got.now, step_s=got.step_s, models=out)


@dataclass
class Planned:
    at: float
    term: int | None
    replicas: dict[str, int]  # model key -> the spec.replicas the view read
    plan: Plan


class RecordingController(Controller):
    """The controller as shipped, recording what each tick planned from (the test's window on its decisions)."""

    planned: list[Planned]

    def plan(self, view: ClusterView, window: MetricsWindow) -> Plan:
        plan = super().plan(view, window)
        self.planned.append(Planned(time.time(), self.gate.term(), {k: m.replicas for k, m in view.models.items()},
                                    plan))
        return plan


@dataclass
class History:
    """Every version of the namespace's Deployments the watch saw: (resourceVersion, name) -> spec.replicas."""

    at_version: dict[tuple[str, str], int] = field(default_factory=dict)
    versions: list[tuple[float, str, int]] = field(default_factory=list)  # (wall time, name, replicas)


async def _record(api: client.ApiClient, ns: str, history: History) -> None:
    apps = client.AppsV1Api(api)
    rv = ""
    while True:
        try:
            listed = await apps.list_namespaced_deployment(ns)
            for d in listed.items:
                _seen(history, d.metadata.name, d.metadata.resource_version, d.spec.replicas)
            rv = rv or listed.metadata.resource_version
            async with watch.Watch().stream(apps.list_namespaced_deployment, ns, resource_version=rv,
                                            timeout_seconds=60) as stream:
                async for event in stream:
                    d = event["object"]
                    rv = d.metadata.resource_version
                    _seen(history, d.metadata.name, rv, d.spec.replicas)
        except (TimeoutError, ApiException, OSError):
            rv = ""
            await asyncio.sleep(0.1)


def _seen(history: History, name: str, rv: str, replicas: int | None) -> None:
    value = int(replicas or 0)
    if (rv, name) not in history.at_version:
        history.at_version[(rv, name)] = value
        history.versions.append((time.time(), name, value))


@contextlib.asynccontextmanager
async def _tasks(*coros: object) -> AsyncIterator[list[asyncio.Task]]:
    tasks = [asyncio.create_task(c) for c in coros]  # type: ignore[arg-type]
    try:
        yield tasks
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _node_ready(api: client.ApiClient, name: str, ready: bool) -> None:
    core = client.CoreV1Api(api)
    node = await core.read_node_status(name)
    stamp = "2024-05-01T12:00:00Z"
    node.status.conditions = [{"type": "Ready", "status": "True" if ready else "False",
                               "reason": "KubeletReady" if ready else "KubeletNotReady",
                               "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}]
    await core.replace_node_status(name, node)


async def _play_loop(play: ClusterPlay) -> None:
    while True:
        with contextlib.suppress(TimeoutError, ApiException, OSError):
            await play.step()
        await asyncio.sleep(0.3)


@dataclass
class Leases:
    """The other elector's terms: (acquired, stepped down) wall times."""

    held: list[tuple[float, float]] = field(default_factory=list)
    since: float | None = None

    def change(self, leading: bool) -> None:
        if leading:
            self.since = time.time()
        elif self.since is not None:
            self.held.append((self.since, time.time()))
            self.since = None


async def _soak(kube, api: client.ApiClient, seed: int, rounds: int) -> list[str]:  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    suffix = uuid.uuid4().hex[:6]
    ns = f"chaos-{suffix}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    nodes = [f"{suffix}-l4-{i}" for i in range(2)]
    for name in nodes:
        await create_gpu_node(api, name, "NVIDIA-L4", 8, {"nvidia.com/gpu": "8", "cpu": "64", "memory": "256Gi",
                                                          "pods": "110"})
    apps = client.AppsV1Api(api)
    for model, floor in FLOORS.items():
        await apps.create_namespaced_deployment(ns, _deployment(model, {
            "slotwise.io/slo-latency-ms": "2000", "slotwise.io/service-time-ms": "100", "slotwise.io/concurrency": "1",
            "slotwise.io/min-replicas": str(floor), "slotwise.io/max-replicas": "6"},
            {"limits": {"nvidia.com/gpu": "1"}}, replicas=max(floor, 1)))
    play = ClusterPlay(api, ns, node_prefix=suffix)
    await play.ensure_service_account()
    history = History()
    leases = Leases()
    problems: list[str] = []
    keys = [f"{ns}/{m}" for m in FLOORS]
    load = ChaosLoad({k: rng.uniform(2.0, 30.0) for k in keys})
    settings = ControllerSettings(
        namespace=ns, lease_namespace=ns, lease_name="slotwise", identity="ctl-a", lease_duration_s=LEASE_S,
        renew_deadline_s=RENEW_S, retry_period_s=RETRY_S, tick_s=1.0, http_port=0,
        policy_knobs={"tick_s": 1.0, "scale_down_stabilization_s": 2.0, "stable_window_s": 5.0})
    try:
        async with FaultProxy(kube.url, ca_file=kube.ca_file) as proxy, \
                TimeoutApiClient(proxy.client_configuration(kube.token),
                                 request_timeout_s=request_timeout_for(LEASE_S, RENEW_S)) as through:
            ctl = RecordingController(through, settings, metrics_source=load)
            ctl.planned = []
            acquired: list[float] = []
            ctl.elector.on_change(lambda leading: acquired.append(time.time()) if leading else None)
            stop = asyncio.Event()
            async with _tasks(_record(api, ns, history), _play_loop(play), ctl.run(stop)):
                deadline = time.time() + 30
                while not ctl.elector.is_leader and time.time() < deadline:
                    await asyncio.sleep(0.2)
                assert ctl.elector.is_leader, f"seed {seed}: the controller never led"
                await asyncio.sleep(2.0)
                for _ in range(rounds):
                    if rng.random() < 0.5:  # the load moves under most faults: scale-ups and scale-downs happen
                        _new_load(rng, load, keys)
                    fault = rng.choice(FAULTS)
                    await _fault(fault, rng, proxy, api, ns, nodes, keys, load, leases, ctl)
                # clean: every fault lifted, a few ticks to settle
                proxy.clear_rules()
                proxy.resume_watches()
                load.partial.clear()
                for name in nodes:
                    await _node_ready(api, name, True)
                await asyncio.sleep(3 * settings.tick_s + LEASE_S)
                stop.set()
            writes = [w for w in proxy.requests if _write(w) and w.done_at is not None]
            problems += _check(seed, writes, history, ctl.planned, leases, acquired)
            scales = [w for w in writes if w.method == "PUT" and w.path.endswith("/scale")]
            down = sum(1 for w in scales if _decrease(w, history))
            moves = sum(1 for p in ctl.planned for a in p.plan.of_type(ScaleModel) if a.replicas != a.previous)
            print(f"seed {seed}: {moves} scale actions planned, {len(ctl.planned)} ticks planned, {len(writes)} writes "
                  f"({len(scales)} scale, {down} down), {len(leases.held)} lease losses, {len(acquired)} acquisitions, "
                  f"{sum(1 for r in proxy.requests if r.fault)} faulted requests")
    finally:
        for name in nodes:
            with contextlib.suppress(ApiException):
                await core.delete_node(name)
    return problems


async def _fault(fault: str, rng: random.Random, proxy: FaultProxy, api: client.ApiClient, ns: str,
                 nodes: list[str], keys: list[str], load: ChaosLoad, leases: Leases, ctl: Controller) -> None:
    if fault == "latency":
        proxy.delay(lambda r: not r.watch, rng.uniform(0.05, 0.6))
        await asyncio.sleep(ROUND_S)
        proxy.clear_rules()
    elif fault == "errors":
        status = rng.choice((429, 500, 503))
        headers = {"Retry-After": "1"} if status == 429 else None
        proxy.fail_next(rng.randint(1, 6), status, headers=headers)
        await asyncio.sleep(ROUND_S)
    elif fault == "timeouts":
        proxy.black_hole(lambda r: not r.watch and not _lease(r))
        await asyncio.sleep(rng.uniform(0.5, 2.0))
        proxy.clear_rules()
        await asyncio.sleep(ROUND_S / 2)
    elif fault == "drop-watches":
        proxy.cut_watches()
        await asyncio.sleep(ROUND_S)
    elif fault == "pause-watches":
        proxy.pause_watches()
        await asyncio.sleep(rng.uniform(1.0, 3.0))
        proxy.resume_watches()
        await asyncio.sleep(ROUND_S / 2)
    elif fault == "lease-loss":
        await _lease_loss(rng, proxy, api, ns, leases, ctl)
    elif fault == "partial":
        load.partial = set(rng.sample(keys, rng.randint(1, len(keys))))
        await asyncio.sleep(ROUND_S)
        load.partial.clear()
    elif fault == "notready":
        node = rng.choice(nodes)
        await _node_ready(api, node, False)
        await asyncio.sleep(ROUND_S)
        await _node_ready(api, node, True)
    elif fault == "other-writer":
        model = rng.choice(list(FLOORS))
        replicas = rng.randint(max(FLOORS[model], 1), 6)
        with contextlib.suppress(ApiException):
            await client.AppsV1Api(api).patch_namespaced_deployment_scale(model, ns, {"spec": {"replicas": replicas}})
        await asyncio.sleep(ROUND_S)
    elif fault == "load":
        _new_load(rng, load, keys)
        await asyncio.sleep(ROUND_S)


def _new_load(rng: random.Random, load: ChaosLoad, keys: list[str]) -> None:
    for k in keys:
        load.rates[k] = rng.choice((0.0, rng.uniform(0.5, 5.0), rng.uniform(5.0, 60.0)))


async def _lease_loss(rng: random.Random, proxy: FaultProxy, api: client.ApiClient, ns: str, leases: Leases,
                      ctl: Controller) -> None:
    """The controller's renewals never come back; another elector takes the Lease, holds it a while, steps down."""
    other = LeaderElector(api, ns, "slotwise", f"ctl-b-{uuid.uuid4().hex[:4]}", lease_duration_s=LEASE_S,
                          renew_deadline_s=RENEW_S, retry_period_s=RETRY_S)
    other.on_change(leases.change)
    proxy.black_hole(_lease)
    task = asyncio.create_task(other.run())
    try:
        deadline = time.time() + 3 * LEASE_S
        while not other.is_leader and time.time() < deadline:
            await asyncio.sleep(0.1)
        proxy.clear_rules()  # the controller's renewals go through again: it must wait for the Lease
        await asyncio.sleep(rng.uniform(0.5, 2.5))
    finally:
        task.cancel()  # steps down, releasing the Lease
        await asyncio.gather(task, return_exceptions=True)
    if leases.since is not None:
        leases.change(False)
    await asyncio.sleep(ROUND_S / 2)


def _decrease(w: SeenRequest, history: History) -> bool:
    body = json.loads(w.body or b"{}")
    current = history.at_version.get((body["metadata"].get("resourceVersion"), w.path.split("/")[-2]))
    return current is not None and int(body["spec"]["replicas"]) < current


def _check(seed: int, writes: list[SeenRequest], history: History, planned: list[Planned], leases: Leases,
           acquired: list[float]) -> list[str]:
    problems: list[str] = []
    say = problems.append
    for w in writes:
        landed = w.done_at or w.at
        for start, end in leases.held:
            if start <= landed <= end:
                say(f"seed {seed}: {w.method} {w.path} landed at +{landed - start:.2f} s into another's term")
        if w.path.endswith("/eviction"):
            say(f"seed {seed}: an eviction {w.path} in a soak that lends nothing (no term planned it)")
            continue
        if not (w.method == "PUT" and w.path.endswith("/scale")):
            continue
        body = json.loads(w.body or b"{}")
        name = w.path.split("/")[-2]
        wrote = int(body["spec"]["replicas"])
        rv = body["metadata"].get("resourceVersion")
        floor = FLOORS.get(name, 0)
        if wrote < floor:
            say(f"seed {seed}: scale {name} to {wrote}, below its floor {floor}")
        current = history.at_version.get((rv, name))
        if current is None or wrote >= current or w.status not in (200, 201):
            continue
        tick = max((p for p in planned if p.at <= w.at), key=lambda p: p.at, default=None)
        key = next((k for k in (tick.replicas if tick else {}) if k.endswith(f"/{name}")), None)
        started = None if tick is None or key is None else tick.replicas[key]
        if started != current:
            say(f"seed {seed}: scale {name} {current} -> {wrote} written, but the tick planned from {started}")
    for _, name, replicas in history.versions:
        if replicas < FLOORS.get(name, 0):
            say(f"seed {seed}: {name} at {replicas} replicas, below its floor {FLOORS[name]}")
    ups = [w for w in writes if w.method == "PUT" and w.path.endswith("/scale")]
    if not ups:
        say(f"seed {seed}: no scale write at all: the soak did not exercise the controller")
    return problems


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", _seeds())
async def test_chaos_soak_keeps_every_guarantee(kube_apiserver, api: client.ApiClient, seed: int) -> None:
    rounds = int(os.environ.get("SLOTWISE_CHAOS_ROUNDS", "30"))
    print(f"chaos soak seed {seed} ({rounds} rounds): SLOTWISE_CHAOS_SEEDS={seed} reproduces it")
    problems = await asyncio.wait_for(_soak(kube_apiserver, api, seed, rounds), timeout=240)
    assert not problems, f"chaos soak seed {seed} (SLOTWISE_CHAOS_SEEDS={seed}): " + "; ".join(problems[:10])


def test_the_soak_checks_fail_on_a_bad_write() -> None:
    """The checks themselves: each guarantee's violation, written by hand, is caught."""
    history = History({("7", "m1"): 3}, [(0.0, "m1", 3), (1.0, "m1", 1)])
    planned = [Planned(10.0, 1, {"ns/m1": 2}, Plan(now=10.0))]

    def put(replicas: int, at: float = 11.0) -> SeenRequest:
        body = json.dumps({"spec": {"replicas": replicas}, "metadata": {"resourceVersion": "7"}}).encode()
        return SeenRequest("PUT", "/apis/apps/v1/namespaces/ns/deployments/m1/scale", {}, 200, at=at, done_at=at,
                           body=body)

    problems = _check(0, [put(2)], history, planned, Leases(), [])
    assert any("planned from 2" in p for p in problems)  # a decrease from 3 planned from a view of 2
    assert any("below its floor" in p for p in problems)  # the version at 1 replica
    late = _check(0, [put(3, at=5.0)], History({("7", "m1"): 3}, []), planned, Leases([(4.0, 6.0)]), [])
    assert any("into another's term" in p for p in late)
    evict = SeenRequest("POST", "/api/v1/namespaces/ns/pods/t-0/eviction", {}, 201, at=1.0, done_at=1.0)
    assert any("eviction" in p for p in _check(0, [evict, put(3)], History({("7", "m1"): 3}, []), planned,
                                               Leases(), []))
    clean = _check(0, [put(3)], History({("7", "m1"): 3}, [(0.0, "m1", 3)]), planned, Leases(), [])
    assert clean == []
    assert np.isfinite(ROUND_S)
