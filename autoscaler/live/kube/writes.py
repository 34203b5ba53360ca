"""What the Kubernetes actuators write, as pure functions: the ``slotwise.io/status`` annotation, the Events'
type / reason / message, a pod template's merged resources and node selector, the merged mig-parted config; and
how they name an action, a time and an API error in their reports; when a status is worth writing again
(:func:`status_change`) and the number-free text Events are de-duplicated by (:func:`stable_text`)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import yaml
from kubernetes_asyncio.client.rest import ApiException

from autoscaler.api.plan import Action, Plan, Reason, Shortfall, ShortfallCause, UpdateStatus
from autoscaler.live.kube.gpu_nodes import is_gpu_resource
from sharing.render import to_yaml


class Gone(Exception):
    """The object an action addresses no longer exists (deleted meanwhile)."""


def describe(action: Action) -> str:
    return Plan(0.0, [action]).describe()[0]


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def split_key(key: str, default_namespace: str) -> tuple[str, str]:
    """``"ns/name"`` -> (ns, name); a bare name gets ``default_namespace``."""
    ns, sep, name = key.partition("/")
    return (ns, name) if sep else (default_namespace, key)


def scale_outcome(live: int, target: int, planned_from: int, *, decrease: bool) -> str:
    """What to do with a plan's scale to ``target`` (planned from the Deployment's ``planned_from`` replicas as the
    view read them; ``decrease``: whether the plan lowers the model's replicas) when the Scale just read says
    ``live``: ``"unchanged"``, ``"write"``, or ``"stale-view"`` -- a value below ``live`` that no scale-down rail
    approved, never written: planned from another starting point (a frozen Deployments cache, another writer), or
    planned as an increase (a pods cache lagging behind a scale someone else made: 1 pod seen, spec 6, a plan of
    1 -> 3 would halve the fleet). A value above ``live`` is written whatever it was planned from: it lowers
    nothing."""
    if target == live:
        return "unchanged"
    if target < live and (live != planned_from or not decrease):
        return "stale-view"
    return "write"


def merged_resources(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A container's ``resources`` after a slot change: ``old`` without ANY GPU resource (``nvidia.com/gpu``,
    ``nvidia.com/mig-*``: the old slot kind must go, not linger beside the new one), then ``new``'s entries.
    CPU/memory and other sections of ``old`` stay. Quantities as strings, as the API serves them."""
    out: dict[str, Any] = {k: v for k, v in old.items() if k not in ("limits", "requests")}
    for section in ("limits", "requests"):
        kept = {r: str(q) for r, q in (old.get(section) or {}).items() if not is_gpu_resource(r)}
        kept.update({r: str(q) for r, q in (new.get(section) or {}).items()})
        if kept:
            out[section] = kept
    out.update({k: v for k, v in new.items() if k not in ("limits", "requests")})
    return out


def merged_node_selector(old: Mapping[str, str], new: Mapping[str, str]) -> dict[str, str]:
    """``old`` without the ``nvidia.com/*`` keys (the previous slot kind's GPU selection), then ``new``; the
    user's own keys (zone, pool ...) stay."""
    out = {k: v for k, v in old.items() if not k.startswith("nvidia.com/")}
    out.update({k: str(v) for k, v in new.items()})
    return out


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def status_payload(a: UpdateStatus, *, dry_run: bool, now: float,
                   shortfall: Mapping[str, int] | None = None, autoscaled_by: str | None = None,
                   coexistence: str | None = None) -> dict[str, Any]:
    """The ``slotwise.io/status`` annotation's JSON; ``shortfall`` (cause -> replicas not placed this tick, from
    the plan's Shortfalls of the model) only when there is one; ``autoscaledBy`` (the HPA / ScaledObject that
    scales the workload, :attr:`~autoscaler.live.kube.objects.ManagedModel.autoscaled_by`) and ``coexistence``
    (``hands-off`` | ``advise``) only for such a model: ``desired`` is then what slotwise would set, not written."""
    payload = {
        "desired": a.desired,
        "current": a.current,
        "reason": str(a.reason),
        "forecastRps": _finite(a.forecast_rps),
        "predictedLatencyMs": _finite(a.predicted_latency_ms),
        "sloLatencyMs": _finite(a.slo_latency_ms),
        "message": a.message,
        "conditionOk": a.condition_ok,
        "dryRun": dry_run,
        "updated": rfc3339(now),
    }
    if shortfall:
        payload["shortfall"] = {str(cause): int(n) for cause, n in shortfall.items()}
    if autoscaled_by:
        payload["autoscaledBy"] = autoscaled_by
        payload["coexistence"] = coexistence or COEXISTENCE_DEFAULT
    return payload


