"""Kueue's CRDs on the test apiserver (a bare apiserver serves no Kueue): ``kueue_crds.yaml`` (ClusterQueue and
Workload, v1beta1 and v1beta2 served, in the upstream schema's shape for the fields slotwise uses) installed,
Established, and removed again -- other tests expect no Kueue."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

CRDS = Path(__file__).resolve().parent / "kueue_crds.yaml"


@contextlib.asynccontextmanager
async def kueue_installed(api: client.ApiClient) -> AsyncIterator[None]:
    """The CRDs installed and Established for the block; deleted (and gone) after it."""
    ext = client.ApiextensionsV1Api(api)
    docs = [d for d in yaml.safe_load_all(CRDS.read_text()) if d]
    created = []
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
    try:
        yield
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
