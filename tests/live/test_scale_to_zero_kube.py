"""Scale to and from zero, the controller's side (issue 18), against the real kube-apiserver (API level 1.20:
EndpointSlices at discovery.k8s.io/v1beta1).

- ``SetRouting`` writes the activator EndpointSlice of the model's Service with the contract's labels, ports and
  endpoints (the Ready activator pods), keeps its endpoints in step with those pods, and deletes it;
- a routing write that fails, or finds no Ready activator pod, blocks the scale to zero of the same model in the
  same tick (never drop traffic); the reconciles of slices in step read nothing and come after the scale writes;
- ``POST /v1/activations`` on the controller's HTTP port wakes the tick loop at once (well before the tick
  interval) and the held count reaches the metrics window as ``held_requests``; bad JSON is a 400, a report
  without the activator's token a 401 (the token checks: test_activation_auth_kube.py); reports during a cold
  start do not storm the tick.

The activation book and the slice texts are also checked pure, without the apiserver.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from realparts.faultproxy import FaultProxy

from autoscaler.api.plan import Plan, Reason, ScaleModel, SetRouting
from autoscaler.live.activations import ActivationBook, ActivationError
from autoscaler.live.controller import Controller, ControllerSettings
from autoscaler.live.kube.actuator import ActuatorConfig, KubeActuator
from autoscaler.live.kube.routing import activator_endpoints, activator_slice, slice_current, slice_name, via_activator
from autoscaler.live.kube.watches import ENDPOINT_SLICE_WATCH

pytest_plugins = ("realparts.kube",)

ACTIVATOR_LABELS = {"app.kubernetes.io/name": "slotwise", "app.kubernetes.io/component": "activator"}


# -- pure -------------------------------------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _report(activator: str, held: int, model: str = "chat", ns: str = "ml") -> dict:
    return {"activator": activator, "models": [{"namespace": ns, "service": model, "model": model, "held": held,
                                                "oldest_wait_s": 0.5}]}


def test_the_book_sums_activators_and_forgets_a_silent_one() -> None:
    clock = Clock()
    book = ActivationBook(ttl_s=5.0, clock=clock)
    book.report(_report("a-1", 3))
    book.report(_report("a-2", 2))
    assert book.held() == {"ml/chat": 5.0}
    book.report(_report("a-1", 1))  # a newer report replaces the activator's earlier one
    assert book.held() == {"ml/chat": 3.0}
    clock.t += 4.0
    book.report(_report("a-2", 2))
    clock.t += 2.0  # a-1 silent for 6 s: expired; a-2 reported 2 s ago
    assert book.held() == {"ml/chat": 2.0}
    book.report({"activator": "a-2", "models": []})  # holds nothing any more
    assert book.held() == {}


def test_the_book_wakes_for_a_model_without_an_active_replica_or_new_to_it() -> None:
    clock = Clock()
    book = ActivationBook(clock=clock)
    book.active = lambda model: model == "ml/warm"
    assert book.report(_report("a", 4, "warm"))  # new to the book: wakes (the view may not know it yet)
    book.wake.clear()
    clock.t += 2.0
    assert not book.report(_report("a", 5, "warm"))  # known, with an active replica: nothing a tick could do
    assert not book.report(_report("b", 1, "warm"))  # another activator, same model: still known
    assert not book.wake.is_set()
    assert not book.report(_report("a", 0, "cold"))  # nothing held: nothing to wake for
    assert book.report(_report("a", 1, "cold"))
    assert book.wake.is_set()


def test_reports_during_a_cold_start_do_not_storm_the_tick() -> None:
    """A model whose replica is starting (placed, not Ready) for minutes: every activator reports every second;
    only the first report wakes. A model at zero (no active replica) wakes at most once per second however many
    reports come."""
    clock = Clock()
    book = ActivationBook(clock=clock)
    starting = {"ml/chat"}
    book.active = lambda model: model in starting
    wakes = 0
    for _ in range(120):  # two minutes of a cold start, three activators
        for a in ("a-1", "a-2", "a-3"):
            wakes += book.report(_report(a, 7, "chat"))
        clock.t += 1.0
    assert wakes == 1  # the first report (a model new to the book); none while its replica starts
    starting.clear()  # at zero: every report asks for a scale from zero, the limit keeps it to one wake a second
    woke_at = []
    for _ in range(40):
        for a in ("a-1", "a-2", "a-3"):
            if book.report(_report(a, 7, "chat")):
                woke_at.append(clock.t)
        clock.t += 0.25
    assert 10 <= len(woke_at) <= 10 + 1, woke_at
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(woke_at)), woke_at


@pytest.mark.parametrize("body", [[], {"models": []}, {"activator": "a", "models": {}},
                                  {"activator": "a", "models": [{"namespace": "ml", "held": 1}]},
                                  {"activator": "a", "models": [{"namespace": "ml", "model": "m", "held": -1}]},
                                  {"activator": "a", "models": [{"namespace": "ml", "model": "m", "held": True}]}])
def test_a_report_that_is_not_the_contract_is_refused(body: Any) -> None:
    book = ActivationBook(clock=Clock())
    with pytest.raises(ActivationError):
        book.report(body)
    assert book.held() == {} and not book.wake.is_set()


def _pod(name: str, ip: str, ready: bool = True, deleting: bool = False) -> dict:
    meta: dict[str, Any] = {"name": name, "namespace": "slotwise", "labels": ACTIVATOR_LABELS}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": "n1"},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_only_ready_activator_pods_are_endpoints_and_a_change_is_seen() -> None:
    pods = [_pod("b", "10.0.0.2"), _pod("a", "10.0.0.1"), _pod("c", "10.0.0.3", ready=False),
            _pod("d", "10.0.0.4", deleting=True)]
    eps = activator_endpoints(pods)
    assert [e.ip for e in eps] == ["10.0.0.1", "10.0.0.2"]
    ports = [{"name": "http", "protocol": "TCP", "port": 8012}]
    s1 = activator_slice("ml", "chat", "chat", ports, eps)
    assert slice_current(s1, activator_slice("ml", "chat", "chat", ports, tuple(reversed(eps))))
    assert not slice_current(s1, activator_slice("ml", "chat", "chat", ports, eps[:1]))
    assert via_activator([s1], "ml", "chat") is True
    assert via_activator([activator_slice("ml", "chat", "chat", ports, ())], "ml", "chat") is False
    assert via_activator([s1], "ml", None) is None
    assert via_activator([s1], "other", "chat") is False


# -- against the apiserver --------------------------------------------------------------------------------------

@pytest_asyncio.fixture
async def ns(api: ApiClient) -> str:
    name = f"stz-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    await core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    return name


async def _model(api: ApiClient, ns: str, replicas: int = 1) -> None:
    """A Deployment annotated for scale to zero, fronted by Service ``chat`` with two named ports."""
    labels = {"app": "chat"}
    await client.AppsV1Api(api).create_namespaced_deployment(ns, {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "chat", "annotations": {"slotwise.io/min-replicas": "0",
                                                     "slotwise.io/service": "chat",
                                                     "slotwise.io/slo-latency-ms": "1000"}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                     {"name": "vllm", "image": "registry.invalid/vllm:test"}]}}}})
    await client.CoreV1Api(api).create_namespaced_service(ns, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat"},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": 8000},
                                               {"name": "metrics", "port": 9000, "targetPort": 9000}]}})


async def _activator_pod(api: ApiClient, ns: str, name: str, ip: str, service_account: str | None = None) -> None:
    core = client.CoreV1Api(api)
    spec: dict[str, Any] = {"automountServiceAccountToken": False,
                            "containers": [{"name": "activator", "image": "registry.invalid/slotwise:test"}]}
    if service_account:
        await core.create_namespaced_service_account(ns, {"metadata": {"name": service_account}})
        spec["serviceAccountName"] = service_account
    await core.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": ACTIVATOR_LABELS}, "spec": spec})
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    await core.patch_namespaced_pod_status(name, ns, {"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": stamp}]}})


async def _token(api: ApiClient, ns: str, pod: str) -> str:
    """The pod's projected-style token (TokenRequest bound to it, the activation audience)."""
    got = await client.CoreV1Api(api).read_namespaced_pod(pod, ns)
    req = await client.CoreV1Api(api).create_namespaced_service_account_token(
        got.spec.service_account_name, ns, {"spec": {"audiences": ["slotwise.io/activations"],
                                                     "boundObjectRef": {"kind": "Pod", "apiVersion": "v1",
                                                                        "name": pod, "uid": got.metadata.uid}}})
    return req.status.token


