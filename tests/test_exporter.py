"""The controller's exporter over real HTTP: /metrics after a tick of a small hand-built plan, series of models
that leave vanish, /healthz and /readyz answer with status codes and reasons."""

from __future__ import annotations

import math
from types import SimpleNamespace

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from autoscaler.exporter import ControllerMetrics, Health, bound_port, gpu_slots, lent_gpus, start_http
from autoscaler.plan import Plan, Reason, ScaleModel, Shortfall, UpdateStatus
from autoscaler.snapshot import (
    ClusterSnapshot,
    MetricsWindow,
    ModelMetrics,
    ModelObservation,
    Replica,
    TrainingWorkload,
)
from autoscaler.spec import ModelSpec
from sharing.catalog import load_catalog
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
    "slotwise_tick_duration_seconds_bucket",
    "slotwise_errors_total",
    "slotwise_is_leader",
    "slotwise_actions_total",
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
        ms["ns/a"] = ModelMetrics(rate=np.array([10.0, 11.5]), in_flight=np.array([4.0, 5.0]))
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
    assert _value(got, "slotwise_shortfall_replicas", model="ns/a", reason="no free GPU slot fits the replica") == 1
    # the window: the last step's rate, stale flags (a stale model has no observed rate)
    assert _value(got, "slotwise_observed_requests_per_second", model="ns/a") == 11.5
    assert _value(got, "slotwise_observed_requests_per_second", model="ns/b") is None
    assert _value(got, "slotwise_metrics_stale", model="ns/a") == 0
    assert _value(got, "slotwise_metrics_stale", model="ns/b") == 1
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
