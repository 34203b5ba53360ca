"""A TTFT+ITL model in the simulator (issue 17, item 3): requests decoding together slow each other by the same
ITL(b) law the capacity model sizes with, so a replica's throughput saturates with its batch; a request is within
the SLO only when its TTFT and its ITL both are; and the model is sized on the tighter of its two SLOs."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaler.api.spec import ModelSpec
from autoscaler.estimation import capacity as C
from autoscaler.policies import make_policy
from autoscaler.sim.des import DesEngine
from autoscaler.sim.fluid import FluidEngine
from autoscaler.sim.queueing import Workload
from autoscaler.sim.run import SimConfig, SimResult, simulate
from autoscaler.sim.workload import build_workload
from forecasting.traces.model import RequestLog
from sharing.cluster import nodes_from_spec

RATE = 5.0
# 1,000 input tokens (150 ms of prefill) and 100-300 output tokens (2-6 s of decode at 20 ms a token, alone)
LLM = ModelSpec(name="llm", slo_latency_ms=2000.0, slo_metric="ttft", prefill_ms_per_1k_tokens=150.0,
                decode_ms_per_token=20.0, concurrency=32, decode_batch_slowdown=0.05, cold_start_s=30.0,
                max_replicas=40)


def _log(rate: float, duration_s: float, seed: int = 1) -> RequestLog:
    rng = np.random.default_rng(seed)
    n = rng.poisson(rate * duration_s)
    return RequestLog(t=np.sort(rng.uniform(0.0, duration_s, n)), model_index=np.zeros(n, dtype=np.int32),
                      models=("llm",), input_tokens=np.full(n, 1000.0),
                      output_tokens=rng.integers(100, 301, n).astype(np.float64))


def _run(spec: ModelSpec, policy: str, mode: str = "fluid", **knobs: object) -> tuple[SimResult, C.ServiceProfile]:
    w = build_workload(_log(RATE, 5400.0), {"llm": spec})
    res = simulate(w, nodes_from_spec("48xH100-80GB"), make_policy(policy, **knobs), SimConfig(mode=mode))
    return res, w.profiles["llm"]


def _attainment(res: SimResult) -> float:
    return float(res.minute_within.sum() / res.minute_arrivals.sum())


@pytest.mark.parametrize("mode", ["fluid", "des"])
def test_itl_binds_the_model_is_sized_for_its_itl(mode: str) -> None:
    spec = LLM.with_(slo_itl_ms=25.0)  # ITL(b) <= 25 ms: a batch of at most 6 of the 32 slots
    oracle, profile = _run(spec, "oracle", mode)
    ttft_n, itl_n = C.slo_bounds(RATE, profile)
    assert itl_n >= ttft_n + 5  # (9 against 2: the ITL is the tighter)
    settled = oracle.minute_replicas[0][20:]
    assert itl_n - 0.5 <= settled.mean() <= itl_n + 1.0  # the oracle follows the ITL's count, not the TTFT's
    assert _attainment(oracle) >= 0.95
    slotwise, _ = _run(spec, "slotwise", mode)
    assert slotwise.minute_replicas[0][20:].min() >= itl_n
    assert _attainment(slotwise) >= 0.95


@pytest.mark.parametrize("mode", ["fluid", "des"])
def test_ttft_binds_the_model_is_sized_for_its_ttft(mode: str) -> None:
    spec = LLM.with_(slo_itl_ms=60.0)  # a full batch decodes at 51 ms a token: the ITL holds at any count
    oracle, profile = _run(spec, "oracle", mode)
    ttft_n, itl_n = C.slo_bounds(RATE, profile)
    assert itl_n == 0 and ttft_n >= 2
    assert ttft_n - 0.5 <= oracle.minute_replicas[0][20:].mean() <= ttft_n + 1.0
    assert _attainment(oracle) >= 0.95
    slotwise, _ = _run(spec, "slotwise", mode)
    ttft_only, _ = _run(LLM, "slotwise", mode)
    np.testing.assert_array_equal(slotwise.minute_replicas, ttft_only.minute_replicas)
    assert _attainment(slotwise) >= 0.95


@pytest.mark.parametrize("mode", ["fluid", "des"])
def test_a_request_with_a_late_itl_is_late(mode: str) -> None:
    """The TTFT's count serves the TTFT, but most requests then decode in batches whose ITL misses 25 ms."""
    ttft_n = C.slo_bounds(RATE, C.profile_from_spec(LLM.with_(service_time_ms=4150.0)))[0] + 1
    static = {"replicas_by_model": {"llm": ttft_n}}
    ttft_only, _ = _run(LLM, "static", mode, **static)
    both, _ = _run(LLM.with_(slo_itl_ms=25.0), "static", mode, **static)
    assert _attainment(ttft_only) >= 0.95 > 0.8 > _attainment(both)


