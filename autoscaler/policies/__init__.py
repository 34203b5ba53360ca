"""Scaling policies: the baselines (static, HPA, KPA, oracle) and slotwise's own, behind one registry.

``make_policy("hpa", tolerance=0.05)`` builds a policy by name with knobs named after the real system's
settings; an unknown name or knob is a ``ValueError`` that lists what exists, so a typo in a benchmark
config fails loudly instead of silently running defaults.

Pure: no I/O, no clock (time is ``ctx.now``). May import: ``autoscaler.api``, ``autoscaler.estimation``,
``sharing``, ``forecasting``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from autoscaler.policies.base import Policy
from autoscaler.policies.hpa import HPAPolicy, HPAState
from autoscaler.policies.kpa import KPAPolicy, KPAState
from autoscaler.policies.oracle import OraclePolicy, OracleState
from autoscaler.policies.predictive import PredictivePolicy, PredictiveState
from autoscaler.policies.slo import SloPolicy, SloState
from autoscaler.policies.static import StaticPolicy, StaticState

POLICIES: dict[str, Callable[..., Policy]] = {
    "static": StaticPolicy,
    "hpa": HPAPolicy,
    "kpa": KPAPolicy,
    "oracle": OraclePolicy,
    "slotwise": SloPolicy,
    "predictive": PredictivePolicy,
}


def make_policy(name: str, **knobs: Any) -> Policy:
    """Build the policy registered as ``name`` with ``knobs`` as constructor parameters."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    params = inspect.signature(factory).parameters
    unknown = sorted(k for k in knobs if k not in params)
    if unknown:
        raise ValueError(f"policy {name!r} has no knob(s) {', '.join(unknown)}; knobs: {', '.join(params)}")
    return factory(**knobs)


__all__ = [
    "POLICIES",
    "HPAPolicy",
    "HPAState",
    "KPAPolicy",
    "KPAState",
    "OraclePolicy",
    "OracleState",
    "PredictivePolicy",
    "PredictiveState",
    "SloPolicy",
    "SloState",
    "StaticPolicy",
    "StaticState",
    "make_policy",
]
