"""The ordering of asks: an ask's progress through one tick, whether its model misses its SLO without its next
replica, and the rank key that decides who is served next (guarantee first, then what fixes an SLO miss, by
priority, SLO damage per GPU and past borrowing; the baselines' simpler orders)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoscaler.decision.arbitration.damage import EPS, expected_load, share_gained, slo_attainment
from autoscaler.decision.arbitration.types import Ask


@dataclass
class Progress:
    """One ask during a tick: what it got so far and the GPU-equivalents its next replica takes."""

    ask: Ask
    frac: float  # GPU-equivalents of the next replica (estimate until one is placed)
    placed: int = 0
    waiting: int = 0  # replicas granted on capacity being freed (reclaiming / preempting)
    units: float = 0.0
    done: bool = False

    @property
    def replicas(self) -> int:
        return self.ask.current + self.placed + self.waiting

    def remaining(self) -> int:
        """Replicas still to grant: the capacity left, at one unit per replica."""
        left = math.ceil(self.ask.wanted - self.units - self.waiting - EPS)
        return max(0, min(left, self.ask.max_new - self.placed - self.waiting))


def misses(p: Progress) -> bool:
    """Without the next replica the model misses its SLO at the load it was sized for (its forecast's upper
    quantile): what ranks free capacity."""
    a = p.ask
    return slo_attainment(a.load_rps, p.replicas, a.profile) < a.slo_target - EPS


def would_miss(p: Progress) -> bool:
    """Without the next replica the model misses its SLO at the load it expects (the forecast's median, at
    least the observed load): what justifies a preemption. Draining another model's replicas for the tail
    of one's own forecast would turn a risk into a certain loss."""
    a = p.ask
    return slo_attainment(expected_load(a), p.replicas, a.profile) < a.slo_target - EPS


def gain_per_gpu(p: Progress) -> float:
    """What the next replica is worth at the model's tail, per GPU-equivalent it takes (:func:`share_gained`):
    the ranking of free capacity."""
    return share_gained(p.ask.profile, p.ask.load_rps, p.replicas, p.remaining()) / max(p.frac, EPS)


def gain_expected(p: Progress) -> float:
    """What the next replica is worth at the model's expected load: what a preemption for it is weighed by."""
    return share_gained(p.ask.profile, expected_load(p.ask), p.replicas, p.remaining())


def rank_key(p: Progress, mode: str, within_guarantee: bool, borrowed: float) -> tuple:
    """The ask served first has the smallest key. ``within_guarantee``: its next replica keeps its team inside its
    guarantee; ``borrowed``: its team's recent borrowing (the fairness tie-break)."""
    a = p.ask
    tier = 0 if within_guarantee else 1
    if mode == "slo":
        return (tier, 0 if misses(p) else 1, -a.priority, -gain_per_gpu(p), borrowed, a.order)
    if mode == "priority":
        return (tier, -a.priority, a.order)
    return (-a.priority, a.order)