@pytest.mark.parametrize("engine", [FluidEngine, DesEngine])
def test_a_replica_saturates_at_its_full_batch_throughput(engine: type) -> None:
    """One replica offered more than it can decode: it completes c / (full-batch occupancy) requests a second, the
    same throughput the capacity model's overload bound says (32 / (0.15 + 4 x 2.55) s = 3.09 req/s)."""
    duration = 3600.0
    log = _log(RATE, duration)
    done = {}
    for alpha in (0.0, 0.05):
        spec = LLM.with_(decode_batch_slowdown=alpha)
        w = Workload.from_request_log(log, [spec])
        eng = engine(w)
        stats = [eng.step(k * 10.0, 10.0, np.ones(1)) for k in range(int(duration / 10.0))]
        done[alpha] = sum(float(s.completed[0]) for s in stats[60:]) / (duration - 600.0)
    mean_decode = 20e-3 * float(np.mean(log.output_tokens))
    full = 32.0 / (0.15 + mean_decode * (1.0 + 0.05 * 31))
    assert done[0.05] == pytest.approx(full, rel=0.05)
    assert done[0.0] == pytest.approx(RATE, rel=0.05)  # without the slowdown one replica keeps up
    profile = build_workload(log, {"llm": LLM}).profiles["llm"]
    assert C.latency_attainment(full * 1.01, 1, profile) == 0.0 < C.latency_attainment(full * 0.7, 1, profile)


def test_models_without_the_decode_keys_get_the_workload_of_before() -> None:
    w = Workload.from_request_log(_log(1.0, 600.0), [LLM.with_(decode_batch_slowdown=0.0)])
    assert w.itl_slo_s is None and not w.decode_bound.any()


def test_on_the_bundled_azure_llm_trace_the_itl_sets_the_count_and_is_met() -> None:
    """The bundled Azure LLM 2023 slice (real input and output token counts per request; ATTRIBUTION.md) with the
    simulator's LLM defaults (8 slots, 20 ms a token) plus a 25 ms ITL target and a 0.05 batch slowdown (a batch
    of at most 6): slotwise holds more replicas than for the TTFT alone, and the requests meet both targets."""
    from autoscaler.sim.defaults import model_specs
    from autoscaler.sim.harness import DEFAULT_TRACE, default_cluster
    from forecasting.traces import resolve_trace

    trace = resolve_trace(DEFAULT_TRACE)
    base = model_specs(trace)
    runs = {}
    for name, extra in (("ttft", {"decode_batch_slowdown": 0.05}),
                        ("ttft+itl", {"decode_batch_slowdown": 0.05, "slo_itl_ms": 25.0})):
        specs = {m: s.with_(**extra) for m, s in base.items() if isinstance(s, ModelSpec)}
        w = build_workload(trace, specs, history_s=900.0)
        res = simulate(w, default_cluster(w, 10.0), make_policy("slotwise"), SimConfig())
        runs[name] = res
    for i, _ in enumerate(runs["ttft+itl"].models):
        both, ttft = runs["ttft+itl"], runs["ttft"]
        assert both.minute_replicas[i].mean() > ttft.minute_replicas[i].mean()
        assert both.minute_within[i].sum() / both.minute_arrivals[i].sum() >= 0.95


@pytest.mark.parametrize(("metric", "slo_ms"), [("e2e", 9000.0), ("ttft", 2000.0)])
def test_the_fluid_engine_serves_the_capacity_models_law(metric: str, slo_ms: float) -> None:
    """In steady state the fluid engine reproduces the capacity model's attainment of a decode-bound TTFT+ITL (or
    e2e+ITL) model, as it does for the plain M/G/c: the same batch law, the same ITL share, the decode in an e2e
    latency stretched alike."""
    spec = LLM.with_(slo_metric=metric, slo_latency_ms=slo_ms, service_time_ms=4150.0, concurrency=16,
                     slo_itl_ms=30.0)
    profile = C.profile_from_spec(spec)
    eng = FluidEngine(Workload.from_rates(["llm"], np.full((1, 60), 2.0), 60.0, [profile]))
    stats = [eng.step(k * 10.0, 10.0, np.array([2.0])) for k in range(360)][30:]
    within = sum(float(s.within_slo[0]) for s in stats) / sum(float(s.arrivals[0]) for s in stats)
    assert within == pytest.approx(C.attainment(2.0, 2, profile), abs=0.005)
    assert C.attainment(2.0, 2, profile) < 0.99  # (the batch costs something here: the check is not vacuous)


