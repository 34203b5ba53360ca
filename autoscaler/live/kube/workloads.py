"""The workload kinds a model may be: anything with a ``/scale`` subresource that carries the ``slotwise.io/*``
annotations. Pure: where each kind keeps its pod template, how its pods are found, what a replica is, and at which
path its ``/scale`` is -- the translation (:mod:`~autoscaler.live.kube.translate`) reads objects through these and
the actuator (:mod:`~autoscaler.live.kube.actuator`) writes through them.

- **Deployment** (``apps/v1``) and **StatefulSet** (``apps/v1``): ``spec.template``, pods by ``spec.selector``, one
  pod per replica. A StatefulSet scale-down removes the highest ordinals, so ``pod-deletion-cost`` is no use there.
  Its controller keeps the pods of ordinals ``[start, start + spec.replicas)`` (``spec.ordinals.start``, default
  0) and deletes those above: with a gap below (pods 0, 1, 3, 4 after pod 2 was deleted), ``spec.replicas = 3``
  removes 3 AND 4. :func:`statefulset_replicas_keeping` is the value that removes only the replicas planned.
- **LeaderWorkerSet** (``leaderworkerset.x-k8s.io/v1``, kubernetes-sigs/lws): a replica is a *group* of
  ``spec.leaderWorkerTemplate.size`` pods (default 1): the leader, from ``leaderTemplate`` (absent: the worker
  template), and ``size - 1`` workers from ``workerTemplate``. The LWS controller labels every pod
  ``leaderworkerset.sigs.k8s.io/name=<lws>``, ``.../group-index=<i>`` and ``.../worker-index=<j>`` (0 = the leader);
  the leader pod is named ``<lws>-<i>``, its workers ``<lws>-<i>-<j>``. ``spec.replicas`` counts groups, and a
  scale-down removes the highest group indices (leader and its worker StatefulSet): no per-pod choice either.
- **Rollout** (``argoproj.io/v1alpha1``, Argo Rollouts): ``spec.template`` and ``spec.selector`` like a Deployment,
  pods run by ReplicaSets (so ``pod-deletion-cost`` is honoured). A Rollout with ``spec.workloadRef`` has no template
  of its own: it runs the referenced Deployment's (``kind: Deployment``, same namespace), which the translation
  reads when that Deployment is among the Deployments it is given; the selector is the Rollout's, else the
  Deployment's. Argo's own rule for such a Rollout ("To perform an update, the change should be made to the Pod
  template field of the Deployment", docs/migrating.md) is where the actuator writes its slot template:
  :func:`template_home`. Other referenced kinds are not written (refused ``no-pod-template``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoscaler.live.kube.discovery import APPS, ARGO_ROLLOUTS, LEADERWORKERSET, collection_path

# LeaderWorkerSet pod labels (kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go)
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"


@dataclass(frozen=True)
class WorkloadKind:
    """One scalable workload kind, as slotwise reads and scales it."""

    kind: str
    group: str
    versions: tuple[str, ...]  # what slotwise speaks, newest first (discovery picks the served one)
    resource: str  # plural, for paths
    template_paths: tuple[tuple[str, ...], ...]  # where the pod templates are; slot resources read from the first
    grouped: bool = False  # a replica is a group of pods (LeaderWorkerSet)
    # a scale-down honours controller.kubernetes.io/pod-deletion-cost (ReplicaSets: Deployment, Rollout); the
    # others remove the highest ordinals / group indices whatever the pods say
    deletion_cost: bool = True

    @property
    def api(self) -> tuple[str, tuple[str, ...]]:
        """The ``(group, versions)`` pair discovery takes (``ServedApis.pick``)."""
        return (self.group, self.versions)

    def api_version(self, version: str | None = None) -> str:
        return f"{self.group}/{version or self.versions[0]}" if self.group else (version or self.versions[0])

    def object_path(self, version: str, namespace: str, name: str) -> str:
        return f"{collection_path(self.group, version, self.resource, namespace)}/{name}"

    def scale_path(self, version: str, namespace: str, name: str) -> str:
        return self.object_path(version, namespace, name) + "/scale"

    def templates(self, obj: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
        """``(JSON pointer, pod template)`` of every template the object has, the primary one first."""
        out = []
        for path in self.template_paths:
            node: Any = obj
            for part in path:
                node = node.get(part) if isinstance(node, Mapping) else None
            if isinstance(node, Mapping):
                out.append(("/" + "/".join(path), node))
        return out

    def template(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """The primary pod template ({} when there is none, e.g. a Rollout with ``workloadRef``)."""
        got = self.templates(obj)
        return got[0][1] if got else {}

    def containers(self, obj: Mapping[str, Any], container: str) -> list[tuple[str, int]]:
        """Where a slot change goes: ``(JSON pointer of the pod template, container index)`` for each template, the
        container named ``container`` (the model's, :attr:`ManagedModel.container`), else -- in a template other than
        the primary one, e.g. a LeaderWorkerSet's ``leaderTemplate`` whose container is named differently -- its first
        container: every pod of a group holds ``gpus-per-replica`` GPUs of the same slot kind."""
        out = []
        for i, (path, tmpl) in enumerate(self.templates(obj)):
            names = [c.get("name") for c in (tmpl.get("spec") or {}).get("containers") or [] if isinstance(c, Mapping)]
            if container in names:
                out.append((path, names.index(container)))
            elif i > 0 and names:
                out.append((path, 0))
        return out

    def selector(self, obj: Mapping[str, Any]) -> Any:
        """The label selector (as served: matchLabels / matchExpressions) of the object's pods."""
        if self.grouped:
            # every pod of every group carries the set's name (LWS has no spec.selector)
            return {"matchLabels": {LWS_NAME_LABEL: str((obj.get("metadata") or {}).get("name"))}}
        return (obj.get("spec") or {}).get("selector")

    def group_size(self, obj: Mapping[str, Any]) -> int:
        """Pods per replica: ``spec.leaderWorkerTemplate.size`` (default 1) for a LeaderWorkerSet, else 1."""
        if not self.grouped:
            return 1
        raw = ((obj.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size", 1)
        try:
            n = int(raw)
        except (TypeError, ValueError):
            return 1
        return max(n, 1)


DEPLOYMENT = WorkloadKind("Deployment", APPS[0], APPS[1], "deployments", (("spec", "template"),))
STATEFULSET = WorkloadKind("StatefulSet", APPS[0], APPS[1], "statefulsets", (("spec", "template"),),
                           deletion_cost=False)
LEADERWORKERSET_KIND = WorkloadKind(
    "LeaderWorkerSet", LEADERWORKERSET[0], LEADERWORKERSET[1], "leaderworkersets",
    (("spec", "leaderWorkerTemplate", "workerTemplate"), ("spec", "leaderWorkerTemplate", "leaderTemplate")),
    grouped=True, deletion_cost=False)
ROLLOUT = WorkloadKind("Rollout", ARGO_ROLLOUTS[0], ARGO_ROLLOUTS[1], "rollouts", (("spec", "template"),))

KINDS: tuple[WorkloadKind, ...] = (DEPLOYMENT, STATEFULSET, LEADERWORKERSET_KIND, ROLLOUT)
_BY_KIND = {(k.group, k.kind): k for k in KINDS}


def split_api_version(api_version: str) -> tuple[str, str]:
    """``"apps/v1"`` -> ("apps", "v1"); ``"v1"`` -> ("", "v1")."""
    group, sep, version = api_version.rpartition("/")
    return (group, version) if sep else ("", api_version)


def kind_of(obj: Mapping[str, Any], default: WorkloadKind | None = None) -> WorkloadKind | None:
    """The kind of a served object by its ``kind`` and ``apiVersion``'s group; ``default`` when it carries none
    (list items do not), None for a kind slotwise does not scale."""
    kind = obj.get("kind")
    if not kind:
        return default
    group, _ = split_api_version(str(obj.get("apiVersion") or ""))
    return _BY_KIND.get((group, str(kind)))


def by_name(kind: str, api_version: str) -> WorkloadKind | None:
    """The kind a :class:`~autoscaler.live.kube.objects.ManagedModel` names (its ``kind`` and ``api_version``)."""
    return _BY_KIND.get((split_api_version(api_version)[0], kind))


def workload_ref(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """A Rollout's ``spec.workloadRef`` to a Deployment as ``(kind, name)``; None without one."""
    ref = (obj.get("spec") or {}).get("workloadRef")
    if not isinstance(ref, Mapping) or not ref.get("name"):
        return None
    return (str(ref.get("kind") or "Deployment"), str(ref["name"]))


def template_home(obj: Mapping[str, Any]) -> tuple[WorkloadKind, str] | None:
    """Where the pod template of a workload without one of its own lives: a Rollout's ``workloadRef`` to a
    Deployment -> (DEPLOYMENT, its name); None for any other reference (ReplicaSet, PodTemplate: not written)."""
    ref = workload_ref(obj)
    if ref is None or ref[0] != DEPLOYMENT.kind:
        return None
    return DEPLOYMENT, ref[1]


def statefulset_ordinal(pod: str, set_name: str) -> int | None:
    """The ordinal of a StatefulSet's pod ``<set>-<ordinal>``; None for a name not of that shape."""
    prefix, sep, ordinal = pod.rpartition("-")
    return int(ordinal) if sep and prefix == set_name and ordinal.isascii() and ordinal.isdigit() else None


def ordinals_start(obj: Mapping[str, Any]) -> int:
    """``spec.ordinals.start`` (Kubernetes 1.26+; 0 when unset)."""
    raw = ((obj.get("spec") or {}).get("ordinals") or {}).get("start", 0)
    try:
        return max(int(raw), 0)
    except (TypeError, ValueError):
        return 0


def statefulset_replicas_keeping(set_name: str, start: int, pods: Sequence[str], keep: int) -> int | None:
    """The ``spec.replicas`` a StatefulSet scale-down writes so that, of its replicas ``pods`` (pod names, those
    not already going), exactly the ``keep`` lowest ordinals stay: the controller keeps ordinals
    ``[start, start + replicas)`` and deletes the others, so that is the lowest ordinal to go, less ``start``.
    Ordinals missing below it (a gap) are recreated by the controller: more replicas than planned for a while,
    never fewer. All kept (``keep`` >= the pods): the highest one's end. None when a pod's ordinal is unknown
    (the caller holds)."""
    ordinals = [statefulset_ordinal(p, set_name) for p in pods]
    if any(o is None for o in ordinals):
        return None
    known = sorted(o for o in ordinals if o is not None)
    if not known:
        return max(keep, 0)
    if keep >= len(known):
        return known[-1] + 1 - start
    return max(known[max(keep, 0)] - start, 0)


@dataclass(frozen=True)
class PodGroup:
    """The pods of one LeaderWorkerSet group, by the labels the LWS controller puts on them."""

    index: str  # the group index (label value)
    leader: str | None  # key of the leader pod (worker-index 0), None when it is not among the pods
    workers: tuple[str, ...]  # keys of the other pods, by worker index


def group_pods(pods: Sequence[tuple[str, Mapping[str, str]]]) -> dict[str, PodGroup]:
    """``(pod key, labels)`` of one LeaderWorkerSet's pods -> its groups by group index (pods without a group index
    label are left out). The leader is worker index 0; a group whose leader is missing still has its workers."""
    found: dict[str, tuple[list[str], list[tuple[int, str]]]] = {}
    for key, labels in pods:
        idx = labels.get(LWS_GROUP_INDEX_LABEL)
        if idx is None:
            continue
        leaders, workers = found.setdefault(idx, ([], []))
        wi = labels.get(LWS_WORKER_INDEX_LABEL, "0")
        if wi == "0":
            leaders.append(key)
        else:
            try:
                workers.append((int(wi), key))
            except ValueError:
                workers.append((1 << 30, key))
    out = {}
    for idx in sorted(found, key=_index_order):
        leaders, workers = found[idx]
        leader = sorted(leaders)[0] if leaders else None
        extra = sorted(leaders)[1:]  # two pods claiming worker-index 0: the second counts as a worker
        out[idx] = PodGroup(idx, leader, tuple(k for _, k in sorted(workers)) + tuple(extra))
    return out


def leader_key(namespace: str, name: str, index: str) -> str:
    """The leader pod's key of group ``index`` (``<lws>-<index>``): the group's replica id even while it is gone."""
    return f"{namespace}/{name}-{index}"


def _index_order(idx: str) -> tuple[int, str]:
    return (int(idx), idx) if idx.isdigit() else (1 << 30, idx)
