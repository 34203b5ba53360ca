"""The controller's exporter over real HTTP: /metrics after a tick of a small hand-built plan, series of models
that leave vanish, /healthz and /readyz answer with status codes and reasons."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from autoscaler.api.plan import (
    Plan,
    PreemptionReason,
    Reason,
    RemoveReplica,
    ScaleModel,
    Shortfall,
    ShortfallCause,
    UpdateStatus,
)
from autoscaler.api.snapshot import (
    ClusterSnapshot,
    MetricsWindow,
    ModelMetrics,
    ModelObservation,
    Replica,
    TrainingWorkload,
)
from autoscaler.api.spec import ModelSpec
from autoscaler.decision.arbitration import TeamQuota
from autoscaler.live.exporter import (
    ControllerMetrics,
    gpu_slots,
    lent_by_kind,
    lent_gpus,
    reclaim_buckets,
)
from autoscaler.live.health import Health, bound_port, start_http
from autoscaler.live.kube.objects import ManagedModel
from sharing.catalog import load_catalog
from sharing.lending import LENT_MODEL, lent_owner
from sharing.slots import Inventory, NodeSpec, Slot

CONTRACT = (
    "slotwise_decisions_total",
    "slotwise_desired_replicas",
    "slotwise_current_replicas",
    "slotwise_forecast_requests_per_second",
    "slotwise_observed_requests_per_second",
    "slotwise_predicted_latency_seconds",
    "slotwise_slo_latency_seconds",
    "slotwise_gpu_slots",
    "slotwise_fragmentation_ratio",
    "slotwise_shortfall_replicas",
    "slotwise_metrics_stale",
    "slotwise_metrics_partial",
    "slotwise_tick_duration_seconds_bucket",
    "slotwise_errors_total",
    "slotwise_is_leader",
    "slotwise_actions_total",
    "slotwise_requests_total",
    "slotwise_requests_late_total",
    "slotwise_slo_objective_ratio",
    "slotwise_lent_gpu_slots",
    "slotwise_reclaim_deadline_seconds",
    "slotwise_preemptions_total",
    "slotwise_team_gpus",
    "slotwise_exact_budget_exceeded_total",
)
A100 = load_catalog().get("A100-80GB")
L4 = load_catalog().get("L4-24GB")


def _inventory() -> Inventory:
    inv = Inventory.from_nodes([NodeSpec("n1", "A100-80GB", 2, mig_enabled=True), NodeSpec("n2", "L4-24GB", 1)])
    inv.allocate(Slot.whole("n2", 0, L4), "ns/a-1", "ns/a")
    inv.allocate(Slot.mig("n1", 0, A100, "3g", 0), "ns/b-1", "ns/b")
    return inv


def _snapshot(models: tuple[str, ...] = ("ns/a", "ns/b")) -> ClusterSnapshot:
    inv = _inventory()
    slot_of = {m: s for m, ss in inv.allocations_by_model().items() for _, s in ss}
    obs = {}
    for key in models:
        ns, name = key.split("/")
        obs[key] = ModelObservation(
            name=key,
            spec=ModelSpec(name, ns, slo_latency_ms=500 if name == "a" else 250),
            desired_replicas=1,
            replicas=(Replica(f"{key}-1", slot_of[key], True, 0.0),),
        )
    training = (TrainingWorkload("ml/train", "Job", gpus=1.0, nodes=("n1",), running=True),)
    return ClusterSnapshot(now=100.0, models=obs, inventory=inv, training=training)


def _plan() -> Plan:
    return Plan(
        now=100.0,
        actions=[
            ScaleModel("ns/a", 3, 1, Reason.FORECAST, "forecast 12.5 req/s"),
            Shortfall("ns/a", 1, "no free GPU slot fits the replica"),
            UpdateStatus("ns/a", 2, 1, Reason.UNPLACEABLE, forecast_rps=12.5, predicted_latency_ms=420.0,
                         slo_latency_ms=500.0),
            UpdateStatus("ns/b", 1, 1, Reason.STABLE, forecast_rps=None, slo_latency_ms=250.0),
        ],
    )


def _window(models: tuple[str, ...] = ("ns/a", "ns/b")) -> MetricsWindow:
    ms = {}
    if "ns/a" in models:
        ms["ns/a"] = ModelMetrics(
            rate=np.array([10.0, 11.5]), in_flight=np.array([4.0, 5.0]), within_rate=np.array([10.0, 10.5])
        )
    if "ns/b" in models:
        ms["ns/b"] = ModelMetrics(rate=np.zeros(0), in_flight=np.zeros(0), stale=True)
    return MetricsWindow(now=100.0, step_s=15.0, models=ms)


@pytest_asyncio.fixture
async def served():
    metrics = ControllerMetrics()
    clock = SimpleNamespace(t=1000.0)
    health = Health(tick_s=5.0, max_missed_ticks=3, clock=lambda: clock.t)
    runner = await start_http(metrics, health, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{bound_port(runner)}"
    async with aiohttp.ClientSession() as session:
        yield SimpleNamespace(metrics=metrics, health=health, clock=clock, url=url, session=session)
    await runner.cleanup()


async def _scrape(s) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with s.session.get(f"{s.url}/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def _names(samples: dict) -> set[str]:
    return {name for name, _ in samples}


@pytest.mark.asyncio
async def test_metrics_after_a_tick_carry_every_contract_metric(served) -> None:
    m = served.metrics
    m.record_tick(_plan(), _snapshot(), _window(), seconds=0.042)
    m.record_actuation(SimpleNamespace(
        applied=["scale ns/a: 1 -> 3 (forecast)"],
        skipped=[("template ns/b: resources {}", "dry-run"), ("scale ns/b: 1 -> 1", "unchanged")],
        errors=["scale ns/c: HTTP 409 conflict"],
    ))
    m.error("metrics")
    m.set_leader(True)
    got = await _scrape(served)
    assert set(CONTRACT) <= _names(got)

    # the plan's numbers, per model
    assert _value(got, "slotwise_desired_replicas", model="ns/a") == 3  # the scale action wins
    assert _value(got, "slotwise_desired_replicas", model="ns/b") == 1
    assert _value(got, "slotwise_current_replicas", model="ns/a") == 1
    assert _value(got, "slotwise_decisions_total", model="ns/a", reason="unplaceable") == 1
    assert _value(got, "slotwise_decisions_total", model="ns/b", reason="stable") == 1
    assert _value(got, "slotwise_decisions_total", model="ns/a", reason="forecast") is None  # one per model
    assert _value(got, "slotwise_forecast_requests_per_second", model="ns/a") == 12.5
    assert _value(got, "slotwise_forecast_requests_per_second", model="ns/b") is None  # no forecast: absent
    assert _value(got, "slotwise_predicted_latency_seconds", model="ns/a") == pytest.approx(0.42)
    assert _value(got, "slotwise_slo_latency_seconds", model="ns/a") == pytest.approx(0.5)
    assert _value(got, "slotwise_slo_latency_seconds", model="ns/b") == pytest.approx(0.25)
    # the shortfall's cause is the reason label (the words are for Events); the team is the spec's
    assert _value(got, "slotwise_shortfall_replicas", team="default", model="ns/a", reason="unplaceable") == 1
    # the window: the last step's rate, stale flags (a stale model has no observed rate)
    assert _value(got, "slotwise_observed_requests_per_second", model="ns/a") == 11.5
    assert _value(got, "slotwise_observed_requests_per_second", model="ns/b") is None
    assert _value(got, "slotwise_metrics_stale", model="ns/a") == 0
    assert _value(got, "slotwise_metrics_stale", model="ns/b") == 1
    # SLO accounting: first sight counts the newest step only (11.5 req/s x 15 s, 1 req/s of it late);
    # a stale model counts nothing yet, but its objective is known from the spec (default p95)
    assert _value(got, "slotwise_requests_total", model="ns/a") == pytest.approx(172.5)
    assert _value(got, "slotwise_requests_late_total", model="ns/a") == pytest.approx(15.0)
    assert _value(got, "slotwise_requests_total", model="ns/b") is None
    assert _value(got, "slotwise_slo_objective_ratio", model="ns/a") == pytest.approx(0.95)
    assert _value(got, "slotwise_slo_objective_ratio", model="ns/b") == pytest.approx(0.95)
    # GPU-equivalents: the L4 is whole; one A100 holds a 3g.40gb instance (3/7), the other is idle
    assert _value(got, "slotwise_gpu_slots", gpu_model="L4-24GB", state="used") == 1
    assert _value(got, "slotwise_gpu_slots", gpu_model="L4-24GB", state="free") == 0
    assert _value(got, "slotwise_gpu_slots", gpu_model="A100-80GB", state="used") == pytest.approx(3 / 7)
    assert _value(got, "slotwise_gpu_slots", gpu_model="A100-80GB", state="free") == pytest.approx(2 - 3 / 7)
    assert _value(got, "slotwise_gpu_slots", gpu_model="A100-80GB", state="lent") == 1
    assert _value(got, "slotwise_fragmentation_ratio") == pytest.approx(_inventory().fragmentation())
    assert _value(got, "slotwise_tick_duration_seconds_count") == 1
    assert _value(got, "slotwise_tick_duration_seconds_sum") == pytest.approx(0.042)
    # actuation and the rest
    assert _value(got, "slotwise_actions_total", kind="scale", outcome="applied") == 1
    assert _value(got, "slotwise_actions_total", kind="template", outcome="dry-run") == 1
    assert _value(got, "slotwise_actions_total", kind="scale", outcome="unchanged") == 1
    assert _value(got, "slotwise_actions_total", kind="scale", outcome="error") == 1
    assert _value(got, "slotwise_errors_total", kind="metrics") == 1
    assert _value(got, "slotwise_is_leader") == 1
    assert _value(got, "slotwise_exact_budget_exceeded_total") == 0
    # an exact placement whose wall-clock safety cut fired is counted (its plan may differ on another machine)
    m.record_tick(dataclasses.replace(_plan(), exact_budget_exceeded=2), _snapshot(), _window(), seconds=0.01)
    assert _value(await _scrape(served), "slotwise_exact_budget_exceeded_total") == 2
    m.set_leader(False)
    assert _value(await _scrape(served), "slotwise_is_leader") == 0


@pytest.mark.asyncio
async def test_series_of_models_that_leave_vanish(served) -> None:
    m = served.metrics
    m.record_tick(_plan(), _snapshot(), _window(), seconds=0.01)
    before = await _scrape(served)
    assert any(dict(labels).get("model") == "ns/b" for _, labels in before)
    # ns/b leaves; ns/a's next tick has no shortfall and no status update
    m.record_tick(Plan(now=115.0), _snapshot(("ns/a",)), _window(("ns/a",)), seconds=0.01)
    after = await _scrape(served)
    assert not any(dict(labels).get("model") == "ns/b" for _, labels in after)
    assert not any(name == "slotwise_shortfall_replicas" for name, _ in after)
    # ns/a's gauges hold between status updates; its desired count falls back to the Deployment's scale
    assert _value(after, "slotwise_desired_replicas", model="ns/a") == 1
    assert _value(after, "slotwise_forecast_requests_per_second", model="ns/a") == 12.5
    assert _value(after, "slotwise_decisions_total", model="ns/a", reason="unplaceable") == 1
    assert _value(after, "slotwise_tick_duration_seconds_count") == 2
    # a model that goes stale loses its observed rate but keeps a stale flag
    stale = MetricsWindow(now=130.0, step_s=15.0, models={})
    m.record_tick(Plan(now=130.0), _snapshot(("ns/a",)), stale, seconds=0.01)
    got = await _scrape(served)
    assert _value(got, "slotwise_observed_requests_per_second", model="ns/a") is None
    assert _value(got, "slotwise_metrics_stale", model="ns/a") == 1


@pytest.mark.asyncio
async def test_label_values_from_free_text_stay_bounded(served) -> None:
    m = served.metrics
    m.record_actuation(SimpleNamespace(
        applied=[f"kind{i} something" for i in range(50)], skipped=[("x", f"why{i}") for i in range(50)], errors=[]
    ))
    m.record_actuation(SimpleNamespace(applied=["!!! weird line"], skipped=[], errors=[]))
    got = await _scrape(served)
    kinds = {dict(labels)["kind"] for name, labels in got if name == "slotwise_actions_total"}
    outcomes = {dict(labels)["outcome"] for name, labels in got if name == "slotwise_actions_total"}
    assert len(kinds) <= 33 and "other" in kinds
    assert len(outcomes) <= 34 and "other" in outcomes
    total = sum(v for (name, _), v in got.items() if name == "slotwise_actions_total")
    assert total == 101  # folding changes labels, never counts


@pytest.mark.asyncio
async def test_healthz_follows_the_heartbeat(served) -> None:
    s = served

    async def get(path: str) -> tuple[int, str]:
        async with s.session.get(f"{s.url}{path}") as resp:
            return resp.status, await resp.text()

    status, text = await get("/healthz")
    assert status == 200 and "starting" in text  # a start is not a death
    s.clock.t += 16.0  # 3 ticks of 5 s, and no beat
    status, text = await get("/healthz")
    assert status == 503 and "stalled" in text and "no tick yet" in text
    s.health.beat()
    status, text = await get("/healthz")
    assert status == 200 and text.startswith("ok")
    s.clock.t += 14.0
    assert (await get("/healthz"))[0] == 200
    s.clock.t += 2.0
    status, text = await get("/healthz")
    assert status == 503 and "16.0s since last tick" in text and "limit 15.0s" in text
    s.health.beat(s.clock.t)
    assert (await get("/healthz"))[0] == 200


@pytest.mark.asyncio
async def test_readyz_needs_synced_caches_and_a_tick(served) -> None:
    s = served

    async def get() -> tuple[int, str]:
        async with s.session.get(f"{s.url}/readyz") as resp:
            return resp.status, await resp.text()

    status, text = await get()
    assert status == 503 and "caches not synced" in text
    s.health.set_ready(False, "informer /api/v1/pods not synced")
    status, text = await get()
    assert status == 503 and "/api/v1/pods" in text
    s.health.set_ready(True)
    status, text = await get()
    assert status == 503 and "not run a tick" in text
    s.health.beat()
    assert await get() == (200, "ok\n")
    s.health.set_ready(False, "lost the apiserver watch")
    status, text = await get()
    assert status == 503 and "lost the apiserver watch" in text


def test_gpu_accounting_helpers() -> None:
    inv = _inventory()
    slots = gpu_slots(inv)
    assert slots["L4-24GB"] == (1.0, 0.0)
    used, free = slots["A100-80GB"]
    assert math.isclose(used + free, 2.0) and math.isclose(used, 3 / 7)
    # the total used agrees with the inventory's own allocated fraction here (no oversubscription)
    assert math.isclose(sum(u for u, _ in slots.values()), inv.allocated_gpu_fraction() * inv.gpus_total)
    # time-slicing shares oversubscribing a GPU's compute count as one GPU, not more
    shared = Inventory.from_nodes([NodeSpec("s", "L4-24GB", 1)], max_compute_oversubscription=2.0)
    for i in range(3):
        shared.allocate(Slot.share("s", 0, L4, 4.0, 0.5), f"ns/c-{i}", "ns/c")
    assert gpu_slots(shared) == {"L4-24GB": (1.0, 0.0)}
    snap = _snapshot()
    two = TrainingWorkload("ml/t2", "Workload", gpus=2.0, nodes=("n1", "n2"), running=True)
    idle = TrainingWorkload("ml/t3", "Pod", gpus=4.0, nodes=("n1",), running=False)
    nowhere = TrainingWorkload("ml/t4", "Pod", gpus=1.0, running=True)
    snap = ClusterSnapshot(snap.now, snap.models, snap.inventory, (*snap.training, two, idle, nowhere))
    assert lent_gpus(snap) == {"A100-80GB": 2.0, "L4-24GB": 1.0, "unknown": 1.0}


# -- SLO accounting: requests and late requests, each metrics step counted once ---------------------------


def _one_model(percentile: float = 99.0) -> ClusterSnapshot:
    snap = _snapshot(("ns/a",))
    obs = snap.models["ns/a"]
    spec = ModelSpec("a", "ns", slo_latency_ms=500, slo_percentile=percentile)
    models = {"ns/a": ModelObservation(obs.name, spec, obs.desired_replicas, obs.replicas)}
    return ClusterSnapshot(now=snap.now, models=models, inventory=snap.inventory)


def _tick(m: ControllerMetrics, now: float, rate, within, *, stale: bool = False, snap=None) -> None:
    mm = ModelMetrics(
        rate=np.asarray(rate, dtype=float),
        in_flight=np.zeros(len(rate)),
        within_rate=None if within is None else np.asarray(within, dtype=float),
        stale=stale,
    )
    snap = snap if snap is not None else _one_model()
    m.record_tick(Plan(now=now), snap, MetricsWindow(now=now, step_s=15.0, models={"ns/a": mm}), seconds=0.01)


def _counts(m: ControllerMetrics, model: str = "ns/a") -> tuple[float | None, float | None]:
    get = m.registry.get_sample_value
    return get("slotwise_requests_total", {"model": model}), get("slotwise_requests_late_total", {"model": model})


def test_requests_count_each_step_once_across_overlapping_windows() -> None:
    m = ControllerMetrics()
    # now=100 on a 15 s grid: steps at 45, 60, 75, 90. First sight: only the newest (4 req/s, 1 of them late)
    _tick(m, 100.0, [1, 2, 3, 4], [1, 1, 1, 3])
    assert _counts(m) == (60.0, 15.0)
    assert m.registry.get_sample_value("slotwise_slo_objective_ratio", {"model": "ns/a"}) == pytest.approx(0.99)
    # a faster tick inside the same step: the same window again, nothing new
    _tick(m, 103.0, [1, 2, 3, 4], [1, 1, 1, 3])
    assert _counts(m) == (60.0, 15.0)
    # two steps later (75..120): 105 is new (all in time); 120's within-rate is unknown: skipped, not guessed
    _tick(m, 121.0, [3, 4, 5, 6], [1, 3, 5, math.nan])
    assert _counts(m) == (60.0 + 75.0, 15.0)
    # next step (90..135): only 135 (7 req/s, 6 in time); 120 was seen already and stays uncounted
    _tick(m, 135.0, [4, 5, 6, 7], [3, 5, 6, 6])
    assert _counts(m) == (60.0 + 75.0 + 105.0, 15.0 + 15.0)
    # within above rate (histogram and request counter are separate series): never negative late counts
    _tick(m, 150.0, [5, 6, 7, 2], [5, 6, 6, 2.5])
    assert _counts(m) == (60.0 + 75.0 + 105.0 + 30.0, 30.0)
    # a NaN rate step counts nothing
    _tick(m, 165.0, [6, 7, 2, math.nan], [6, 6, 2.5, 1.0])
    assert _counts(m) == (270.0, 30.0)


def test_stale_and_histogramless_models_count_nothing_and_catch_up_within_the_window() -> None:
    m = ControllerMetrics()
    _tick(m, 90.0, [2, 2], [2, 2])  # first sight at 90: 30 requests
    assert _counts(m) == (30.0, 0.0)
    _tick(m, 105.0, [2, 2], [2, 2], stale=True)  # stale: hold, count nothing
    _tick(m, 120.0, [], [], stale=True)
    assert _counts(m) == (30.0, 0.0)
    # fresh again at 135 (window 75..135): the steps since 90 that the window still holds are counted
    _tick(m, 135.0, [2, 2, 1, 0, 4], [2, 2, 0, 0, 4])
    assert _counts(m) == (30.0 + 15.0 + 0.0 + 60.0, 15.0)
    # a server without a latency histogram: no SLO accounting at all for a new model
    m2 = ControllerMetrics()
    _tick(m2, 90.0, [2, 2], None)
    assert _counts(m2) == (None, None)


def test_counters_match_the_series_whatever_the_tick_timing() -> None:
    """Ticks faster than the step, slower (skipping steps the window still holds) and jittered: the
    counters end at exactly the sum over the steps from the first-seen one on, no step twice or lost."""
    rng = np.random.default_rng(7)
    step, points = 15.0, 8
    grid = np.arange(0, 200) * step
    rate = rng.uniform(0, 20, grid.size)
    within = rate * rng.uniform(0.5, 1.0, grid.size)
    m = ControllerMetrics()
    now, first = 200.0, None
    while now < grid[-1]:
        end = int(math.floor(now / step + 1e-9))
        lo = end - points + 1
        _tick(m, now, rate[lo:end + 1], within[lo:end + 1])
        first = end if first is None else first
        last = end
        now += rng.choice([3.0, 7.5, 15.0, 31.0, 60.0, 100.0])  # never more than the window (120 s) at once
    requests, late = _counts(m)
    assert requests == pytest.approx(float(np.sum(rate[first:last + 1])) * step)
    assert late == pytest.approx(float(np.sum(rate[first:last + 1] - within[first:last + 1])) * step)


def test_slo_series_leave_with_the_model_and_restart_from_the_newest_step() -> None:
    m = ControllerMetrics()
    _tick(m, 90.0, [2, 2], [1, 1])
    assert _counts(m) == (30.0, 15.0)
    empty = ClusterSnapshot(now=105.0, models={}, inventory=_inventory())
    m.record_tick(Plan(now=105.0), empty, MetricsWindow(now=105.0, step_s=15.0), seconds=0.01)
    assert _counts(m) == (None, None)
    assert m.registry.get_sample_value("slotwise_slo_objective_ratio", {"model": "ns/a"}) is None
    _tick(m, 120.0, [2, 2, 3], [1, 1, 3])  # back: a new first sight, the newest step only
    assert _counts(m) == (45.0, 0.0)


def test_a_replica_that_loses_the_lease_freezes_and_counts_anew_when_it_leads_again() -> None:
    m = ControllerMetrics()
    m.set_leader(True)
    m.record_tick(_plan(), _snapshot(), _window(), seconds=0.01)
    get = m.registry.get_sample_value
    assert get("slotwise_desired_replicas", {"model": "ns/a"}) == 3
    assert get("slotwise_requests_total", {"model": "ns/a"}) == pytest.approx(172.5)
    m.set_leader(False)
    assert get("slotwise_is_leader") == 0
    # a tick that was under way when the lease went finishes after it: its duration counts, nothing else
    # (the gauges keep the last leading tick's numbers: queries pick the leader by slotwise_is_leader)
    moved = MetricsWindow(now=115.0, step_s=15.0, models={
        "ns/a": ModelMetrics(rate=np.array([11.5, 50.0]), in_flight=np.zeros(2), within_rate=np.zeros(2)),
    })
    m.record_tick(Plan(now=115.0), _snapshot(("ns/a",)), moved, seconds=0.01)
    assert get("slotwise_desired_replicas", {"model": "ns/a"}) == 3
    assert get("slotwise_observed_requests_per_second", {"model": "ns/a"}) == 11.5
    assert get("slotwise_desired_replicas", {"model": "ns/b"}) == 1  # not forgotten by a follower's tick
    assert get("slotwise_requests_total", {"model": "ns/a"}) == pytest.approx(172.5)
    assert get("slotwise_decisions_total", {"model": "ns/a", "reason": "unplaceable"}) == 1
    assert get("slotwise_tick_duration_seconds_count") == 2
    # leader again, three steps later: only the newest step is added (the other leader counted the ones
    # in between), and the gauges follow the ticks again
    m.set_leader(True)
    later = MetricsWindow(now=145.0, step_s=15.0, models={
        "ns/a": ModelMetrics(rate=np.array([11.5, 8.0, 9.0, 2.0]), in_flight=np.zeros(4),
                             within_rate=np.array([10.5, 8.0, 9.0, 2.0])),
        "ns/b": ModelMetrics(rate=np.zeros(0), in_flight=np.zeros(0), stale=True),
    })
    m.record_tick(Plan(now=145.0), _snapshot(), later, seconds=0.01)
    assert get("slotwise_desired_replicas", {"model": "ns/a"}) == 1
    assert get("slotwise_observed_requests_per_second", {"model": "ns/a"}) == 2.0
    assert get("slotwise_requests_total", {"model": "ns/a"}) == pytest.approx(172.5 + 30.0)
    assert get("slotwise_requests_late_total", {"model": "ns/a"}) == pytest.approx(15.0)


# -- lending: lent GPUs, reclaims, the deadline ----------------------------------------------------------------------


def _lent_snapshot() -> ClusterSnapshot:
    """n1 (2 x A100) lent whole, training on it; n2's L4 serves ns/a; training elsewhere on n3 (not lent by us)."""
    inv = Inventory.from_nodes([NodeSpec("n1", "A100-80GB", 2), NodeSpec("n2", "L4-24GB", 1),
                                NodeSpec("n3", "L4-24GB", 2)])
    inv.allocate(Slot.whole("n2", 0, L4), "ns/a-1", "ns/a")
    for d in range(2):
        inv.allocate(Slot.whole("n1", d, A100), lent_owner("n1", d), LENT_MODEL)
    inv.allocate(Slot.whole("n3", 0, L4), "pod:ml/other", "pod:ml/other")
    training = (TrainingWorkload("ml/big", "Job", gpus=2.0, nodes=("n1",), running=True),
                TrainingWorkload("ml/other", "Pod", gpus=1.0, nodes=("n3",), running=True))
    return ClusterSnapshot(now=100.0, models={}, inventory=inv, training=training,
                           lent={("n1", 0): 50.0, ("n1", 1): 50.0})


