"""The list+watch :class:`~autoscaler.live.kube.informer.Informer` against a REAL kube-apiserver 1.20.2.

Every informer here talks to the real apiserver through :class:`realparts.faultproxy.FaultProxy`, which relays
everything and, when a test arms it, injects the faults real clusters produce: 410 Gone (as a watch ERROR
event and as an HTTP status), dropped watch connections, HTTP 500s, and "disconnected for a while" (paused
watches). The objects are changed directly on the apiserver (not through the proxy), like another client would.
Without the apiserver binary (no root/apt/network to build it) these tests SKIP, as the smoke tests do.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from realparts.faultproxy import FaultProxy

from autoscaler.live.kube.informer import Backoff, Informer

if TYPE_CHECKING:
    from realparts.kube import KubeApiserver

pytest_plugins = ("realparts.kube",)

FAST = {"backoff_initial_s": 0.05, "backoff_max_s": 0.4, "rng": random.Random(7)}
WAIT_S = 15.0  # generous ceilings for a busy 2-core machine; the polls return as soon as the condition holds


async def eventually(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for: {what}")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def running(informer: Informer) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(informer.run())
    try:
        yield task
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest_asyncio.fixture
async def proxy(kube_apiserver: KubeApiserver) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(kube_apiserver.url, ca_file=kube_apiserver.ca_file) as fault_proxy:
        yield fault_proxy


@pytest_asyncio.fixture
async def proxied(kube_apiserver: KubeApiserver, proxy: FaultProxy) -> AsyncIterator[client.ApiClient]:
    async with client.ApiClient(proxy.client_configuration(kube_apiserver.token)) as api_client:
        yield api_client


@pytest_asyncio.fixture
async def namespace(api: client.ApiClient) -> str:
    name = f"slotwise-informer-{uuid.uuid4().hex[:8]}"
    await client.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name  # no controller-manager: a deleted namespace would only sit in Terminating, so it is left


class ConfigMaps:
    """Direct (unproxied) writes, as another client of the cluster would make them."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.path = f"/api/v1/namespaces/{namespace}/configmaps"

    def key(self, name: str) -> str:
        return f"{self.namespace}/{name}"

    async def create(self, name: str, labels: dict[str, str] | None = None, value: str = "1") -> None:
        body = {"metadata": {"name": name, "labels": labels or {}}, "data": {"value": value}}
        await self.core.create_namespaced_config_map(self.namespace, body)

    async def patch(self, name: str, body: dict[str, Any]) -> None:
        await self.core.patch_namespaced_config_map(name, self.namespace, body)

    async def delete(self, name: str) -> None:
        await self.core.delete_namespaced_config_map(name, self.namespace)


@pytest_asyncio.fixture
async def cms(api: client.ApiClient, namespace: str) -> ConfigMaps:
    return ConfigMaps(api, namespace)


def keys(informer: Informer) -> set[str]:
    return {f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in informer.items()}


def value(informer: Informer, key: str) -> str | None:
    obj = informer.get(key)
    return None if obj is None else obj["data"]["value"]


def recorder(informer: Informer) -> list[tuple[str, str]]:
    """(event type, object name) for every notification; RELIST is recorded with an empty name."""
    seen: list[tuple[str, str]] = []
    informer.subscribe(lambda kind, obj: seen.append((kind, (obj.get("metadata") or {}).get("name") or "")))
    return seen


# --- pure: the backoff ---------------------------------------------------------------------------------------


def test_backoff_is_full_jitter_exponential_and_resets() -> None:
    backoff = Backoff(0.5, 4.0, random.Random(1))
    ceilings = []
    for _ in range(8):
        ceilings.append(backoff.ceiling())
        delay = backoff.next()
        assert 0.0 <= delay <= ceilings[-1]
    assert ceilings == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    # full jitter: the delays are spread over [0, ceiling], not bunched at the ceiling
    delays = [Backoff(1.0, 1.0, random.Random(seed)).next() for seed in range(200)]
    assert min(delays) < 0.1 and max(delays) > 0.9
    backoff.reset()
    assert backoff.ceiling() == 0.5
    with pytest.raises(ValueError):
        Backoff(0.0, 1.0)


