"""Label selectors (``metav1.LabelSelector``: matchLabels and matchExpressions), compiled once and evaluated on
label dicts, with the API server's semantics for ``In``, ``NotIn``, ``Exists`` and ``DoesNotExist``.

The translation uses it to find a Deployment's pods (by selector, not by ownerReferences); an empty selector
selects nothing here rather than every pod of the namespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class SelectorError(ValueError):
    """A label selector this module cannot evaluate (unknown operator, malformed expression)."""


@dataclass(frozen=True)
class Selector:
    """A compiled ``metav1.LabelSelector``: ``match_labels`` AND every expression."""

    match_labels: tuple[tuple[str, str], ...]
    expressions: tuple[tuple[str, str, frozenset[str]], ...]  # (key, operator, values)

    @classmethod
    def compile(cls, selector: Mapping[str, Any] | None) -> Selector:
        if not selector or not (selector.get("matchLabels") or selector.get("matchExpressions")):
            # apps/v1 rejects an empty selector on a Deployment; if one ever comes, it selects nothing here
            # rather than every pod of the namespace.
            raise SelectorError("has no selector")
        labels = tuple(sorted((str(k), str(v)) for k, v in (selector.get("matchLabels") or {}).items()))
        exprs = []
        for e in selector.get("matchExpressions") or ():
            key, op = e.get("key"), e.get("operator")
            values = frozenset(str(v) for v in e.get("values") or ())
            if not key:
                raise SelectorError(f"matchExpression {e!r} has no key")
            if op in ("In", "NotIn"):
                if not values:
                    raise SelectorError(f"matchExpression on {key!r}: {op} needs values")
            elif op in ("Exists", "DoesNotExist"):
                if values:
                    raise SelectorError(f"matchExpression on {key!r}: {op} takes no values")
            else:
                raise SelectorError(f"matchExpression on {key!r}: unknown operator {op!r}")
            exprs.append((str(key), str(op), values))
        return cls(labels, tuple(exprs))

    def matches(self, labels: Mapping[str, str]) -> bool:
        for k, v in self.match_labels:
            if labels.get(k) != v:
                return False
        for key, op, values in self.expressions:
            present = key in labels
            if op == "In":
                if not present or labels[key] not in values:
                    return False
            elif op == "NotIn":
                if present and labels[key] in values:
                    return False
            elif op == "Exists":
                if not present:
                    return False
            elif present:  # DoesNotExist
                return False
        return True


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a ``LabelSelector`` dict selects ``labels`` (an empty or invalid selector selects nothing)."""
    try:
        return Selector.compile(selector).matches(labels)
    except SelectorError:
        return False