def test_lent_gpus_are_neither_used_nor_free_and_training_on_them_counts_once() -> None:
    snap = _lent_snapshot()
    assert gpu_slots(snap.inventory) == {"A100-80GB": (0.0, 0.0), "L4-24GB": (2.0, 1.0)}
    assert lent_by_kind(snap) == {"A100-80GB": 2}
    # the job on the lent node is the lent GPUs (not 2 more); the pod on n3 runs on GPUs we did not lend
    assert lent_gpus(snap) == {"A100-80GB": 2.0, "L4-24GB": 1.0}
    m = ControllerMetrics()
    m.record_tick(Plan(now=100.0), snap, MetricsWindow(now=100.0, step_s=15.0), seconds=0.01)
    get = m.registry.get_sample_value
    assert get("slotwise_lent_gpu_slots", {"gpu_model": "A100-80GB"}) == 2
    assert get("slotwise_lent_gpu_slots", {"gpu_model": "L4-24GB"}) == 0  # a kind with nothing lent says 0
    assert get("slotwise_gpu_slots", {"gpu_model": "A100-80GB", "state": "lent"}) == 2
    assert get("slotwise_gpu_slots", {"gpu_model": "A100-80GB", "state": "used"}) == 0
    # the lent node leaves the inventory: its kind's series go
    gone = ClusterSnapshot(now=115.0, models={}, inventory=Inventory.from_nodes([NodeSpec("n2", "L4-24GB", 1)]))
    m.record_tick(Plan(now=115.0), gone, MetricsWindow(now=115.0, step_s=15.0), seconds=0.01)
    assert get("slotwise_lent_gpu_slots", {"gpu_model": "A100-80GB"}) is None


