"""Leadership faults against a REAL kube-apiserver, injected by the fault proxy (issue 16, failure modes 2 and 11).

- A leader whose Lease renewals are black-holed stops writing at its renew deadline: not one write reaches the
  apiserver after the follower has acquired, even in the middle of a tick with writes still to make.
- With the apiserver black-holed entirely, a tick ends (every request has a timeout; the write gate closes at the
  renew deadline) instead of hanging on a request that never comes back.
- A replica that regains the Lease after a gap plans as a fresh start: no scale-down before the stabilization
  window, whatever it remembered from its earlier term.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from realparts.clusterplay import ClusterPlay, create_gpu_node
from realparts.faultproxy import FaultProxy, SeenRequest
from realparts.scripted import ScriptedLoad
from realparts.scripted import deployment as _deployment

from autoscaler.api.plan import ScaleModel
from autoscaler.live.controller import Controller, ControllerSettings
from autoscaler.live.kube.client import TimeoutApiClient, request_timeout_for
from autoscaler.live.kube.informer import frozen_informers
from autoscaler.live.kube.leader import LeaderElector

pytest_plugins = ("realparts.kube",)
pytestmark = pytest.mark.asyncio

LEASE_S, RENEW_S, RETRY_S = 4.0, 3.0, 0.5
MODELS = 12  # each due model's first decision writes a status and an Event: two dozen writes in one tick


def _lease(r: SeenRequest) -> bool:
    return "/leases" in r.path


def _cluster_write(r: SeenRequest) -> bool:
    return r.method not in ("GET", "HEAD") and not _lease(r)


@pytest_asyncio.fixture
async def namespace(api: client.ApiClient) -> AsyncIterator[str]:
    ns = f"lead-{uuid.uuid4().hex[:6]}"
    await client.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": ns}})
    apps = client.AppsV1Api(api)
    for i in range(MODELS):
        await apps.create_namespaced_deployment(ns, _deployment(f"m{i}", {
            "slotwise.io/slo-latency-ms": "500", "slotwise.io/service-time-ms": "100",
            "slotwise.io/max-replicas": "4"}))
    yield ns


def _settings(ns: str, identity: str, **kw: object) -> ControllerSettings:
    return ControllerSettings(namespace=ns, lease_namespace=ns, lease_name="slotwise", identity=identity,
                              lease_duration_s=LEASE_S, renew_deadline_s=RENEW_S, retry_period_s=RETRY_S,
                              tick_s=1.0, http_port=0, **kw)


@contextlib.asynccontextmanager
async def _running(*tasks_of: object) -> AsyncIterator[list[asyncio.Task]]:
    tasks = [asyncio.create_task(c) for c in tasks_of]  # type: ignore[arg-type]
    try:
        yield tasks
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def _leader_through_proxy(kube, ns: str) -> AsyncIterator[tuple[Controller, FaultProxy]]:
    """Controller A, talking to the apiserver through a fault proxy, synced and leading."""
    async with FaultProxy(kube.url, ca_file=kube.ca_file) as proxy:
        timeout = request_timeout_for(LEASE_S, RENEW_S)
        async with TimeoutApiClient(proxy.client_configuration(kube.token), request_timeout_s=timeout) as api:
            rates = {f"{ns}/m{i}": 1.0 for i in range(MODELS)}
            ctl = Controller(api, _settings(ns, "ctl-a"), metrics_source=ScriptedLoad(rates))
            async with _running(*(i.run() for i in ctl.informers), ctl.elector.run()):
                for inf in ctl.informers:
                    assert await inf.wait_synced(20.0), inf.stats.last_error
                await asyncio.wait_for(ctl.elector.wait_leader(), 20)
                yield ctl, proxy


async def test_deposed_leader_writes_nothing_after_the_follower_acquires(kube_apiserver, namespace: str) -> None:
    ns = namespace
    async with _leader_through_proxy(kube_apiserver, ns) as (a, proxy), kube_apiserver.api_client() as direct:
        acquired: list[float] = []
        b = LeaderElector(direct, ns, "slotwise", "ctl-b", lease_duration_s=LEASE_S, renew_deadline_s=RENEW_S,
                          retry_period_s=RETRY_S)
        b.on_change(lambda leading: acquired.append(time.time()) if leading else None)
        async with _running(b.run()):
            armed = time.time()
            # A's renewals never come back, and each of its writes takes a while: the tick is still writing when
            # A's renew deadline passes and when B takes over
            proxy.black_hole(_lease)
            proxy.delay(_cluster_write, 0.4)
            await asyncio.wait_for(a.tick(), 60)
            deadline = time.time() + 3 * LEASE_S
            while not acquired and time.time() < deadline:
                await asyncio.sleep(0.1)
            assert acquired, "the follower never acquired the Lease"
            await asyncio.sleep(1.0)  # anything still in flight has landed
            writes = [w for w in proxy.writes(since=armed) if _cluster_write(w)]
            assert writes, "the tick wrote nothing at all: the test did not exercise a tick with writes"
            late = [f"{w.method} {w.path} at +{w.done_at - acquired[0]:.2f} s"
                    for w in writes if w.done_at is not None and w.done_at >= acquired[0]]
            assert late == [], f"{len(late)} write(s) after the follower acquired: {late[:5]}"
            assert not a.elector.is_leader


async def test_black_holed_apiserver_does_not_hang_a_tick(kube_apiserver, namespace: str) -> None:
    async with _leader_through_proxy(kube_apiserver, namespace) as (a, proxy):
        proxy.black_hole(lambda r: not r.watch)  # nothing comes back: no answer, no error
        # bounded by the renew deadline (the gate closes) plus one request timeout; without timeouts it never ends
        result = await asyncio.wait_for(a.tick(), 4 * LEASE_S)
        assert not a.elector.is_leader
        assert result.report is None or result.report.errors or result.report.applied == []


async def test_regained_lease_waits_the_stabilization_window_like_a_fresh_start(api: client.ApiClient) -> None:
    suffix = uuid.uuid4().hex[:6]
    ns = f"regain-{suffix}"
    await client.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": ns}})
    node = f"{suffix}-l4"
    await create_gpu_node(api, node, "NVIDIA-L4", 4, {"nvidia.com/gpu": "4", "cpu": "32", "memory": "128Gi",
                                                      "pods": "110"})
    try:
        await client.AppsV1Api(api).create_namespaced_deployment(ns, _deployment("chat", {
            "slotwise.io/slo-latency-ms": "500", "slotwise.io/service-time-ms": "100",
            "slotwise.io/max-replicas": "4"}, {"limits": {"nvidia.com/gpu": "1"}}, replicas=3))
        play = ClusterPlay(api, ns, node_prefix=suffix)
        await play.ensure_service_account()
        for _ in range(3):
            await play.step()
        now = [1_000_000.0]
        # 3 replicas serving a trickle: the policy wants 1, after its stabilization window
        ctl = Controller(api, _settings(ns, f"regain-{suffix}"), metrics_source=ScriptedLoad({f"{ns}/chat": 0.2}),
                         clock=lambda: now[0])
        async with _running(*(i.run() for i in ctl.informers)):
            for inf in ctl.informers:
                assert await inf.wait_synced(20.0), inf.stats.last_error
            await asyncio.sleep(0.5)

            def down(result) -> list[ScaleModel]:
                return [s for s in result.plan.of_type(ScaleModel) if s.replicas < s.previous]

            async with _running(ctl.elector.run()) as (_elector,):
                await asyncio.wait_for(ctl.elector.wait_leader(), 20)
                first = await ctl.tick()
                assert first.view.snapshot.models[f"{ns}/chat"].replicas, "no replicas seen"
                assert not down(first), first.plan.describe()  # a fresh start waits
            # term 1 ends (the Lease released); an hour later the same process leads again (term 2)
            assert not ctl.elector.is_leader
            now[0] += 3600.0
            async with _running(ctl.elector.run()):
                await asyncio.wait_for(ctl.elector.wait_leader(), 20)
                regained = await ctl.tick()
                assert not down(regained), (
                    "scaled down on the first tick of a new term: " + regained.plan.describe())
                # ... and it is the stabilization window, not a stuck hold: once it has passed, it scales down
                later = None
                for _ in range(40):
                    now[0] += 10.0
                    later = await ctl.tick()
                    if down(later):
                        break
                assert later is not None and down(later), later.plan.describe() if later else "no tick"
    finally:
        await client.CoreV1Api(api).delete_node(node)


async def test_a_frozen_cache_holds_every_decision(kube_apiserver, api: client.ApiClient, namespace: str) -> None:
    """Failure mode 3: watches paused and a Deployment scaled 1 -> 6 by someone else: the cache still says 1 and
    is still synced. The controller plans and writes nothing until the cache is confirmed again."""
    ns = namespace
    async with FaultProxy(kube_apiserver.url, ca_file=kube_apiserver.ca_file) as proxy, \
            TimeoutApiClient(proxy.client_configuration(kube_apiserver.token), request_timeout_s=5.0) as via:
        # heavy load on m0: an unfrozen tick plans (its scale, statuses, Events)
        ctl = Controller(via, _settings(ns, "ctl-frozen"), metrics_source=ScriptedLoad({f"{ns}/m0": 50.0}))
        for inf in (ctl.deployments, ctl.pods, ctl.nodes):  # a watch of 2 s: frozen after 3 s without contact
            inf.watch_timeout_s, inf.contact_grace_s = 2, 1.0
        async with _running(*(i.run() for i in ctl.informers), ctl.elector.run()):
            for inf in ctl.informers:
                assert await inf.wait_synced(20.0), inf.stats.last_error
            await asyncio.wait_for(ctl.elector.wait_leader(), 20)
            live = await ctl.tick()
            assert live.plan.actions, "the test needs a tick that plans something"
            proxy.pause_watches()
            await client.AppsV1Api(api).patch_namespaced_deployment_scale("m1", ns, {"spec": {"replicas": 6}})
            deadline = time.time() + 15
            while not any(i.frozen() for i in (ctl.deployments, ctl.pods)) and time.time() < deadline:
                await asyncio.sleep(0.2)
            assert ctl.deployments.get(f"{ns}/m1")["spec"]["replicas"] == 1  # the stale cache
            before = len(proxy.writes())
            held = await ctl.tick()
            assert held.plan.actions == [] and held.report is None, held.plan.describe()
            assert len(proxy.writes()) == before
            scale = await client.AppsV1Api(api).read_namespaced_deployment_scale("m1", ns)
            assert scale.spec.replicas == 6
            proxy.resume_watches()
            deadline = time.time() + 15
            while frozen_informers(ctl.informers) and time.time() < deadline:
                await asyncio.sleep(0.2)
            assert ctl.deployments.get(f"{ns}/m1")["spec"]["replicas"] == 6
            assert (await ctl.tick()).report is not None, "decisions resume once the cache is confirmed"
