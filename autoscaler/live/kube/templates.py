"""Which GPU resources a model's pods should request: the pod-template half of a placement (pure).

In Kubernetes all pods of a Deployment share one template, and kube-scheduler -- not slotwise -- binds each
pod to a node. So a :class:`~autoscaler.api.plan.PlaceReplica` becomes real through the template: its slot's
resource request (``nvidia.com/gpu`` or ``nvidia.com/mig-<profile>``, from :func:`sharing.render.pod_resources`)
and a node selector on the GPU product. The template is set when a model has no running replica yet (its
first placement chooses the slot kind) or when it asks for no GPU at all; a running model keeps its template,
because changing it rolls every pod -- re-slotting a running model is a separate, deliberate step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from autoscaler.api.plan import PlaceReplica, Plan, SetSlotTemplate
from autoscaler.live.kube.objects import GPU_PRODUCT, ClusterView
from sharing.render import pod_resources


def gpu_resources(resources: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The ``nvidia.com/*`` part of a container's resources (requests and limits)."""
    out: dict[str, dict[str, str]] = {}
    for part in ("requests", "limits"):
        got = {k: str(v) for k, v in (resources.get(part) or {}).items() if k.startswith("nvidia.com/")}
        if got:
            out[part] = got
    return out


def template_actions(plan: Plan, view: ClusterView) -> list[SetSlotTemplate]:
    """A :class:`SetSlotTemplate` for each model whose first placements need a slot its template does not ask for."""
    inv = view.snapshot.inventory
    by_model: dict[str, list[PlaceReplica]] = {}
    for a in plan.of_type(PlaceReplica):
        by_model.setdefault(a.model, []).append(a)
    actions: list[SetSlotTemplate] = []
    for model, placed in sorted(by_model.items()):
        managed = view.models.get(model)
        obs = view.snapshot.models.get(model)
        if managed is None or obs is None:
            continue
        current = gpu_resources(managed.resources)
        if current and obs.active_replicas > 0:
            continue  # running pods: keep their slot kind (see the module docstring)
        # The slot shape most of this tick's placements chose (ties: the first placed).
        shapes: Counter[tuple[str, str | None]] = Counter()
        first: dict[tuple[str, str | None], PlaceReplica] = {}
        for a in placed:
            limits = pod_resources(a.slot, inv.catalog.get(a.slot.gpu_model))["limits"]
            node = inv.nodes.get(a.slot.node)
            shape = (repr(sorted(limits.items())), None if node is None else node.labels.get(GPU_PRODUCT))
            shapes[shape] += 1
            first.setdefault(shape, a)
        ((shape, _n),) = shapes.most_common(1)
        chosen = first[shape]
        gpu = inv.catalog.get(chosen.slot.gpu_model)
        wanted = pod_resources(chosen.slot, gpu)
        selector = dict(managed.node_selector)
        if shape[1]:
            selector[GPU_PRODUCT] = shape[1]
        if wanted == current and selector == dict(managed.node_selector):
            continue
        actions.append(SetSlotTemplate(model, wanted, selector))
    return actions
