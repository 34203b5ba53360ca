"""End to end, scale from zero (issue 18's target): a model at zero receives requests, the activator holds them,
the controller scales 0 -> 1, the requests are answered once the replica is Ready, nothing is dropped; with the
queue full, callers get 503 + Retry-After.

Real parts: the kube-apiserver (``realparts.kube``), the controller (``Controller.run``, acting, with the Lease),
the activator process (``slotwise activator``), a model-server process (``tests/realparts/modelserver.py``, its
``POST /v1/completions``) as the pod's backend. :class:`realparts.clusterplay.ClusterPlay` plays the ReplicaSet
controller, scheduler, kubelet and the endpointslice controller: the model's pod gets IP 127.0.0.1 and the
Service's slice points at the model server's port. The controller's tick is 60 s: the scale from zero must come
from the activator's report waking it, not from a tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from realparts.clusterplay import ClusterPlay, create_gpu_node

from autoscaler.live.controller import Controller, ControllerSettings

pytest_plugins = ("realparts.kube",)
pytestmark = pytest.mark.asyncio

MODELSERVER = Path(__file__).resolve().parents[1] / "realparts" / "modelserver.py"
TICK_S = 60.0
QUEUE_LIMIT = 3


def _started(proc: subprocess.Popen, log: Path) -> None:
    """Until the process printed ``listening on PORT`` to ``log`` (its output goes to a file: a pipe nobody reads
    would fill and block it)."""
    deadline = time.monotonic() + 30.0
    while "listening" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, "did not start: " + log.read_text()[-2000:]
        time.sleep(0.05)


async def _until(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return
        assert time.monotonic() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.1)


async def test_a_held_request_is_answered_after_the_scale_from_zero(api: client.ApiClient, kube_apiserver: Any,
                                                                    tmp_path: Path) -> None:
    from realparts.prometheus import free_port

    suffix = uuid.uuid4().hex[:6]
    ns = f"s0-{suffix}"
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    node = f"{suffix}-l4"
    await create_gpu_node(api, node, "NVIDIA-L4", 8, {"nvidia.com/gpu": "8", "cpu": "64", "memory": "256Gi",
                                                      "pods": "110"})

    model_port, proxy_port, admin_port, ctl_port = free_port(), free_port(), free_port(), free_port()
    labels = {"app": "chat"}
    await apps.create_namespaced_deployment(ns, {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "chat", "annotations": {
            "slotwise.io/min-replicas": "0", "slotwise.io/max-replicas": "2", "slotwise.io/service": "chat",
            # a fixed keep-alive: no request yet, so no pre-warm -- the model stays at zero until one is held
            "slotwise.io/keep-alive": "fixed", "slotwise.io/keep-alive-seconds": "600",
            "slotwise.io/slo-latency-ms": "2000", "slotwise.io/service-time-ms": "50",
            "slotwise.io/cold-start-seconds": "2", "slotwise.io/slot-kinds": "whole"}},
        "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                     {"name": "vllm", "image": "registry.invalid/vllm:test",
                      "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    await core.create_namespaced_service(ns, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat"},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": model_port}]}})
    # the activator's pod object (the process is this test's): the controller's slice lists it
    act_labels = {"app.kubernetes.io/name": "slotwise", "app.kubernetes.io/component": "activator"}
    play = ClusterPlay(api, ns, node_prefix=suffix, endpoint_slices=True, ready_after_s=1.0)
    await play.ensure_service_account()
    # its ServiceAccount and the token the kubelet would project (the reports' bearer token, --token-file)
    await core.create_namespaced_service_account(ns, {"metadata": {"name": "slotwise-activator"}})
    pod = await core.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "activator-e2e", "labels": act_labels},
        "spec": {"automountServiceAccountToken": False, "serviceAccountName": "slotwise-activator",
                 "containers": [{"name": "activator", "image": "registry.invalid/slotwise:test"}]}})
    token = await core.create_namespaced_service_account_token("slotwise-activator", ns, {"spec": {
        "audiences": ["slotwise.io/activations"],
        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "activator-e2e", "uid": pod.metadata.uid}}})
    (tmp_path / "token").write_text(token.status.token)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    await core.patch_namespaced_pod_status("activator-e2e", ns, {"status": {
        "phase": "Running", "podIP": "127.0.0.1",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": stamp}]}})

    replicas_file = tmp_path / "chat.replicas"
    replicas_file.write_text("1")
    server = subprocess.Popen(
        [sys.executable, str(MODELSERVER), "--port", str(model_port), "--model", "chat", "--rps", "0",
         "--service-ms", "50", "--replicas-file", str(replicas_file), "--token-ms", "5"],
        stdout=(tmp_path / "modelserver.log").open("w"), stderr=subprocess.STDOUT)
    activator = subprocess.Popen(
        [sys.executable, "-m", "autoscaler.cli.main", "activator", "--kubeconfig", str(kube_apiserver.kubeconfig),
         "--controller", f"http://127.0.0.1:{ctl_port}", "--host", "127.0.0.1", "--port", str(proxy_port),
         "--admin-port", str(admin_port), "--namespace", ns, "--pod-name", "activator-e2e",
         "--queue-limit", str(QUEUE_LIMIT), "--hold-timeout-s", "60", "--token-file", str(tmp_path / "token"),
         "--port-count", "1"],
        stdout=(tmp_path / "activator.log").open("w"), stderr=subprocess.STDOUT)
    settings = ControllerSettings(
        namespace=ns, lease_namespace=ns, lease_name="slotwise", identity=f"s0-{suffix}", tick_s=TICK_S,
        http_host="127.0.0.1", http_port=ctl_port, history_hours=0.0, activator_enabled=True,
        lease_duration_s=15.0, renew_deadline_s=10.0, retry_period_s=0.5)
    ctl = Controller(api, settings)
    stop = asyncio.Event()
    playing = asyncio.Event()

    async def play_loop() -> None:
        while not stop.is_set():
            if playing.is_set():
                await play.step()
            await asyncio.sleep(0.2)
            assert not run.done(), run  # the controller must keep running

    try:
        _started(server, tmp_path / "modelserver.log")
        _started(activator, tmp_path / "activator.log")
        run = asyncio.create_task(ctl.run(stop))
        player = asyncio.create_task(play_loop())
        slices = client.CustomObjectsApi(api)

        async def routed() -> bool:
            got = await slices.list_namespaced_custom_object(
                "discovery.k8s.io", "v1beta1", ns, "endpointslices",
                label_selector="endpointslice.kubernetes.io/managed-by=slotwise.io")
            return bool(got["items"] and got["items"][0].get("endpoints"))

        # at zero, no Ready replica: the first tick routes the Service through the activator
        await _until(routed, 30.0, "the activator EndpointSlice")
        async with aiohttp.ClientSession() as http:
            await _until(lambda: _ok(http, f"http://127.0.0.1:{admin_port}/readyz"), 30.0, "the activator ready")
            await asyncio.sleep(1.0)  # the activator's slice watch sees the route
            url = f"http://127.0.0.1:{proxy_port}/v1/completions"
            headers = {"X-Slotwise-Model": f"{ns}/chat"}

            async def ask() -> tuple[int, str | None, str]:
                async with http.post(url, json={"prompt": "hi", "max_tokens": 4}, headers=headers,
                                     timeout=aiohttp.ClientTimeout(total=90)) as r:
                    return r.status, r.headers.get("Retry-After"), await r.text()

            # the ClusterPlay is paused: nothing can become Ready, the queue fills
            ticks = ctl.ticks
            sent = time.monotonic()
            asks = [asyncio.create_task(ask()) for _ in range(QUEUE_LIMIT + 2)]
            await _until(lambda: sum(a.done() for a in asks) >= 2, 20.0, "the queue-full answers")
            full = [a.result() for a in asks if a.done()]
            assert [s for s, _, _ in full] == [503, 503], full
            assert all(retry for _, retry, _ in full), full
            # the controller was woken by the report: a tick runs (and the scale 0 -> 1 is there) long before the
            # 60 s tick is due
            await _until(lambda: ctl.ticks > ticks, 10.0, "the tick the report wakes")
            await _until(lambda: _scale(apps, ns), 10.0, "the scale 0 -> 1")
            assert time.monotonic() - sent < TICK_S / 4
            assert not await _pods(core, ns, "app=chat")  # no pod yet: the requests are held
            playing.set()  # the pod is created, Ready, in the Service's slice
            held = await asyncio.wait_for(asyncio.gather(*[a for a in asks if a not in
                                                           [x for x in asks if x.done() and x.result()[0] == 503]]),
                                          60.0)
        assert [s for s, _, _ in held] == [200] * QUEUE_LIMIT, (  # every held request answered
            held, play.log[-8:], (tmp_path / "activator.log").read_text()[-3000:])
        assert all('"choices"' in text or "text" in text for _, _, text in held), held
        assert ctl.ticks < 5  # woken, not ticking fast
        assert not player.done()
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(run, 30.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(player, 5.0)
        for proc in (activator, server):
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        with contextlib.suppress(Exception):
            await core.delete_node(node)


async def _ok(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url) as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def _scale(apps: client.AppsV1Api, ns: str) -> bool:
    got = await apps.read_namespaced_deployment_scale("chat", ns)
    return int(got.spec.replicas or 0) >= 1


async def _scale_now(apps: client.AppsV1Api, ns: str) -> int:
    return int((await apps.read_namespaced_deployment_scale("chat", ns)).spec.replicas or 0)


async def _pods(core: client.CoreV1Api, ns: str, selector: str) -> list[Any]:
    return (await core.list_namespaced_pod(ns, label_selector=selector)).items
