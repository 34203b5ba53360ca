"""SLO damage, the arithmetic arbitration ranks and preempts by: the share of a model's requests inside its SLO
(the queueing model's attainment) that a replica more brings, or a replica less costs. Pure functions of numbers."""

from __future__ import annotations

import math

from autoscaler.decision.arbitration.types import Ask, ModelLoad
from autoscaler.estimation.capacity import ServiceProfile, attainment, min_replicas_for_slo

EPS = 1e-9


def weight(priority: int) -> float:
    """A model's SLO counts this much when a preemption weighs the preemptor's gain against the victims' loss."""
    return 1.0 + max(priority, 0)


def expected_load(x: Ask | ModelLoad) -> float:
    """The load a model expects (the forecast's median, at least what it observes); the sized-for load if unknown."""
    return x.load_rps if x.expected_rps is None else x.expected_rps


def served(load: float, replicas: int, profile: ServiceProfile) -> float:
    """Requests per second ``replicas`` serve at ``load`` (all of it, or their capacity when overloaded)."""
    return min(load, max(replicas, 0) * profile.concurrency / profile.mean_s)


def slo_attainment(load: float, replicas: int, profile: ServiceProfile | None) -> float:
    """The share of requests within the SLO latency ``replicas`` give at ``load`` (1 without a profile or a load)."""
    if profile is None or not load > 0 or not math.isfinite(load):
        return 1.0
    return attainment(load, replicas, profile)


def share_gained(profile: ServiceProfile | None, load: float, replicas: int, remaining: int) -> float:
    """The share of the model's requests its next replica brings inside the SLO at ``load``, with ``replicas``
    already and ``remaining`` still to grant: the share the replicas still to come (up to what it needs) bring,
    averaged over them -- one replica of a model several short of its need brings none inside on its own, yet it
    is part of the way there -- at least the share it serves while the model stays overloaded."""
    if profile is None or not load > 0:
        return 0.0
    n = replicas
    room = max(1, remaining)
    n_to = max(n + 1, min(min_replicas_for_slo(load, profile, n + room), n + room))
    inside = slo_attainment(load, n_to, profile) - slo_attainment(load, n, profile)
    return max(inside / (n_to - n), (served(load, n + 1, profile) - served(load, n, profile)) / load)


def replica_loss(ld: ModelLoad, replicas: int, gpu_fraction: float) -> float:
    """What taking one of ``replicas`` of a model costs, as a share of its requests at its expected load (pushed
    out of the SLO, at least no longer served), per GPU-equivalent freed."""
    load = expected_load(ld)
    if ld.profile is None or not load > 0:
        return 0.0
    n = replicas
    inside = slo_attainment(load, n, ld.profile) - slo_attainment(load, n - 1, ld.profile)
    value = max(inside, (served(load, n, ld.profile) - served(load, n - 1, ld.profile)) / load)
    return round(value / max(gpu_fraction, EPS), 9)


def spare(ld: ModelLoad, replicas: int) -> bool:
    """The model still meets its SLO with one replica fewer than ``replicas`` even at the load it was sized for
    (its forecast's upper quantile)."""
    return slo_attainment(ld.load_rps, replicas - 1, ld.profile) >= ld.slo_target - EPS
