"""Live pods, read once per view: the fields every step of the translation looks at, oldest first.

"Live" means not ``Succeeded``/``Failed``: a terminal pod is gone for every purpose of the translation (it
holds no GPU, is no replica, no borrower, and blocks no MIG re-layout).

:func:`slim_pod` is the pods informer's ``transform``: the cache keeps only the fields the readers of cached pods
look at (this module, :mod:`~autoscaler.live.kube.translate`, :mod:`~autoscaler.live.kube.training`,
:mod:`~autoscaler.live.kube.gpu_nodes`), so a cluster-wide pod cache holds no one's environment variables,
volumes, command lines or managedFields (less memory, and no secrets passed in env in the controller's heap).
The lending and MIG actuators read the pods they act on from the server, never from this cache.

:class:`PodScope` is its ``keep`` (issue 30): the informer stays cluster-wide (another namespace's GPUs are never
free), but a namespaced controller caches -- and reads each tick -- only the pods that can matter to it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autoscaler.live.kube.fields import metadata, parse_time
from autoscaler.live.kube.gpu_nodes import is_gpu_node, pod_gpu_requests
from autoscaler.live.kube.objects import PREEMPTIBLE_LABEL, PREFIX, object_key

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


@dataclass
class PodScope:
    """Which pods the controller's cluster-wide pods informer caches (its ``keep``), so that namespace mode does not
    hold and read every pod of the cluster each tick. The API has no selector for "requests a GPU" (field selectors
    on pods cover names, node, phase), so this is decided at the informer's ingest, per listed or watched pod.

    Never a terminal pod (``Succeeded``/``Failed``: nobody's replica, holds nothing; :func:`live_pods` skips them
    anyway). With ``namespaces`` None (every namespace in scope) every other pod. Else a pod is kept when any of:

    - it is in a namespace in scope (a model's replica, whatever it requests);
    - it requests GPUs (``nvidia.com/gpu``, ``nvidia.com/mig-*``) or claims DRA devices (``spec.resourceClaims``):
      the inventory must see every GPU in use, whoever's;
    - it is a preemptible training pod (``slotwise.io/preemptible=true``: the lend stage's);
    - it is bound to a GPU node (:func:`~autoscaler.live.kube.gpu_nodes.is_gpu_node`, or named by DRA
      ResourceSlices): its CPU and memory count against the host capacity slots may use (``host.py``), and the MIG
      gate and lending see every pod on such a node.

    What is dropped: other namespaces' pods without GPUs on nodes without GPUs, and pending ones (bound later to a
    GPU node, the binding's event keeps them). The GPU nodes come from the nodes and ResourceSlices informers
    (:meth:`on_node`, :meth:`on_slice`; the pods informer waits for their first sync); a node that turns into a GPU
    node later (its device plugin started after the node's first pods were bound) calls ``relist`` once (the pods
    informer's :meth:`~autoscaler.live.kube.informer.Informer.request_relist`: only a list brings back what was
    dropped). Nodes leave the set only when deleted (a device plugin restarting does not make a node lose its pods).
    """

    namespaces: Collection[str] | None
    relist: Callable[[], None] = lambda: None
    gpu_nodes: set[str] = field(default_factory=set)  # device-plugin GPU nodes (labels, capacity)
    dra_nodes: dict[str, set[str]] = field(default_factory=dict)  # node -> the ResourceSlices naming it
    # the informers the GPU nodes are read from (nodes, ResourceSlices: as discovery placed them); a node joining
    # before all of them synced once is their first list (the pods informer lists after it), and asks for no relist
    sources: Callable[[], Iterable[Any]] = tuple

    def nodes_known(self) -> bool:
        return all(inf.synced for inf in self.sources())

    def keep(self, pod: Mapping[str, Any]) -> bool:
        status = pod.get("status") or {}
        if status.get("phase") in _TERMINAL_PHASES:
            return False
        if self.namespaces is None:
            return True
        meta = metadata(pod)
        if meta.get("namespace") in self.namespaces:
            return True
        spec = pod.get("spec") or {}
        if spec.get("resourceClaims") or pod_gpu_requests(spec):
            return True
        if (meta.get("labels") or {}).get(PREEMPTIBLE_LABEL) == "true":
            return True
        node = spec.get("nodeName")
        return bool(node) and (node in self.gpu_nodes or node in self.dra_nodes)

    def on_node(self, kind: str, node: dict[str, Any]) -> None:
        """The nodes informer's subscriber: GPU nodes in, deleted nodes out."""
        name = str(metadata(node).get("name") or "")
        if kind == "DELETED":
            self.gpu_nodes.discard(name)
        elif kind in ("ADDED", "MODIFIED") and name not in self.gpu_nodes and is_gpu_node(node):
            self._joined(name, self.gpu_nodes.add)

    def on_slice(self, kind: str, slice_obj: dict[str, Any]) -> None:
        """The ResourceSlices informer's subscriber: the nodes DRA slices name (a DRA GPU node)."""
        name = str((slice_obj.get("spec") or {}).get("nodeName") or "")
        key = object_key(slice_obj)
        if not name:
            return
        if kind == "DELETED":
            slices = self.dra_nodes.get(name, set())
            slices.discard(key)
            if not slices:
                self.dra_nodes.pop(name, None)
        elif kind in ("ADDED", "MODIFIED"):
            if name in self.dra_nodes:
                self.dra_nodes[name].add(key)
            else:
                self._joined(name, lambda n: self.dra_nodes.setdefault(n, set()).add(key))

    def _joined(self, name: str, add: Callable[[str], None]) -> None:
        known = name in self.gpu_nodes or name in self.dra_nodes
        add(name)
        if not known and self.namespaces is not None and self.nodes_known():
            self.relist()  # pods bound to it before it had GPUs were dropped: only a list brings them back
