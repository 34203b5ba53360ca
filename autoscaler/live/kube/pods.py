"""Live pods, read once per view: the fields every step of the translation looks at, oldest first.

"Live" means not ``Succeeded``/``Failed``: a terminal pod is gone for every purpose of the translation (it
holds no GPU, is no replica, no borrower, and blocks no MIG re-layout).

:func:`slim_pod` is the pods informer's ``transform``: the cache keeps only the fields the readers of cached pods
look at (this module, :mod:`~autoscaler.live.kube.translate`, :mod:`~autoscaler.live.kube.training`,
:mod:`~autoscaler.live.kube.gpu_nodes`), so a cluster-wide pod cache holds no one's environment variables,
volumes, command lines or managedFields (less memory, and no secrets passed in env in the controller's heap).
The lending and MIG actuators read the pods they act on from the server, never from this cache.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from autoscaler.live.kube.fields import metadata, parse_time
from autoscaler.live.kube.gpu_nodes import pod_gpu_requests
from autoscaler.live.kube.objects import PREFIX, object_key

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

# What the readers of cached pods use, and nothing else (a field added to a reader must be added here too:
# tests/live/test_pod_slimming.py compares views of slimmed and full pods).
_META_KEEP = ("name", "namespace", "uid", "resourceVersion", "labels", "creationTimestamp", "deletionTimestamp",
              "ownerReferences")
# resourceClaims / resourceClaimStatuses: which DRA claims the pod holds (live/kube/dra.py reads the device from them)
# overhead: part of what the scheduler counts against a node's allocatable (live/kube/host.py)
_SPEC_KEEP = ("nodeName", "terminationGracePeriodSeconds", "resourceClaims", "overhead")
_STATUS_KEEP = ("phase", "conditions", "startTime", "resourceClaimStatuses")


def _slim_containers(containers: Any) -> list[dict[str, Any]]:
    """Each container's name and resource limits/requests (what GPU requests and the first container's name
    are read from); env, command, image, probes and mounts are dropped."""
    out = []
    for c in containers or ():
        if not isinstance(c, Mapping):
            continue
        slim: dict[str, Any] = {}
        for k in ("name", "restartPolicy"):  # restartPolicy Always: a sidecar init container (its requests add up)
            if k in c:
                slim[k] = c[k]
        res = c.get("resources")
        if isinstance(res, Mapping):
            slim["resources"] = {k: res[k] for k in ("limits", "requests") if k in res}
        out.append(slim)
    return out


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict with only what the translation reads of a pod (the pods informer's ``transform``).

    Kept: kind/apiVersion; metadata name, namespace, uid, resourceVersion (the informer compares it), labels,
    creation and deletion times, ownerReferences, and only slotwise's own annotations (``slotwise.io/*``, e.g.
    the last checkpoint); spec nodeName, terminationGracePeriodSeconds and each (init) container's name and
    resources; status phase, conditions and startTime. Everything else (env, volumes, managedFields,
    ``kubectl.kubernetes.io/last-applied-configuration`` ...) is dropped.
    """
    out: dict[str, Any] = {k: pod[k] for k in ("kind", "apiVersion") if k in pod}
    meta = pod.get("metadata")
    if isinstance(meta, Mapping):
        slim_meta = {k: meta[k] for k in _META_KEEP if k in meta}
        annotations = meta.get("annotations")
        if isinstance(annotations, Mapping):
            ours = {k: v for k, v in annotations.items() if str(k).startswith(PREFIX)}
            if ours:
                slim_meta["annotations"] = ours
        out["metadata"] = slim_meta
    spec = pod.get("spec")
    if isinstance(spec, Mapping):
        slim_spec = {k: spec[k] for k in _SPEC_KEEP if k in spec}
        for k in ("containers", "initContainers"):
            if k in spec:
                slim_spec[k] = _slim_containers(spec[k])
        out["spec"] = slim_spec
    status = pod.get("status")
    if isinstance(status, Mapping):
        out["status"] = {k: status[k] for k in _STATUS_KEEP if k in status}
    return out


@dataclass
class LivePod:
    obj: Mapping[str, Any]  # the pod as served (the informer's cached dict: never modified)
    key: str  # "<namespace>/<name>"
    namespace: str
    labels: Mapping[str, str]
    node: str | None  # spec.nodeName; None while pending
    gpus: dict[str, int]  # GPU resource -> count (pod_gpu_requests)
    created: float  # creationTimestamp, epoch seconds


def live_pods(pods: Iterable[Mapping[str, Any]], now: float) -> list[LivePod]:
    """The pods that are not terminal, oldest first (ties by key), so that allocating them is deterministic."""
    live: list[LivePod] = []
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") in _TERMINAL_PHASES:
            continue
        meta = metadata(pod)
        spec = pod.get("spec") or {}
        live.append(LivePod(
            obj=pod,
            key=object_key(pod),
            namespace=str(meta.get("namespace") or ""),
            labels=meta.get("labels") or {},
            node=spec.get("nodeName") or None,
            gpus=pod_gpu_requests(spec),
            # The API always sets creationTimestamp; without one a pod is taken as new, never as long-lived.
            created=parse_time(meta.get("creationTimestamp")) or now,
        ))
    live.sort(key=lambda p: (p.created, p.key))
    return live