def test_reclaim_histogram_has_a_bucket_at_the_deadline_and_counts_reports() -> None:
    assert 120.0 in reclaim_buckets(120.0) and 97.5 in reclaim_buckets(97.5)
    assert list(reclaim_buckets(97.5)) == sorted(set(reclaim_buckets(97.5)))
    default = ControllerMetrics()
    assert default.registry.get_sample_value("slotwise_reclaim_deadline_seconds") == 120.0
    m = ControllerMetrics(reclaim_deadline_s=97.5)
    get = m.registry.get_sample_value
    assert get("slotwise_reclaim_deadline_seconds") == 97.5
    report = SimpleNamespace(
        applied=["reclaim n1: free after 97.5s (forecast)"], skipped=[], errors=[],
        lends=2, reclaims_started=[("n1", "forecast"), ("n2", "shortfall"), ("n3", "forecast")],
        reclaims_done=[SimpleNamespace(seconds=97.5), SimpleNamespace(seconds=97.6), 3.0, float("nan")],
    )
    m.record_lending(report)
    assert get("slotwise_reclaim_duration_seconds_bucket", {"le": "97.5"}) == 2  # <= deadline: on time
    assert get("slotwise_reclaim_duration_seconds_bucket", {"le": "+Inf"}) == 3  # NaN is not a duration
    assert get("slotwise_reclaim_duration_seconds_count") == 3
    assert get("slotwise_reclaims_total", {"reason": "forecast"}) == 2
    assert get("slotwise_reclaims_total", {"reason": "shortfall"}) == 1
    assert get("slotwise_lends_total") == 2
    m.record_lending(SimpleNamespace(lends=["n4"], reclaims_started=[SimpleNamespace(reason="hysteresis")]))
    assert get("slotwise_lends_total") == 3 and get("slotwise_reclaims_total", {"reason": "hysteresis"}) == 1
    with pytest.raises(ValueError):
        ControllerMetrics(reclaim_deadline_s=float("inf"))


