"""The scorecard cannot contradict itself (issue 15, item 1): invariants over random small simulations.

Each example builds a tiny workload (1-3 models, a few minutes, random rates, SLO percentiles and latency targets),
runs one policy on a small cluster in the fluid or the discrete-event engine, and checks the card against its own
definitions (autoscaler/sim/scorecard.py's docstring): idle <= cost = serving + idle, the headline = (requests -
violating) / requests, counts are whole numbers that add up, the attainable mask is consistent, no float noise, and
``slotwise report`` reads back exactly the JSON's numbers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.api.spec import ModelSpec
from autoscaler.cli.simulate import json_doc, write_json
from autoscaler.policies import make_policy
from autoscaler.report.data import CARD_FIELDS, MODEL_FIELDS, load_simulation, sections_from_simulation
from autoscaler.sim.run import SimConfig, SimResult, simulate
from autoscaler.sim.scorecard import EPS, scorecard, team_card
from autoscaler.sim.workload import build_workload
from forecasting.traces.model import RateSeries
from sharing.cluster import nodes_from_spec

COUNTS = ("requests", "violating_requests", "unattainable_requests", "late_requests")
RUN_COUNTS = ("scale_events", "preemptions", "reclaims", "reclaims_late", "training_jobs_started",
              "training_jobs_completed", "unreasoned")
CLUSTERS = ("4xH100-80GB", "2xH100-80GB:mig", "2xH100-80GB:mig,2xL4")
POLICIES = ("static", "hpa", "oracle", "slotwise")
PROPS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def runs(draw: st.DrawFn) -> tuple[SimResult, list[Any], np.ndarray]:
    """A small random simulation, the cluster it ran on, and a random attainable mask for its model-minutes."""
    m = draw(st.integers(1, 3))
    minutes = draw(st.integers(4, 8))
    specs = {}
    for i in range(m):
        service_ms = draw(st.sampled_from((50, 100, 200)))
        whole = draw(st.booleans())
        specs[f"m{i}"] = ModelSpec(
            name=f"m{i}",
            service_time_ms=service_ms,
            slo_latency_ms=service_ms * draw(st.sampled_from((2, 5, 20))),
            slo_percentile=draw(st.sampled_from((90.0, 95.0, 99.0))),
            gpu_memory_gib=None if whole else 20,
            gpu_compute_share=1.0 if whole else 0.25,
            cold_start_s=draw(st.sampled_from((10, 60))),
            concurrency=draw(st.sampled_from((1, 4))),
        )
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    # some models nearly idle (fractional fluid arrivals, minutes without requests), some busy
    scale = rng.choice([0.02, 1.0, 15.0], size=(m, 1))
    rates = rng.uniform(0.0, 1.0, (m, minutes)) * scale
    series = RateSeries(rates=rates, models=tuple(specs), step_s=60.0)
    name = draw(st.sampled_from(POLICIES))
    policy = make_policy(name, **({"replicas": draw(st.integers(1, 3))} if name == "static" else {}))
    nodes = nodes_from_spec(draw(st.sampled_from(CLUSTERS)))
    cfg = SimConfig(tick_s=min(10.0, policy.tick_s), mode=draw(st.sampled_from(("fluid", "des"))), seed=seed,
                    burn_in_s=60.0)
    res = simulate(build_workload(series, specs), nodes, policy, cfg)
    attainable = rng.uniform(size=res.minute_arrivals.shape) < draw(st.sampled_from((0.0, 0.5, 0.9, 1.0)))
    return res, nodes, attainable


def floats(x: Any) -> list[float]:
    if isinstance(x, dict):
        return [f for v in x.values() for f in floats(v)]
    if isinstance(x, list | tuple):
        return [f for v in x for f in floats(v)]
    return [x] if isinstance(x, float) else []


def is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def reference_violating(res: SimResult) -> np.ndarray:
    """Per model, the requests in model-minutes that missed, straight from the definition (unrounded)."""
    out = np.zeros(len(res.models))
    for i in range(len(res.models)):
        for a, w in zip(res.minute_arrivals[i], res.minute_within[i], strict=True):
            if a > EPS and w / a < res.slo_percentile[i] / 100.0 - EPS:
                out[i] += a
    return out


@PROPS
@given(runs(), st.one_of(st.none(), st.floats(0.1, 50.0)))
def test_the_card_agrees_with_itself(run: tuple[SimResult, list[Any], np.ndarray], bound: float | None) -> None:
    res, _, attainable = run
    card = scorecard(res, res.gpu_hours * 0.8 or None, lower_bound_gpu_hours=bound, attainable=attainable)

    # cost: idle is a part of it
    assert 0.0 <= card["idle_cost_usd"] <= card["cost_usd"]
    assert card["cost_usd"] == card["serving_cost_usd"] + card["idle_cost_usd"]
    assert card["serving_cost_usd"] == math.fsum(pm["cost_usd"] for pm in card["per_model"].values())
    cost = card["cost"]
    assert cost["cost_usd"] == card["cost_usd"] and cost["idle_cost_usd"] == card["idle_cost_usd"]
    assert cost["total_gpu_hours"] == cost["serving_gpu_hours"] + cost["idle_gpu_hours"]
    assert cost["idle_gpu_hours"] <= cost["total_gpu_hours"]
    assert cost["serving_gpu_hours"] == pytest.approx(card["gpu_hours"], rel=1e-9, abs=1e-9)

    # counts: whole, and they add up
    for key in COUNTS:
        assert is_count(card[key]), (key, card[key])
        assert card[key] == sum(pm[key] for pm in card["per_model"].values()), key
        assert card[key] <= card["requests"], key
    for key in RUN_COUNTS:
        assert is_count(card[key]), (key, card[key])
    assert all(is_count(v) for v in card["decisions_by_reason"].values())
    for pm in card["per_model"].values():
        assert all(is_count(pm[k]) for k in COUNTS)
        assert pm["violating_requests"] <= pm["requests"] and pm["late_requests"] <= pm["requests"]

    # the rounding: whole already in the discrete-event engine; within a request or two of the expected counts in
    # the fluid engine (each of a model's four parts is within 1)
    raw = res.minute_arrivals.sum(axis=1)
    ref = reference_violating(res)
    for i, name in enumerate(res.models):
        pm = card["per_model"][name]
        tol = 0 if res.mode == "des" else 1
        assert abs(pm["requests"] - raw[i]) <= tol + 1e-6, (name, pm["requests"], raw[i])
        assert abs(pm["violating_requests"] - ref[i]) <= 2 * tol + 1e-6, (name, pm["violating_requests"], ref[i])

    # the headline and the raw share, from the card's own counts
    n = card["requests"]
    for row in (card, *card["per_model"].values()):
        r = row["requests"]
        assert 0.0 <= row["slo_attainment"] <= 1.0
        assert row["slo_attainment"] == ((r - row["violating_requests"]) / r if r else 1.0)
        assert row["requests_within_latency"] == ((r - row["late_requests"]) / r if r else 1.0)
        assert 0.0 <= row["slo_minutes_met"] <= 1.0
        # attainable minutes: the meeting requests of the attainable minutes lie between all meeting requests less
        # the unattainable ones and all meeting requests
        att = r - row["unattainable_requests"]
        met_att = row["slo_attainment_attainable"] * att
        assert abs(met_att - round(met_att)) < 1e-6 * max(1, att)
        met = r - row["violating_requests"]
        assert met - row["unattainable_requests"] <= round(met_att) <= min(met, att)
        if att == 0:
            assert row["slo_attainment_attainable"] == 1.0
    if n == 0:
        assert card["slo_attainment"] == 1.0

    # references
    assert card["gpu_hours_vs_lower_bound"] == (card["gpu_hours"] / bound if bound else None)
    assert card["lower_bound_gpu_hours"] == bound
    if card["gpu_hours"] > 0:
        assert card["gpu_hours_vs_oracle"] == pytest.approx(1 / 0.8)

    # the team view says the same
    every = team_card(res)["all"]
    assert every["cost_usd"] == card["cost_usd"] and every["requests"] == n
    assert every["violating_requests"] == card["violating_requests"]
    assert every["slo_attainment"] == (card["slo_attainment"] if n else None)

    # no float noise, nothing JSON cannot carry
    assert all(f == 0.0 or abs(f) >= EPS for f in floats(card))
    assert json.loads(json.dumps(card, allow_nan=False)) == card


@PROPS
@given(runs())
def test_everything_attainable_is_no_mask(run: tuple[SimResult, list[Any], np.ndarray]) -> None:
    res, _, _ = run
    plain = scorecard(res)
    for card in (plain, scorecard(res, attainable=np.ones(res.minute_arrivals.shape, dtype=bool))):
        assert card["unattainable_requests"] == 0
        assert card["slo_attainment_attainable"] == card["slo_attainment"]
        for pm in card["per_model"].values():
            assert pm["slo_attainment_attainable"] == pm["slo_attainment"]
    none = scorecard(res, attainable=np.zeros(res.minute_arrivals.shape, dtype=bool))
    assert none["unattainable_requests"] == none["requests"] and none["slo_attainment_attainable"] == 1.0
    assert none["slo_attainment"] == plain["slo_attainment"]  # the mask changes only the attainable numbers


@PROPS
@given(run=runs())
def test_the_report_reads_the_json_s_numbers(tmp_path_factory: pytest.TempPathFactory,
                                             run: tuple[SimResult, list[Any], np.ndarray]) -> None:
    res, nodes, attainable = run
    cards = [scorecard(res, res.gpu_hours or None, lower_bound_gpu_hours=1.0, attainable=attainable)]
    path = Path(tmp_path_factory.mktemp("card")) / "scorecard.json"
    write_json(json_doc("random", res.mode, 10.0, nodes, None, cards), str(path))
    doc = load_simulation(str(path))
    assert isinstance(doc["results"], list)
    (card,) = doc["results"]
    (s,) = [x.to_dict() for x in sections_from_simulation(doc, source=str(path))]
    for key in CARD_FIELDS:
        assert s[key] == card[key] and type(s[key]) is type(card[key]), key
    models = {m["model"]: m for m in s["models"]}
    for name, pm in card["per_model"].items():
        for key in MODEL_FIELDS:
            assert models[name][key] == pm[key], (name, key)
    # the teams add up to the JSON's serving cost and counts
    assert math.fsum(t["cost_usd"] for t in s["teams"]) == pytest.approx(card["serving_cost_usd"], abs=1e-12)
    assert sum(t["requests"] for t in s["teams"]) == card["requests"]
    assert sum(t["violating_requests"] for t in s["teams"]) == card["violating_requests"]


def test_latency_is_at_each_model_s_own_percentile() -> None:
    series = RateSeries(rates=np.full((2, 6), 3.0), models=("p95", "p99"), step_s=60.0)
    base = ModelSpec(name="x", slo_latency_ms=500, service_time_ms=100, cold_start_s=10, concurrency=1)
    specs = {"p95": base.with_(name="p95", slo_percentile=95.0), "p99": base.with_(name="p99", slo_percentile=99.0)}
    res = simulate(build_workload(series, specs), nodes_from_spec("4xH100-80GB"), make_policy("static", replicas=2),
                   SimConfig(burn_in_s=0.0))
    own = getattr(res, "latency_at_slo_percentile_s", None)
    card = scorecard(res)
    if own is None:  # the engine's p95 is exactly the p95 model's; nothing exact for the p99 one
        assert card["per_model"]["p95"]["latency_at_slo_percentile_s"] == pytest.approx(float(res.latency_p95_s[0]))
        assert card["per_model"]["p99"]["latency_at_slo_percentile_s"] is None
    res.latency_at_slo_percentile_s = np.array([0.25, 0.4])  # type: ignore[attr-defined]
    card = scorecard(res)
    assert card["per_model"]["p95"]["latency_at_slo_percentile_s"] == 0.25
    assert card["per_model"]["p99"]["latency_at_slo_percentile_s"] == 0.4


def test_a_mask_of_the_wrong_shape_is_refused() -> None:
    series = RateSeries(rates=np.full((1, 4), 1.0), models=("a",), step_s=60.0)
    spec = ModelSpec(name="a", slo_latency_ms=500, service_time_ms=100)
    res = simulate(build_workload(series, {"a": spec}), nodes_from_spec("2xH100-80GB"), make_policy("hpa"),
                   SimConfig(burn_in_s=0.0))
    with pytest.raises(ValueError, match="attainable has shape"):
        scorecard(res, attainable=np.ones((2, 4), dtype=bool))
