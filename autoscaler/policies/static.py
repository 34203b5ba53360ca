"""Static baseline: a fixed replica count per model, as a fleet sized by hand for its peak would be."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autoscaler.api.plan import Reason
from autoscaler.api.spec import ModelSpec
from autoscaler.policies.base import PolicyContext, PolicyResult, ScalingBehavior


@dataclass(frozen=True)
class StaticState:
    replicas: int


class StaticPolicy:
    """Always the same count: ``replicas_by_model[spec.key or spec.name]``, else ``replicas``, else
    ``spec.max_replicas`` (with nothing known, the only "sized for the peak" count is the ceiling).

    The simulator computes the peak-sized count per model from the trace and passes ``replicas_by_model``.
    """

    name = "static"
    instant_start = False
    uses_forecast = False  # reacts to observed (or, for the oracle, true) load only
    learns = False
    behavior: ScalingBehavior | None = None

    def __init__(
        self,
        replicas_by_model: Mapping[str, int] | None = None,
        replicas: int | None = None,
        tick_s: float = 60.0,
    ) -> None:
        if replicas is not None and replicas < 0:
            raise ValueError("replicas must be >= 0")
        if replicas_by_model is not None and any(v < 0 for v in replicas_by_model.values()):
            raise ValueError("replicas_by_model values must be >= 0")
        if not tick_s > 0:
            raise ValueError("tick_s must be > 0")
        self.replicas_by_model = dict(replicas_by_model or {})
        self.replicas = replicas
        self.tick_s = tick_s

    def replicas_for(self, spec: ModelSpec) -> int:
        for k in (spec.key, spec.name):
            if k in self.replicas_by_model:
                return self.replicas_by_model[k]
        return self.replicas if self.replicas is not None else spec.max_replicas

    def initial_state(self, spec: ModelSpec, replicas: int) -> StaticState:
        # The fixed count, not the starting one: a static fleet is provisioned before traffic arrives.
        return StaticState(self.replicas_for(spec))

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        state = ctx.state if isinstance(ctx.state, StaticState) else StaticState(self.replicas_for(ctx.spec))
        return PolicyResult(state.replicas, state, Reason.STATIC, "fixed replicas")