# --- against the real apiserver ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_paged_initial_list_then_added_modified_deleted(
    proxied: client.ApiClient, proxy: FaultProxy, cms: ConfigMaps
) -> None:
    for i in range(5):
        await cms.create(f"cm-{i}")
    informer = Informer(proxied, cms.path, page_size=2, **FAST)
    events = recorder(informer)
    assert not informer.synced
    async with running(informer):
        assert await informer.wait_synced(WAIT_S)
        assert keys(informer) == {cms.key(f"cm-{i}") for i in range(5)}
        assert informer.get(cms.key("cm-3"))["kind"] == "ConfigMap"  # filled in from the list's kind
        assert sorted(events) == [("ADDED", f"cm-{i}") for i in range(5)]
        lists = [r for r in proxy.requests if not r.watch]
        assert [r.query.get("limit") for r in lists] == ["2", "2", "2"]  # 5 objects in pages of 2
        assert "continue" not in lists[0].query and all(r.query.get("continue") for r in lists[1:])

        await eventually(lambda: proxy.open_watches == 1, "the watch to open")
        watch = next(r for r in proxy.requests if r.watch)
        assert watch.query["allowWatchBookmarks"] == "true"
        assert watch.query["resourceVersion"] == informer.resource_version

        await cms.create("cm-new")
        await cms.patch("cm-0", {"data": {"value": "changed"}})
        await cms.delete("cm-1")
        await eventually(
            lambda: (
                value(informer, cms.key("cm-0")) == "changed"
                and cms.key("cm-new") in keys(informer)
                and cms.key("cm-1") not in keys(informer)
            ),
            "create, patch and delete to reach the cache",
        )
        assert events[5:] == [("ADDED", "cm-new"), ("MODIFIED", "cm-0"), ("DELETED", "cm-1")]
        assert informer.stats.errors == 0 and informer.stats.relists == 0 and informer.stats.events == 3


@pytest.mark.asyncio
@pytest.mark.parametrize("as_event", [True, False], ids=["error-event-410", "http-410"])
async def test_gone_relists_and_drops_what_was_deleted_meanwhile(
    proxied: client.ApiClient, proxy: FaultProxy, cms: ConfigMaps, as_event: bool
) -> None:
    for name in ("a", "b", "c"):
        await cms.create(name)
    informer = Informer(proxied, cms.path, **FAST)
    events = recorder(informer)
    async with running(informer):
        assert await informer.wait_synced(WAIT_S)
        await eventually(lambda: proxy.open_watches == 1, "the watch to open")
        await cms.create("warm-up")  # a watch event, so the 410 below does not come right after a list
        await eventually(lambda: cms.key("warm-up") in keys(informer), "the warm-up object")

        # disconnect the informer, change things behind its back, then let it back in with its resourceVersion
        # expired: the events it missed are gone, only a re-list can tell it that "a" was deleted
        proxy.pause_watches()
        await eventually(lambda: proxy.held_watches == 1, "the informer to try to watch again")
        await cms.delete("a")
        await cms.patch("b", {"data": {"value": "changed"}})
        await cms.create("d")
        proxy.gone_next_watch(as_event=as_event)
        mark = len(events)
        proxy.resume_watches()

        await eventually(lambda: informer.stats.relists == 1, "a re-list")
        assert keys(informer) == {cms.key(n) for n in ("b", "c", "d", "warm-up")}
        assert value(informer, cms.key("b")) == "changed"
        assert sorted(events[mark:]) == [("ADDED", "d"), ("DELETED", "a"), ("MODIFIED", "b"), ("RELIST", "")]
        assert events[-1] == ("RELIST", "")  # the diff first, then "the cache was replaced"
        assert informer.stats.gone == 1
        assert [r.fault for r in proxy.requests if r.fault and r.fault.startswith("gone")] == [
            "gone-event" if as_event else "gone-http"
        ]

        # and it keeps watching from the new list's resourceVersion
        await cms.create("e")
        await eventually(lambda: cms.key("e") in keys(informer), "an object created after the re-list")
        assert informer.stats.relists == 1


