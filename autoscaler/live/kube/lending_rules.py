"""The lending actuator's rules, as pure functions of what the API serves: which pods may be evicted (only those
labelled preemptible) and in what order, the eviction's grace, the node patches that lend and release a node, the
Kueue ClusterQueue's lendingLimit, the Kueue API version to use, the marks on the Workloads a reclaim deactivated
(so that only those are reactivated), how an eviction's 429 is told apart (a PodDisruptionBudget's refusal from
plain throttling) with its ``Retry-After``, the Warning Event of an overdue reclaim, the timestamps a reclaim
survives a restart by, and the record of the operator's own lendingLimit that a rollback gives back."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from autoscaler.live.kube.discovery import KUEUE
from autoscaler.live.kube.objects import (
    GPU_RESOURCE,
    LENT_LABEL,
    LENT_SINCE_ANNOTATION,
    LENT_TAINT_EFFECT,
    LENT_TAINT_KEY,
    LENT_TAINT_VALUE,
    MIG_RESOURCE_PREFIX,
    PREEMPTIBLE_LABEL,
    RECLAIM_REASON_ANNOTATION,
    RECLAIM_SINCE_ANNOTATION,
    TrainingRef,
    has_lent_taint,
)
from autoscaler.live.kube.writes import retry_after_s as retry_after_s  # re-exported: the eviction rules use it
from autoscaler.live.kube.writes import rfc3339, status_body

# Kueue mode: a Workload slotwise deactivated for a reclaim carries this label (selectable: the reactivation lists
# them server-side) and the annotations below (when, which node, why); a Workload deactivated by anyone else has
# no label and is never reactivated by slotwise.
DEACTIVATED_LABEL = "slotwise.io/deactivated"
DEACTIVATED_VALUE = "reclaim"
DEACTIVATED_SINCE_ANNOTATION = "slotwise.io/deactivated-since"  # RFC 3339
DEACTIVATED_FOR_ANNOTATION = "slotwise.io/deactivated-for"  # "<node> (<reclaim reason>)"
# The Kueue API versions slotwise can use, preferred first (v1beta2: Kueue 0.15+; the fields slotwise touches --
# ClusterQueue spec.resourceGroups[].flavors[].resources[].lendingLimit, Workload spec.active -- are the same):
# discovery's list, the one place versions are named.
KUEUE_VERSIONS = tuple(KUEUE[1])
# Kueue mode: the inference ClusterQueue's lendingLimit as the operator had it before slotwise first changed it,
# kept on the ClusterQueue itself -- so a restarted controller, or the other replica once it leads, gives back the
# operator's value too. JSON {"<flavor>/<resource>": the lendingLimit as the API served it, or null: it was unset};
# an entry is written with slotwise's first change of that limit and taken off when the limit is given back.
ORIGINAL_LIMIT_ANNOTATION = "slotwise.io/original-lending-limit"
RECLAIM_OVERDUE_REASON = "ReclaimOverdue"  # the Warning Event of a reclaim in flight past its deadline
RECLAIM_FORCED_REASON = "ReclaimForced"  # ... and of the pods deleted past the deadline + force_after_s
DEFAULT_RETRY_AFTER_S = 1.0  # a 429 without Retry-After: wait this long before asking again

_TERMINAL = frozenset({"Succeeded", "Failed"})
_JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")


def is_preemptible(labels: Mapping[str, str] | None) -> bool:
    """The ONLY test for "may be evicted for inference": the pod itself carries ``slotwise.io/preemptible=true``.
    Anything else (no label, another value, a label on the owning Job only) is treated as inference."""
    return (labels or {}).get(PREEMPTIBLE_LABEL) == "true"


def _gpu_request(pod: Mapping[str, Any]) -> bool:
    for c in (*((pod.get("spec") or {}).get("containers") or ()), *((pod.get("spec") or {}).get("initContainers")
                                                                    or ())):
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            for name, q in (res.get(part) or {}).items():
                if (name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)) and str(q) not in ("0", "0m"):
                    return True
    return False


def pod_key(pod: Mapping[str, Any]) -> str:
    """``"<namespace>/<name>"`` of a pod."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def is_live(pod: Mapping[str, Any]) -> bool:
    """Not ``Succeeded``/``Failed``."""
    return (pod.get("status") or {}).get("phase") not in _TERMINAL