def same_status(current: str | None, payload: Mapping[str, Any]) -> bool:
    """The annotation already says ``payload`` (everything but the ``updated`` time)."""
    if not current:
        return False
    try:
        old = json.loads(current)
    except ValueError:
        return False
    if not isinstance(old, dict):
        return False
    return {k: v for k, v in old.items() if k != "updated"} == {k: v for k, v in payload.items() if k != "updated"}


# What a status says that matters to a reader at once: any change of these is written (and gets an Event) at once.
_MATERIAL_KEYS = ("desired", "current", "reason", "conditionOk", "dryRun", "sloLatencyMs", "shortfall", "autoscaledBy",
                  "coexistence")
# Numbers that move with every noisy sample: written at once only past a relative change, else with the refresh.
_NOISY_NUMBERS = ("forecastRps", "predictedLatencyMs")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?%?")


def stable_text(message: str) -> str:
    """``message`` with every number replaced by ``#``: the part of a decision's text that does not move with
    noisy load ("q0.95 forecast 12.31 req/s" and "q0.95 forecast 12.87 req/s" are the same text)."""
    return _NUMBER.sub("#", message)


def _parse_time(text: object) -> float | None:
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _moved(old: object, new: object, ratio: float) -> bool:
    """A noisy number changed by more than ``ratio`` of its size (a number appearing or going counts)."""
    if old is None or new is None:
        return old is not new
    if not isinstance(old, int | float) or not isinstance(new, int | float):
        return old != new
    return abs(new - old) > ratio * max(abs(old), abs(new), 1.0)


def status_change(current: str | None, payload: Mapping[str, Any], *, now: float, refresh_s: float,
                  ratio: float) -> str | None:
    """Why the ``slotwise.io/status`` annotation ``current`` (its JSON text) should become ``payload`` now: the
    first material difference (a key of :data:`_MATERIAL_KEYS`, the message's :func:`stable_text`, a noisy number
    moved by more than ``ratio``), ``"refresh"`` when only noise differs and the annotation is ``refresh_s`` old,
    None when it should stay (it says the same, or only noise differs and it is recent).

    Why not on every difference: the message and the forecast numbers move with every noisy sample, and one
    PATCH per model and decision is, at 1,000 models, ~100 Deployment writes per second for nothing new."""
    if not current:
        return "new"
    try:
        old = json.loads(current)
    except ValueError:
        return "unreadable"
    if not isinstance(old, dict):
        return "unreadable"
    for key in _MATERIAL_KEYS:
        if old.get(key) != payload.get(key):
            return key
    if stable_text(str(old.get("message", ""))) != stable_text(str(payload.get("message", ""))):
        return "message"
    for key in _NOISY_NUMBERS:
        if _moved(old.get(key), payload.get(key), ratio):
            return key
    if {k: v for k, v in old.items() if k != "updated"} == {k: v for k, v in payload.items() if k != "updated"}:
        return None
    written = _parse_time(old.get("updated"))
    return "refresh" if written is None or now - written >= refresh_s else None


