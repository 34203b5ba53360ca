"""The arbitration settings: the modes, each team's quota, and :class:`ArbitrationPolicy` read from configuration."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ARBITRATION_MODES = ("slo", "priority", "partition")
_TEAM_KEYS = ("name", "guaranteed_gpus", "borrowing_limit_gpus", "namespaces", "max_priority")


@dataclass(frozen=True)
class TeamQuota:
    """A team's GPU quota for inference, in GPU-equivalents: ``guaranteed_gpus`` it always gets when its models
    need them, and at most ``borrowing_limit_gpus`` more of what others do not use (None: no limit).

    Team and priority are annotations any namespace owner writes, so the operator binds them here:
    ``namespaces`` (not empty) are the only namespaces whose models may claim the team, and a namespace listed by
    any team may claim only the teams that list it; ``max_priority`` (None: only ``limits.max_priority``) is the
    highest ``slotwise.io/priority`` the team's models may declare. A model breaking either is refused (a spec
    error for that model: ``autoscaler/decision/admission.py``)."""

    name: str
    guaranteed_gpus: float = 0.0
    borrowing_limit_gpus: float | None = None
    namespaces: tuple[str, ...] = ()
    max_priority: int | None = None

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
        if not (isinstance(self.namespaces, tuple) and all(isinstance(n, str) and n for n in self.namespaces)):
            raise ValueError(f"team {self.name}: namespaces must be a list of namespace names, got {self.namespaces!r}")
        p = self.max_priority
        if p is not None and not (isinstance(p, int) and not isinstance(p, bool)):
            raise ValueError(f"team {self.name}: max_priority must be a whole number (or absent), got {p!r}")

    @property
    def limit_gpus(self) -> float:
        """The most the team may hold (inf: no limit)."""
        return math.inf if self.borrowing_limit_gpus is None else self.guaranteed_gpus + self.borrowing_limit_gpus


@dataclass(frozen=True)
class ArbitrationPolicy:
    """How the decision core arbitrates when GPUs run out (see the package docstring).

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
        fairness_half_life_s) and ``teams`` (a list of {name, guaranteed_gpus, borrowing_limit_gpus, namespaces,
        max_priority}). Raises ValueError naming the key for anything unknown or invalid."""
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
            extra = sorted(set(t) - set(_TEAM_KEYS))
            if extra:
                raise ValueError(f"teams[{i}]: unknown key(s) {', '.join(extra)} (known: {', '.join(_TEAM_KEYS)})")
            namespaces = t.get("namespaces") or ()
            if isinstance(namespaces, str):
                namespaces = (namespaces,)
            try:
                quotas.append(TeamQuota(t.get("name", ""), t.get("guaranteed_gpus", 0.0),
                                        t.get("borrowing_limit_gpus"),
                                        tuple(namespaces) if isinstance(namespaces, list | tuple) else namespaces,
                                        t.get("max_priority")))
            except ValueError as e:
                raise ValueError(f"teams[{i}]: {e}") from None
        return cls(teams=tuple(quotas), **doc)
