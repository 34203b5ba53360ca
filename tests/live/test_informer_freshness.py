"""Issue 16, failure mode 3 (the informer's part): a frozen cache says so.

``synced`` stays True forever, so a cache whose watch stopped delivering looks as good as a current one: with the
watches paused, a Deployment scaled 1 -> 6 still reads 1 from the cache, and a plan computed from it halves the
fleet. The informer now tells how long ago the server last confirmed its cache, and ``frozen()`` once that is
longer than a healthy watch ever goes (``watch_timeout_s`` + grace): the controller holds decisions then.

Against the REAL kube-apiserver through :class:`realparts.faultproxy.FaultProxy` (``pause_watches`` drops the
open watches and holds new ones, as a partitioned apiserver or a stuck proxy would), with a 2 s watch timeout so
the bound is seconds, not minutes. Plus the bound's arithmetic on a fake clock.
"""

from __future__ import annotations

import asyncio
import math
import random
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from realparts.faultproxy import FaultProxy

from autoscaler.live.kube.informer import Informer, frozen_informers

if TYPE_CHECKING:
    from realparts.kube import KubeApiserver

pytest_plugins = ("realparts.kube",)

WATCH_TIMEOUT_S = 2  # the server ends each watch after this: a healthy informer hears from it at least this often
GRACE_S = 3.0  # generous for a busy 2-core machine: frozen after 5 s without contact
FAST = {"backoff_initial_s": 0.05, "backoff_max_s": 0.4, "rng": random.Random(5)}
WAIT_S = 20.0


async def eventually(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for: {what}")
        await asyncio.sleep(0.02)


@pytest_asyncio.fixture
async def proxy(kube_apiserver: KubeApiserver) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(kube_apiserver.url, ca_file=kube_apiserver.ca_file) as fault_proxy:
        yield fault_proxy


@pytest_asyncio.fixture
async def proxied(kube_apiserver: KubeApiserver, proxy: FaultProxy) -> AsyncIterator[client.ApiClient]:
    async with client.ApiClient(proxy.client_configuration(kube_apiserver.token)) as api_client:
        yield api_client


def deployment(name: str, replicas: int) -> dict:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "server", "image": "vllm"}]}}}}


def test_frozen_is_no_contact_for_longer_than_the_watch_timeout_plus_grace() -> None:
    now = [100.0]
    inf = Informer(None, "/api/v1/pods", watch_timeout_s=50, clock=lambda: now[0], backoff_max_s=30.0)
    assert inf.freeze_after_s == 50 + 50  # default grace: as long as a watch (issue 30; 15 + 15 s by default)
    assert inf.last_contact is None and inf.last_contact_age() == math.inf and inf.frozen()  # never heard
    inf._replace({}, "7")  # a complete list
    assert inf.last_contact == 100.0 and not inf.frozen()
    now[0] = 200.5
    assert inf.last_contact_age() == 100.5 and inf.frozen() and inf.frozen(now=200.1)
    assert not inf.frozen(now=200.0) and inf.last_contact_age(now=50.0) == 0.0
    inf._apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}})  # a bookmark is contact
    assert inf.last_contact_age() == 0.0 and not inf.frozen()
    assert frozen_informers([inf]) == [] and frozen_informers([inf], now=400.0) == [inf.name]
    with pytest.raises(ValueError):
        Informer(None, "/api/v1/pods", contact_grace_s=-1)


@pytest.mark.asyncio
async def test_paused_watches_make_the_informer_frozen_within_the_bound(
    api: client.ApiClient, proxied: client.ApiClient, proxy: FaultProxy
) -> None:
    ns = f"slotwise-fresh-{uuid.uuid4().hex[:8]}"
    await client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    apps = client.AppsV1Api(api)  # direct writes, like another client of the cluster
    await apps.create_namespaced_deployment(ns, deployment("m", 1))
    inf = Informer(proxied, f"/apis/apps/v1/namespaces/{ns}/deployments", watch_timeout_s=WATCH_TIMEOUT_S,
                   contact_grace_s=GRACE_S, name="deployments", **FAST)
    assert inf.freeze_after_s == WATCH_TIMEOUT_S + GRACE_S

    def replicas() -> int | None:
        obj = inf.get(f"{ns}/m")
        return None if obj is None else obj["spec"]["replicas"]

    task = asyncio.create_task(inf.run())
    try:
        assert await inf.wait_synced(WAIT_S)
        # Healthy, and nothing changes: the server ends each watch at its timeout and that is contact, so the
        # informer is never frozen over three watch timeouts' worth of quiet.
        loop = asyncio.get_running_loop()
        quiet_until = loop.time() + 3 * WATCH_TIMEOUT_S
        watches_before = inf.stats.watches
        while loop.time() < quiet_until:
            assert not inf.frozen(), f"frozen while healthy (no contact for {inf.last_contact_age():.1f} s)"
            assert not frozen_informers([inf])
            await asyncio.sleep(0.05)
        assert inf.stats.watches > watches_before  # watches did end and reopen meanwhile
        assert inf.stats.errors == 0

        # Watches paused: someone scales 1 -> 6; the cache still says 1 and is still "synced" -- but frozen,
        # no later than the bound after its last contact.
        proxy.pause_watches()
        paused_at = loop.time()
        await apps.patch_namespaced_deployment_scale("m", ns, {"spec": {"replicas": 6}})
        await eventually(inf.frozen, "the informer to report frozen while its watches are paused")
        took = loop.time() - paused_at
        assert took <= inf.freeze_after_s + 2.0, f"frozen only after {took:.1f} s (bound {inf.freeze_after_s} s)"
        assert inf.synced and replicas() == 1  # what the stale cache would have planned from
        assert frozen_informers([inf]) == ["deployments"]
        assert inf.last_contact_age() > inf.freeze_after_s

        # Resumed: the held watch goes through, delivers the change, and the informer is fresh again.
        proxy.resume_watches()
        await eventually(lambda: replicas() == 6 and not inf.frozen(), "the change and fresh contact after resume")
    finally:
        proxy.resume_watches()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.asyncio
async def test_failing_requests_are_no_contact(
    api: client.ApiClient, proxied: client.ApiClient, proxy: FaultProxy
) -> None:
    """An apiserver that answers every request with 500 is no contact: the cache freezes, then recovers."""
    ns = f"slotwise-fresh-{uuid.uuid4().hex[:8]}"
    await client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    inf = Informer(proxied, f"/api/v1/namespaces/{ns}/configmaps", watch_timeout_s=WATCH_TIMEOUT_S,
                   contact_grace_s=GRACE_S, **FAST)
    task = asyncio.create_task(inf.run())
    try:
        assert await inf.wait_synced(WAIT_S)
        await eventually(lambda: proxy.open_watches == 1, "the watch to open")
        proxy.fail_next(10**6)  # every request from now on: HTTP 500
        proxy.cut_watches()
        await eventually(inf.frozen, "the informer to report frozen while every request fails")
        assert inf.stats.errors > 0
        proxy.fail_next(0)
        await eventually(lambda: not inf.frozen(), "fresh contact once the server answers again")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
