"""Names and small types shared by the Kubernetes adapters (informers, translation, actuator, leader election).

Kubernetes objects travel between the adapters as plain JSON dicts, exactly as the API serves them
(camelCase keys): the informers cache them, :mod:`~autoscaler.live.kube.translate` turns them into the
decision core's :class:`~autoscaler.api.snapshot.ClusterSnapshot`, and the actuator addresses them by the
:class:`ManagedModel` the translation keeps for each model. A model's key everywhere (snapshot, plan,
metrics, forecaster) is ``"<namespace>/<workload name>"`` (a Deployment, StatefulSet, LeaderWorkerSet or Argo
Rollout: :mod:`~autoscaler.live.kube.workloads`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autoscaler.api.snapshot import ClusterSnapshot

PREFIX = "slotwise.io/"
STATUS_ANNOTATION = PREFIX + "status"  # JSON written by the actuator (desired/current/forecast/latency/reason)
PREEMPTIBLE_LABEL = PREFIX + "preemptible"  # "true" on training pods / Jobs / Kueue Workloads we may lend to
LAST_CHECKPOINT_ANNOTATION = PREFIX + "last-checkpoint"  # RFC 3339 time of a training job's last checkpoint
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"  # which pods a scale-down removes first

# Lending, "pods" mode (autoscaler/live/kube/lending.py): a lent node carries the label (training pods select
# it) and the NoSchedule taint (training pods tolerate it, inference pods do not), plus the time it was lent. While
# a reclaim is in flight the label is gone (no new training lands) but the taint stays until the last training pod
# left; the reclaim annotations carry the decision's time and reason across controller restarts.
LENT_LABEL = PREFIX + "lent"  # "true" on a node lent to training
LENT_TAINT_KEY = PREFIX + "lent"  # taint slotwise.io/lent=true:NoSchedule
LENT_TAINT_VALUE = "true"
LENT_TAINT_EFFECT = "NoSchedule"
LENT_SINCE_ANNOTATION = PREFIX + "lent-since"  # RFC 3339: when the node was lent
RECLAIM_SINCE_ANNOTATION = PREFIX + "reclaim-since"  # RFC 3339 (fractional seconds): the decision to reclaim
RECLAIM_REASON_ANNOTATION = PREFIX + "reclaim-reason"  # the ReclaimGpus reason (forecast, shortfall ...)

# NVIDIA GPU Feature Discovery / GPU operator node labels
GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB
GPU_COUNT = "nvidia.com/gpu.count"
GPU_REPLICAS = "nvidia.com/gpu.replicas"  # time-slicing replicas per GPU (GFD)
MIG_CAPABLE = "nvidia.com/mig.capable"
MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_CONFIG = "nvidia.com/mig.config"
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"  # pending | rebooting | success | failed (MIG manager)
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # + "<profile>", e.g. nvidia.com/mig-3g.40gb (mixed strategy)

FIELD_MANAGER = "slotwise"

# Scale to and from zero (docs/scale-to-zero.md): the Service that fronts a model (an annotation on the workload),
# and the EndpointSlice the controller adds beside that Service's own while traffic goes through the activator.
SERVICE_ANNOTATION = PREFIX + "service"  # the name of the Service in the workload's namespace
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "slotwise.io"  # the managed-by value of the controller's activator slices
MODEL_LABEL = PREFIX + "model"  # the workload's name, on the activator slice
ACTIVATOR_PORT = 8012  # the activator's proxy port (the contract with autoscaler/live/activator)


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


@dataclass(frozen=True)
class ManagedModel:
    """How the actuator addresses one managed model (any workload with a ``/scale`` subresource) in Kubernetes."""

    key: str  # "<namespace>/<name>": the model's name in the snapshot and the plan
    namespace: str
    name: str
    uid: str
    replicas: int  # the workload's spec.replicas as read
    container: str  # the container the slot resources are set on (the first one)
    resources: Mapping[str, Any] = field(default_factory=dict)  # that container's resources as read
    node_selector: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    # Its pods on GPU nodes out of service (NotReady, GPUs no longer advertised), not being deleted: observed as
    # draining (no capacity), but the ReplicaSet still counts them in spec.replicas until they are evicted, so a
    # scale write of N live replicas must ask for N + this many.
    unavailable_replicas: int = 0
    # Which workload it is: its kind, apiVersion and resource (plural, for paths): Deployment, StatefulSet,
    # LeaderWorkerSet, Argo Rollout ... (autoscaler/live/kube/workloads.py)
    kind: str = "Deployment"
    api_version: str = "apps/v1"
    resource: str = "deployments"
    # pods per replica: a LeaderWorkerSet replica is a group (leader + workers) placed together; 1 elsewhere
    group_size: int = 1
    # the HorizontalPodAutoscaler or KEDA ScaledObject that targets the same workload ("<Kind> <ns>/<name>"):
    # slotwise then never writes /scale (autoscaler/live/kube/autoscalers.py); None: nobody else scales it
    autoscaled_by: str | None = None
    # DRA: the pod template's claims made from ResourceClaimTemplates, claim name -> template name
    # (spec.resourceClaims[].resourceClaimTemplateName); what the template asks for is read into ``resources``
    claim_templates: Mapping[str, str] = field(default_factory=dict)
    # the Service fronting it (``slotwise.io/service``), whose traffic the activator holds while it is at zero;
    # None: nothing holds its requests (it still scales to zero with min-replicas 0)
    service: str | None = None


@dataclass(frozen=True)
class PodRef:
    """A live (not Succeeded/Failed) pod on a GPU node, as the lending actuator needs it."""

    key: str  # "<namespace>/<name>"
    uid: str
    labels: Mapping[str, str]
    grace_s: float  # terminationGracePeriodSeconds (30 when unset)
    deleting: bool  # deletionTimestamp set (evicted or deleted, the kubelet has not finished yet)
    model: str | None = None  # the managed model whose replica it is (None: not an inference replica)
    gpus: Mapping[str, int] = field(default_factory=dict)  # GPU resource -> count it requests

    @property
    def preemptible(self) -> bool:
        return self.labels.get(PREEMPTIBLE_LABEL) == "true"


@dataclass(frozen=True)
class NodeInfo:
    """What the MIG safety gate and the actuator need to know about a GPU node."""

    name: str
    labels: Mapping[str, str]
    unschedulable: bool
    gpu_pods: Mapping[str, int] = field(default_factory=dict)  # GPU resource -> pods on the node requesting it
    annotations: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()  # spec.taints as served
    pods: tuple[PodRef, ...] = ()  # live pods bound to the node, by key
    # why the node is no capacity now although its labels say GPUs: NotReady, or the device plugin advertises
    # none (gpu_nodes.out_of_service); None: in service. Out of service nodes are not in the inventory.
    out_of_service: str | None = None

    @property
    def lent(self) -> bool:
        """Lent to training now (pods mode): the label is there."""
        return self.labels.get(LENT_LABEL) == "true"

    @property
    def reclaiming(self) -> bool:
        """A reclaim is in flight (pods mode): the taint without the label."""
        return not self.lent and has_lent_taint(self.taints)


@dataclass(frozen=True)
class TrainingRef:
    """How the lending actuator addresses one training workload of ``ClusterSnapshot.training`` (same name)."""

    name: str  # "<namespace>/<name>" (the TrainingWorkload's name)
    kind: str  # Pod, Job, Workload
    namespace: str
    uid: str = ""
    pods: tuple[str, ...] = ()  # keys of its live pods (the pod itself for kind Pod)
    workloads: tuple[str, ...] = ()  # Kueue Workloads ("ns/name") that admit it, as far as the caches know


def has_lent_taint(taints: Any) -> bool:
    return any(isinstance(t, Mapping) and t.get("key") == LENT_TAINT_KEY and t.get("effect") == LENT_TAINT_EFFECT
               for t in taints or ())


@dataclass(frozen=True)
class ClusterView:
    """One read of the informer caches: the decision core's snapshot plus what acting on it needs.

    ``problems`` lists what could not be understood (a node with an unknown GPU product, a pod asking for a MIG
    profile its node does not have ...), one line each: the controller logs them and counts them as errors;
    they never stop the tick.
    """

    snapshot: ClusterSnapshot
    models: dict[str, ManagedModel]
    nodes: dict[str, NodeInfo]
    problems: list[str] = field(default_factory=list)
    training: dict[str, TrainingRef] = field(default_factory=dict)  # by TrainingWorkload name