@pytest.mark.asyncio
async def test_recovers_from_dropped_watches_and_500s_without_relisting(
    proxied: client.ApiClient, proxy: FaultProxy, cms: ConfigMaps
) -> None:
    await cms.create("a")
    proxy.fail_next(2)  # the first list fails twice, then goes through
    informer = Informer(proxied, cms.path, **FAST)
    async with running(informer):
        assert await informer.wait_synced(WAIT_S)
        assert informer.stats.errors == 2 and "500" in (informer.stats.last_error or "")
        assert keys(informer) == {cms.key("a")}
        await eventually(lambda: proxy.open_watches == 1, "the watch to open")

        # the next watch is dropped after relaying one event; the current one is dropped now
        proxy.cut_next_watch(after_events=1)
        proxy.cut_watches()
        await eventually(lambda: proxy.open_watches == 1, "the watch to reopen")
        await cms.create("b")
        await cms.create("c")
        await eventually(lambda: {cms.key("b"), cms.key("c")} <= keys(informer), "b and c after a mid-stream cut")

        # three 500s in a row on the watch, with changes in between
        proxy.fail_next(3)
        proxy.cut_watches()
        await cms.create("d")
        await cms.delete("a")
        await cms.patch("b", {"data": {"value": "changed"}})
        await eventually(
            lambda: (
                keys(informer) == {cms.key(n) for n in ("b", "c", "d")} and value(informer, cms.key("b")) == "changed"
            ),
            "convergence after the 500s",
        )
        stats = informer.stats
        assert stats.errors >= 2 + 2 + 3  # two failed lists, two cut streams, three 500s
        assert stats.watch_restarts >= 2 + 3
        # every reconnect resumed from its resourceVersion: the apiserver replayed what was missed, no re-list
        assert stats.relists == 0 and stats.gone == 0
        assert sum(1 for r in proxy.requests if not r.watch and r.status == 200) == 1
        resumed = [r for r in proxy.requests if r.watch and r.status == 200]
        assert len(resumed) >= 3 and all(r.query.get("resourceVersion") for r in resumed)


@pytest.mark.asyncio
async def test_label_selector_filters_and_tracks_objects_moving_in_and_out(
    proxied: client.ApiClient, proxy: FaultProxy, cms: ConfigMaps
) -> None:
    await cms.create("a1", labels={"app": "a"})
    await cms.create("b1", labels={"app": "b"})
    informer = Informer(proxied, cms.path, label_selector="app=a", **FAST)
    events = recorder(informer)
    async with running(informer):
        assert await informer.wait_synced(WAIT_S)
        assert keys(informer) == {cms.key("a1")}
        assert all(r.query.get("labelSelector") == "app=a" for r in proxy.requests)
        await eventually(lambda: proxy.open_watches == 1, "the watch to open")

        await cms.patch("b1", {"metadata": {"labels": {"app": "a"}}})  # moves into the selection
        await cms.patch("a1", {"metadata": {"labels": {"app": "c"}}})  # moves out of it
        await cms.create("b2", labels={"app": "b"})  # never in it
        await eventually(lambda: keys(informer) == {cms.key("b1")}, "b1 in, a1 out")
        assert events[1:] == [("ADDED", "b1"), ("DELETED", "a1")]