# -- the engine's ITL and a declaration that is wrong (issue 28: learned decode behaviour) ---------------------------


@pytest.mark.parametrize("engine", [FluidEngine, DesEngine])
def test_the_engines_report_the_itl_at_the_slo_percentile_their_batches_decode_at(engine: type) -> None:
    """What an engine's ITL histogram says: about the law at the percentile's batch of the replicas' load (the DES's
    per-request batches, the fluid's state), never below a request decoding alone."""
    spec = LLM.with_(slo_itl_ms=25.0)
    w = Workload.from_request_log(_log(RATE, 1200.0), [spec])
    eng = engine(w)
    replicas = 4
    prof = C.profile_from_spec(spec.with_(service_time_ms=4150.0))
    seen = []
    for k in range(120):
        stats = eng.step(10.0 * k, 10.0, np.array([replicas]))
        assert stats.itl_at_slo_pct is not None
        if k >= 30 and np.isfinite(stats.itl_at_slo_pct[0]):
            seen.append((stats.itl_at_slo_pct[0], stats.busy[0] / replicas))
    itl = np.array([s[0] for s in seen])
    assert len(itl) > 60 and itl.min() >= 0.020 - 1e-12
    busy = float(np.mean([s[1] for s in seen]))  # requests decoding per replica: the law's Erlangs
    expected = prof.itl_base_s * (1.0 + prof.decode_slowdown * (C.itl_batch_scalar(0.95, busy, 32) - 1.0))
    assert float(np.median(itl)) == pytest.approx(expected, rel=0.15)


def test_models_without_the_decode_law_report_no_itl() -> None:
    w = Workload.from_request_log(_log(RATE, 300.0), [LLM.with_(decode_batch_slowdown=0.0)])
    for engine in (FluidEngine(w), DesEngine(w)):
        for k in range(12):  # (past the first ticks: requests settle and finish)
            stats = engine.step(10.0 * k, 10.0, np.array([3]))
            assert stats.arrivals[0] > 0
            assert stats.itl_at_slo_pct is not None and not np.isfinite(stats.itl_at_slo_pct).any()


@pytest.mark.parametrize("mode", ["fluid", "des"])
def test_a_decode_declared_too_fast_is_learned_from_the_engines_itl(mode: str) -> None:
    """Declared 16 ms a token where the engine decodes at 20: by the declaration a full batch of 8 meets the 25 ms ITL
    (16 x 1.35 = 21.6 ms), so the ITL never caps it and most requests decode in batches that miss. Reading the engine's
    ITL, the controller learns the law and sizes for the cap; without the reading (an engine that exports no ITL
    histogram) it cannot."""
    truth = LLM.with_(slo_itl_ms=25.0, concurrency=8, max_replicas=60)
    told = truth.with_(decode_ms_per_token=16.0)
    w = build_workload(_log(RATE, 3600.0), {"llm": truth}, declared={"llm": told})
    assert w.controller_specs["llm"] is told and w.controller_profiles["llm"].itl_base_s == 0.016
    assert w.profiles["llm"].itl_base_s == 0.020  # what the engines serve
    nodes = nodes_from_spec("48xH100-80GB")
    blind = simulate(w, nodes, make_policy("slotwise"), SimConfig(mode=mode, itl_metric=False))
    learned = simulate(w, nodes, make_policy("slotwise"), SimConfig(mode=mode))
    assert _attainment(blind) < 0.9
    assert _attainment(learned) >= 0.97
    assert learned.minute_replicas[0][20:].mean() > 1.3 * blind.minute_replicas[0][20:].mean()


def test_declared_specs_must_name_the_served_models() -> None:
    with pytest.raises(ValueError, match="same models"):
        build_workload(_log(RATE, 60.0), {"llm": LLM}, declared={"other": LLM})