# -- arbitration: shortfalls by cause, preemptions, guarantee refusals, team GPUs ------------------------------------


def _teams_snapshot(now: float, models: tuple[str, ...] = ("ns/a", "ns/b"), team_a: str = "search") -> ClusterSnapshot:
    """ns/a (team ``team_a``) on a whole L4 (1 GPU-equivalent) and a MIG 3g slice (3/7); ns/b (team ml) on one
    3g slice; one A100 lent to training (no team's)."""
    inv = Inventory.from_nodes([NodeSpec("n1", "A100-80GB", 2, mig_enabled=True), NodeSpec("n2", "L4-24GB", 1),
                                NodeSpec("n3", "A100-80GB", 1)])
    inv.allocate(Slot.whole("n2", 0, L4), "ns/a-1", "ns/a")
    inv.allocate(Slot.mig("n1", 1, A100, "3g", 0), "ns/a-2", "ns/a")
    inv.allocate(Slot.whole("n3", 0, A100), lent_owner("n3", 0), LENT_MODEL)
    if "ns/b" in models:
        inv.allocate(Slot.mig("n1", 0, A100, "3g", 0), "ns/b-1", "ns/b")
    team = {"ns/a": team_a, "ns/b": "ml"}
    obs = {}
    for key in models:
        ns, name = key.split("/")
        placed = tuple(Replica(owner, slot, True, 0.0) for owner, slot in inv.allocations_by_model().get(key, []))
        obs[key] = ModelObservation(key, ModelSpec(name, ns, slo_latency_ms=500, team=team[key]), len(placed), placed)
    return ClusterSnapshot(now=now, models=obs, inventory=inv, lent={("n3", 0): 0.0})


