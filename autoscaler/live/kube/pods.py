"""Live pods, read once per view: the fields every step of the translation looks at, oldest first.

"Live" means not ``Succeeded``/``Failed``: a terminal pod is gone for every purpose of the translation (it
holds no GPU, is no replica, no borrower, and blocks no MIG re-layout).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from autoscaler.live.kube.fields import metadata, parse_time
from autoscaler.live.kube.gpu_nodes import pod_gpu_requests
from autoscaler.live.kube.objects import object_key

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


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
