"""Names and small types shared by the Kubernetes adapters (informers, translation, actuator, leader election).

Kubernetes objects travel between the adapters as plain JSON dicts, exactly as the API serves them
(camelCase keys): the informers cache them, :mod:`~autoscaler.adapters.kube.translate` turns them into the
decision core's :class:`~autoscaler.snapshot.ClusterSnapshot`, and the actuator addresses them by the
:class:`ManagedModel` the translation keeps for each model. A model's key everywhere (snapshot, plan,
metrics, forecaster) is ``"<namespace>/<deployment name>"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autoscaler.snapshot import ClusterSnapshot

PREFIX = "slotwise.io/"
STATUS_ANNOTATION = PREFIX + "status"  # JSON written by the actuator (desired/current/forecast/latency/reason)
PREEMPTIBLE_LABEL = PREFIX + "preemptible"  # "true" on training pods / Jobs / Kueue Workloads we may lend to
LAST_CHECKPOINT_ANNOTATION = PREFIX + "last-checkpoint"  # RFC 3339 time of a training job's last checkpoint
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"  # which pods a scale-down removes first

# NVIDIA GPU Feature Discovery / GPU operator node labels
GPU_PRODUCT = "nvidia.com/gpu.product"
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


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


@dataclass(frozen=True)
class ManagedModel:
    """How the actuator addresses one managed model (a Deployment) in Kubernetes."""

    key: str  # "<namespace>/<name>": the model's name in the snapshot and the plan
    namespace: str
    name: str
    uid: str
    replicas: int  # the Deployment's spec.replicas as read
    container: str  # the container the slot resources are set on (the first one)
    resources: Mapping[str, Any] = field(default_factory=dict)  # that container's resources as read
    node_selector: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeInfo:
    """What the MIG safety gate and the actuator need to know about a GPU node."""

    name: str
    labels: Mapping[str, str]
    unschedulable: bool
    gpu_pods: Mapping[str, int] = field(default_factory=dict)  # GPU resource -> pods on the node requesting it


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
