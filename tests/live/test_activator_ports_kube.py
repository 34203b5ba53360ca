"""Every Service port and both IP families through the activator (issue 30), against the real kube-apiserver.

- A multi-port Service: the controller's activator slice lists every TCP port (the i-th at activator port
  8012 + i); the activator, fed by its EndpointSlice watch from the apiserver, listens per port and forwards a
  request to the backends' port of the same name -- held at zero, then released there.
- A dual-stack Service (``ipFamilies: [IPv4, IPv6]``; the 1.20 apiserver started with ``IPv6DualStack`` and a
  dual-stack service range): one activator slice per family, ``addressType`` IPv4 and IPv6, each with the activator
  pods' address of that family; no activator address of a family is a failed route; the unroute deletes both; and
  the activator forwards to an IPv6 backend (``[::1]``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient

from autoscaler.api.plan import Plan, SetRouting
from autoscaler.live.activator.metrics import ActivatorMetrics
from autoscaler.live.activator.proxy import Activator, new_session
from autoscaler.live.activator.routes import RouteTable
from autoscaler.live.activator.watch import SliceWatch
from autoscaler.live.controller import Controller, ControllerSettings
from autoscaler.live.kube.routing import activator_endpoints
from autoscaler.live.kube.watches import ENDPOINT_SLICE_WATCH

pytest_plugins = ("realparts.kube",)
pytestmark = pytest.mark.asyncio

ACTIVATOR_LABELS = {"app.kubernetes.io/name": "slotwise", "app.kubernetes.io/component": "activator"}
DUAL_STACK_FLAGS = ("--feature-gates=IPv6DualStack=true", "--service-cluster-ip-range=10.0.0.0/24,fd00:10::/108")


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


async def eventually(check: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def namespace(api: ApiClient) -> str:
    name = f"ports-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    await core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    return name


async def model(api: ApiClient, ns: str, service_spec: dict[str, Any]) -> None:
    labels = {"app": "chat"}
    await client.AppsV1Api(api).create_namespaced_deployment(ns, {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "chat", "annotations": {"slotwise.io/min-replicas": "0",
                                                     "slotwise.io/service": "chat",
                                                     "slotwise.io/slo-latency-ms": "1000"}},
        "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                     {"name": "vllm", "image": "registry.invalid/vllm:test"}]}}}})
    await client.CoreV1Api(api).create_namespaced_service(ns, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat"},
        "spec": {"selector": labels, **service_spec}})


async def activator_pod(api: ApiClient, ns: str, name: str, ips: list[str]) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": ACTIVATOR_LABELS},
        "spec": {"automountServiceAccountToken": False,
                 "containers": [{"name": "activator", "image": "registry.invalid/slotwise:test"}]}})
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    await core.patch_namespaced_pod_status(name, ns, {"status": {
        "phase": "Running", "podIP": ips[0], "podIPs": [{"ip": ip} for ip in ips],
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": stamp}]}})


async def started(api: ApiClient, ns: str) -> tuple[Controller, list[asyncio.Task]]:
    """A controller with the activator enabled, its informers synced (no Lease: the actuator is called directly)."""
    ctl = Controller(api, ControllerSettings(namespace=ns, lease_namespace=ns, activator_enabled=True, http_port=0,
                                             identity=f"c-{uuid.uuid4().hex[:6]}"))
    await ctl.discover()
    tasks = [asyncio.create_task(i.run()) for i in ctl.informers]
    await eventually(lambda: all(i.synced for i in ctl.informers))
    return ctl, tasks


async def stopped(tasks: list[asyncio.Task]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def slices(api: ApiClient, ns: str, version: str) -> dict[str, dict[str, Any]]:
    got = await client.CustomObjectsApi(api).list_namespaced_custom_object(
        "discovery.k8s.io", version, ns, "endpointslices",
        label_selector="endpointslice.kubernetes.io/managed-by=slotwise.io")
    return {s["metadata"]["name"]: s for s in got["items"]}


async def post_pod_slice(api: ApiClient, ns: str, version: str, name: str, family: str, address: str,
                         ports: list[tuple[str, int]]) -> None:
    """The Service's own slice as the endpointslice controller writes it (the bare apiserver has none)."""
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        "discovery.k8s.io", version, ns, "endpointslices", {
            "apiVersion": f"discovery.k8s.io/{version}", "kind": "EndpointSlice",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/service-name": "chat",
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
            "addressType": family,
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": n, "protocol": "TCP", "port": p} for n, p in ports]})


async def backend(host: str, answer: str) -> tuple[web.AppRunner, int]:
    """A model-server stand-in that answers which one it is."""
    async def any_path(_r: web.Request) -> web.Response:
        return web.Response(text=answer)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", any_path)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port(host)
    await web.TCPSite(runner, host, port).start()
    return runner, port


class ActivatorRig:
    """The activator in this loop: its RouteTable fed by SliceWatch from the apiserver, one listener per activator
    port (8012, 8013: served on free local ports)."""

    def __init__(self) -> None:
        self.runners: list[web.ServerRunner] = []
        self.tasks: list[asyncio.Task] = []
        self.urls: dict[int, str] = {}  # activator port -> local URL

    async def start(self, api: ApiClient, ns: str, version: str, session: aiohttp.ClientSession) -> None:
        self.activator = Activator(RouteTable(), ActivatorMetrics(), session, hold_timeout_s=20.0)
        self.watch = SliceWatch(api, self.activator.table, self.activator.on_change, version=version,
                                namespaces=[ns])
        self.tasks = [asyncio.create_task(i.run()) for i in self.watch.informers]
        await eventually(lambda: self.watch.synced)
        for slice_port in (8012, 8013):
            runner = web.ServerRunner(self.activator.proxy_server(slice_port))
            await runner.setup()
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self.runners.append(runner)
            self.urls[slice_port] = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        await stopped(self.tasks)
        for r in self.runners:
            await r.cleanup()


async def ask(http: aiohttp.ClientSession, url: str, ns: str) -> tuple[int, str]:
    async with http.get(url + "/v1/models", headers={"X-Slotwise-Model": f"{ns}/chat"},
                        timeout=aiohttp.ClientTimeout(total=30)) as r:
        return r.status, await r.text()


async def test_every_service_port_is_fronted_and_forwarded_to_its_own_backend_port(api: ApiClient) -> None:
    ns = await namespace(api)
    await model(api, ns, {"ports": [{"name": "http", "port": 80, "targetPort": 8000},
                                    {"name": "grpc", "port": 9000, "targetPort": 9000},
                                    {"name": "dns", "port": 53, "protocol": "UDP"}]})
    await activator_pod(api, ns, "activator-a", ["10.1.0.1"])
    ctl, tasks = await started(api, ns)
    version = ENDPOINT_SLICE_WATCH.version(ctl.apis)
    rig = ActivatorRig()
    backends = [await backend("127.0.0.1", "http-backend"), await backend("127.0.0.1", "grpc-backend")]
    try:
        report = await ctl.actuator.apply(Plan(now=time.time(), actions=[SetRouting(f"{ns}/chat", True, "t")]),
                                          ctl.view())
        assert not report.errors, report.errors
        ours = (await slices(api, ns, version))["chat-slotwise-activator"]
        # every TCP Service port, each at its own activator port; the UDP one is not HTTP: left to the pods
        assert [(p["name"], p["port"]) for p in ours["ports"]] == [("http", 8012), ("grpc", 8013)]

        async with new_session() as session, aiohttp.ClientSession() as http:
            await rig.start(api, ns, version, session)
            await eventually(lambda: rig.activator.table.by_key.get(f"{ns}/chat") is not None)
            # at zero: a request on the grpc port is held ...
            held = asyncio.create_task(ask(http, rig.urls[8013], ns))
            await eventually(lambda: len(rig.activator.queues.get(f"{ns}/chat") or ()) == 1)
            # ... until the pod is Ready in the Service's own slice: then forwarded to ITS port, not the first
            await post_pod_slice(api, ns, version, "chat-pods", "IPv4", "127.0.0.1",
                                 [("http", backends[0][1]), ("grpc", backends[1][1])])
            assert await asyncio.wait_for(held, 15) == (200, "grpc-backend")
            assert await ask(http, rig.urls[8012], ns) == (200, "http-backend")
    finally:
        await rig.stop()
        for runner, _ in backends:
            await runner.cleanup()
        await stopped(tasks)


@pytest.fixture(scope="module")
def dual_stack_apiserver() -> Iterator[Any]:
    """A second real kube-apiserver 1.20.2, dual-stack: IPv6DualStack on (alpha in 1.20) and an IPv4 + IPv6
    service range, so a Service may have ``ipFamilies: [IPv4, IPv6]``."""
    from realparts.kube import running_kube_apiserver

    with running_kube_apiserver(extra_args=DUAL_STACK_FLAGS) as server:
        yield server


@pytest_asyncio.fixture
async def dual_api(dual_stack_apiserver: Any) -> AsyncIterator[ApiClient]:
    async with dual_stack_apiserver.api_client() as api_client:
        yield api_client


async def test_a_dual_stack_service_gets_an_ipv4_and_an_ipv6_activator_slice(dual_api: ApiClient) -> None:
    api = dual_api
    ns = await namespace(api)
    await model(api, ns, {"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"],
                          "ports": [{"name": "http", "port": 80, "targetPort": 8000}]})
    svc = await client.CoreV1Api(api).read_namespaced_service("chat", ns)
    assert svc.spec.ip_families == ["IPv4", "IPv6"] and len(svc.spec.cluster_ips) == 2  # really dual-stack
    # an activator with an IPv4 address only: the IPv6 ClusterIP would lead nowhere at zero -- a failed route
    await activator_pod(api, ns, "activator-v4", ["10.1.0.7"])
    ctl, tasks = await started(api, ns)
    version = ENDPOINT_SLICE_WATCH.version(ctl.apis)
    rig = ActivatorRig()
    runner, port = await backend("::1", "ipv6-backend")
    try:
        plan = Plan(now=time.time(), actions=[SetRouting(f"{ns}/chat", True, "t")])
        report = await ctl.actuator.apply(plan, ctl.view())
        assert len(report.errors) == 1 and "IPv6 address" in report.errors[0], report
        assert "chat-slotwise-activator-ipv6" not in await slices(api, ns, version)

        await client.CoreV1Api(api).delete_namespaced_pod("activator-v4", ns, grace_period_seconds=0)
        await activator_pod(api, ns, "activator-a", ["10.1.0.1", "fd00:1::1"])
        await eventually(lambda: [e.pod for e in activator_endpoints(ctl.activator_pods.items())] == ["activator-a"])
        report = await ctl.actuator.apply(dataclass_now(plan), ctl.view())
        assert not report.errors, report.errors
        got = await slices(api, ns, version)
        assert {n: (s["addressType"], [e["addresses"] for e in s["endpoints"]]) for n, s in got.items()} == {
            "chat-slotwise-activator": ("IPv4", [["10.1.0.1"]]),
            "chat-slotwise-activator-ipv6": ("IPv6", [["fd00:1::1"]])}
        assert all([(p["name"], p["port"]) for p in s["ports"]] == [("http", 8012)] for s in got.values())
        await eventually(lambda: ctl.view().snapshot.models[f"{ns}/chat"].via_activator is True)
        # in step: the reconcile reads and writes nothing for either family
        reads = ctl.actuator.routing.reads
        again = await ctl.actuator.apply(Plan(now=time.time()), ctl.view())
        assert not again.applied and not again.errors and ctl.actuator.routing.reads == reads

        # the activator: the IPv6 pod slice is a backend like the IPv4 one ([::1])
        async with new_session() as session, aiohttp.ClientSession() as http:
            await rig.start(api, ns, version, session)
            await post_pod_slice(api, ns, version, "chat-pods-v6", "IPv6", "::1", [("http", port)])
            await eventually(lambda: (rig.activator.table.by_key.get(f"{ns}/chat") or _NoRoute).backends
                             == (f"http://[::1]:{port}",))
            assert await ask(http, rig.urls[8012], ns) == (200, "ipv6-backend")

        report = await ctl.actuator.apply(Plan(now=time.time(), actions=[SetRouting(f"{ns}/chat", False, "t")]),
                                          ctl.view())
        assert not report.errors, report.errors
        assert await slices(api, ns, version) == {}  # both families' slices deleted
    finally:
        await rig.stop()
        await runner.cleanup()
        await stopped(tasks)


class _NoRoute:
    backends: tuple[str, ...] = ()


def dataclass_now(plan: Plan) -> Plan:
    import dataclasses

    return dataclasses.replace(plan, now=time.time())
