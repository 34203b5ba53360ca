"""The EndpointSlice informers that feed the activator's :class:`~autoscaler.live.activator.routes.RouteTable`.

One :class:`~autoscaler.live.kube.informer.Informer` per namespace (or one cluster-wide) on the EndpointSlices
that belong to a Service (label ``kubernetes.io/service-name``), at ``discovery.k8s.io`` v1, or v1beta1 where the
server has no v1 (Kubernetes < 1.21). Slices are slimmed to what the routes read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from autoscaler.live.activator.routes import Route, RouteTable
from autoscaler.live.kube.discovery import ServedApis, collection_path
from autoscaler.live.kube.informer import RELIST, Informer
from autoscaler.live.kube.objects import SERVICE_NAME_LABEL

GROUP = "discovery.k8s.io"
VERSIONS = ("v1", "v1beta1")


def slice_version(apis: ServedApis) -> str:
    """The EndpointSlice version to watch (v1 when discovery failed: every supported server past 1.20 has it)."""
    return apis.version(GROUP, VERSIONS) or "v1"


def slim_slice(s: dict[str, Any]) -> dict[str, Any]:
    meta = s.get("metadata") or {}
    return {
        "metadata": {k: meta.get(k) for k in ("name", "namespace", "labels", "resourceVersion")},
        "addressType": s.get("addressType"),
        "ports": s.get("ports") or [],
        "endpoints": [{"addresses": e.get("addresses") or [], "conditions": e.get("conditions") or {}}
                      for e in s.get("endpoints") or ()],
    }


class SliceWatch:
    """Informers -> ``table``; ``on_change(route)`` after every change of a fronted Service."""

    def __init__(self, api_client: Any, table: RouteTable, on_change: Callable[[Route], None], *,
                 version: str = "v1", namespaces: Sequence[str] = (), **informer_kwargs: Any) -> None:
        self.table = table
        self.on_change = on_change
        self.informers = [
            Informer(api_client, collection_path(GROUP, version, "endpointslices", ns or None),
                     label_selector=SERVICE_NAME_LABEL, transform=slim_slice, **informer_kwargs)
            for ns in (namespaces or [""])
        ]
        for inf in self.informers:
            inf.subscribe(self._event)

    @property
    def synced(self) -> bool:
        return all(i.synced for i in self.informers)

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == RELIST:
            slices = [s for inf in self.informers for s in inf.items()]
            for route in self.table.replace(slices):
                self.on_change(route)
            return
        route = self.table.apply(kind, obj)
        if route is not None:
            self.on_change(route)