def _preempt(replica: str, reason: PreemptionReason) -> RemoveReplica:
    return RemoveReplica("ns/b", replica, preempted_by="ns/a", reason=reason,
                         message=f"{replica} preempted ({reason}) for ns/a")


def test_arbitration_metrics_from_a_hand_built_plan() -> None:
    m = ControllerMetrics(teams=(TeamQuota("search", 2.0, 1.0), TeamQuota("ml", 0.5), TeamQuota("idle", 4.0, 0.0)))
    get = m.registry.get_sample_value
    window = MetricsWindow(now=100.0, step_s=15.0)
    plan = Plan(now=100.0, actions=[
        Shortfall("ns/a", 2, "lower-priority replicas are draining", ShortfallCause.PREEMPTING, "search", True),
        Shortfall("ns/a", 1, "meets its SLO without it", ShortfallCause.HEADROOM, "search", False),
        Shortfall("ns/a", 1, "no free GPU slot fits the replica", ShortfallCause.UNPLACEABLE, "search", True),
        Shortfall("ns/a", 1, "no free GPU slot fits the replica", ShortfallCause.UNPLACEABLE, "search", True),
        _preempt("ns/b-1", PreemptionReason.GUARANTEE),
        _preempt("ns/b-2", PreemptionReason.PRIORITY),
        RemoveReplica("ns/a", "ns/a-9"),  # an ordinary scale-down: no preemption
    ])
    m.record_tick(plan, _teams_snapshot(100.0), window, seconds=0.01)

    def short(reason: str, model: str = "ns/a", team: str = "search") -> float | None:
        return get("slotwise_shortfall_replicas", {"team": team, "model": model, "reason": reason})

    assert (short("preempting"), short("headroom"), short("unplaceable")) == (2, 1, 2)
    # refusals inside the guarantee, in missing replicas: the grant in progress (preempting) and the headroom
    # ask (outside the guarantee) are not refusals
    refusals = {s.labels["reason"]: s.value for s in m.guarantee_refusals.collect()[0].samples
                if s.name.endswith("_total")}
    assert refusals == {"unplaceable": 2}
    assert get("slotwise_guarantee_refusals_total", {"team": "search", "model": "ns/a", "reason": "unplaceable"}) == 2

    def preempted(reason: str, model: str = "ns/b", team: str = "ml") -> float | None:
        return get("slotwise_preemptions_total", {"team": team, "model": model, "reason": reason})

    assert (preempted("guarantee"), preempted("priority")) == (1, 1)  # the victim's team and model
    # every managed model has its series at 0 from the start (increase() then sees a first preemption)
    assert (preempted("guarantee", "ns/a", "search"), preempted("priority", "ns/a", "search")) == (0, 0)

    def gpus(team: str, kind: str) -> float | None:
        return get("slotwise_team_gpus", {"team": team, "kind": kind})

    assert gpus("search", "held") == pytest.approx(1 + 3 / 7)  # a whole L4 + a 3g slice; lent GPUs are no team's
    assert (gpus("search", "guaranteed"), gpus("search", "limit")) == (2.0, 3.0)
    assert gpus("ml", "held") == pytest.approx(3 / 7)
    assert gpus("ml", "guaranteed") == 0.5 and gpus("ml", "limit") is None  # no borrowing limit: no series
    assert (gpus("idle", "held"), gpus("idle", "guaranteed"), gpus("idle", "limit")) == (0.0, 4.0, 4.0)

    # next tick: the core plans ns/b-1's preemption again (its scale-down not done yet) and one more; only the
    # unplaceable shortfall is left (the others' series go), and it is refused again
    plan2 = Plan(now=110.0, actions=[
        Shortfall("ns/a", 1, "no free GPU slot fits the replica", ShortfallCause.UNPLACEABLE, "search", True),
        _preempt("ns/b-1", PreemptionReason.GUARANTEE),
        _preempt("ns/b-3", PreemptionReason.PRIORITY),
    ])
    m.record_tick(plan2, _teams_snapshot(110.0), window, seconds=0.01)
    assert (preempted("guarantee"), preempted("priority")) == (1, 2)  # each replica once
    assert (short("preempting"), short("headroom"), short("unplaceable")) == (None, None, 1)
    assert get("slotwise_guarantee_refusals_total", {"team": "search", "model": "ns/a", "reason": "unplaceable"}) == 3

    # ns/b leaves: its series go; ml stays (a configured quota), holding nothing
    m.record_tick(Plan(now=120.0), _teams_snapshot(120.0, ("ns/a",)), window, seconds=0.01)
    assert preempted("guarantee") is None and preempted("priority") is None
    assert gpus("ml", "held") == 0.0 and gpus("ml", "guaranteed") == 0.5
    assert short("unplaceable") is None

    # ns/a's team annotation changes: the old identity's series go, the new team appears without a quota
    m.record_tick(Plan(now=130.0), _teams_snapshot(130.0, ("ns/a",), team_a="web"), window, seconds=0.01)
    assert get("slotwise_guarantee_refusals_total", {"team": "search", "model": "ns/a", "reason": "unplaceable"}) \
        is None
    assert preempted("priority", "ns/a", "search") is None and preempted("priority", "ns/a", "web") == 0
    assert gpus("search", "held") == 0.0 and gpus("web", "held") == pytest.approx(1 + 3 / 7)
    assert gpus("web", "guaranteed") == 0.0 and gpus("web", "limit") is None


