"""Which API groups and versions the apiserver serves: asked once at start (``/api``, ``/apis``), then pure lookups.

Everything versioned that slotwise reads or writes is addressed through :class:`ServedApis` -- policy (Eviction,
PodDisruptionBudget), autoscaling (HorizontalPodAutoscaler), coordination (Lease), ``resource.k8s.io`` (Dynamic
Resource Allocation), discovery.k8s.io (EndpointSlices), Kueue, LeaderWorkerSet, Argo Rollouts, KEDA -- so one
binary works on Kubernetes 1.20 through 1.35+ and with whichever version of an add-on is installed. Each caller
names the versions it can speak, newest first; :meth:`ServedApis.version` answers the first of those the server
serves (None: the group or every version of it is absent, so the feature is off and says so).

Discovery that fails (apiserver slow at start, RBAC) leaves :data:`ASSUMED`: what a current cluster serves for the
built-in groups, nothing for add-ons. Informers on an assumed path are optional where the group is: a 404 there
reads as "none of these".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("slotwise.discovery")

# The groups slotwise speaks, and the versions it can speak for each, newest first.
POLICY = ("policy", ("v1", "v1beta1"))
AUTOSCALING = ("autoscaling", ("v2", "v2beta2"))
COORDINATION = ("coordination.k8s.io", ("v1",))
RESOURCE = ("resource.k8s.io", ("v1", "v1beta2", "v1beta1"))
KUEUE = ("kueue.x-k8s.io", ("v1beta2", "v1beta1"))
LEADERWORKERSET = ("leaderworkerset.x-k8s.io", ("v1",))
ARGO_ROLLOUTS = ("argoproj.io", ("v1alpha1",))
KEDA = ("keda.sh", ("v1alpha1",))
APPS = ("apps", ("v1",))
DISCOVERY = ("discovery.k8s.io", ("v1", "v1beta1"))  # EndpointSlices: v1 from 1.21, v1beta1 on 1.17-1.20


@dataclass(frozen=True)
class ServedApis:
    """group -> the versions the server serves for it, its preferred version first (core: group ``""``)."""

    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    discovered: bool = True  # False: discovery failed and these are assumptions (ASSUMED)

    def served(self, group: str, version: str) -> bool:
        return version in self.groups.get(group, ())

    def version(self, group: str, speak: Sequence[str]) -> str | None:
        """The newest version of ``group`` both slotwise (``speak``, newest first) and the server know."""
        have = self.groups.get(group, ())
        return next((v for v in speak if v in have), None)

    def pick(self, wanted: tuple[str, Sequence[str]]) -> str | None:
        """:meth:`version` for one of the module's ``(group, versions)`` pairs, e.g. ``apis.pick(POLICY)``."""
        return self.version(*wanted)

    def group_version(self, wanted: tuple[str, Sequence[str]]) -> str | None:
        """``"<group>/<version>"`` (``apiVersion`` as objects carry it) or None when not served."""
        v = self.pick(wanted)
        return None if v is None else (f"{wanted[0]}/{v}" if wanted[0] else v)


def collection_path(group: str, version: str, resource: str, namespace: str | None = None) -> str:
    """The collection path of ``resource``: ``/api/v1/...`` for the core group, ``/apis/<g>/<v>/...`` otherwise,
    under ``namespaces/<ns>/`` when one is given."""
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    return f"{base}/namespaces/{namespace}/{resource}" if namespace else f"{base}/{resource}"


# What a current cluster serves of the built-in groups; used when discovery fails. Add-ons are not assumed.
ASSUMED = ServedApis(
    # autoscaling: only v1, served from 1.2 to today (v2 is 1.23+): an assumption must hold on any server
    groups={"": ("v1",), "apps": ("v1",), "policy": ("v1",), "autoscaling": ("v1",),
            "coordination.k8s.io": ("v1",)},
    discovered=False,
)


def parse_group_list(core: Mapping[str, Any] | None, groups: Mapping[str, Any] | None) -> ServedApis:
    """``GET /api`` (APIVersions) and ``GET /apis`` (APIGroupList) -> :class:`ServedApis`. Pure."""
    out: dict[str, tuple[str, ...]] = {}
    if core:
        out[""] = tuple(str(v) for v in core.get("versions") or ())
    for g in (groups or {}).get("groups") or ():
        name = str(g.get("name") or "")
        versions = [str(v.get("version")) for v in g.get("versions") or () if v.get("version")]
        preferred = (g.get("preferredVersion") or {}).get("version")
        if preferred in versions:
            versions.remove(preferred)
            versions.insert(0, preferred)
        out[name] = tuple(versions)
    return ServedApis(groups=out)


async def discover(api_client: Any) -> ServedApis:
    """Ask the server (``/api`` and ``/apis``: two requests). On any failure: :data:`ASSUMED`, with a warning."""
    from kubernetes_asyncio.client import ApisApi, CoreApi

    try:
        core = api_client.sanitize_for_serialization(await CoreApi(api_client).get_api_versions())
        groups = api_client.sanitize_for_serialization(await ApisApi(api_client).get_api_versions())
    except Exception as e:  # the controller must start anyway; the informers on optional paths tell the rest
        log.warning("API discovery failed (%s: %s): assuming a current cluster's built-in groups, no add-ons",
                    type(e).__name__, e)
        return ASSUMED
    return parse_group_list(core, groups)
