"""Readers of single fields of Kubernetes objects (plain JSON dicts, as the API serves them): pure and lenient.

Each returns a usable value or None (a default where Kubernetes has one) for a missing or malformed field, so
that the translation can turn anything it cannot read into one problem line instead of an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from autoscaler.api.snapshot import DEFAULT_GRACE_S


def metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def parse_time(value: Any) -> float | None:
    """RFC 3339 (``2024-05-01T12:00:00Z``, optionally with fractional seconds or an offset) -> epoch seconds."""
    if not isinstance(value, str) or not value:
        return None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        return None
    if dt.tzinfo is None:  # the API always says Z; a naive time is read as UTC, never as local time
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def parse_count(value: Any) -> int | None:
    """A non-negative whole count (an extended-resource quantity or a numeric label); None if not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float):
        return int(value) if value >= 0 and value.is_integer() else None
    text = str(value).strip()
    try:
        n = int(text)
    except ValueError:
        # Quantities may come as milli-units ("1000m"); extended resources are whole, so only exact ones count.
        if text.endswith("m") and text[:-1].isdigit() and int(text[:-1]) % 1000 == 0:
            return int(text[:-1]) // 1000
        return None
    return n if n >= 0 else None


def grace_s(pod_spec: Mapping[str, Any]) -> float:
    """A pod spec's ``terminationGracePeriodSeconds`` (Kubernetes' default when unset or invalid)."""
    g = pod_spec.get("terminationGracePeriodSeconds")
    return float(g) if isinstance(g, int | float) and not isinstance(g, bool) and g >= 0 else DEFAULT_GRACE_S


def condition(obj: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    """The ``status.conditions`` entry of type ``ctype``, if any."""
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == ctype:
            return c
    return None


def owner_ref(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The object's first ownerReference of ``kind``, if any."""
    for ref in metadata(obj).get("ownerReferences") or ():
        if ref.get("kind") == kind:
            return ref
    return None