async def _pods(api: ApiClient, ns: str) -> list[dict]:
    got = await client.CoreV1Api(api).list_namespaced_pod(ns, label_selector="app.kubernetes.io/component=activator")
    return [api.sanitize_for_serialization(p) for p in got.items]


async def _slice(api: ApiClient, ns: str, version: str, family: str = "IPv4") -> dict | None:
    try:
        return await client.CustomObjectsApi(api).get_namespaced_custom_object(
            "discovery.k8s.io", version, ns, "endpointslices", slice_name("chat", family))
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


async def _controller(api: ApiClient, ns: str, **kw: Any) -> Controller:
    settings = ControllerSettings(namespace=ns, lease_namespace=ns, activator_enabled=True, http_port=0,
                                  identity=f"c-{uuid.uuid4().hex[:6]}", **kw)
    ctl = Controller(api, settings)
    await ctl.discover()
    return ctl


async def _sync(ctl: Controller) -> list[asyncio.Task]:
    tasks = [asyncio.create_task(i.run()) for i in ctl.informers]
    for _ in range(200):
        if all(i.synced for i in ctl.informers):
            return tasks
        await asyncio.sleep(0.05)
    raise AssertionError("informers not synced")


async def _stop(tasks: list[asyncio.Task]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _eventually(check: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_set_routing_writes_the_contract_slice_follows_the_activator_and_deletes_it(api: ApiClient,
                                                                                          ns: str) -> None:
    await _model(api, ns)
    await _activator_pod(api, ns, "activator-a", "10.1.0.1")
    ctl = await _controller(api, ns)
    version = ENDPOINT_SLICE_WATCH.version(ctl.apis)
    assert version == "v1beta1"  # the fixture's API level is 1.20
    tasks = await _sync(ctl)
    try:
        view = ctl.view()
        assert view.models[f"{ns}/chat"].service == "chat"
        assert view.snapshot.models[f"{ns}/chat"].via_activator is False  # no slice yet
        plan = Plan(now=view.snapshot.now, actions=[SetRouting(f"{ns}/chat", True, "test")])
        report = await ctl.actuator.apply(plan, view)
        assert not report.errors, report.errors
        got = await _slice(api, ns, version)
        assert got is not None
        assert got["metadata"]["labels"] == {"kubernetes.io/service-name": "chat",
                                             "endpointslice.kubernetes.io/managed-by": "slotwise.io",
                                             "slotwise.io/model": "chat"}
        # every Service port goes to the activator, each at its own port (the listener a request arrives on says
        # which Service port it came through)
        assert [(p["name"], p["port"]) for p in got["ports"]] == [("http", 8012), ("metrics", 8013)]
        assert got["addressType"] == "IPv4"  # a single-stack Service: no IPv6 slice
        assert await _slice(api, ns, version, "IPv6") is None
        assert [e["addresses"] for e in got["endpoints"]] == [["10.1.0.1"]]
        await _eventually(lambda: ctl.view().snapshot.models[f"{ns}/chat"].via_activator is True)

        # a second activator pod becomes Ready: the next tick's reconcile adds it, without a SetRouting planned
        await _activator_pod(api, ns, "activator-b", "10.1.0.2")
        await _eventually(lambda: len(activator_endpoints(ctl.activator_pods.items())) == 2)
        order: list[str] = []

        async def seen(what: str, _key: str) -> None:
            order.append(what)

        ctl.actuator.before_write = seen
        # the tick's scale writes come first, the reconciles after them
        plan = Plan(now=time.time(), actions=[ScaleModel(f"{ns}/chat", 2, previous=1, reason=Reason.ACTIVATED)])
        report = await ctl.actuator.apply(plan, ctl.view())
        ctl.actuator.before_write = None
        assert any("EndpointSlice updated" in line for line in report.applied), report
        assert order == ["scale", "routing"], order
        got = await _slice(api, ns, version)
        assert sorted(e["addresses"][0] for e in got["endpoints"]) == ["10.1.0.1", "10.1.0.2"]
        await _eventually(lambda: len(ctl.watched[ENDPOINT_SLICE_WATCH].items()[0]["endpoints"]) == 2)
        reads = ctl.actuator.routing.reads
        again = await ctl.actuator.apply(Plan(now=time.time()), ctl.view())
        assert not again.applied and not again.errors  # in step: nothing written ...
        assert ctl.actuator.routing.reads == reads  # ... and nothing read: the informers' copies said so

        plan = Plan(now=time.time(), actions=[SetRouting(f"{ns}/chat", False, "test")])
        report = await ctl.actuator.apply(plan, ctl.view())
        assert not report.errors, report.errors
        assert await _slice(api, ns, version) is None
        await _eventually(lambda: ctl.view().snapshot.models[f"{ns}/chat"].via_activator is False)
    finally:
        await _stop(tasks)


@pytest_asyncio.fixture
async def proxy(kube_apiserver: Any) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(kube_apiserver.url, ca_file=kube_apiserver.ca_file) as p:
        yield p


async def _scale_of(api: ApiClient, ns: str) -> int:
    got = await client.AppsV1Api(api).read_namespaced_deployment_scale("chat", ns)
    return int(got.spec.replicas or 0)


@pytest.mark.asyncio
async def test_a_failed_routing_write_blocks_the_scale_to_zero(api: ApiClient, ns: str, proxy: FaultProxy,
                                                               kube_apiserver: Any) -> None:
    await _model(api, ns, replicas=1)
    await _activator_pod(api, ns, "activator-a", "10.1.0.1")
    ctl = await _controller(api, ns)
    tasks = await _sync(ctl)
    try:
        view = ctl.view()
        async with ApiClient(proxy.client_configuration(kube_apiserver.token)) as proxied:
            actuator = KubeActuator(proxied, ActuatorConfig())
            actuator.activator_pods = ctl.activator_pods.items
            actuator.slice_api_version = f"discovery.k8s.io/{ENDPOINT_SLICE_WATCH.version(ctl.apis)}"
            # the EndpointSlice write is held unanswered, then answered 503 (a broken apiserver connection)
            proxy.black_hole(lambda seen: seen.method in ("POST", "PUT") and "endpointslices" in seen.path)
            plan = Plan(now=view.snapshot.now, actions=[
                SetRouting(f"{ns}/chat", True, "test"),
                ScaleModel(f"{ns}/chat", 0, previous=1, reason=Reason.SCALED_TO_ZERO)])
            applying = asyncio.create_task(actuator.apply(plan, view))
            await _eventually(lambda: any(r.fault == "black-hole" for r in proxy.requests))
            proxy.clear_rules()
            report = await applying
        assert len(report.errors) == 1 and "503" in report.errors[0], report
        assert [why for _, why in report.skipped] == ["routing-failed"], report
        assert await _scale_of(api, ns) == 1  # the traffic still has its pod: not scaled to zero
        assert not [r for r in proxy.requests if "/scale" in r.path and r.method == "PUT"]
    finally:
        await _stop(tasks)


@pytest.mark.asyncio
async def test_no_ready_activator_pod_is_a_failed_routing_write_and_blocks_the_scale_to_zero(api: ApiClient,
                                                                                             ns: str) -> None:
    await _model(api, ns, replicas=1)
    ctl = await _controller(api, ns)  # the activator is enabled, but none of its pods is there
    tasks = await _sync(ctl)
    try:
        view = ctl.view()
        plan = Plan(now=view.snapshot.now, actions=[
            SetRouting(f"{ns}/chat", True, "to zero"),
            ScaleModel(f"{ns}/chat", 0, previous=1, reason=Reason.SCALED_TO_ZERO)])
        report = await ctl.actuator.apply(plan, view)
        assert len(report.errors) == 1 and "no Ready activator pod" in report.errors[0], report
        assert [why for _, why in report.skipped] == ["routing-failed"], report
        assert await _scale_of(api, ns) == 1  # its traffic keeps its pod
        assert await _slice(api, ns, ENDPOINT_SLICE_WATCH.version(ctl.apis)) is None  # no empty slice written
    finally:
        await _stop(tasks)


@pytest.mark.asyncio
async def test_a_scale_to_zero_ticks_after_the_routing_waits_when_its_activators_are_gone(api: ApiClient,
                                                                                         ns: str) -> None:
    """The rail's real sequence: one tick routes (SetRouting, one replica kept), a later one scales to 0 alone.
    The activator pods of the first tick die in between: the scale to 0 must not be written (the slice still
    names their IPs; at zero the model's requests would go nowhere). Once an activator is Ready again it is."""
    await _model(api, ns, replicas=1)
    await _activator_pod(api, ns, "activator-a", "10.1.0.1")
    ctl = await _controller(api, ns)
    version = ENDPOINT_SLICE_WATCH.version(ctl.apis)
    tasks = await _sync(ctl)
    try:
        report = await ctl.actuator.apply(Plan(now=time.time(), actions=[SetRouting(f"{ns}/chat", True, "t")]),
                                          ctl.view())
        assert not report.errors, report
        await _eventually(lambda: ctl.view().snapshot.models[f"{ns}/chat"].via_activator is True)
        await client.CoreV1Api(api).delete_namespaced_pod("activator-a", ns, grace_period_seconds=0)
        await _eventually(lambda: not activator_endpoints(ctl.activator_pods.items()))
        zero = Plan(now=time.time(), actions=[ScaleModel(f"{ns}/chat", 0, previous=1,
                                                         reason=Reason.SCALED_TO_ZERO)])
        report = await ctl.actuator.apply(zero, ctl.view())
        assert len(report.errors) == 1 and "no Ready activator pod" in report.errors[0], report
        assert [why for _, why in report.skipped] == ["routing-failed"], report
        assert await _scale_of(api, ns) == 1  # its traffic keeps its pod

        await _activator_pod(api, ns, "activator-b", "10.1.0.2")
        await _eventually(lambda: len(activator_endpoints(ctl.activator_pods.items())) == 1)
        report = await ctl.actuator.apply(dataclasses.replace(zero, now=time.time()), ctl.view())
        assert not report.errors, report
        assert [e["addresses"] for e in (await _slice(api, ns, version))["endpoints"]] == [["10.1.0.2"]]
        assert await _scale_of(api, ns) == 0
    finally:
        await _stop(tasks)


@pytest.mark.asyncio
async def test_an_activation_report_wakes_the_tick_at_once(api: ApiClient, ns: str) -> None:
    from realparts.prometheus import free_port

    await _model(api, ns, replicas=0)
    port = free_port()
    # a long tick: a report must not wait for it; a dry run takes no Lease, so this replica ticks
    ctl = Controller(api, ControllerSettings(namespace=ns, lease_namespace=ns, activator_enabled=True,
                                             tick_s=60.0, http_host="127.0.0.1", http_port=port,
                                             actuator=ActuatorConfig(dry_run=True)))
    stop = asyncio.Event()
    run = asyncio.create_task(ctl.run(stop))
    try:
        await _eventually(lambda: ctl.ticks >= 1, timeout_s=30.0)
        await asyncio.sleep(0.3)  # the loop is asleep until the next tick, 60 s away
        ticks = ctl.ticks
        url = f"http://127.0.0.1:{port}/v1/activations"
        async with aiohttp.ClientSession() as http:
            # only the activator's ServiceAccount token is taken (tests/live/test_activation_auth_kube.py): none
            # sent, even from an activator pod's IP
            await _activator_pod(api, ns, "activator-a", "127.0.0.1", service_account="slotwise-activator")
            await _eventually(lambda: any((p.get("status") or {}).get("podIP") == "127.0.0.1"
                                          for p in ctl.activator_pods.items()))
            async with http.post(url, json=_report("activator-a", 2, "chat", ns)) as refused:
                assert refused.status == 401 and "no bearer token" in await refused.text()
            assert ctl.activations.held() == {}
            auth = {"Authorization": "Bearer " + await _token(api, ns, "activator-a")}
            async with http.post(url, data=b"{not json", headers=auth) as bad:
                assert bad.status == 400 and "not JSON" in await bad.text()
            async with http.post(url, json={"activator": "x", "models": [{"namespace": ns}]}, headers=auth) as bad:
                assert bad.status == 400 and "models[0]" in await bad.text()
            assert ctl.ticks == ticks  # a refused report woke nothing
            sent = time.monotonic()
            async with http.post(url, json=_report("activator-a", 2, "chat", ns), headers=auth) as ok:
                assert ok.status == 202
                assert await ok.json() == {"leader": True}
            await _eventually(lambda: ctl.ticks > ticks, timeout_s=5.0)
            woke_after = time.monotonic() - sent
        assert woke_after < 3.0, woke_after  # not the 60 s tick
        window = await ctl.metrics_window(ctl.view())
        held = window.models[f"{ns}/chat"]
        assert held.held_requests == 2.0 and held.stale  # no metric source: stale, but it carries the held count
    finally:
        stop.set()
        await asyncio.wait_for(run, 30.0)


# -- pure: issue 30 (every port, both families, who may report) -------------------------------------------------

def test_slice_ports_are_every_tcp_port_each_at_its_own_activator_port() -> None:
    from autoscaler.live.kube.routing import ACTIVATOR_PORT_COUNT, slice_ports

    svc = {"spec": {"ports": [{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"},
                              {"name": "grpc", "port": 9000, "protocol": "TCP"}]}}
    assert [(p["name"], p["port"]) for p in slice_ports(svc)] == [("http", 8012), ("grpc", 8013)]
    many = {"spec": {"ports": [{"name": f"p{i}", "port": 1000 + i} for i in range(40)]}}
    assert [p["port"] for p in slice_ports(many)] == list(range(8012, 8012 + ACTIVATOR_PORT_COUNT))
    assert slice_ports(None) == [{"name": "", "protocol": "TCP", "port": 8012}]


def test_service_families_and_one_slice_per_family() -> None:
    from autoscaler.live.kube.routing import ActivatorEndpoint, service_families

    assert service_families({"spec": {"ipFamilies": ["IPv6", "IPv4"]}}) == ("IPv6", "IPv4")
    assert service_families({"spec": {"clusterIPs": ["fd00::10"]}}) == ("IPv6",)
    assert service_families({"spec": {"clusterIP": "None"}}) == ("IPv4",)
    e = ActivatorEndpoint("10.0.0.1", "a", "ns", None, ("10.0.0.1", "fd00::1"))
    v6 = activator_slice("ns", "chat", "chat", [], [e], family="IPv6")
    assert (v6["metadata"]["name"], v6["addressType"], v6["endpoints"][0]["addresses"]) == (
        "chat-slotwise-activator-ipv6", "IPv6", ["fd00::1"])
    only_v4 = ActivatorEndpoint("10.0.0.2", "b", "ns")
    assert activator_slice("ns", "chat", "chat", [], [only_v4], family="IPv6")["endpoints"] == []
    assert via_activator([v6], "ns", "chat") is True


def test_judge_takes_the_service_account_and_its_pod_not_an_address() -> None:
    from autoscaler.live.activations import Reviewed, bearer_token, judge

    pods = [{"metadata": {"name": "act-0", "uid": "u0"}, "status": {"podIP": "10.0.0.5"}}]
    user = "system:serviceaccount:sw:slotwise-activator"

    def j(r: Reviewed, peer: str = "127.0.0.6") -> Any:
        got = judge(r, user=user, audience="slotwise.io/activations", pods=pods, peer=peer,
                    peer_ips=lambda p: [p["status"]["podIP"]])
        return None if got is None else (got.status, got.reason)

    ok = Reviewed(True, user, ("slotwise.io/activations",), "act-0", "u0")
    assert j(ok) is None  # from any address (a sidecar, SNAT)
    assert j(Reviewed(False, error="expired")) == (401, "invalid-token")
    assert j(dataclasses.replace(ok, audiences=("https://kubernetes.default.svc",))) == (401, "invalid-token")
    assert j(dataclasses.replace(ok, user="system:serviceaccount:sw:default")) == (403, "wrong-service-account")
    assert j(dataclasses.replace(ok, pod="act-9")) == (403, "not-an-activator-pod")
    assert j(dataclasses.replace(ok, pod_uid="u-recreated")) == (403, "not-an-activator-pod")
    unbound = dataclasses.replace(ok, pod=None, pod_uid=None)  # a legacy Secret's token: the address is checked
    assert j(unbound) == (403, "not-an-activator-pod") and j(unbound, "::ffff:10.0.0.5") is None
    assert bearer_token("Bearer abc") == "abc" and bearer_token("Basic abc") is None and bearer_token(None) is None
