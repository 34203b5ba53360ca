"""What the decision core remembers between ticks: per model (policy state, learning, capacity, when it is next
due, what it was last sized on), the fleet forecaster, the lend stage's memory and the teams' recent borrowing.

Plain dataclasses, mutated only by the decision core's stages (``decide``, the lend stage, arbitration).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from autoscaler.api.plan import Reason
from autoscaler.api.snapshot import window_mean
from autoscaler.api.spec import ModelSpec
from autoscaler.decision.arbitration import ArbitrationState
from autoscaler.decision.scaledown import ScaleDownState
from autoscaler.estimation.capacity import ServiceProfile
from autoscaler.estimation.forecast import FleetForecaster
from autoscaler.estimation.idle_times import IdleTimes
from autoscaler.estimation.model_learning import ModelLearning
from autoscaler.policies.base import Forecast
from sharing.lending import LendingPlan
from sharing.slots import SlotRequest


@dataclass  # (never mutated; not frozen: one per model and tick, and a frozen __init__ costs 4x)
class SizedLoad:
    """What a model was last sized on, for arbitration: its load at the forecast's sizing quantile (its *tail*)
    and at the median (what it *expects*), each at least the load observed over the last minute. Computed only
    when arbitration asks (most ticks it does not)."""

    forecast: Forecast | None
    quantile: float
    rate: np.ndarray
    step_s: float

    @cached_property
    def observed_rps(self) -> float:
        return window_mean(self.rate, self.step_s, 60.0) or 0.0

    def _at(self, q: float) -> float:
        f = self.forecast.at(q) if self.forecast is not None else math.nan
        return max(f, self.observed_rps) if math.isfinite(f) else self.observed_rps

    @cached_property
    def tail_rps(self) -> float:
        return self._at(self.quantile)

    @cached_property
    def expected_rps(self) -> float:
        return self._at(0.5)


@dataclass
class ModelState:
    """What the controller remembers about one model between ticks."""

    policy_state: Any
    capacity: ServiceProfile
    next_decision_at: float = -math.inf
    learning: ModelLearning | None = None
    last_reason: Reason | None = None
    last_desired: int = -1
    sized: SizedLoad | None = None  # the loads it was last sized on (arbitration's SLO-damage inputs)
    scale_down: ScaleDownState = field(default_factory=ScaleDownState)  # its behaviour's windows and scale events
    # The arrivals' dispersion its policy last sized with (PolicyResult.arrival_scv; 1 = Poisson, or not measured):
    # the lend stage sizes the model's need-soon with it.
    arrival_scv: float = 1.0
    # The mean service time of the profile it is sized with over the declared one (autoscaler/estimation/work.py):
    # the offered work the in-flight count reads, in requests/s of that profile.
    work_unit: float = 1.0
    # A model that may go to zero (min_replicas 0): its idle times, what its keep-alive policy decides on
    # (autoscaler/decision/zero.py); None until it is first decided with min_replicas 0.
    idle: IdleTimes | None = None

    def profile(self) -> ServiceProfile:
        """The service profile sizing uses now: the learned one when the model learns, else the prior."""
        return self.capacity if self.learning is None else self.learning.profile(self.learning.kind)


@dataclass
class NeedSoon:
    """One model's need over the reclaim horizon, as of its last decision."""

    replicas: int  # what sizing asks for at the upper quantile over the reclaim horizon
    request: SlotRequest  # the model's slot shape
    guess: bool  # stale metrics or no forecast: ``replicas`` is only a floor, lending is held
    next_at: float  # when to recompute (the model's next decision)
    spec: ModelSpec | None = None  # what ``request`` and ``replicas`` were computed from, to reuse them while
    sized_for: tuple | None = None  # ... the spec, the forecast, the quantile and the profile stay the same


@dataclass
class LendState:
    """What the lend stage remembers between ticks (``ControllerState.lending``)."""

    need: dict[str, NeedSoon] = field(default_factory=dict)
    reclaiming: dict[tuple[str, int], float] = field(default_factory=dict)  # lent GPU -> when its reclaim was asked
    last: LendingPlan | None = None  # the last tick's plan (what the controller reports: buffer, surplus)


@dataclass
class ControllerState:
    models: dict[str, ModelState] = field(default_factory=dict)
    replica_seq: int = 0
    # Measured service profiles to use instead of the spec prior (a warm start: offline profiling in
    # the simulator, learned online by the sizing issue).
    profiles: dict[str, ServiceProfile] = field(default_factory=dict)
    invalid: dict[str, str] = field(default_factory=dict)  # model -> spec problem last reported
    forecaster: FleetForecaster | None = None
    forecast_models: frozenset[str] = frozenset()  # the models the forecaster was last synced to
    lending: LendState | None = None  # the lend stage's memory (need-soon per model, reclaims in flight)
    arbitration: ArbitrationState = field(default_factory=ArbitrationState)  # teams' recent borrowing
    # Idle times warm-started from history (IdleTimes.from_rates), picked up by a model's first decision; and the
    # fleet's pooled idle times, the prior of models with few of their own (autoscaler/decision/zero.py).
    idle_history: dict[str, IdleTimes] = field(default_factory=dict)
    idle_prior: IdleTimes | None = None


def fresh_state(
    profiles: dict[str, ServiceProfile] | None = None, forecaster: FleetForecaster | None = None,
    idle: dict[str, IdleTimes] | None = None,
) -> ControllerState:
    """A controller's state at start: optionally measured profiles, a warm-started forecaster and idle times
    warm-started from history (model -> ``IdleTimes.from_rates(...)``)."""
    return ControllerState(profiles=dict(profiles or {}), forecaster=forecaster, idle_history=dict(idle or {}))
