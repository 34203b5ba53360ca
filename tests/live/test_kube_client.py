"""The controller's API client (``autoscaler.live.kube.client``, issue 30): a read the server throttles (429) or fails
transiently (5xx) is asked again -- after the server's ``Retry-After`` -- within the one request timeout every
request of a tick has; a write is never retried there (the writers retry with their read ``resourceVersion``).

Against a REAL kube-apiserver 1.20.2 + etcd (``realparts.kube``) through the fault proxy
(``realparts.faultproxy``), which answers the requests it is told to fail itself and forwards the rest.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException
from realparts.faultproxy import FaultProxy, SeenRequest
from test_actuator_safety import make_model
from test_kube_actuator import view_of

from autoscaler.api.plan import Plan, Reason, UpdateStatus
from autoscaler.live.kube.actuator import ActuatorConfig, KubeActuator
from autoscaler.live.kube.client import TimeoutApiClient
from autoscaler.live.kube.objects import STATUS_ANNOTATION

pytest_plugins = ("realparts.kube",)

aio = pytest.mark.asyncio


def _get(seen: SeenRequest) -> bool:
    return seen.method == "GET"


def _not_get(seen: SeenRequest) -> bool:
    return seen.method != "GET"


@pytest_asyncio.fixture
async def proxy(kube_apiserver: Any) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(kube_apiserver.url, ca_file=kube_apiserver.ca_file) as p:
        yield p


@pytest_asyncio.fixture
async def ns(api: client.ApiClient) -> str:
    name = f"slotwise-client-{uuid.uuid4().hex[:8]}"
    await client.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": name}})
    return name


def _client(proxy: FaultProxy, kube: Any, timeout_s: float = 5.0) -> TimeoutApiClient:
    return TimeoutApiClient(proxy.client_configuration(kube.token), request_timeout_s=timeout_s)


def _statuses(proxy: FaultProxy, since: int, method: str = "GET") -> list[int | None]:
    return [r.status for r in proxy.requests[since:] if r.method == method]


@aio
async def test_a_throttled_read_waits_for_its_retry_after_and_is_asked_again(proxy: FaultProxy, kube_apiserver: Any,
                                                                            ns: str) -> None:
    """A GET answered 429 with ``Retry-After: 1`` (API Priority and Fairness): asked again after that second, the
    read succeeds -- before, the 429 reached the caller and failed its action for the tick."""
    async with _client(proxy, kube_apiserver) as via:
        loop = asyncio.get_running_loop()
        mark = len(proxy.requests)
        proxy.fail_next(1, status=429, match=_get, headers={"Retry-After": "1"})
        t0 = loop.time()
        got = await client.CoreV1Api(via).read_namespace(ns)
        assert got.metadata.name == ns
        assert loop.time() - t0 >= 1.0, "the server's Retry-After was not honoured"
        assert _statuses(proxy, mark) == [429, 200]


@aio
async def test_a_transient_server_error_on_a_read_is_retried(proxy: FaultProxy, kube_apiserver: Any,
                                                            ns: str) -> None:
    """GETs are idempotent: a 503 and a 500 (an apiserver restarting, etcd leader change) are asked again after a
    short backoff, without a Retry-After."""
    async with _client(proxy, kube_apiserver) as via:
        mark = len(proxy.requests)
        proxy.fail_next(1, status=503, match=_get)
        assert (await client.CoreV1Api(via).read_namespace(ns)).metadata.name == ns
        proxy.fail_next(1, status=500, match=_get)
        assert (await client.CoreV1Api(via).list_namespaced_config_map(ns)).items is not None
        assert _statuses(proxy, mark) == [503, 200, 500, 200]


@aio
async def test_a_read_fails_at_once_when_the_retry_after_passes_its_deadline(proxy: FaultProxy,
                                                                            kube_apiserver: Any, ns: str) -> None:
    """The read and its retries end within the request timeout (a tick must not hang on a read): a Retry-After of
    30 s against a 2 s timeout is not waited for -- the 429 reaches the caller at once, after one request."""
    async with _client(proxy, kube_apiserver, timeout_s=2.0) as via:
        loop = asyncio.get_running_loop()
        mark = len(proxy.requests)
        proxy.fail_next(1, status=429, match=_get, headers={"Retry-After": "30"})
        t0 = loop.time()
        with pytest.raises(ApiException) as raised:
            await client.CoreV1Api(via).read_namespace(ns)
        assert raised.value.status == 429
        assert loop.time() - t0 < 1.0
        assert _statuses(proxy, mark) == [429]


@aio
async def test_a_write_is_not_retried_by_the_client(proxy: FaultProxy, kube_apiserver: Any, ns: str) -> None:
    """Only reads: a write's retry belongs to its writer (read again, the resourceVersion carried, the gate
    checked again), so a throttled POST reaches the caller after one request."""
    async with _client(proxy, kube_apiserver) as via:
        mark = len(proxy.requests)
        proxy.fail_next(1, status=429, match=_not_get, headers={"Retry-After": "0"})
        with pytest.raises(ApiException) as raised:
            await client.CoreV1Api(via).create_namespaced_config_map(ns, {"metadata": {"name": "c"}, "data": {}})
        assert raised.value.status == 429
        assert _statuses(proxy, mark, "POST") == [429]


@aio
async def test_a_throttled_read_before_a_status_write_no_longer_fails_it(api: client.ApiClient, proxy: FaultProxy,
                                                                        kube_apiserver: Any, ns: str) -> None:
    """The tick's path: the actuator reads the workload before writing its status; that GET throttled (429,
    ``Retry-After: 1``) used to fail the status write for the tick. Now it is asked again and the status lands."""
    m = await make_model(api, ns, "llm-read-429", replicas=2)
    async with _client(proxy, kube_apiserver) as via:
        act = KubeActuator(via, ActuatorConfig())
        dep = f"/apis/apps/v1/namespaces/{ns}/deployments/{m.name}"
        proxy.fail_next(1, status=429, match=lambda s: s.method == "GET" and s.path == dep,
                        headers={"Retry-After": "1"})
        r = await act.apply(Plan(0.0, [UpdateStatus(m.key, 3, 2, Reason.FORECAST)]), view_of([m]))
        assert not r.errors, r.errors
        assert r.applied == [line for line in r.applied if line.startswith("status")] and r.applied
    got = await client.AppsV1Api(api).read_namespaced_deployment(m.name, ns)
    assert json.loads(got.metadata.annotations[STATUS_ANNOTATION])["desired"] == 3
