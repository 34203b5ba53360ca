"""The activator's EndpointSlice watch against the REAL kube-apiserver 1.20.2 (discovery.k8s.io/v1beta1 there):
slices created in the apiserver become its routes and backends, and released held requests follow them."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest
from test_activator_routes import activator_slice, pod_slice

from autoscaler.live.activator.routes import Route, RouteTable
from autoscaler.live.activator.watch import SliceWatch, slice_version
from autoscaler.live.kube.discovery import discover

pytest_plugins = ("realparts.kube",)
pytestmark = pytest.mark.asyncio


async def call(api: Any, path: str, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    resp = await api.call_api(path, method, body=body, header_params={"Content-Type": "application/json"},
                              auth_settings=["BearerToken"], _preload_content=False)
    text = await resp.text()
    assert resp.status < 300, text
    return json.loads(text)


async def create(api: Any, version: str, ns: str, body: dict[str, Any]) -> None:
    body = {**body, "apiVersion": f"discovery.k8s.io/{version}"}
    body["metadata"] = {k: v for k, v in body["metadata"].items() if k != "resourceVersion"}
    await call(api, f"/apis/discovery.k8s.io/{version}/namespaces/{ns}/endpointslices", "POST", body)


async def replace(api: Any, version: str, ns: str, body: dict[str, Any]) -> None:
    name = body["metadata"]["name"]
    path = f"/apis/discovery.k8s.io/{version}/namespaces/{ns}/endpointslices/{name}"
    current = await call(api, path, "GET")
    body = {**body, "apiVersion": f"discovery.k8s.io/{version}"}
    body["metadata"] = {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}
    await call(api, path, "PUT", body)


async def eventually(cond: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_slices_in_the_apiserver_become_routes_and_backends(api: Any) -> None:
    from kubernetes_asyncio import client

    ns = "act-" + uuid.uuid4().hex[:6]
    await client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    version = slice_version(await discover(api))
    assert version == "v1beta1"  # the 1.20 server has no discovery.k8s.io/v1
    table = RouteTable()
    changes: list[Route] = []
    watch = SliceWatch(api, table, changes.append, version=version, namespaces=[ns],
                       backoff_initial_s=0.05, backoff_max_s=0.5)
    # a slice that exists before the watch starts comes with the list
    await create(api, version, ns, pod_slice(ns, "llm", [("10.1.0.1", False)], [("http", 8000)], name="llm-x1"))
    tasks = [asyncio.create_task(i.run()) for i in watch.informers]
    try:
        await eventually(lambda: watch.synced, "informer never synced")
        assert table.lookup(f"{ns}/llm", None) is None  # not fronted: no activator slice yet
        await create(api, version, ns, activator_slice(ns, "llm", "llm-deploy"))
        await eventually(lambda: table.lookup(None, f"llm.{ns}.svc") is not None, "activator slice not seen")
        route = table.lookup(f"{ns}/llm", None)
        assert route is not None and route.model == "llm-deploy" and route.backends == ()
        await replace(api, version, ns, pod_slice(ns, "llm", [("10.1.0.1", True)], [("http", 8000)], name="llm-x1"))
        await eventually(lambda: route.backends == ("http://10.1.0.1:8000",), "ready endpoint not a backend")
        assert changes and changes[-1] is route
        # a slice of a Service nobody fronts changes nothing
        await create(api, version, ns, pod_slice(ns, "other", [("10.1.0.9", True)], [("http", 80)], name="o-1"))
        await asyncio.sleep(0.3)
        assert table.lookup(f"{ns}/other", None) is None
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