@pytest.mark.asyncio
async def test_bookmarks_and_server_ended_watches_resume_quietly(
    proxied: client.ApiClient, proxy: FaultProxy, cms: ConfigMaps
) -> None:
    # Nothing matches the selector at first, so only BOOKMARKs can move the informer past the change below. The
    # apiserver sends one ~2 s before a watch's timeoutSeconds, but only best effort (the API promises none, and on
    # a busy machine the 1.20 server skipped them for whole runs): the proxy injects one in the server's shape, and
    # the watch then ends at its timeoutSeconds like any other.
    informer = Informer(proxied, cms.path, label_selector="app=a", watch_timeout_s=3, **FAST)
    async with running(informer):
        assert await informer.wait_synced(WAIT_S)
        listed = int(informer.resource_version or 0)
        await cms.create("other", labels={"app": "other"})
        created = int((await cms.core.read_namespaced_config_map("other", cms.namespace)).metadata.resource_version)
        assert created > listed
        await eventually(lambda: proxy.open_watches == 1, "the watch to open")
        assert proxy.bookmark_open_watches(str(created)) == 1
        await eventually(lambda: int(informer.resource_version or 0) >= created, "a bookmark past the change")
        assert informer.stats.bookmarks >= 1 and informer.stats.events == 0 and informer.items() == []

        await eventually(lambda: informer.stats.watch_restarts >= 1, "the server to end the watch")
        await eventually(lambda: proxy.open_watches == 1, "the watch to reopen")
        resumed = [r for r in proxy.requests if r.watch][-1]
        assert resumed.query["timeoutSeconds"] == "3"
        assert int(resumed.query["resourceVersion"]) >= created  # from the bookmark, not from the list
        await cms.create("a1", labels={"app": "a"})
        await eventually(lambda: keys(informer) == {cms.key("a1")}, "an event on the resumed watch")
    assert informer.stats.errors == 0 and informer.stats.relists == 0


@pytest.mark.asyncio
async def test_optional_path_of_missing_crd_is_synced_and_empty(proxied: client.ApiClient) -> None:
    path = "/apis/kueue.x-k8s.io/v1beta1/workloads"
    optional = Informer(proxied, path, optional=True, **FAST)
    required = Informer(proxied, path, **FAST)
    async with running(optional), running(required):
        assert await optional.wait_synced(WAIT_S)
        assert optional.items() == [] and optional.stats.not_found >= 1 and optional.stats.errors == 0
        # without optional=True a 404 is an error like any other: retried, never "synced"
        await eventually(lambda: required.stats.errors >= 2, "the required informer to retry")
        assert not required.synced and "404" in (required.stats.last_error or "")


@pytest.mark.asyncio
async def test_optional_path_picks_up_a_crd_installed_later(api: client.ApiClient, proxied: client.ApiClient) -> None:
    group = f"t{uuid.uuid4().hex[:8]}.slotwise.io"
    path = f"/apis/{group}/v1/widgets"
    informer = Informer(proxied, path, optional=True, backoff_initial_s=0.05, backoff_max_s=0.3)
    async with running(informer):
        assert await informer.wait_synced(WAIT_S) and informer.items() == []
        crd = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"widgets.{group}"},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                    }
                ],
            },
        }
        await client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
        await eventually(lambda: informer.stats.lists >= 1, "the CRD's collection to be listed")
        custom = client.CustomObjectsApi(api)
        await custom.create_namespaced_custom_object(
            group,
            "v1",
            "default",
            "widgets",
            {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "w1"}},
        )
        await eventually(lambda: informer.get("default/w1") is not None, "a custom object through the watch")
        assert informer.get("default/w1")["kind"] == "Widget"


@pytest.mark.asyncio
async def test_cancelling_run_closes_the_watch(proxied: client.ApiClient, proxy: FaultProxy, cms: ConfigMaps) -> None:
    await cms.create("a")
    informer = Informer(proxied, cms.path, **FAST)
    async with running(informer):
        assert await informer.wait_synced(WAIT_S)
        await eventually(lambda: proxy.open_watches == 1, "the watch to open")
    # cancelled (running() checked that run() ended with CancelledError): the connection was closed, and the
    # cache stays readable
    await eventually(lambda: proxy.open_watches == 0, "the proxy to see the watch connection closed", timeout=5)
    assert keys(informer) == {cms.key("a")}