def inference_pods(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """Live pods asking for a GPU that are not preemptible: a node holding one may not be lent."""
    return sorted(pod_key(p) for p in pods if is_live(p) and _gpu_request(p)
                  and not is_preemptible((p.get("metadata") or {}).get("labels")))


def belongs_to(pod: Mapping[str, Any], name: str, ref: TrainingRef | None) -> bool:
    """Whether a live pod is one of the training workload ``name``'s (by the view's pod list, or its owner)."""
    key = pod_key(pod)
    if key == name or (ref is not None and key in ref.pods):
        return True
    meta = pod.get("metadata") or {}
    ns, _, obj = name.partition("/")
    if meta.get("namespace") != ns or ref is None or ref.kind == "Pod":
        return False
    for owner in meta.get("ownerReferences") or ():
        if owner.get("kind") == ref.kind and (owner.get("name") == obj or (ref.uid and owner.get("uid") == ref.uid)):
            return True
    labels = meta.get("labels") or {}
    return ref.kind == "Job" and any(labels.get(lbl) == obj for lbl in _JOB_NAME_LABELS)


def eviction_order(pods: Sequence[Mapping[str, Any]], workloads: Sequence[str],
                   refs: Mapping[str, TrainingRef]) -> tuple[list[Mapping[str, Any]], list[str]]:
    """(the pods to evict, in order; the pods the plan named that may NOT be evicted).

    Every live preemptible pod on the node is evicted: the named workloads' first, in the plan's preemption order,
    then any other preemptible pod there (it holds the node's GPUs just the same). A named pod without the
    preemptible label is refused, never evicted.
    """
    live = [p for p in pods if is_live(p)]
    order: list[Mapping[str, Any]] = []
    refused: list[str] = []
    seen: set[str] = set()
    for name in workloads:
        ref = refs.get(name)
        for p in sorted((p for p in live if belongs_to(p, name, ref)), key=pod_key):
            key = pod_key(p)
            if key in seen:
                continue
            seen.add(key)
            if is_preemptible((p.get("metadata") or {}).get("labels")):
                order.append(p)
            else:
                refused.append(key)
    for p in sorted(live, key=pod_key):
        key = pod_key(p)
        if key not in seen and is_preemptible((p.get("metadata") or {}).get("labels")):
            seen.add(key)
            order.append(p)
    return order, refused


def eviction_grace(pod_grace: Any, max_reclaim_s: float) -> int:
    """The Eviction's grace period: the pod's own (30 s when unset), capped by the reclaim deadline."""
    grace = pod_grace if isinstance(pod_grace, int | float) and not isinstance(pod_grace, bool) and pod_grace >= 0 \
        else 30
    return int(max(0, min(float(grace), math.floor(max_reclaim_s))))


def lent_node_patch(node: Mapping[str, Any], now: float) -> dict[str, Any] | None:
    """The merge patch that lends ``node`` (label, taint, lent-since), or None when it already says so.

    ``spec.taints`` is a list, which a merge patch replaces whole: the patch carries the read list plus ours and the
    read ``resourceVersion`` (a concurrent change of the taints makes it a 409, re-read and retried).
    """
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    taints = list((node.get("spec") or {}).get("taints") or [])
    want_label = labels.get(LENT_LABEL) != "true"
    want_since = LENT_SINCE_ANNOTATION not in annotations
    want_taint = not has_lent_taint(taints)
    if not (want_label or want_since or want_taint):
        return None
    patch: dict[str, Any] = {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                                          "labels": {LENT_LABEL: "true"}}}
    if want_since:
        patch["metadata"]["annotations"] = {LENT_SINCE_ANNOTATION: rfc3339(now)}
    if want_taint:
        taints.append({"key": LENT_TAINT_KEY, "value": LENT_TAINT_VALUE, "effect": LENT_TAINT_EFFECT})
        patch["spec"] = {"taints": taints}
    return patch


