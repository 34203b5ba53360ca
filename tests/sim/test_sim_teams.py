"""The simulator's team numbers (issue 9): success rate against a request timeout, busy GPU time, shortfalls by
cause, refusals inside a guarantee, preemptions and unreasoned decisions recorded from the plans, training waits,
and ``team_card`` (per team and overall) on top of them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from test_sim import poisson_log

import autoscaler.decision.tick as tick_module
from autoscaler.api.plan import (
    LendGpus,
    Plan,
    PreemptionReason,
    Reason,
    RemoveReplica,
    Shortfall,
    ShortfallCause,
    UpdateStatus,
)
from autoscaler.api.snapshot import ClusterSnapshot, MetricsWindow
from autoscaler.api.spec import ModelSpec
from autoscaler.decision.arbitration import ArbitrationPolicy, TeamQuota
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.core import Decision
from autoscaler.policies import make_policy
from autoscaler.sim.cluster import SHORTFALL_CAUSES, SimCluster
from autoscaler.sim.run import SimConfig, SimResult, simulate
from autoscaler.sim.scorecard import ALL_KEYS, COLUMNS, TEAM_KEYS, scorecard, team_card
from autoscaler.sim.training import TrainingJob, TrainingQueue
from autoscaler.sim.workload import build_workload
from forecasting.traces.model import RequestLog
from sharing.cluster import nodes_from_spec
from sharing.lending import LendingPolicy

# One whole GPU per replica, one request at a time, 100 ms of service (exponential in a log without service times).
WHOLE = ModelSpec(name="x", slo_latency_ms=500, service_time_ms=100, cold_start_s=60, concurrency=1)
SLICE = ModelSpec(name="x", slo_latency_ms=500, gpu_memory_gib=20, gpu_compute_share=0.25, service_time_ms=100,
                  cold_start_s=60, concurrency=1)


def run(trace, specs, policy, nodes_spec: str, **cfg) -> SimResult:  # type: ignore[no-untyped-def]
    return simulate(build_workload(trace, specs), nodes_from_spec(nodes_spec), policy, SimConfig(**cfg))


def two_teams() -> tuple[RequestLog, dict[str, ModelSpec]]:
    """``small`` (team assist) fits; ``big`` (team search) needs ~6 whole GPUs of the 3 there are."""
    log = poisson_log({"small": 2.0, "big": 40.0}, 1200.0, seed=3)
    specs = {"small": WHOLE.with_(name="small", team="assist"),
             "big": WHOLE.with_(name="big", team="search", max_replicas=20)}
    return log, specs


class Injected:
    """Wraps the simulator's decision core: ``extra(snapshot)`` gives actions appended to the tick's plan (a fake
    core's decisions, so the recorder is tested without depending on the arbitration algorithm)."""

    def __init__(self, extra) -> None:  # type: ignore[no-untyped-def]
        self.real = tick_module.decide
        self.extra = extra
        self.configs: list[CoreConfig] = []

    def __call__(self, snapshot: ClusterSnapshot, metrics: MetricsWindow, state, config: CoreConfig) -> Decision:  # type: ignore[no-untyped-def]
        self.configs.append(config)
        d = self.real(snapshot, metrics, state, config)
        d.plan.actions.extend(self.extra(snapshot))
        return d


# ------------------------------------------------------------------------------------------------ team_card


def test_team_rows_sum_to_the_overall_and_match_the_run() -> None:
    log, specs = two_teams()
    res = run(log, specs, make_policy("slotwise"), "3xH100-80GB")
    quotas = (TeamQuota("search", 2.0, 1.0), TeamQuota("research", 1.0))  # research: a quota, no models
    card = team_card(res, quotas)
    rows = {r["team"]: r for r in card["teams"]}
    assert list(rows) == ["search", "research", "assist"]  # quotas first, then the models' teams
    for r in card["teams"]:
        assert tuple(r) == TEAM_KEYS
    every = card["all"]
    assert tuple(every) == (*TEAM_KEYS, *ALL_KEYS) and every["team"] == "all"
    assert rows["search"]["guaranteed_gpus"] == 2.0 and rows["search"]["borrowing_limit_gpus"] == 1.0
    assert rows["assist"]["guaranteed_gpus"] == 0.0 and rows["assist"]["borrowing_limit_gpus"] is None
    assert every["guaranteed_gpus"] == 3.0 and every["borrowing_limit_gpus"] is None  # assist has no limit
    assert rows["research"]["models"] == [] and rows["research"]["requests"] == 0.0
    assert rows["research"]["slo_attainment"] is None and rows["research"]["utilization_busy"] is None
    assert sorted(every["models"]) == ["big", "small"]

    for key in ("requests", "violating_requests", "late_requests", "gpu_hours_allocated", "gpu_hours_busy",
                "replica_wait_minutes", "refusals_within_guarantee", "preemptions_caused"):
        assert every[key] == pytest.approx(sum(r[key] for r in card["teams"])), key
    # the teams' costs are the serving cost; the "all" row's cost adds the idle cost, as the scorecard's does
    assert every["serving_cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in card["teams"]))
    assert every["cost_usd"] == every["serving_cost_usd"] + every["idle_cost_usd"]
    causes: dict[str, float] = {}
    for r in card["teams"]:
        for c, v in r["shortfall_minutes_by_cause"].items():
            causes[c] = causes.get(c, 0.0) + v
    assert every["shortfall_minutes_by_cause"] == pytest.approx(causes)

    # ... and agree with the run's own totals
    sc = scorecard(res)
    assert every["requests"] == pytest.approx(sc["requests"]) and 0.8 * len(log) < every["requests"] < len(log)
    assert every["gpu_hours_allocated"] == pytest.approx(res.gpu_hours)
    assert every["cost_usd"] == sc["cost_usd"] and every["serving_cost_usd"] == sc["serving_cost_usd"]
    assert every["violating_requests"] == sc["violating_requests"]
    assert every["replica_wait_minutes"] == pytest.approx(res.unplaced_replica_minutes)
    assert every["slo_attainment"] == sc["slo_attainment"]
    assert every["requests_within_latency"] == sc["requests_within_latency"]
    assert every["success_rate"] == pytest.approx(sc["success_rate"])
    assert every["gpus_total"] == 3 and every["unreasoned"] == sc["unreasoned"] == 0
    # The search team is the one short of GPUs, and the waiting shows there, not on assist.
    assert rows["search"]["replica_wait_minutes"] > 5 * rows["assist"]["replica_wait_minutes"] > 0.0
    assert rows["search"]["success_rate"] < 0.5 < rows["assist"]["success_rate"]  # big's queue outgrows a minute
    assert rows["search"]["slo_attainment"] < rows["assist"]["slo_attainment"]
    for r in (*card["teams"], every):
        assert r["gpu_hours_busy"] <= r["gpu_hours_allocated"] + 1e-9
    # big's replicas are saturated; small's one replica is mostly idle at 2 req/s x 100 ms
    assert rows["search"]["utilization_busy"] > 0.9
    assert 0.1 < rows["assist"]["utilization_busy"] < 0.4
    assert every["training_jobs_started"] == 0 and every["training_wait_p50_s"] is None
    json.dumps(card)
    json.dumps(sc)


def test_scorecard_keeps_its_keys_and_adds_the_overall_team_numbers() -> None:
    log, specs = two_teams()
    sc = scorecard(run(log, specs, make_policy("hpa"), "3xH100-80GB"))
    for key in (*COLUMNS, "per_model", "cost", "lending", "unplaced_replica_minutes", "decisions_by_reason"):
        assert key in sc, key
    for key in ("success_rate", "request_timeout_s", "gpu_hours_busy", "utilization_busy", "preemptions",
                "preemptions_by_reason", "unreasoned", "refusals_within_guarantee", "shortfall_minutes_by_cause",
                "training_jobs_started", "training_wait_p95_s"):
        assert key in sc, key
    assert 0.0 <= sc["success_rate"] <= 1.0 and sc["request_timeout_s"] == 60.0
    for pm in sc["per_model"].values():
        assert 0.0 <= pm["success_rate"] <= 1.0 and pm["gpu_hours_busy"] <= pm["gpu_hours"] + 1e-9


# ------------------------------------------------------------------------------------------------ success rate


@pytest.mark.parametrize("mode", ["fluid", "des"])
def test_success_rate_falls_when_the_timeout_is_tiny(mode: str) -> None:
    log = poisson_log({"a": 10.0}, 900.0, seed=5)
    spec = SLICE.with_(name="a", min_replicas=4, max_replicas=4)
    rates = {}
    for timeout in (60.0, 0.2, 0.05, 1e-4):
        res = run(log, {"a": spec}, make_policy("static", replicas=4), "8xH100-80GB:mig", mode=mode,
                  request_timeout_s=timeout)
        assert res.minute_success is not None and res.request_timeout_s == timeout
        assert np.all(res.minute_success <= res.minute_arrivals + 1e-9)
        rates[timeout] = scorecard(res)["success_rate"]
    assert rates[60.0] > 0.999, rates  # 4 replicas for 1 Erlang: every request done within a minute
    # exponential service of mean 100 ms: P(S <= 0.2) ~ 0.86, P(S <= 0.05) ~ 0.39, and the waits only lower them
    assert 0.7 < rates[0.2] < 0.9 and 0.25 < rates[0.05] < 0.42 and rates[1e-4] < 0.01, rates


def test_fluid_and_des_agree_on_the_success_rate() -> None:
    log = poisson_log({"a": 25.0}, 1200.0, seed=7)
    spec = SLICE.with_(name="a", min_replicas=3, max_replicas=3)
    got = {mode: scorecard(run(log, {"a": spec}, make_policy("static", replicas=3), "8xH100-80GB:mig", mode=mode,
                                  request_timeout_s=0.3))["success_rate"] for mode in ("fluid", "des")}
    assert got["des"] < 0.99, got  # 2.5 Erlangs on 3 servers: the waits matter
    assert abs(got["fluid"] - got["des"]) < 0.04, got


@pytest.mark.parametrize("mode", ["fluid", "des"])
def test_busy_gpu_time_is_the_offered_load_share_of_what_is_held(mode: str) -> None:
    # 4 fixed replicas on MIG slices; 10 req/s x 100 ms = 1 Erlang over 4 servers: utilisation 0.25
    log = poisson_log({"a": 10.0}, 1800.0, seed=9)
    spec = SLICE.with_(name="a", min_replicas=4, max_replicas=4)
    res = run(log, {"a": spec}, make_policy("static", replicas=4), "8xH100-80GB:mig", mode=mode)
    assert res.minute_gpu_s is not None and res.minute_busy_gpu_s is not None
    assert res.minute_gpu_s.sum() / 3600.0 == pytest.approx(res.gpu_hours)
    assert np.all(res.minute_busy_gpu_s <= res.minute_gpu_s + 1e-9)
    row = team_card(res)["all"]
    offered = len(log) / 1800.0 * SLICE.service_time_s / 4  # Erlangs per server
    assert row["utilization_busy"] == pytest.approx(offered, rel=0.1)


# ------------------------------------------------------------------------------------------------ the plans' record


def test_shortfalls_by_cause_and_refusals_inside_a_guarantee() -> None:
    c = SimCluster(nodes_from_spec("2xH100-80GB"), ["x"], {"x": WHOLE}, np.array([10.0]))
    col = {cause: j for j, cause in enumerate(SHORTFALL_CAUSES)}
    c.apply(Plan(0.0, [
        Shortfall("x", 2, "the team holds its limit", ShortfallCause.BORROWING_LIMIT, "t", within_guarantee=True),
        Shortfall("x", 1, "lent GPUs coming back", ShortfallCause.RECLAIMING, "t", within_guarantee=True),
        UpdateStatus("x", 5, 2, Reason.UNPLACEABLE),
    ]))
    assert c.shortfall[0] == 3 and c.refused_within[0] == 2  # reclaiming is a grant in progress, not a refusal
    assert c.shortfall_by_cause[0, col["borrowing_limit"]] == 2 and c.shortfall_by_cause[0, col["reclaiming"]] == 1
    c.apply(Plan(10.0, [Shortfall("x", 1, "draining lower priority", ShortfallCause.PREEMPTING, "t", True)]))
    assert c.shortfall[0] == 1 and c.refused_within[0] == 0  # the new plan's shortfalls replace the old
    c.apply(Plan(20.0, [UpdateStatus("x", 3, 3, Reason.FORECAST)]))  # re-stated without a shortfall: over
    assert c.shortfall[0] == 0 and not c.shortfall_by_cause.any() and c.unreasoned == 0


def test_decisions_without_a_reason_are_counted() -> None:
    c = SimCluster(nodes_from_spec("2xH100-80GB"), ["x"], {"x": WHOLE}, np.array([10.0]))
    c.score_from = 100.0
    bad = [Shortfall("x", 1, ""), Shortfall("x", 1, "words", ""),  # no words; no cause
           Shortfall("x", 1, "words", "not-a-cause"),  # a cause nobody knows
           RemoveReplica("x", "nope", preempted_by="y", reason="", message="")]
    c.apply(Plan(50.0, list(bad)))
    assert c.unreasoned == 0, "before the scored period nothing counts"
    c.apply(Plan(100.0, list(bad)))
    assert c.unreasoned == 4
    assert c.shortfall_by_cause[0, SHORTFALL_CAUSES.index("")] == 2  # the unknown cause and the missing one
    c.apply(Plan(110.0, [Shortfall("x", 1, "no slot fits")]))  # the default cause with words is fine
    assert c.unreasoned == 4


def test_injected_shortfalls_reach_the_result_and_the_card() -> None:
    log = poisson_log({"a": 2.0}, 900.0)
    spec = SLICE.with_(name="a", team="t")

    def short(snap: ClusterSnapshot) -> list:  # type: ignore[type-arg]
        if snap.now != 600.0:
            return []
        return [Shortfall("a", 2, "", ""),  # no cause, no words: unreasoned
                Shortfall("a", 2, "the team holds its limit", ShortfallCause.BORROWING_LIMIT, "t", True)]

    inject = Injected(short)
    tick_module.decide, saved = inject, tick_module.decide
    try:
        res = run(log, {"a": spec}, make_policy("hpa"), "8xH100-80GB:mig", burn_in_s=120.0)
    finally:
        tick_module.decide = saved
    assert res.unreasoned == 1
    # they stand until the model's status is re-stated without one, and count for every tick they stand
    minutes = res.shortfalls["a"]["none"]
    assert minutes > 0 and res.shortfalls["a"] == {"none": minutes, "borrowing_limit": minutes}
    assert res.unplaced_replica_minutes == pytest.approx(2 * minutes)
    assert res.refusals_within_guarantee == {"a": minutes}  # refused while inside the guarantee
    assert minutes == pytest.approx(round(minutes * 60 / 20) * 20 / 60)  # 2 replicas x whole 10 s ticks
    card = team_card(res)
    row = card["teams"][0]
    assert card["all"]["unreasoned"] == 1 and row["shortfall_minutes_by_cause"] == res.shortfalls["a"]
    assert row["replica_wait_minutes"] == pytest.approx(2 * minutes) and row["refusals_within_guarantee"] == minutes
    assert scorecard(res)["unreasoned"] == 1


def test_preemptions_are_recorded_once_carried_out_in_the_scored_period() -> None:
    log = poisson_log({"low": 3.0, "high": 3.0}, 900.0)
    specs = {"low": SLICE.with_(name="low", team="batch", min_replicas=2),
             "high": SLICE.with_(name="high", team="search", priority=10)}
    seen: list[str] = []

    def preempt(snap: ClusterSnapshot) -> list:  # type: ignore[type-arg]
        if snap.now not in (60.0, 600.0):  # 60: inside the burn-in, not scored
            return []
        rep = next(r for r in snap.models["low"].replicas if not r.draining)
        seen.append(rep.replica_id)
        return [RemoveReplica("low", rep.replica_id, preempted_by="high", reason=PreemptionReason.PRIORITY,
                              message="high would miss its SLO"),
                RemoveReplica("low", rep.replica_id, preempted_by="high", reason=PreemptionReason.PRIORITY,
                              message="twice in one plan: drained once")]

    inject = Injected(preempt)
    tick_module.decide, saved = inject, tick_module.decide
    try:
        res = run(log, specs, make_policy("hpa"), "8xH100-80GB:mig", burn_in_s=300.0)
    finally:
        tick_module.decide = saved
    assert res.preemptions == [{"at_s": 600.0, "model": "low", "team": "batch", "replica": seen[1],
                                "by_model": "high", "reason": "priority", "message": "high would miss its SLO"}]
    rows = {r["team"]: r for r in team_card(res)["teams"]}
    assert rows["batch"]["preemptions_by_reason"] == {"priority": 1} and rows["batch"]["preemptions_caused"] == 0
    assert rows["search"]["preemptions_by_reason"] == {} and rows["search"]["preemptions_caused"] == 1
    sc = scorecard(res)
    assert sc["preemptions"] == 1 and sc["preemptions_by_reason"] == {"priority": 1} and sc["unreasoned"] == 0


def test_arbitration_and_timeout_settings_reach_the_core() -> None:
    log = poisson_log({"a": 1.0}, 300.0)
    policy = ArbitrationPolicy(mode="partition", teams=(TeamQuota("t", 1.0),))
    for given, expected in ((policy, policy), (None, CoreConfig(policy=make_policy("hpa")).arbitration)):
        inject = Injected(lambda snap: [])
        tick_module.decide, saved = inject, tick_module.decide
        try:
            res = run(log, {"a": SLICE.with_(name="a")}, make_policy("hpa"), "8xH100-80GB:mig", arbitration=given,
                      request_timeout_s=5.0)
        finally:
            tick_module.decide = saved
        assert inject.configs and all(c.arbitration == expected for c in inject.configs)
        assert res.request_timeout_s == 5.0


# ------------------------------------------------------------------------------------------------ training waits


def test_training_wait_is_from_entering_the_backlog_to_the_first_start() -> None:
    jobs = [TrainingJob(f"training/{n}", 1, 10_000.0) for n in ("a", "b", "c")]
    c = SimCluster(nodes_from_spec("8xH100-80GB"), ["x"], {"x": WHOLE}, np.array([10.0]),
                   lending=LendingPolicy(enabled=True), training=TrainingQueue(jobs))
    c.score_from = 100.0
    c.apply(Plan(500.0, [LendGpus("h100-80gb-0", (6, 7), "H100-80GB")]))
    # a stood at the head of the queue from the start (0) until the first lend; b entered when a left the source
    assert [r.job.name for r in c.runs.values()] == ["training/a", "training/b"]
    assert c.stats.job_waits_s == [500.0, 0.0]
    c.apply(Plan(800.0, [LendGpus("h100-80gb-0", (5,), "H100-80GB")]))
    assert c.stats.job_waits_s == [500.0, 0.0, 300.0]  # c entered at 500, when b left


def test_training_numbers_in_the_overall_row() -> None:
    log = poisson_log({"a": 2.0}, 3600.0)
    jobs = (TrainingJob("training/short", 1, 300.0), TrainingJob("training/pair", 2, 600.0))
    res = run(log, {"a": SLICE.with_(name="a")}, make_policy("hpa"), "8xH100-80GB:mig", static_training_gpus=2,
              training=jobs, burn_in_s=0.0)
    every = team_card(res)["all"]
    assert res.lending is not None
    assert every["training_jobs_started"] == len(res.lending.job_waits_s) > 0
    assert every["training_jobs_completed"] > 0 and every["training_goodput_gpu_hours"] > 0
    waits = sorted(res.lending.job_waits_s)
    assert every["training_wait_p50_s"] in waits and every["training_wait_p95_s"] in waits  # never interpolated
    assert 0.0 <= every["training_wait_p50_s"] <= every["training_wait_p95_s"]
    assert math.isfinite(every["training_wait_p95_s"])
