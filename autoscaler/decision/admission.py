"""Admission: every model's spec held against the operator's caps and team bindings before the core decides.

Annotations are written by whoever owns a namespace, so a value that parses can still be hostile or absurd: a
``concurrency`` of 10^400 (a whole number) overflows the queueing model, ``max-replicas: 100000`` of thousandth-GPU
shares makes one tick place for minutes and asks the device plugin for 1,000 time-slice replicas of every GPU, and
``team`` / ``priority`` are self-declared. :func:`admit` turns every such model into an invalid one -- ``spec`` None,
a :class:`~autoscaler.api.spec.SpecError` naming the annotation, the value and the cap or binding -- so the core
treats it as it treats a typo: a status condition and an Event for that model, its replicas left alone, every other
model decided as usual.

The caps are :class:`~autoscaler.api.spec.SpecLimits` (``limits:`` in the settings); the bindings come from the
team list (``teams[].namespaces``, ``teams[].max_priority``: :class:`~autoscaler.decision.arbitration.TeamQuota`).
A priority over its team's cap is refused, not clamped: clamping would change the arbitration order silently, a
refusal tells the model's owner (Event) and the cap's value.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from autoscaler.api.snapshot import ClusterSnapshot, ModelObservation
from autoscaler.api.spec import PREFIX, ModelSpec, SpecError, SpecLimits, SpecProblem, limit_problems, within_limits
from autoscaler.decision.arbitration import ArbitrationPolicy


@dataclass(frozen=True)
class TeamBindings:
    """The team list as lookups: which namespaces may claim a team, which teams a namespace may claim, each
    team's priority cap. Empty maps: no binding (every team claimable from anywhere, as before issue 16)."""

    namespaces_of: dict[str, frozenset[str]]  # team -> the namespaces that may claim it (teams that list some)
    teams_of: dict[str, frozenset[str]]  # namespace -> the teams that list it
    max_priority: dict[str, int]  # team -> its cap

    @property
    def active(self) -> bool:
        return bool(self.namespaces_of or self.max_priority)


@lru_cache(maxsize=8)
def bindings(policy: ArbitrationPolicy) -> TeamBindings:
    """The team bindings of ``policy`` (cached: the policy is frozen, and admission runs every tick)."""
    namespaces_of: dict[str, frozenset[str]] = {}
    teams_of: dict[str, set[str]] = {}
    caps: dict[str, int] = {}
    for t in policy.teams:
        if t.namespaces:
            namespaces_of[t.name] = frozenset(t.namespaces)
            for ns in t.namespaces:
                teams_of.setdefault(ns, set()).add(t.name)
        if t.max_priority is not None:
            caps[t.name] = t.max_priority
    return TeamBindings(namespaces_of, {ns: frozenset(ts) for ns, ts in teams_of.items()}, caps)


def team_problems(spec: ModelSpec, b: TeamBindings) -> list[SpecProblem]:
    """What the model's team and priority break of the bindings (empty: nothing)."""
    problems: list[SpecProblem] = []
    team, ns = spec.team, spec.namespace
    allowed = b.namespaces_of.get(team)
    if allowed is not None and ns not in allowed:
        problems.append(SpecProblem(
            PREFIX + "team", team, f"team {team} is bound to namespace(s) {', '.join(sorted(allowed))} "
            f"(teams[].namespaces); a model in namespace {ns} may not claim it"))
    else:
        mine = b.teams_of.get(ns)
        if mine is not None and team not in mine:
            problems.append(SpecProblem(
                PREFIX + "team", team, f"namespace {ns} belongs to team(s) {', '.join(sorted(mine))} "
                "(teams[].namespaces): set slotwise.io/team to one of them"))
    cap = b.max_priority.get(team)
    if cap is not None and spec.priority > cap:
        problems.append(SpecProblem(PREFIX + "priority", str(spec.priority),
                                    f"above team {team}'s cap teams[].max_priority ({cap})"))
    return problems


def _team_ok(spec: ModelSpec, b: TeamBindings) -> bool:
    """:func:`team_problems` is empty (without building it)."""
    team = spec.team
    allowed = b.namespaces_of.get(team)
    if allowed is not None:
        if spec.namespace not in allowed:
            return False
    else:
        mine = b.teams_of.get(spec.namespace)
        if mine is not None and team not in mine:
            return False
    cap = b.max_priority.get(team)
    return cap is None or spec.priority <= cap


def admit(snapshot: ClusterSnapshot, limits: SpecLimits, arbitration: ArbitrationPolicy) -> ClusterSnapshot:
    """``snapshot`` with every model over a cap or breaking a team binding made invalid (``spec`` None, the
    problems in ``spec_error``); the same object when every model is admitted (most ticks: nothing copied)."""
    b = bindings(arbitration)
    check_teams = b.active
    refused: dict[str, ModelObservation] | None = None
    for name, obs in snapshot.models.items():
        spec = obs.spec
        if spec is None or (within_limits(spec, limits) and (not check_teams or _team_ok(spec, b))):
            continue  # (the common case: a few comparisons per model and tick)
        problems = limit_problems(spec, limits)
        if check_teams:
            problems += team_problems(spec, b)
        if problems:
            if refused is None:
                refused = {}
            refused[name] = replace(obs, spec=None, spec_error=SpecError(name, problems))
    if refused is None:
        return snapshot
    return replace(snapshot, models={n: refused.get(n, o) for n, o in snapshot.models.items()})
