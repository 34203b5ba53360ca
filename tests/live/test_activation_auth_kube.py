"""Who may report activations (issue 30): the activator's ServiceAccount token, checked by a TokenReview against
the real kube-apiserver (1.20.2, started with service-account signing keys and an issuer: it serves TokenRequest
and TokenReview).

The tokens are real: ``serviceaccounts/<name>/token`` (TokenRequest) with the activation audience, bound to the
activator's pod object as the kubelet's projected token is. The peer is always 127.0.0.1, which is NOT the
activator pod's IP -- what the controller sees behind a mesh sidecar or SNAT: a valid token is taken there, and a
sender that only has an activator pod's IP (a pod that got a dead activator's IP) is not.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient

from autoscaler.live.controller import Controller, ControllerSettings
from autoscaler.live.kube.actuator import ActuatorConfig

pytest_plugins = ("realparts.kube",)
pytestmark = pytest.mark.asyncio

ACTIVATOR_LABELS = {"app.kubernetes.io/name": "slotwise", "app.kubernetes.io/component": "activator"}
SA = "slotwise-activator"  # the controller's default activator_service_account (the chart sets its own name)
ACTIVATION_AUDIENCE = "slotwise.io/activations"  # the audience the chart's projected token is issued for


@pytest_asyncio.fixture
async def ns(api: ApiClient) -> str:
    name = f"auth-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    for sa in ("default", SA, "intruder"):
        await core.create_namespaced_service_account(name, {"metadata": {"name": sa}})
    return name


async def activator_pod(api: ApiClient, ns: str, name: str, ip: str, sa: str = SA,
                        labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Running, Ready pod object (nothing runs it: the bare apiserver has no kubelet) -> its body."""
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": ACTIVATOR_LABELS if labels is None else labels},
        "spec": {"serviceAccountName": sa, "automountServiceAccountToken": False,
                 "containers": [{"name": "activator", "image": "registry.invalid/slotwise:test"}]}})
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    got = await core.patch_namespaced_pod_status(name, ns, {"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": stamp}]}})
    return api.sanitize_for_serialization(got)


