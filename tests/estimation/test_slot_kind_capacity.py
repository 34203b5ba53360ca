"""Capacity per (model, slot kind): the kind key, declared slot speeds, and what the core learns and sizes with."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from autoscaler.api.plan import Reason
from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow, ModelMetrics, ModelObservation, Replica
from autoscaler.api.spec import PREFIX, ModelSpec, SpecError, parse_annotations
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.core import decide
from autoscaler.decision.state import ControllerState, fresh_state
from autoscaler.estimation.capacity import ServiceProfile, min_replicas_for_slo, profile_from_spec
from autoscaler.estimation.learning import CapacityLearner
from autoscaler.estimation.model_learning import slot_kind, slot_speed
from autoscaler.policies.base import PolicyContext, PolicyResult, ScalingBehavior
from sharing.catalog import load_catalog
from sharing.cluster import nodes_from_spec
from sharing.slots import Inventory, Slot

CAT = load_catalog()
H100 = CAT.get("H100-80GB")
A100 = CAT.get("A100-80GB")
L4 = CAT.get("L4-24GB")
WHOLE = Slot.whole("h100-0", 0, H100)
MIG_1G = Slot.mig("h100-1", 0, H100, "1g", 0)
MIG_3G = Slot.mig("h100-1", 0, H100, "3g", 4)
SHARE_L4 = Slot.share("l4-0", 0, L4, 8.0, 0.3)


# -- the key -------------------------------------------------------------------------------------------


def test_slot_kind_keys() -> None:
    assert slot_kind(WHOLE) == "H100-80GB/whole"
    assert slot_kind(Slot.whole("h100-0", (0, 1), H100)) == "H100-80GB/whole"  # tensor parallel: same kind
    assert slot_kind(MIG_1G) == "H100-80GB/1g.10gb"
    assert slot_kind(MIG_3G) == "H100-80GB/3g.40gb"
    assert slot_kind(Slot.mig("a", 0, A100, "3g", 4)) == "A100-80GB/3g.40gb"
    assert slot_kind(SHARE_L4) == "L4-24GB/share"
    assert slot_kind(Slot.share("a", 0, A100, 5.0, 0.1, profile="1g", start=0)) == "A100-80GB/1g.10gb/share"
    assert slot_kind(Slot.mig("elsewhere", 3, H100, "1g", 6)) is slot_kind(MIG_1G)  # memoised


@pytest.mark.parametrize(
    ("kind", "speed"),
    [
        ("H100-80GB/3g.40gb", 0.6),  # the whole key beats the slot type
        ("A100-80GB/3g.40gb", 0.45),  # the slot type, on any GPU
        ("H100-80GB/1g.10gb", 0.2),  # the slot type beats the GPU model
        ("H100-80GB/whole", 0.9),  # the GPU model
        ("T4-16GB/whole", 1.0),  # no entry: 1
        ("L4-24GB/share", 0.4),  # the GPU model by its catalog alias
        ("L4-24GB/whole", 0.4),
        ("A100-80GB/1g.10gb/share", 0.1),
        ("A100-80GB/whole", 1.0),  # "A100" is the catalog's alias of A100-40GB, not this one
        ("A100-40GB/whole", 0.7),
    ],
)
def test_slot_speed_resolution(kind: str, speed: float) -> None:
    speeds = (
        ("3g.40gb", 0.45),
        ("l4", 0.4),
        ("1G.10GB", 0.2),
        ("H100-80GB", 0.9),
        ("h100-80gb/3g.40gb", 0.6),
        ("1g.10gb/share", 0.1),
        ("A100", 0.7),
    )
    assert slot_speed(kind, speeds) == speed
    assert slot_speed(kind, ()) == 1.0


# -- the annotation ---------------------------------------------------------------------------------


def test_slot_speeds_annotation_parses_in_order() -> None:
    spec = parse_annotations(
        "m", {PREFIX + "slo-latency-ms": "500", PREFIX + "slot-speeds": " L4=0.4 ,, H100-80GB/3g.40gb=0.5,whole=1e0"}
    )
    assert spec.slot_speeds == (("L4", 0.4), ("H100-80GB/3g.40gb", 0.5), ("whole", 1.0))
    hash(spec.slot_speeds)  # a tuple of tuples: hashable, like the frozen spec's other fields
    assert parse_annotations("m", {PREFIX + "slo-latency-ms": "500"}).slot_speeds == ()


def test_every_bad_slot_speed_entry_is_named_in_one_problem() -> None:
    raw = "L4=fast,1g.10gb=0,=0.5,share=-1,whole=inf,L4-24GB,3g.40gb=nan,good=2,GOOD=3"
    with pytest.raises(SpecError) as info:
        parse_annotations("m", {PREFIX + "slo-latency-ms": "500", PREFIX + "slot-speeds": raw})
    (p,) = info.value.problems
    assert p.key == PREFIX + "slot-speeds" and p.value == raw
    for fragment in [
        "L4: speed 'fast' must be a number > 0",
        "1g.10gb: speed '0' must be a number > 0",
        "entry '=0.5' has an empty slot kind",
        "share: speed '-1' must be a number > 0",
        "whole: speed 'inf' must be a number > 0",
        "entry 'L4-24GB' is not KIND=SPEED",
        "3g.40gb: speed 'nan' must be a number > 0",
        "GOOD: given twice",
        "e.g. L4=0.4,1g.10gb=0.25",
    ]:
        assert fragment in p.reason
    assert "good:" not in p.reason


# -- the core: per-kind observations and the profile the policy sizes with ------------------------------


@dataclass
class Recorder:
    """A learning policy that keeps the count and records every context."""

    learns: bool = True
    uses_forecast: bool = False
    name: str = "recorder"
    tick_s: float = 10.0
    behavior: ScalingBehavior | None = None
    seen: list[PolicyContext] = field(default_factory=list)

    def initial_state(self, spec: ModelSpec, replicas: int) -> None:
        return None

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        self.seen.append(ctx)
        return PolicyResult(ctx.current_replicas, None, Reason.STABLE)


INVENTORY = Inventory.from_nodes(nodes_from_spec("1xH100-80GB"))
K_1G, K_3G, K_WHOLE = "H100-80GB/1g.10gb", "H100-80GB/3g.40gb", "H100-80GB/whole"


def _run(
    spec: ModelSpec, replicas: list[tuple[Slot, bool, bool]], rate: float, in_flight: float, ticks: int = 1
) -> tuple[Recorder, ControllerState]:
    """``ticks`` decisions of one model whose replicas are (slot, ready, draining)."""
    policy, state = Recorder(), fresh_state()
    reps = tuple(Replica(f"m-{i}", s, ready=ok, started_at=0.0, draining=d) for i, (s, ok, d) in enumerate(replicas))
    obs = ModelObservation("m", spec, len(reps), reps)
    for t in range(1, ticks + 1):
        now = 10.0 * t
        snap = ClusterSnapshot(now=now, models={"m": obs}, inventory=INVENTORY)
        m = ModelMetrics(rate=np.full(30, rate), in_flight=np.full(30, in_flight))
        state = decide(snap, MetricsWindow(now=now, step_s=10.0, models={"m": m}), state, CoreConfig(policy)).state  # type: ignore[arg-type]
    return policy, state


SPEC = ModelSpec(name="m", slot_speeds=(("1g.10gb", 0.25), ("3g.40gb", 0.5)))


def test_a_declared_slower_kind_is_sized_with_the_slower_profile() -> None:
    prior = profile_from_spec(SPEC)
    # No load yet (nothing learned): the profiles are the declared ones.
    slow, _ = _run(SPEC, [(MIG_1G, True, False)] * 2, rate=0.0, in_flight=0.0)
    ref, _ = _run(SPEC, [(WHOLE, True, False)] * 2, rate=0.0, in_flight=0.0)
    slow_profile: ServiceProfile = slow.seen[-1].capacity
    ref_profile: ServiceProfile = ref.seen[-1].capacity
    assert ref_profile.mean_s == prior.mean_s
    assert slow_profile.mean_s == pytest.approx(4.0 * prior.mean_s, rel=0.01)  # speed 0.25: 4x the service
    for rate in (5.0, 50.0, 200.0):
        assert min_replicas_for_slo(rate, slow_profile) > min_replicas_for_slo(rate, ref_profile)
    assert min_replicas_for_slo(50.0, slow_profile) >= 3 * min_replicas_for_slo(50.0, ref_profile)


def test_all_ready_replicas_on_one_kind_feed_that_kind() -> None:
    rate, in_flight = 5.0, 1.6
    # Two ready on the 3g kind; one still starting and one draining elsewhere do not make it mixed.
    replicas = [(MIG_3G, True, False), (MIG_3G, True, False), (WHOLE, False, False), (MIG_1G, True, True)]
    policy, state = _run(SPEC, replicas, rate, in_flight, ticks=3)
    learning = state.models["m"].learning
    assert learning is not None
    direct = CapacityLearner(profile_from_spec(SPEC), declared_speed={K_3G: 0.5, K_1G: 0.25})
    for _ in range(3):
        assert direct.observe(rate, 2, in_flight, kind=K_3G) is not None
    assert learning.capacity.count == direct.count == 3
    for kind in (None, K_3G, K_WHOLE):  # the kinds seen (a kind's speed is resolved on first sight)
        assert learning.capacity.scale_for(kind) == pytest.approx(direct.scale_for(kind), rel=1e-12)
    # The 3g kind's own data differs from what the model-level factor alone would give it.
    assert learning.capacity.scale_for(K_3G) != pytest.approx(learning.capacity.scale / 0.5, rel=1e-3)
    assert learning.kind == K_3G and learning.kinds_seen == {K_3G, K_WHOLE}  # (the draining one is not counted)
    assert policy.seen[-1].capacity is learning.capacity.profile(K_3G)


def test_mixed_placement_feeds_the_model_level_factor_only() -> None:
    rate, in_flight = 5.0, 1.6
    replicas = [(MIG_3G, True, False), (MIG_1G, True, False), (MIG_1G, True, False)]
    policy, state = _run(SPEC, replicas, rate, in_flight, ticks=3)
    learning = state.models["m"].learning
    assert learning is not None
    direct = CapacityLearner(profile_from_spec(SPEC))
    for _ in range(3):
        direct.observe(rate, 3, in_flight, kind=None)
    cap = learning.capacity
    assert cap.count == 3 and cap.scale == pytest.approx(direct.scale, rel=1e-12) and cap.scale != 1.0
    # No kind has data of its own: each is the model-level factor over its declared speed.
    assert cap.scale_for(K_3G) == pytest.approx(cap.scale / 0.5, rel=1e-12)
    assert cap.scale_for(K_1G) == pytest.approx(cap.scale / 0.25, rel=1e-12)
    # The policy sizes with the kind most active replicas run on.
    assert learning.kind == K_1G and policy.seen[-1].capacity is cap.profile(K_1G)


def test_ties_size_with_the_slower_kind_and_no_replicas_with_the_reference() -> None:
    policy, state = _run(SPEC, [(MIG_3G, True, False), (MIG_1G, False, False)], rate=0.0, in_flight=0.0)
    learning = state.models["m"].learning
    assert learning is not None and learning.kind == K_1G
    policy, state = _run(SPEC, [], rate=0.0, in_flight=0.0)
    learning = state.models["m"].learning
    assert learning is not None and learning.kind is None
    assert policy.seen[-1].capacity is learning.capacity.profile(None)
    assert math.isclose(policy.seen[-1].capacity.mean_s, profile_from_spec(SPEC).mean_s)


# -- placing on a slower kind: more replicas for the same capacity ----------------------------------------


@dataclass
class Wants:
    """A learning policy that asks for ``extra`` more replicas than it has."""

    extra: int
    learns: bool = True
    uses_forecast: bool = False
    name: str = "wants"
    tick_s: float = 10.0
    behavior: ScalingBehavior | None = None

    def initial_state(self, spec: ModelSpec, replicas: int) -> None:
        return None

    def decide(self, ctx: PolicyContext) -> PolicyResult:
        return PolicyResult(ctx.current_replicas + self.extra, None, Reason.FORECAST)


def _scale_up(spec: ModelSpec, cluster: str, extra: int) -> list:
    """A model running one ready replica on a whole H100 asks for ``extra`` more on ``cluster``."""
    inventory = Inventory.from_nodes(nodes_from_spec(cluster))
    rep = Replica("m-0", WHOLE, ready=True, started_at=0.0)
    obs = ModelObservation("m", spec, 1, (rep,))
    snap = ClusterSnapshot(now=10.0, models={"m": obs}, inventory=inventory)
    m = ModelMetrics(rate=np.zeros(30), in_flight=np.zeros(30))  # no load: nothing learned, declared speeds only
    plan = decide(snap, MetricsWindow(now=10.0, step_s=10.0, models={"m": m}), fresh_state(), CoreConfig(Wants(extra)))
    return plan.plan.actions  # type: ignore[arg-type]


def test_replicas_on_a_declared_slower_kind_count_for_their_speed() -> None:
    from autoscaler.api.plan import PlaceReplica, ScaleModel

    spec = ModelSpec(name="m", slot_kinds=("whole",), slot_speeds=(("L4", 0.5),), max_replicas=100)
    actions = _scale_up(spec, "4xL4-24GB", extra=2)
    placed = [a for a in actions if isinstance(a, PlaceReplica)]
    assert len(placed) == 4 and all(slot_kind(a.slot) == "L4-24GB/whole" for a in placed)  # 2 x (1 / 0.5)
    (scale,) = [a for a in actions if isinstance(a, ScaleModel)]
    assert scale.replicas == 5 and "slower" in scale.detail
    # on the sizing kind itself, one for one
    same = [a for a in _scale_up(spec, "4xH100-80GB", extra=2) if isinstance(a, PlaceReplica)]
    assert len(same) == 2


def test_slower_kind_placement_stops_at_max_replicas_and_reports_the_shortfall() -> None:
    from autoscaler.api.plan import PlaceReplica, Shortfall

    spec = ModelSpec(name="m", slot_kinds=("whole",), slot_speeds=(("L4", 0.5),), max_replicas=3)
    actions = _scale_up(spec, "8xL4-24GB", extra=2)
    assert len([a for a in actions if isinstance(a, PlaceReplica)]) == 2  # the ceiling: 1 + 2
    (short,) = [a for a in actions if isinstance(a, Shortfall)]
    assert short.missing == 1  # 2 asked, 2 x 0.5 placed
