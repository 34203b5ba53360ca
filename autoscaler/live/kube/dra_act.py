"""The actuator's DRA calls: read the NVIDIA driver's ResourceSlices fresh (what a template write or a MIG refusal is
decided on) and create ResourceClaimTemplates, in the ``resource.k8s.io`` version the server serves (discovery).

Fresh reads, not the informers' cache, as the MIG gate reads a node before it acts: both actions are rare (a
model's first placements; a re-layout) and rate-limited. What is rendered is pure, in
:mod:`~autoscaler.live.kube.dra_claims`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client import CustomObjectsApi
from kubernetes_asyncio.client.rest import ApiException

from autoscaler.live.kube.discovery import RESOURCE, ServedApis, discover
from autoscaler.live.kube.dra import DraInventory, read_slices
from autoscaler.live.kube.objects import FIELD_MANAGER
from sharing.catalog import Catalog, load_catalog

GROUP = RESOURCE[0]


class DraActuation:
    """One per actuator; ``apis`` the controller's discovery when handed over, else asked on first use."""

    def __init__(self, api_client: Any, apis: ServedApis | None = None, catalog: Catalog | None = None) -> None:
        self.api_client = api_client
        self.apis = apis
        self.catalog = catalog if catalog is not None else load_catalog()
        self._custom = CustomObjectsApi(api_client)

    async def version(self) -> str | None:
        """The ``resource.k8s.io`` version to speak (v1, v1beta2, v1beta1), None when DRA is not served."""
        if self.apis is None or not self.apis.discovered:  # a failed discovery is asked again, not kept
            self.apis = await discover(self.api_client)
        return self.apis.pick(RESOURCE)

    async def inventory(self, node_labels: Mapping[str, Mapping[str, str]] | None = None) -> DraInventory:
        """The DRA nodes as the server shows them now (none where DRA is not served)."""
        version = await self.version()
        if version is None:
            return DraInventory()
        got = await self._custom.list_cluster_custom_object(GROUP, version, "resourceslices")
        return read_slices(got.get("items") or (), self.catalog, node_labels, await self._device_classes(version))

    async def _device_classes(self, version: str) -> list[dict[str, Any]] | None:
        """The DeviceClasses (which devices slotwise's claims may get); None where the collection is not served
        (then only device taints count, as in a view built without them)."""
        try:
            got = await self._custom.list_cluster_custom_object(GROUP, version, "deviceclasses")
        except ApiException as e:
            if e.status != 404:
                raise
            return None
        return list(got.get("items") or ())

    async def ensure_claim_template(self, body: Mapping[str, Any]) -> str:
        """Create the ResourceClaimTemplate; "created", or "exists" (its name is its spec's hash, and the spec is
        immutable: one that exists is the same)."""
        version = str(body["apiVersion"]).split("/", 1)[1]
        ns = str(body["metadata"]["namespace"])
        try:
            await self._custom.create_namespaced_custom_object(GROUP, version, ns, "resourceclaimtemplates",
                                                               dict(body), field_manager=FIELD_MANAGER)
        except ApiException as e:
            if e.status != 409:
                raise
            return "exists"
        return "created"