_STATUS_REASONS = {
    Reason.INVALID_SPEC: "InvalidAnnotation",
    Reason.DECISION_FAILED: "DecisionFailed",
    Reason.UNPLACEABLE: "Unplaceable",
    Reason.METRICS_STALE: "MetricsStale",
    Reason.METRICS_PARTIAL: "MetricsPartial",
    Reason.SLO_UNATTAINABLE: "SloUnattainable",
    Reason.KV_SATURATED: "KvCacheSaturated",  # Normal: the rail holding or adding a replica is the system working
}
_WARNING_REASONS = {Reason.UNPLACEABLE, Reason.METRICS_STALE, Reason.METRICS_PARTIAL}


def status_event(a: UpdateStatus, autoscaled_by: str | None = None) -> tuple[str, str, str]:
    """(type, reason, message) of the Event recording a status update. A problem's text (e.g. the SpecError
    of invalid annotations) is the message verbatim, so users can grep for it. A model another autoscaler scales
    (``autoscaled_by``) was not scaled: ``Recommended`` instead of ``Scaled``, and the message says who scales."""
    warning = not a.condition_ok or a.reason in _WARNING_REASONS
    reason = _STATUS_REASONS.get(a.reason, "Recommended" if autoscaled_by else "Scaled")
    if not a.condition_ok:
        message = a.message or f"condition not ok ({a.reason})"
    elif autoscaled_by:
        message = f"desired {a.desired} replica(s) (not written: {autoscaled_by} scales it), {a.current} ready: " \
                  f"{a.reason}"
    else:
        message = f"desired {a.desired} replica(s), {a.current} ready: {a.reason}"
        if a.message:
            message += f"; {a.message}"
    return ("Warning" if warning else "Normal"), reason, message


# Living beside an HPA or a KEDA ScaledObject (actuator.coexistence; docs/kubernetes.md "Living beside HPA and KEDA")
HANDS_OFF = "hands-off"  # leave the workload alone: no /scale, no template; say so (status, one Event)
ADVISE = "advise"  # the same, and publish the desired replicas (slotwise_advised_replicas) for the HPA / KEDA
COEXISTENCE_MODES = (HANDS_OFF, ADVISE)
COEXISTENCE_DEFAULT = HANDS_OFF
AUTOSCALED_EVENT = "AutoscaledElsewhere"  # Warning: slotwise does not scale it (hands-off)
ADVISING_EVENT = "AdvisingAutoscaler"  # Normal: slotwise advises its replicas to the autoscaler (advise)
ADVISED_METRIC = "slotwise_advised_replicas"


def autoscaled_event(kind: str, namespace: str, name: str, autoscaled_by: str, replicas: int,
                     mode: str) -> tuple[str, str, str]:
    """(type, reason, message) of the Event telling that ``autoscaled_by`` scales the workload, so slotwise did
    not write its /scale (``replicas``: what it would have set); in ``advise`` mode it names the series to act on."""
    said = f"{autoscaled_by} scales this {kind}: slotwise does not write its /scale"
    if mode == ADVISE:
        selector = f'{ADVISED_METRIC}{{namespace="{namespace}",kind="{kind}",name="{name}"}}'
        return "Normal", ADVISING_EVENT, f"{said}; it advises {replicas} replica(s) now as {selector}"
    return "Warning", AUTOSCALED_EVENT, (
        f"{said} (it would set {replicas} replica(s)); remove the autoscaler to let slotwise scale it, or set "
        f"actuator.coexistence: advise to publish its replicas as {ADVISED_METRIC} for the autoscaler")