def test_a_shortfall_of_a_model_without_a_spec_takes_the_shortfalls_team() -> None:
    m = ControllerMetrics()
    snap = _teams_snapshot(100.0, ("ns/a",))
    plan = Plan(now=100.0, actions=[
        Shortfall("ns/x", 1, "borrowed to the limit", ShortfallCause.BORROWING_LIMIT, "search", False),
        Shortfall("ns/y", 1, "no slot", "weird-cause"),  # not a cause the core has: "other", never free text
    ])
    m.record_tick(plan, snap, MetricsWindow(now=100.0, step_s=15.0), seconds=0.01)
    get = m.registry.get_sample_value
    assert get("slotwise_shortfall_replicas", {"team": "search", "model": "ns/x", "reason": "borrowing_limit"}) == 1
    assert get("slotwise_shortfall_replicas", {"team": "default", "model": "ns/y", "reason": "other"}) == 1


@pytest.mark.asyncio
async def test_a_partially_observed_model_is_exported_as_such(served) -> None:
    """Issue 16, failure mode 4: a model whose targets are not all scraped is 1 in slotwise_metrics_partial
    (its replicas are held from scaling down); whole and stale models are 0."""
    window = _window()
    window.models["ns/a"] = dataclasses.replace(window.models["ns/a"], partial="1 of 2 targets down",
                                                observed_fraction=0.5)
    served.metrics.record_tick(_plan(), _snapshot(), window, seconds=0.01)
    got = await _scrape(served)
    assert _value(got, "slotwise_metrics_partial", model="ns/a") == 1
    assert _value(got, "slotwise_metrics_partial", model="ns/b") == 0  # stale is its own flag
    served.metrics.record_tick(_plan(), _snapshot(), _window(), seconds=0.01)
    assert _value(await _scrape(served), "slotwise_metrics_partial", model="ns/a") == 0


