"""What the controller watches beyond Deployments, Pods, Nodes and training workloads (issue 17), and at which path.

Each :class:`Watch` is one collection: the scalable workloads other than Deployments (StatefulSet,
LeaderWorkerSet, Argo Rollout), the autoscalers that may already own a workload's ``/scale`` (HPA, KEDA
ScaledObject), and Dynamic Resource Allocation's ResourceSlices and ResourceClaims. Which ``build_view`` input an
object feeds is its watch's ``role``.

The version comes from discovery (:mod:`~autoscaler.live.kube.discovery`): the newest one both slotwise and the
server speak. Before discovery has answered (or when it failed) a watch uses its ``fallback`` version, chosen so
that it is served wherever the group exists at all: HPAs are read as ``autoscaling/v1`` then (served from 1.2 to
today; ``scaleTargetRef`` is all slotwise reads of them). Every watch of an add-on group is optional: a 404 reads
as "none", so a cluster without LeaderWorkerSet, Argo Rollouts, KEDA or DRA is a cluster with none of them.

Objects in a list response carry no ``kind``/``apiVersion`` for built-in types; :func:`stamped` adds them, so the
translation can tell a StatefulSet from a LeaderWorkerSet whichever informer it came from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoscaler.live.kube.discovery import (
    ARGO_ROLLOUTS,
    AUTOSCALING,
    DISCOVERY,
    KEDA,
    LEADERWORKERSET,
    RESOURCE,
    ServedApis,
    collection_path,
)

# build_view inputs a watch may feed
WORKLOADS = "workloads"
AUTOSCALERS = "autoscalers"
RESOURCE_SLICES = "resource_slices"
RESOURCE_CLAIMS = "resource_claims"
RESOURCE_CLAIM_TEMPLATES = "resource_claim_templates"
DEVICE_CLASSES = "device_classes"
ENDPOINT_SLICES = "endpoint_slices"


@dataclass(frozen=True)
class Watch:
    name: str  # the informer's name (logs, frozen-cache messages)
    kind: str
    group: str
    versions: tuple[str, ...]  # what slotwise speaks, newest first
    fallback: str  # the version used until discovery says otherwise
    resource: str  # plural
    role: str  # which build_view input it feeds
    scoped: bool  # True: follows the controller's namespace scope (models and their autoscalers); False: cluster
    optional: bool = True  # a 404 (the group not served) reads as "none"
    selected: bool = False  # the controller's label selector applies (workloads only, as for Deployments)
    labels: str | None = None  # a fixed label selector of its own (the controller's activator slices)

    def version(self, apis: ServedApis | None) -> str:
        """The discovered version; the fallback before discovery answered or when it failed (its assumptions are
        no evidence about this server)."""
        got = apis.version(self.group, self.versions) if apis is not None and apis.discovered else None
        return got or self.fallback

    def path(self, apis: ServedApis | None, namespace: str | None) -> str:
        return collection_path(self.group, self.version(apis), self.resource, namespace if self.scoped else None)

    def api_version(self, path: str) -> str:
        """``group/version`` as the objects of ``path`` carry it."""
        version = path.split(f"/apis/{self.group}/", 1)[1].split("/", 1)[0]
        return f"{self.group}/{version}"


WATCHES: tuple[Watch, ...] = (
    Watch("statefulsets", "StatefulSet", "apps", ("v1",), "v1", "statefulsets", WORKLOADS, scoped=True,
          optional=False, selected=True),
    Watch("leaderworkersets", "LeaderWorkerSet", *LEADERWORKERSET, "v1", "leaderworkersets", WORKLOADS,
          scoped=True, selected=True),
    Watch("rollouts", "Rollout", *ARGO_ROLLOUTS, "v1alpha1", "rollouts", WORKLOADS, scoped=True, selected=True),
    Watch("horizontalpodautoscalers", "HorizontalPodAutoscaler", AUTOSCALING[0], (*AUTOSCALING[1], "v1"), "v1",
          "horizontalpodautoscalers", AUTOSCALERS, scoped=True, optional=False),
    Watch("scaledobjects", "ScaledObject", *KEDA, "v1alpha1", "scaledobjects", AUTOSCALERS, scoped=True),
    # cluster-wide whatever the scope, like pods and nodes: the inventory must see every GPU and every claim on one
    Watch("resourceslices", "ResourceSlice", *RESOURCE, "v1", "resourceslices", RESOURCE_SLICES, scoped=False),
    Watch("resourceclaims", "ResourceClaim", *RESOURCE, "v1", "resourceclaims", RESOURCE_CLAIMS, scoped=False),
    # which devices the classes slotwise's claims name select (issue 30; cluster-scoped objects)
    Watch("deviceclasses", "DeviceClass", *RESOURCE, "v1", "deviceclasses", DEVICE_CLASSES, scoped=False),
    # what a DRA model's pods ask for (the models' namespaces)
    Watch("resourceclaimtemplates", "ResourceClaimTemplate", *RESOURCE, "v1", "resourceclaimtemplates",
          RESOURCE_CLAIM_TEMPLATES, scoped=True),
)


# Issue 18: the controller's own activator EndpointSlices (autoscaler/live/kube/routing.py), watched only with the
# activator enabled (Controller.__init__). Required: with the activator on, "cannot list them" must not read as "no
# model goes through the activator" (that would take traffic away from the activator's held requests).
ENDPOINT_SLICE_WATCH = Watch("endpointslices", "EndpointSlice", *DISCOVERY, "v1", "endpointslices", ENDPOINT_SLICES,
                             scoped=True, optional=False,
                             labels="endpointslice.kubernetes.io/managed-by=slotwise.io")


def stamped(kind: str, api_version: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """An informer transform that sets ``kind`` and ``apiVersion`` on every object (list items lack them)."""

    def stamp(obj: dict[str, Any]) -> dict[str, Any]:
        if obj.get("kind") == kind and obj.get("apiVersion") == api_version:
            return obj
        return {**obj, "kind": kind, "apiVersion": api_version}

    return stamp


def by_role(items: Mapping[Watch, Sequence[dict]]) -> dict[str, list[dict]]:
    """The watched objects grouped by the ``build_view`` input they feed (every role of :data:`WATCHES` present,
    maybe empty; ``endpoint_slices`` only when watched: absent is "the activator is not enabled")."""
    out: dict[str, list[dict]] = {WORKLOADS: [], AUTOSCALERS: [], RESOURCE_SLICES: [], RESOURCE_CLAIMS: [],
                                  RESOURCE_CLAIM_TEMPLATES: []}
    for watch, objs in items.items():
        out.setdefault(watch.role, []).extend(objs)
    return out