# Shortfall cause -> (Event type, Event reason). Refusals are Warnings; headroom not granted (the model meets its
# SLO without it) and capacity being freed for the model (grants in progress) are Normal.
_SHORTFALL_EVENTS = {
    ShortfallCause.UNPLACEABLE: ("Warning", "Unplaceable"),
    ShortfallCause.BORROWING_LIMIT: ("Warning", "BorrowingLimit"),
    ShortfallCause.HEADROOM: ("Normal", "Headroom"),
    ShortfallCause.MIN_RUNTIME: ("Warning", "MinRuntime"),
    ShortfallCause.OUTRANKED: ("Warning", "Outranked"),
    ShortfallCause.DAMAGE: ("Warning", "PreemptionTooCostly"),
    ShortfallCause.MAX_REPLICAS: ("Warning", "MaxReplicas"),
    ShortfallCause.RECLAIMING: ("Normal", "Reclaiming"),
    ShortfallCause.PREEMPTING: ("Normal", "Preempting"),
}
PREEMPTED_EVENT = "Preempted"  # the victim Deployment's Warning Event reason


def shortfall_event(a: Shortfall) -> tuple[str, str, str]:
    """(type, reason, message) of the Event recording a shortfall: the cause in the reason and the message, and
    whether the refusal broke the team's guarantee."""
    type_, reason = _SHORTFALL_EVENTS.get(a.cause, ("Warning", "Unplaceable"))
    if a.cause in (ShortfallCause.RECLAIMING, ShortfallCause.PREEMPTING):
        what = "waiting for capacity being freed"
    elif a.cause == ShortfallCause.UNPLACEABLE:
        what = "cannot be placed"
    else:
        what = "not placed"
    guarantee = ", within the team's guarantee" if a.within_guarantee and type_ == "Warning" else ""
    return type_, reason, f"{a.missing} replica(s) {what} ({a.cause}{guarantee}): {a.reason}"


def merge_mig_configs(existing_yaml: str | None, config: Mapping[str, Any]) -> tuple[str, bool]:
    """The mig-parted document with ``config``'s ``mig-configs`` entries merged into the existing ones (other
    nodes' entries survive) -> (YAML, whether it differs from ``existing_yaml``'s content)."""
    old = yaml.safe_load(existing_yaml) if existing_yaml else None
    if not isinstance(old, dict):
        old = {}
    configs = dict(old.get("mig-configs") or {})
    merged = dict(configs)
    merged.update(config.get("mig-configs") or {})
    doc = {"version": old.get("version") or config.get("version", "v1"), "mig-configs": merged}
    return to_yaml(doc), merged != configs or "version" not in old


def api_error(e: BaseException) -> str:
    """``status reason: message`` of an API error (the Status body's message), else the exception."""
    if isinstance(e, ApiException):
        message = ""
        try:
            body = json.loads(e.body) if e.body else {}
            message = body.get("message", "") if isinstance(body, dict) else ""
        except (TypeError, ValueError):
            message = str(e.body)[:200]
        return f"{e.status} {e.reason}" + (f": {message}" if message else "")
    return f"{type(e).__name__}: {e}"


def status_body(body: Any) -> dict[str, Any]:
    """An error answer's body (bytes, text or parsed) as the API's ``Status`` mapping; text that is not JSON
    becomes ``{"message": text}``, anything else ``{}``."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return {"message": body}
    return body if isinstance(body, dict) else {}


def retry_after_s(headers: Mapping[str, str] | None, body: Any = None) -> float | None:
    """Seconds a 429 asks to wait: its ``Retry-After`` header in seconds, else its Status's
    ``details.retryAfterSeconds``; None when it says nothing usable (an HTTP date, absent). The one reading of it
    for every writer (the actuator's retries, the lending actuator's evictions)."""
    for k, v in (headers or {}).items():
        if k.lower() == "retry-after":
            try:
                seconds = float(str(v).strip())
            except ValueError:
                break  # an HTTP date: fall back to the body
            if math.isfinite(seconds) and seconds >= 0:
                return seconds
    details = status_body(body).get("details")
    seconds = details.get("retryAfterSeconds") if isinstance(details, dict) else None
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds >= 0:
        return float(seconds)
    return None
    details = body.get("details") if isinstance(body, dict) else None
    seconds = details.get("retryAfterSeconds") if isinstance(details, dict) else None
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds >= 0:
        return float(seconds)
    return None