def released_node_patch(node: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that ends a reclaim (taint, lent-since and reclaim annotations off), None when done."""
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    taints = list((node.get("spec") or {}).get("taints") or [])
    kept = [t for t in taints if not has_lent_taint([t])]
    ours = [k for k in (LENT_SINCE_ANNOTATION, RECLAIM_SINCE_ANNOTATION, RECLAIM_REASON_ANNOTATION) if k in annotations]
    if len(kept) == len(taints) and not ours:
        return None
    patch: dict[str, Any] = {"metadata": {"resourceVersion": meta.get("resourceVersion")}}
    if ours:
        patch["metadata"]["annotations"] = dict.fromkeys(ours)
    if len(kept) != len(taints):
        patch["spec"] = {"taints": kept or None}
    return patch


def rfc3339_precise(t: float) -> str:
    """RFC 3339 with microseconds: a reclaim's decision time survives a restart without rounding a second off."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


def lending_limit(lent_now: Iterable[tuple[str, int]], reclaiming: Iterable[tuple[str, int]],
                  lend: Iterable[tuple[str, int]]) -> int:
    """Kueue mode: the inference ClusterQueue's lendingLimit after a tick's decisions: the GPUs lent now, minus
    those being reclaimed, plus the newly lent ones (a GPU counted once however many actions name it)."""
    back = set(reclaiming)
    return len((set(lent_now) | set(lend)) - back)


def quantity_count(value: Any) -> int | None:
    """A whole-number resource.Quantity ("8", "8000m", 8) -> 8; None when it is not one."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return int(value) if float(value).is_integer() and value >= 0 else None
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    if text.endswith("m") and text[:-1].isdigit() and int(text[:-1]) % 1000 == 0:
        return int(text[:-1]) // 1000
    return None


def _edited_groups(cq: Mapping[str, Any], flavor: str, resource: str,
                   edit: Callable[[dict[str, Any]], None]) -> tuple[list, bool]:
    """A copy of the ClusterQueue's ``spec.resourceGroups`` with ``edit`` applied (in place) to the copy of every
    (flavor, resource) entry -> (resourceGroups, whether there was one). The rest is kept as served: a merge patch
    replaces the whole list."""
    groups = [dict(g) for g in ((cq.get("spec") or {}).get("resourceGroups") or [])]
    found = False
    for g in groups:
        flavors = []
        for f in g.get("flavors") or []:
            f = dict(f)
            if f.get("name") == flavor:
                resources = []
                for r in f.get("resources") or []:
                    r = dict(r)
                    if r.get("name") == resource:
                        found = True
                        edit(r)
                    resources.append(r)
                f["resources"] = resources
            flavors.append(f)
        g["flavors"] = flavors
    return groups, found


def set_lending_limit(cq: Mapping[str, Any], flavor: str, resource: str, limit: int) -> tuple[list, int, bool] | str:
    """The ClusterQueue's ``spec.resourceGroups`` with ``lendingLimit`` of (flavor, resource) set to ``limit``
    (capped by its nominalQuota) -> (resourceGroups, the limit written, changed), or a problem string."""
    outcome = {"written": limit, "changed": False}

    def edit(r: dict[str, Any]) -> None:
        nominal = quantity_count(r.get("nominalQuota"))
        written = min(limit, nominal) if nominal is not None else limit
        outcome["written"] = written
        if quantity_count(r.get("lendingLimit")) != written or "lendingLimit" not in r:
            r["lendingLimit"] = str(written)
            outcome["changed"] = True

    groups, found = _edited_groups(cq, flavor, resource, edit)
    if not found:
        name = (cq.get("metadata") or {}).get("name")
        return f"ClusterQueue {name} has no flavor {flavor!r} with resource {resource!r}"
    return groups, int(outcome["written"]), bool(outcome["changed"])


def _limit_key(flavor: str, resource: str) -> str:
    return f"{flavor}/{resource}"


def recorded_limits(cq: Mapping[str, Any]) -> dict[str, Any]:
    """The operator's lendingLimits slotwise recorded on the ClusterQueue (:data:`ORIGINAL_LIMIT_ANNOTATION`):
    ``"<flavor>/<resource>"`` -> the value (None: unset); {} when there is no record or it is not one."""
    text = ((cq.get("metadata") or {}).get("annotations") or {}).get(ORIGINAL_LIMIT_ANNOTATION)
    try:
        record = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return dict(record) if isinstance(record, dict) else {}


def _limit_of(cq: Mapping[str, Any], flavor: str, resource: str) -> Any:
    """The (flavor, resource) entry's lendingLimit as served (None: unset, or no such entry)."""
    seen: list[Any] = []
    _edited_groups(cq, flavor, resource, lambda r: seen.append(r.get("lendingLimit")))
    return seen[0] if seen else None


def remember_original(cq: Mapping[str, Any], flavor: str, resource: str) -> dict[str, str] | None:
    """The annotations (merge patch) recording the (flavor, resource) lendingLimit the ClusterQueue has now, to go
    with slotwise's change of it; None when it is recorded already (by the first change: what it says now is
    slotwise's own value)."""
    record = recorded_limits(cq)
    key = _limit_key(flavor, resource)
    if key in record:
        return None
    record[key] = _limit_of(cq, flavor, resource)
    return {ORIGINAL_LIMIT_ANNOTATION: json.dumps(record, sort_keys=True)}


def restore_lending_limit(cq: Mapping[str, Any], flavor: str, resource: str
                          ) -> tuple[list, Any, dict[str, str | None]] | None:
    """The operator's (flavor, resource) lendingLimit given back: (resourceGroups with the recorded value -- the key
    removed when it was unset --, that value, the annotations merge patch taking the record off), or None when
    nothing is recorded (slotwise never changed that limit: it is the operator's as it stands)."""
    record = recorded_limits(cq)
    key = _limit_key(flavor, resource)
    if key not in record:
        return None
    value = record.pop(key)

    def edit(r: dict[str, Any]) -> None:
        if value is None:
            r.pop("lendingLimit", None)
        else:
            r["lendingLimit"] = value

    groups, _ = _edited_groups(cq, flavor, resource, edit)  # an entry gone meanwhile: only the record goes
    left = json.dumps(record, sort_keys=True) if record else None
    return groups, value, {ORIGINAL_LIMIT_ANNOTATION: left}


def kueue_version(served: Iterable[str]) -> str | None:
    """The Kueue API version to use among those the server serves for ``kueue.x-k8s.io`` (v1beta2 first), or None
    when it serves none slotwise knows."""
    have = set(served)
    return next((v for v in KUEUE_VERSIONS if v in have), None)


def deactivate_patch(now: float, node: str, reason: str) -> dict[str, Any]:
    """The merge patch that deactivates a Workload for a reclaim, marked as slotwise's doing."""
    return {"metadata": {"labels": {DEACTIVATED_LABEL: DEACTIVATED_VALUE},
                         "annotations": {DEACTIVATED_SINCE_ANNOTATION: rfc3339_precise(now),
                                         DEACTIVATED_FOR_ANNOTATION: f"{node} ({reason})"}},
            "spec": {"active": False}}


def deactivated_by_slotwise(workload: Mapping[str, Any]) -> bool:
    """A Workload slotwise deactivated and has not reactivated yet (its mark is there)."""
    return ((workload.get("metadata") or {}).get("labels") or {}).get(DEACTIVATED_LABEL) == DEACTIVATED_VALUE


def deactivation_reason(workload: Mapping[str, Any]) -> str | None:
    """The reclaim reason a marked Workload's annotation names (``"<node> (<reason>)"``), or None."""
    value = ((workload.get("metadata") or {}).get("annotations") or {}).get(DEACTIVATED_FOR_ANNOTATION)
    if not isinstance(value, str) or not value.endswith(")") or " (" not in value:
        return None
    return value.rsplit(" (", 1)[1][:-1] or None


def admits(workload: Mapping[str, Any], ref: TrainingRef) -> bool:
    """Whether the Kueue Workload admits the training workload ``ref``: it is the Workload itself, one the caches
    linked to it, or one it owns (by kind and name or uid, in its namespace)."""
    meta = workload.get("metadata") or {}
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    if key == ref.name or key in ref.workloads:
        return True
    _, _, obj = ref.name.partition("/")
    return meta.get("namespace") == ref.namespace and any(
        o.get("kind") == ref.kind and (o.get("name") == obj or (ref.uid and o.get("uid") == ref.uid))
        for o in meta.get("ownerReferences") or ())


def reactivate_patch(workload: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that gives a reclaimed Workload back to Kueue (``spec.active: true``, the marks off), with
    the read ``resourceVersion``: a Workload changed meanwhile is re-read (409) before it is reactivated."""
    meta = workload.get("metadata") or {}
    annotations = [k for k in (DEACTIVATED_SINCE_ANNOTATION, DEACTIVATED_FOR_ANNOTATION)
                   if k in (meta.get("annotations") or {})]
    patch: dict[str, Any] = {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                                          "labels": {DEACTIVATED_LABEL: None}},
                             "spec": {"active": True}}
    if annotations:
        patch["metadata"]["annotations"] = dict.fromkeys(annotations)
    return patch


def eviction_refusal(body: Any) -> str:
    """Why an Eviction got 429: ``"disruption-budget"`` when a PodDisruptionBudget refused it (the Status's cause
    ``DisruptionBudget``, or its message naming the disruption budget), else ``"too-many-requests"`` (the server
    throttling: API Priority and Fairness, max-requests-inflight)."""
    status = status_body(body)
    causes = (status.get("details") or {}).get("causes") if isinstance(status.get("details"), dict) else None
    if any(isinstance(c, dict) and c.get("reason") == "DisruptionBudget" for c in causes or ()):
        return "disruption-budget"
    return "disruption-budget" if "disruption budget" in str(status.get("message", "")).lower() \
        else "too-many-requests"


def reclaim_event(ref: Mapping[str, str], type_: str, reason: str, message: str, now: float, name: str,
                  component: str = "slotwise") -> dict[str, Any]:
    """A core/v1 Event about ``ref`` (an involvedObject: kind, name, namespace, uid); cluster-scoped objects'
    Events live in ``default``."""
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": ref.get("namespace") or "default"},
            "involvedObject": dict(ref), "reason": reason, "message": message[:1024], "type": type_, "count": 1,
            "firstTimestamp": rfc3339(now), "lastTimestamp": rfc3339(now), "source": {"component": component},
            "reportingComponent": component}
