"""Team and priority are self-declared annotations; the operator binds them (issue 16, security).

``teams[].namespaces``: only those namespaces may claim the team, and a namespace a team lists may claim only the
teams that list it; ``teams[].max_priority``: the highest priority the team's models may declare. A model breaking
either is refused -- a spec error for that model (status condition false, an Event), its replicas left alone -- and
the other models are decided as usual.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.api.plan import Reason, ScaleModel, UpdateStatus
from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow, ModelMetrics, ModelObservation
from autoscaler.api.spec import ModelSpec, SpecLimits
from autoscaler.decision.admission import _team_ok, admit, bindings, team_problems
from autoscaler.decision.arbitration import ArbitrationPolicy, TeamQuota
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.core import decide
from autoscaler.decision.state import fresh_state
from autoscaler.policies.base import PolicyContext, PolicyResult
from sharing.cluster import nodes_from_spec
from sharing.slots import Inventory

POLICY = ArbitrationPolicy(teams=(
    TeamQuota("search", 4, namespaces=("search-prod", "search-dev"), max_priority=10),
    TeamQuota("research", 2, namespaces=("research",)),
    TeamQuota("ops", max_priority=0),  # not bound to namespaces: claimable from anywhere, priority capped
))


def spec(ns: str, team: str, priority: int = 0) -> ModelSpec:
    return ModelSpec(name=f"{ns}/m", namespace=ns, team=team, priority=priority)


def problems(ns: str, team: str, priority: int = 0) -> list[str]:
    return [str(p) for p in team_problems(spec(ns, team, priority), bindings(POLICY))]


def test_a_team_bound_to_namespaces_is_claimable_only_from_them() -> None:
    assert problems("search-prod", "search") == []
    assert problems("search-dev", "search") == []
    (p,) = problems("research", "search")
    assert p.startswith("slotwise.io/team='search'") and "search-dev, search-prod" in p and "research" in p


def test_a_bound_namespace_claims_only_its_teams() -> None:
    # claiming a team nobody lists (or the default team) would escape the namespace's quota
    for team in ("adhoc", "default", "ops"):
        (p,) = problems("search-prod", team)
        assert "namespace search-prod belongs to team(s) search" in p, p


def test_unbound_namespaces_and_teams_work_as_before() -> None:
    assert problems("elsewhere", "adhoc") == []
    assert problems("elsewhere", "default") == []
    assert problems("elsewhere", "ops") == []
    assert not bindings(ArbitrationPolicy()).active
    assert not bindings(ArbitrationPolicy(teams=(TeamQuota("a", 1),))).active


@pytest.mark.parametrize(("ns", "team", "priority", "refused"), [
    ("search-prod", "search", 10, False),
    ("search-prod", "search", 11, True),
    ("elsewhere", "ops", 0, False),
    ("elsewhere", "ops", 1, True),
    ("research", "research", 1000, False),  # no team cap: only limits.max_priority
])
def test_priority_is_capped_per_team_by_refusal(ns: str, team: str, priority: int, refused: bool) -> None:
    got = problems(ns, team, priority)
    assert bool(got) is refused
    if refused:
        assert got[0].startswith(f"slotwise.io/priority='{priority}'") and "teams[].max_priority" in got[0]


@given(st.sampled_from(["search-prod", "search-dev", "research", "elsewhere", "ops"]),
       st.sampled_from(["search", "research", "ops", "default", "adhoc"]), st.integers(-5, 20))
def test_the_fast_check_agrees_with_the_named_problems(ns: str, team: str, priority: int) -> None:
    assert _team_ok(spec(ns, team, priority), bindings(POLICY)) is (not problems(ns, team, priority))


def _snapshot(*specs: ModelSpec) -> ClusterSnapshot:
    models = {s.name: ModelObservation(s.name, s, desired_replicas=0) for s in specs}
    return ClusterSnapshot(now=100.0, models=models, inventory=Inventory.from_nodes(nodes_from_spec("4xH100-80GB")))


def test_admission_refuses_only_the_offender_and_copies_nothing_otherwise() -> None:
    ok = _snapshot(spec("search-prod", "search"), spec("elsewhere", "adhoc"))
    assert admit(ok, SpecLimits(), POLICY) is ok  # nothing refused: the same snapshot, no copy
    bad = _snapshot(spec("search-prod", "search"), spec("research", "search"))
    out = admit(bad, SpecLimits(), POLICY)
    assert out.models["search-prod/m"] is bad.models["search-prod/m"]
    refused = out.models["research/m"]
    assert refused.spec is None and refused.spec_error is not None
    assert str(refused.spec_error).startswith("model research/m: slotwise.io/team='search'")


class Two:
    """Every model asks for two replicas."""

    tick_s = 10.0
    name = "two"
    instant_start = False
    uses_forecast = False
    learns = False
    behavior = None

    def initial_state(self, spec: ModelSpec, replicas: int) -> int:
        return 0

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        return PolicyResult(2, 0, Reason.REACTIVE, "two")


def _window(snap: ClusterSnapshot) -> MetricsWindow:
    return MetricsWindow(now=snap.now, step_s=15.0, models={
        n: ModelMetrics(rate=np.full(10, 5.0), in_flight=np.full(10, 0.5)) for n in snap.models})


def test_a_refused_model_gets_an_invalid_status_and_the_others_are_scaled() -> None:
    snap = _snapshot(ModelSpec(name="search-prod/a", namespace="search-prod", team="search", priority=5),
                     ModelSpec(name="research/b", namespace="research", team="search", priority=100))
    config = CoreConfig(policy=Two(), arbitration=POLICY)  # type: ignore[arg-type]
    plan = decide(snap, _window(snap), fresh_state(), config).plan
    assert [a.model for a in plan.of_type(ScaleModel)] == ["search-prod/a"]
    (status,) = [a for a in plan.of_type(UpdateStatus) if a.model == "research/b"]
    assert not status.condition_ok and status.reason is Reason.INVALID_SPEC
    assert "slotwise.io/team='search'" in status.message and "slotwise.io/priority='100'" in status.message


def test_the_settings_bind_teams() -> None:
    policy = ArbitrationPolicy.from_mapping(None, [
        {"name": "search", "guaranteed_gpus": 4, "namespaces": ["search-prod"], "max_priority": 10},
        {"name": "ops", "namespaces": "ops"},  # one namespace may be given as a string
    ])
    assert policy.quota("search") == TeamQuota("search", 4, None, ("search-prod",), 10)
    assert policy.quota("ops").namespaces == ("ops",)


@pytest.mark.parametrize(("team", "message"), [
    ({"name": "a", "namespaces": 5}, "teams[0]: team a: namespaces must be a list of namespace names"),
    ({"name": "a", "namespaces": ["x", ""]}, "teams[0]: team a: namespaces must be a list of namespace names"),
    ({"name": "a", "max_priority": "high"}, "teams[0]: team a: max_priority must be a whole number"),
    ({"name": "a", "max_priority": 1.5}, "teams[0]: team a: max_priority must be a whole number"),
    ({"name": "a", "namespace": ["x"]}, "teams[0]: unknown key(s) namespace"),
])
def test_bad_team_bindings_name_the_key(team: dict, message: str) -> None:
    with pytest.raises(ValueError) as e:
        ArbitrationPolicy.from_mapping(None, [team])
    assert str(e.value).startswith(message), str(e.value)
