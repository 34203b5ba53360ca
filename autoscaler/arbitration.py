"""Arbitration among models when GPUs run out: team quotas, priorities and SLO damage (issue 9).

The decision core sizes every model first (the policy, inside its rails); the replicas asked for beyond the
current ones are *asks*. When they do not all fit, :func:`arbitrate` decides who gets the GPUs, one replica at a
time, and who is preempted, and says why for every replica refused. Pure: no I/O, no clock.

The rules (``mode="slo"``, the default):

1. **Guarantee first.** A replica that keeps its team inside its guaranteed GPUs (GPU-equivalents: a slot counts
   by its GPU fraction) is served before any replica that borrows. A team never holds more than its guarantee +
   borrowing limit (``borrowing_limit``).
2. **Then what fixes an SLO miss.** Among the rest, a replica without which the model would miss its SLO at the
   load its policy sized for (the queueing model's attainment below the SLO percentile) is served before a
   replica that is headroom, by priority, then by **SLO damage per GPU**: the requests per second it brings
   inside the SLO divided by its GPU fraction (the model that would miss worst, per GPU it costs, first), then
   the team that borrowed least lately (fair between equal teams over time).
3. **Capacity being freed before new preemptions.** An ask that does not fit now but fits on GPUs already being
   freed (replicas draining, lent training GPUs) waits for them: on lent GPUs the lend stage reclaims them
   (``reclaiming``); lent training is always reclaimed before any inference is preempted.
4. **Preemption, only to fix an SLO miss or a guarantee.** An ask that fixes a miss may drain replicas of models
   of strictly lower priority (``priority``), and an ask inside its team's guarantee may drain replicas of teams
   above their guarantee (``guarantee``), never taking a victim's team below its guarantee. Victims: those that
   have run ``min_runtime_s`` (a guarantee reclaim does not wait: borrowed capacity is lent on that condition),
   the least SLO damage per GPU freed first; at most ``max_preemptions_per_tick``. No flapping: a victim's
   model ranks below its preemptor by the same rules next tick, and nothing is preempted for headroom.

Baselines, for the benchmark: ``mode="priority"`` (Kueue/KAI-style: the same quotas, then priority and arrival
order, preempting lower priority for any ask, with no SLO knowledge) and ``mode="partition"`` (static per-team
partitions: each team's guarantee, scaled to the cluster, is its hard limit; no borrowing, no preemption).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ARBITRATION_MODES = ("slo", "priority", "partition")


@dataclass(frozen=True)
class TeamQuota:
    """A team's GPU quota for inference, in GPU-equivalents: ``guaranteed_gpus`` it always gets when its models
    need them, and at most ``borrowing_limit_gpus`` more of what others do not use (None: no limit)."""

    name: str
    guaranteed_gpus: float = 0.0
    borrowing_limit_gpus: float | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"team name must be a non-empty string, got {self.name!r}")
        if not (isinstance(self.guaranteed_gpus, int | float) and math.isfinite(self.guaranteed_gpus)
                and self.guaranteed_gpus >= 0):
            raise ValueError(f"team {self.name}: guaranteed_gpus must be a number >= 0, got {self.guaranteed_gpus!r}")
        b = self.borrowing_limit_gpus
        if b is not None and not (isinstance(b, int | float) and math.isfinite(b) and b >= 0):
            raise ValueError(f"team {self.name}: borrowing_limit_gpus must be a number >= 0 (or absent: no limit), "
                             f"got {b!r}")

    @property
    def limit_gpus(self) -> float:
        """The most the team may hold (inf: no limit)."""
        return math.inf if self.borrowing_limit_gpus is None else self.guaranteed_gpus + self.borrowing_limit_gpus


@dataclass(frozen=True)
class ArbitrationPolicy:
    """How the decision core arbitrates when GPUs run out (see the module docstring).

    ``teams``: the quotas; a model whose team is not listed has no guarantee and no borrowing limit.
    ``preemption``: False never drains inference for other inference. ``min_runtime_s``: a replica younger than
    this is not preempted for priority. ``fairness_half_life_s``: how long a team's borrowing is remembered when
    ordering equal asks.
    """

    mode: str = "slo"
    teams: tuple[TeamQuota, ...] = ()
    preemption: bool = True
    min_runtime_s: float = 300.0
    max_preemptions_per_tick: int = 8
    fairness_half_life_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.mode not in ARBITRATION_MODES:
            raise ValueError(f"arbitration mode must be one of {', '.join(ARBITRATION_MODES)}, got {self.mode!r}")
        names = [t.name for t in self.teams]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"teams listed twice: {', '.join(dup)}")
        for knob in ("min_runtime_s", "fairness_half_life_s"):
            v = getattr(self, knob)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{knob} must be a number >= 0, got {v!r}")
        if not (isinstance(self.max_preemptions_per_tick, int) and self.max_preemptions_per_tick >= 0):
            raise ValueError(f"max_preemptions_per_tick must be an integer >= 0, got {self.max_preemptions_per_tick!r}")
        if not isinstance(self.preemption, bool):
            raise ValueError(f"preemption must be true or false, got {self.preemption!r}")

    def quota(self, team: str) -> TeamQuota:
        for t in self.teams:
            if t.name == team:
                return t
        return TeamQuota(team)

    @classmethod
    def from_mapping(cls, arbitration: Mapping[str, Any] | None, teams: Any = None) -> ArbitrationPolicy:
        """From configuration: ``arbitration`` (mode, preemption, min_runtime_s, max_preemptions_per_tick,
        fairness_half_life_s) and ``teams`` (a list of {name, guaranteed_gpus, borrowing_limit_gpus}). Raises
        ValueError naming the key for anything unknown or invalid."""
        doc = dict(arbitration or {})
        allowed = {"mode", "preemption", "min_runtime_s", "max_preemptions_per_tick", "fairness_half_life_s"}
        unknown = sorted(set(doc) - allowed)
        if unknown:
            raise ValueError(f"arbitration: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(allowed))})")
        quotas = []
        if teams is not None and not isinstance(teams, list | tuple):
            raise ValueError(f"teams must be a list of {{name, guaranteed_gpus, borrowing_limit_gpus}}, got {teams!r}")
        for i, t in enumerate(teams or ()):
            if not isinstance(t, Mapping):
                raise ValueError(f"teams[{i}] must be a mapping, got {t!r}")
            extra = sorted(set(t) - {"name", "guaranteed_gpus", "borrowing_limit_gpus"})
            if extra:
                raise ValueError(f"teams[{i}]: unknown key(s) {', '.join(extra)} "
                                 "(known: name, guaranteed_gpus, borrowing_limit_gpus)")
            try:
                quotas.append(TeamQuota(t.get("name", ""), t.get("guaranteed_gpus", 0.0),
                                        t.get("borrowing_limit_gpus")))
            except ValueError as e:
                raise ValueError(f"teams[{i}]: {e}") from None
        return cls(teams=tuple(quotas), **doc)