async def token(api: ApiClient, ns: str, sa: str, pod: dict[str, Any] | None = None,
                audience: str | None = ACTIVATION_AUDIENCE) -> str:
    """A TokenRequest for ``sa`` (bound to ``pod`` as the kubelet's projected token is; ``audience`` None: the
    apiserver's default audience, what an automounted token has)."""
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if audience:
        spec["audiences"] = [audience]
    if pod is not None:
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                                  "uid": pod["metadata"]["uid"]}
    got = await client.CoreV1Api(api).create_namespaced_service_account_token(
        sa, ns, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
    return got.status.token


def report(activator: str, ns: str, held: int = 2) -> dict[str, Any]:
    return {"activator": activator, "models": [{"namespace": ns, "service": "chat", "model": "chat", "held": held,
                                                "oldest_wait_s": 0.5}]}


async def eventually(check: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


@pytest_asyncio.fixture
async def controller(api: ApiClient, ns: str) -> AsyncIterator[tuple[Controller, str]]:
    """A controller (dry run: it ticks without a Lease) serving POST /v1/activations on 127.0.0.1 -> its URL."""
    from realparts.prometheus import free_port

    port = free_port()
    ctl = Controller(api, ControllerSettings(namespace=ns, lease_namespace=ns, activator_enabled=True,
                                             tick_s=60.0, http_host="127.0.0.1", http_port=port,
                                             actuator=ActuatorConfig(dry_run=True)))
    stop = asyncio.Event()
    run = asyncio.create_task(ctl.run(stop))
    try:
        await eventually(lambda: ctl.ticks >= 1, timeout_s=30.0)
        yield ctl, f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        await asyncio.wait_for(run, 30.0)


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
               bearer: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    async with http.post(url + "/v1/activations", json=body, headers=headers) as r:
        return r.status, await r.text()


def refused_metric(text: str, reason: str) -> float:
    line = f'slotwise_activation_reports_refused_total{{reason="{reason}"}} '
    return next((float(x[len(line):]) for x in text.splitlines() if x.startswith(line)), 0.0)


async def test_reports_are_taken_on_the_activator_service_account_token_not_on_an_ip(
        api: ApiClient, ns: str, controller: tuple[Controller, str]) -> None:
    ctl, url = controller
    # the activator's pod is at 10.1.0.1; its reports arrive from 127.0.0.1 (a mesh sidecar, SNAT)
    pod = await activator_pod(api, ns, "activator-a", "10.1.0.1")
    good = await token(api, ns, SA, pod)
    await eventually(lambda: any(p["metadata"]["name"] == "activator-a" for p in ctl.activator_pods.items()))
    async with aiohttp.ClientSession() as http:
        # a valid, pod-bound token of the activator's ServiceAccount: booked, though the address is no pod's
        status, text = await post(http, url, report("activator-a", ns), good)
        assert status == 202, text
        assert ctl.activations.held() == {f"{ns}/chat": 2.0}
        reviews = ctl.report_auth.reviews
        status, _ = await post(http, url, report("activator-a", ns, held=3), good)
        assert status == 202 and ctl.activations.held() == {f"{ns}/chat": 3.0}
        assert ctl.report_auth.reviews == reviews  # the positive review is cached: no second TokenReview

        # no token: 401, whatever the address (here: one that is now an activator pod's, as a pod that got a dead
        # activator's IP would have)
        await activator_pod(api, ns, "activator-local", "127.0.0.1")
        await eventually(lambda: len(ctl.activator_pods.items()) == 2)
        async with http.post(url + "/v1/activations", json=report("activator-local", ns)) as r:
            assert r.status == 401 and r.headers.get("WWW-Authenticate", "").startswith("Bearer")
        # not a token at all, and a real token issued for the apiserver's default audience (an automounted one)
        status, _ = await post(http, url, report("activator-a", ns), "not-a-token")
        assert status == 401
        status, text = await post(http, url, report("activator-a", ns), await token(api, ns, SA, pod, None))
        assert status == 401, text
        # another ServiceAccount's valid token (any pod of the namespace can get its own): 403
        intruder = await activator_pod(api, ns, "intruder", "10.1.0.9", sa="intruder", labels={"app": "x"})
        status, text = await post(http, url, report("intruder", ns), await token(api, ns, "intruder", intruder))
        assert status == 403 and "is not system:serviceaccount:" in text, text
        # the activator's token used to speak for another activator: 403 (a report replaces its sender's last)
        status, text = await post(http, url, report("activator-local", ns, held=50), good)
        assert status == 403, text
        assert ctl.activations.held() == {f"{ns}/chat": 3.0}  # nothing refused was booked

        # the pod the token is bound to is deleted: its token (cached as valid) is refused at once
        await client.CoreV1Api(api).delete_namespaced_pod("activator-a", ns, grace_period_seconds=0)
        await eventually(lambda: all(p["metadata"]["name"] != "activator-a" for p in ctl.activator_pods.items()))
        status, text = await post(http, url, report("activator-a", ns), good)
        assert status == 403 and "not an activator pod" in text, text

        async with http.get(url + "/metrics") as r:
            metrics = await r.text()
    assert refused_metric(metrics, "no-token") == 1
    assert refused_metric(metrics, "invalid-token") == 2
    assert refused_metric(metrics, "wrong-service-account") == 1
    assert refused_metric(metrics, "not-the-sender") == 1
    assert refused_metric(metrics, "not-an-activator-pod") == 1


async def test_the_activator_process_sends_its_token_file(api: ApiClient, ns: str, kube_apiserver: Any,
                                                          controller: tuple[Controller, str], tmp_path: Any) -> None:
    """``slotwise activator --token-file``: the notifier's reports carry the file's token (re-read as it rotates)
    and the controller books them."""
    from autoscaler.live.activator.notify import Notifier, TokenFile

    ctl, url = controller
    pod = await activator_pod(api, ns, "activator-b", "10.1.0.2")
    path = tmp_path / "token"
    path.write_text("stale-token\n")
    now = [0.0]
    tokens = TokenFile(str(path), clock=lambda: now[0])
    await eventually(lambda: any(p["metadata"]["name"] == "activator-b" for p in ctl.activator_pods.items()))
    async with aiohttp.ClientSession() as http:
        notifier = Notifier(http, "activator-b", lambda: report("activator-b", ns)["models"], controllers=[url],
                            token=tokens)
        await notifier.send_once()
        assert notifier.refused == 1  # an invalid token: 401
        path.write_text(await token(api, ns, SA, pod))  # the kubelet rotated it
        now[0] += 60.0
        await notifier.send_once()
    assert notifier.refused == 1 and notifier.sent == 2
    assert ctl.activations.held() == {f"{ns}/chat": 2.0}