def _advised_models(autoscaled: dict[str, str | None], unavailable: int = 0) -> dict[str, Any]:
    """The view's managed models as record_advice reads them (ManagedModel), some scaled by another autoscaler."""
    return {key: ManagedModel(key=key, namespace=key.split("/")[0], name=key.split("/")[1], uid="u", replicas=1,
                              container="c", unavailable_replicas=unavailable, autoscaled_by=by)
            for key, by in autoscaled.items()}


def _advised(samples: dict, name: str) -> float | None:
    return samples.get(("slotwise_advised_replicas", (("kind", "Deployment"), ("name", name), ("namespace", "ns"))))


@pytest.mark.asyncio
async def test_advise_mode_publishes_the_replicas_slotwise_would_set_for_autoscaled_workloads(served) -> None:
    """Issue 17, living beside HPA/KEDA: /metrics carries slotwise_advised_replicas{namespace,kind,name} for each
    workload an HPA / ScaledObject scales (the plan's target, plus the replicas on nodes out of service the
    ReplicaSet still counts), nothing for the others or in hands-off mode, and loses a series when the model
    leaves, loses its autoscaler, or this replica loses the lease."""
    m = served.metrics
    models = _advised_models({"ns/a": "HorizontalPodAutoscaler ns/a", "ns/b": "ScaledObject ns/b"}, unavailable=1)
    m.record_tick(_plan(), _snapshot(), _window(), seconds=0.01)
    m.record_advice(_plan(), models, advise=True)
    got = await _scrape(served)
    # ns/a: planned 1 -> 3, one more replica stuck on a node out of service; ns/b: nothing to change, its replicas
    assert _advised(got, "a") == 4
    assert _advised(got, "b") == 1
    # the desired series keeps its meaning (the plan's replicas, by model key)
    assert _value(got, "slotwise_desired_replicas", model="ns/a") == 3

    # ns/b loses its ScaledObject, then hands-off mode: the series go
    m.record_advice(_plan(), _advised_models({"ns/a": "HorizontalPodAutoscaler ns/a", "ns/b": None}), advise=True)
    got = await _scrape(served)
    assert _advised(got, "b") is None
    assert _advised(got, "a") == 3
    m.record_advice(_plan(), models, advise=False)
    assert "slotwise_advised_replicas" not in {name for name, _ in await _scrape(served)}

    # the model leaves the view; and a follower publishes nothing an autoscaler could act on
    m.record_advice(_plan(), models, advise=True)
    m.record_advice(Plan(now=115.0), _advised_models({"ns/b": "ScaledObject ns/b"}), advise=True)
    got = await _scrape(served)
    assert _advised(got, "a") is None
    assert _advised(got, "b") == 1
    m.set_leader(False)
    m.record_advice(_plan(), models, advise=True)
    assert "slotwise_advised_replicas" not in {name for name, _ in await _scrape(served)}
    m.set_leader(True)
    m.record_advice(_plan(), models, advise=True)
    assert _advised(await _scrape(served), "a") == 4
