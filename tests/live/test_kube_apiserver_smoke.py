"""Smoke tests against a REAL kube-apiserver 1.20.2 + etcd (``realparts.kube``), through kubernetes_asyncio.

What the controller will lean on: Deployments with ``slotwise.io/*`` annotations (create, read back), the
``scale`` subresource, list+watch from a resourceVersion, and coordination.k8s.io/v1 Leases (leader election:
create, renew with optimistic concurrency). The first use builds and caches the apiserver binary (minutes);
without it (no root/apt/network, or ``SLOTWISE_BUILD_KUBE=0`` and no cache) these tests SKIP.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.rest import ApiException

if TYPE_CHECKING:
    from realparts.kube import KubeApiserver

# the real kube-apiserver fixture (module imported by pytest as a plugin, so its asserts are rewritten)
pytest_plugins = ("realparts.kube",)

pytestmark = pytest.mark.asyncio

ANNOTATIONS = {
    "slotwise.io/model": "llama-3-8b",
    "slotwise.io/slo-p95-ms": "250",
    "slotwise.io/slot-kind": "mig-3g.40gb",
}


def micro_time(when: datetime | None = None) -> str:
    """A Kubernetes MicroTime (RFC 3339, always 6 fractional digits: the server rejects e.g. ``...05+00:00``)."""
    return (when or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest_asyncio.fixture
async def namespace(api: client.ApiClient) -> str:
    name = f"slotwise-smoke-{uuid.uuid4().hex[:8]}"
    await client.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name  # no controller-manager: a deleted namespace would only sit in Terminating, so it is left


def deployment(name: str, replicas: int = 1) -> dict:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels, "annotations": dict(ANNOTATIONS)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "server",
                            "image": "registry.invalid/vllm:test",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ]
                },
            },
        },
    }


async def test_server_version_and_auth(kube_apiserver: KubeApiserver, api: client.ApiClient) -> None:
    info = await client.VersionApi(api).get_code()
    assert (info.major, info.minor.rstrip("+")) == ("1", "20")
    config = kube_apiserver.client_configuration()
    config.api_key = {"BearerToken": "not-the-token"}
    async with client.ApiClient(configuration=config) as wrong:
        with pytest.raises(ApiException) as err:
            await client.CoreV1Api(wrong).list_namespace()
    assert err.value.status == 401


async def test_deployment_with_annotations_roundtrip(api: client.ApiClient, namespace: str) -> None:
    apps = client.AppsV1Api(api)
    created = await apps.create_namespaced_deployment(namespace, deployment("llm-a", replicas=2))
    assert created.metadata.uid
    got = await apps.read_namespaced_deployment("llm-a", namespace)
    assert got.metadata.annotations is not None
    assert {k: got.metadata.annotations.get(k) for k in ANNOTATIONS} == ANNOTATIONS
    assert got.spec.replicas == 2
    assert got.spec.template.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
    listed = await apps.list_namespaced_deployment(namespace, label_selector="app=llm-a")
    assert [d.metadata.name for d in listed.items] == ["llm-a"]


async def test_scale_subresource(api: client.ApiClient, namespace: str) -> None:
    apps = client.AppsV1Api(api)
    await apps.create_namespaced_deployment(namespace, deployment("llm-b", replicas=1))
    scale = await apps.read_namespaced_deployment_scale("llm-b", namespace)
    assert scale.spec.replicas == 1
    patched = await apps.patch_namespaced_deployment_scale("llm-b", namespace, {"spec": {"replicas": 4}})
    assert patched.spec.replicas == 4
    assert (await apps.read_namespaced_deployment("llm-b", namespace)).spec.replicas == 4
    # annotations survive a scale change
    got = await apps.read_namespaced_deployment("llm-b", namespace)
    assert got.metadata.annotations["slotwise.io/model"] == "llama-3-8b"


async def test_list_then_watch_sees_scale_change(api: client.ApiClient, namespace: str) -> None:
    apps = client.AppsV1Api(api)
    await apps.create_namespaced_deployment(namespace, deployment("llm-c", replicas=1))
    listed = await apps.list_namespaced_deployment(namespace)
    assert [d.metadata.name for d in listed.items] == ["llm-c"]
    resource_version = listed.metadata.resource_version

    async def first_modified() -> dict:
        async with watch.Watch().stream(
            apps.list_namespaced_deployment, namespace, resource_version=resource_version, timeout_seconds=30
        ) as stream:
            async for event in stream:
                if event["type"] == "MODIFIED":
                    return event
        raise AssertionError("watch ended without a MODIFIED event")

    watcher = asyncio.create_task(first_modified())
    await asyncio.sleep(0.2)  # not needed for correctness: the watch starts at the list's resourceVersion anyway
    await apps.patch_namespaced_deployment_scale("llm-c", namespace, {"spec": {"replicas": 3}})
    event = await asyncio.wait_for(watcher, timeout=40)
    assert isinstance(event["object"], client.V1Deployment)
    assert event["object"].metadata.name == "llm-c"
    assert event["object"].spec.replicas == 3
    assert event["raw_object"]["metadata"]["annotations"]["slotwise.io/slo-p95-ms"] == "250"


async def test_lease_create_and_renew(api: client.ApiClient, namespace: str) -> None:
    leases = client.CoordinationV1Api(api)
    now = micro_time()
    created = await leases.create_namespaced_lease(
        namespace,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "slotwise-leader"},
            "spec": {
                "holderIdentity": "slotwise-0",
                "leaseDurationSeconds": 15,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        },
    )
    assert created.spec.holder_identity == "slotwise-0"
    first_renew = created.spec.renew_time

    await asyncio.sleep(0.01)
    body = (await leases.read_namespaced_lease("slotwise-leader", namespace)).to_dict()
    renewed = await leases.replace_namespaced_lease(
        "slotwise-leader",
        namespace,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "slotwise-leader", "resourceVersion": body["metadata"]["resource_version"]},
            "spec": {
                "holderIdentity": "slotwise-0",
                "leaseDurationSeconds": 15,
                "acquireTime": micro_time(body["spec"]["acquire_time"]),
                "renewTime": micro_time(),
                "leaseTransitions": 0,
            },
        },
    )
    assert renewed.spec.renew_time > first_renew
    assert renewed.metadata.resource_version != body["metadata"]["resource_version"]

    # a second candidate renewing from the stale resourceVersion loses (optimistic concurrency -> 409)
    with pytest.raises(ApiException) as err:
        await leases.replace_namespaced_lease(
            "slotwise-leader",
            namespace,
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": "slotwise-leader", "resourceVersion": body["metadata"]["resource_version"]},
                "spec": {"holderIdentity": "slotwise-1", "leaseDurationSeconds": 15, "renewTime": micro_time()},
            },
        )
    assert err.value.status == 409
    assert (await leases.read_namespaced_lease("slotwise-leader", namespace)).spec.holder_identity == "slotwise-0"
