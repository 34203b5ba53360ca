"""HorizontalPodAutoscalers and KEDA ScaledObjects -> which managed models someone else scales. Pure.

A model that another autoscaler targets is not scaled by slotwise (two writers of one ``/scale`` fight: each
undoes the other every sync), so :func:`mark_autoscaled` sets :attr:`ManagedModel.autoscaled_by` on it and the
actuator leaves its ``/scale`` alone (``actuator.coexistence``: ``hands-off`` or ``advise``; docs/kubernetes.md,
"Living beside HPA and KEDA").

What is read, as served (each object with its ``kind`` set; the informers stamp it):

- **HorizontalPodAutoscaler**, any version (``autoscaling/v1``, ``v2beta2``, ``v2``: they share the field):
  ``spec.scaleTargetRef`` ``{apiVersion, kind, name}`` in the HPA's own namespace.
- **ScaledObject** (``keda.sh/v1alpha1``): ``spec.scaleTargetRef`` ``{name, kind, apiVersion}``, ``kind``
  defaulting to ``Deployment`` and ``apiVersion`` to ``apps/v1`` as KEDA defaults them.
- **KEDA's own HPA**: KEDA actuates a ScaledObject through an HPA it creates (``keda-hpa-<name>`` unless
  ``spec.advanced.horizontalPodAutoscalerConfig.name`` says otherwise), owned by the ScaledObject. That HPA is the
  ScaledObject, not a second autoscaler: one owned by a ScaledObject (ownerReferences), or named
  ``keda-hpa-<name>`` beside a ScaledObject ``<name>`` targeting the same workload, is reported as the
  ScaledObject -- also when the ScaledObjects themselves are not watched (no KEDA RBAC).

A target matches a model by namespace, kind and name; the reference's API group is not compared, so that an old
``extensions/v1beta1`` reference still counts (a false match only leaves a model alone, a missed one is a fight).
Objects being deleted still count until they are gone. Several autoscalers on one workload are all named, and a
problem line says so (they fight each other). An autoscaler whose target is no model is ignored: slotwise does
not scale that workload either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from autoscaler.live.kube.fields import metadata
from autoscaler.live.kube.objects import ManagedModel

HPA = "HorizontalPodAutoscaler"
SCALED_OBJECT = "ScaledObject"
KEDA_GROUP = "keda.sh"
KEDA_HPA_PREFIX = "keda-hpa-"  # the HPA KEDA creates for ScaledObject <name> (unless the ScaledObject names it)


@dataclass(frozen=True)
class Autoscaler:
    """One autoscaler of a workload: who (``kind``, ``namespace``, ``name``) and whose ``/scale`` (``target_*``)."""

    kind: str  # HorizontalPodAutoscaler | ScaledObject
    namespace: str
    name: str
    target_kind: str
    target_name: str

    @property
    def target(self) -> tuple[str, str, str]:
        return (self.namespace, self.target_kind, self.target_name)

    def __str__(self) -> str:
        """``"<Kind> <ns>/<name>"``: what :attr:`ManagedModel.autoscaled_by` says."""
        return f"{self.kind} {self.namespace}/{self.name}"


def _keda_owner(meta: Mapping[str, Any]) -> str | None:
    """The ScaledObject that owns an HPA (KEDA's own HPA), by its ownerReferences."""
    for ref in meta.get("ownerReferences") or ():
        if (isinstance(ref, Mapping) and ref.get("kind") == SCALED_OBJECT
                and str(ref.get("apiVersion") or "").split("/")[0] == KEDA_GROUP and ref.get("name")):
            return str(ref["name"])
    return None


def read_autoscaler(obj: Mapping[str, Any]) -> Autoscaler | str | None:
    """An HPA or a ScaledObject as :class:`Autoscaler`; a problem line when its target cannot be read; None for
    any other kind. KEDA's own HPA is returned as its ScaledObject."""
    kind = obj.get("kind")
    if kind not in (HPA, SCALED_OBJECT):
        return None
    meta = metadata(obj)
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    ref = (obj.get("spec") or {}).get("scaleTargetRef")
    if not isinstance(ref, Mapping) or not ref.get("name"):
        return f"{kind} {ns}/{name}: no spec.scaleTargetRef.name; ignored"
    target_kind = ref.get("kind") or ("Deployment" if kind == SCALED_OBJECT else None)  # KEDA's default
    if not target_kind:
        return f"{kind} {ns}/{name}: no spec.scaleTargetRef.kind; ignored"
    owner = _keda_owner(meta) if kind == HPA else None
    if owner is not None:
        kind, name = SCALED_OBJECT, owner
    return Autoscaler(str(kind), ns, name, str(target_kind), str(ref["name"]))


def autoscalers_by_target(objs: Iterable[Mapping[str, Any]],
                          problems: list[str]) -> dict[tuple[str, str, str], tuple[Autoscaler, ...]]:
    """(namespace, kind, name) of each scaled workload -> its autoscalers (by kind, namespace, name; KEDA's own
    HPAs folded into their ScaledObjects)."""
    found: set[Autoscaler] = set()
    for obj in objs:
        got = read_autoscaler(obj)
        if isinstance(got, str):
            problems.append(got)
        elif got is not None:
            found.add(got)
    # An HPA named keda-hpa-<so> beside ScaledObject <so> on the same target is KEDA's (ownerReferences are the
    # usual proof; the name covers an HPA whose owner was stripped, e.g. by a backup restore)
    scaled = {(a.namespace, a.name, a.target) for a in found if a.kind == SCALED_OBJECT}
    found = {a for a in found
             if not (a.kind == HPA and a.name.startswith(KEDA_HPA_PREFIX)
                     and (a.namespace, a.name[len(KEDA_HPA_PREFIX):], a.target) in scaled)}
    out: dict[tuple[str, str, str], list[Autoscaler]] = {}
    for a in sorted(found, key=lambda a: (a.kind, a.namespace, a.name)):
        out.setdefault(a.target, []).append(a)
    return {t: tuple(v) for t, v in out.items()}


def mark_autoscaled(models: Mapping[str, ManagedModel], objs: Iterable[Mapping[str, Any]],
                    problems: list[str]) -> dict[str, ManagedModel]:
    """The models (by key) another autoscaler targets, each with :attr:`ManagedModel.autoscaled_by` set
    (``"<Kind> <ns>/<name>"``, several joined by ``", "``); the caller updates its models with them."""
    targets = autoscalers_by_target(objs, problems)
    if not targets:
        return {}
    out: dict[str, ManagedModel] = {}
    for key, mm in models.items():
        found = targets.get((mm.namespace, mm.kind, mm.name))
        if not found:
            continue
        by = ", ".join(str(a) for a in found)
        if len(found) > 1:
            problems.append(f"{mm.kind.lower()} {key}: scaled by several autoscalers ({by}); they fight each other")
        out[key] = replace(mm, autoscaled_by=by)
    return out
