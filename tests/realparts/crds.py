"""Install CustomResourceDefinitions on the test apiserver for a block, Established, and remove them after it.

The real kube-apiserver the tests start (1.20.2) serves no add-on APIs (Kueue, LeaderWorkerSet, Argo Rollouts,
KEDA) and no ``resource.k8s.io`` (Dynamic Resource Allocation, GA in 1.34): the tests serve those as CRDs carrying
the upstream schemas (each YAML file here says which upstream version it copies). Other tests expect none of them,
so every block removes what it installed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

HERE = Path(__file__).resolve().parent


@contextlib.asynccontextmanager
async def crds_installed(api: client.ApiClient, *files: str | Path) -> AsyncIterator[list[str]]:
    """The CRDs of ``files`` (YAML streams; relative names are in tests/realparts/) installed and Established for
    the block, their names yielded; deleted (and gone) after it."""
    ext = client.ApiextensionsV1Api(api)
    docs = [d for f in files for d in yaml.safe_load_all((HERE / f).read_text()) if d]
    created = []
    try:
        for crd in docs:
            try:
                await ext.create_custom_resource_definition(crd)
                created.append(crd["metadata"]["name"])
            except ApiException as e:
                if e.status != 409:
                    raise
        for crd in docs:
            for _ in range(200):
                got = await ext.read_custom_resource_definition(crd["metadata"]["name"])
                if any(c.type == "Established" and c.status == "True" for c in got.status.conditions or ()):
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail(f"CRD {crd['metadata']['name']} never Established")
        yield [d["metadata"]["name"] for d in docs]
    finally:
        for name in created:
            with contextlib.suppress(ApiException):
                await ext.delete_custom_resource_definition(name)
        for name in created:  # wait until gone (the apiserver's own finalizer removes the objects first)
            for _ in range(400):
                try:
                    await ext.read_custom_resource_definition(name)
                except ApiException as e:
                    if e.status == 404:
                        break
                    raise
                await asyncio.sleep(0.05)
