"""Kueue's CRDs on the test apiserver (a bare apiserver serves no Kueue): ``kueue_crds.yaml`` (ClusterQueue and
Workload, v1beta1 and v1beta2 served, in the upstream schema's shape for the fields slotwise uses) installed,
Established, and removed again -- other tests expect no Kueue."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from kubernetes_asyncio import client
from realparts.crds import crds_installed

CRDS = Path(__file__).resolve().parent / "kueue_crds.yaml"


@contextlib.asynccontextmanager
async def kueue_installed(api: client.ApiClient) -> AsyncIterator[None]:
    """The CRDs installed and Established for the block; deleted (and gone) after it."""
    async with crds_installed(api, CRDS):
        yield
