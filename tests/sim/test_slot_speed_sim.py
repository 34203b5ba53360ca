"""Heterogeneous speed in the simulator (issue 15, item 5): each replica serves at its slot's speed."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from autoscaler.api.spec import ModelSpec, SpecError
from autoscaler.policies import make_policy
from autoscaler.sim.cluster import SimCluster
from autoscaler.sim.defaults import model_specs
from autoscaler.sim.des import DesEngine
from autoscaler.sim.fluid import FluidEngine
from autoscaler.sim.queueing import QueueEngine, TickStats, Workload
from autoscaler.sim.run import SimConfig, SimResult, simulate
from autoscaler.sim.workload import build_workload
from forecasting.traces.model import RateSeries, RequestLog
from sharing.catalog import load_catalog
from sharing.cluster import nodes_from_spec
from sharing.slot_speed import gpu_speeds, table_speed
from sharing.slots import Slot

CAT = load_catalog()
L4 = gpu_speeds()["L4-24GB"].speed
SPEC = ModelSpec(name="m", slo_latency_ms=30000.0, service_time_ms=10.0, concurrency=1, cold_start_s=0.0)


def _light_log(duration_s: float = 3600.0, every_s: float = 60.0, service_s: float = 0.01) -> RequestLog:
    """One request every ``every_s``, each ``service_s`` on the reference GPU: no request waits, and even on an L4
    the utilisation of a tick with one request (1 %) keeps the fluid engine's Poisson wait out of the 95th
    percentile."""
    t = np.arange(0.5, duration_s, every_s)
    return RequestLog(t=t, model_index=np.zeros(len(t), dtype=np.int32), models=("m",),
                      service_s=np.full(len(t), service_s))


def _cluster(kind: str, spec: ModelSpec = SPEC, slots: list[Slot] | None = None, mig: bool = False) -> SimCluster:
    nodes = nodes_from_spec(f"8x{kind}" + (":mig" if mig else ""))
    c = SimCluster(nodes, ["m"], {"m": spec}, drain_s=np.zeros(1))
    c.preplace("m", slots or [Slot.whole(nodes[0].name, 0, CAT.get(kind))])
    return c


def _serve(engine: QueueEngine, cluster: SimCluster, ticks: int, dt: float = 10.0) -> list[TickStats]:
    return [engine.step(k * dt, dt, cluster.routable, None if cluster.at_reference_speed else cluster)
            for k in range(ticks)]


def _median_latency(stats: list[TickStats]) -> float:
    return float(np.nanmedian([s.latency_at_slo_pct[0] for s in stats]))


@pytest.mark.parametrize("engine", ["fluid", "des"])
def test_the_same_load_on_an_l4_and_an_h100_takes_the_tables_ratio(engine: str) -> None:
    w = Workload.from_request_log(_light_log(), [SPEC])
    lat, busy = {}, {}
    for kind in ("H100-80GB", "L4"):
        cluster = _cluster(kind)
        eng = FluidEngine(w) if engine == "fluid" else DesEngine(w)
        stats = _serve(eng, cluster, 360)
        lat[kind] = _median_latency(stats)
        busy[kind] = sum(float(s.busy[0]) for s in stats)
    assert lat["H100-80GB"] == pytest.approx(0.01, rel=1e-6)
    assert lat["L4"] / lat["H100-80GB"] == pytest.approx(1.0 / L4, rel=1e-6)  # 10.05x: the MLPerf GPT-J ratio
    # ... and each request holds the L4's server 1/speed as long.
    assert busy["L4"] / busy["H100-80GB"] == pytest.approx(1.0 / L4, rel=0.02)


def test_a_mig_slice_serves_slower_than_its_gpu() -> None:
    g = CAT.get("H100-80GB")
    nodes = nodes_from_spec("8xH100-80GB:mig")
    spec = SPEC.with_(gpu_memory_gib=30.0)
    cluster = _cluster("H100-80GB", spec, [Slot.mig(nodes[0].name, 0, g, "3g", 0)], mig=True)
    assert cluster.capacity[0] == pytest.approx(math.sqrt(3 / 7 * 4 / 8))
    stats = _serve(DesEngine(Workload.from_request_log(_light_log(), [spec])), cluster, 360)
    assert _median_latency(stats) == pytest.approx(0.01 / math.sqrt(3 / 7 * 4 / 8), rel=1e-9)


def test_the_annotation_overrides_the_table() -> None:
    spec = SPEC.with_(slot_speeds=(("L4", 0.5),))
    cluster = _cluster("L4", spec)
    assert cluster.capacity[0] == 0.5 and not cluster.at_reference_speed
    stats = _serve(DesEngine(Workload.from_request_log(_light_log(), [spec])), cluster, 360)
    assert _median_latency(stats) == pytest.approx(0.02, rel=1e-9)


def test_mixed_speeds_each_replica_at_its_own() -> None:
    """One H100 and one L4 replica: the DES serves each request at the speed of the replica it lands on."""
    nodes = nodes_from_spec("1xH100-80GB,1xL4")
    c = SimCluster(nodes, ["m"], {"m": SPEC}, drain_s=np.zeros(1))
    c.preplace("m", [Slot.whole(nodes[0].name, 0, CAT.get("H100-80GB")), Slot.whole(nodes[1].name, 0, CAT.get("L4"))])
    assert c.speeds_of(0) == [1.0, L4] and c.capacity[0] == pytest.approx(1.0 + L4)
    eng = DesEngine(Workload.from_request_log(_light_log(), [SPEC]), seed=3)
    _serve(eng, c, 360)
    lat = eng._latency[np.isfinite(eng._latency)]
    fast, slow = np.isclose(lat, 0.01), np.isclose(lat, 0.01 / L4)
    assert np.all(fast | slow)
    assert 0.35 < slow.mean() < 0.65  # uniform random routing: about half on each
    # The fluid engine serves the pair as two replicas of their mean speed.
    fl = _serve(FluidEngine(Workload.from_request_log(_light_log(), [SPEC])), c, 360)
    assert _median_latency(fl) == pytest.approx(0.01 / ((1.0 + L4) / 2), rel=1e-6)


@pytest.mark.parametrize("engine_cls", [FluidEngine, DesEngine])
def test_capacity_tracks_routable_replicas_and_all_reference_speeds_change_nothing(engine_cls: type) -> None:
    """Speeds of exactly 1 (what an all-H100 whole-GPU cluster has) give the very same ticks as no speeds."""
    rng = np.random.default_rng(0)
    t = np.sort(rng.random(4000) * 2000.0)
    occ = rng.exponential(0.5, len(t))
    w = Workload.from_requests(("a", "b"), t, rng.integers(0, 2, len(t)), occ, occ, 2, 1.5)

    class Ones:
        def __init__(self) -> None:
            self.capacity = np.zeros(2)

        def speeds_of(self, i: int) -> list[float]:
            return [1.0] * int(self.capacity[i])

    ones = Ones()
    plain, with_ones = engine_cls(w), engine_cls(w)
    for k, n in enumerate([1, 3, 3, 2, 5, 5, 1, 0, 4] * 20):
        routable = np.array([n, max(n - 1, 0)])
        ones.capacity = routable.astype(float)
        a, b = plain.step(k * 10.0, 10.0, routable), with_ones.step(k * 10.0, 10.0, routable, ones)
        for f in TickStats.__dataclass_fields__:
            assert np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True), f
    assert np.array_equal(plain.latency_quantile(0.95), with_ones.latency_quantile(0.95), equal_nan=True)


def test_the_cluster_keeps_capacity_as_replicas_come_and_go() -> None:
    from autoscaler.api.plan import PlaceReplica, Plan, RemoveReplica

    nodes = nodes_from_spec("2xL4,1xH100-80GB")
    c = SimCluster(nodes, ["m"], {"m": SPEC.with_(cold_start_s=30.0)}, drain_s=np.array([5.0]))
    assert c.at_reference_speed
    c.preplace("m", [Slot.whole(nodes[1].name, 0, CAT.get("H100-80GB"))])
    assert c.at_reference_speed and c.capacity[0] == 1.0
    c.apply(Plan(now=0.0, actions=(PlaceReplica("m", "r1", Slot.whole(nodes[0].name, 0, CAT.get("L4"))),)))
    assert c.capacity[0] == 1.0 and c.at_reference_speed  # starting: not routable yet
    c.advance(30.0)
    assert c.routable[0] == 2 and c.capacity[0] == pytest.approx(1.0 + L4) and not c.at_reference_speed
    c.apply(Plan(now=40.0, actions=(RemoveReplica("m", "r1"),)))
    assert c.routable[0] == 1 and c.capacity[0] == pytest.approx(1.0) and c.at_reference_speed  # draining
    c.lose_node(nodes[1].name, 50.0)
    assert c.routable[0] == 0 and c.capacity[0] == 0.0


def _simulate(kind: str, policy: str, rate: float, hours: float, spec: ModelSpec, **knobs: object) -> SimResult:
    steps = int(hours * 60)
    trace = RateSeries(rates=np.full((1, steps), rate), models=("m",), step_s=60.0)
    w = build_workload(trace, {"m": spec})
    return simulate(w, nodes_from_spec(f"64x{kind}"), make_policy(policy, **knobs), SimConfig(tick_s=10.0))


def test_simulated_runs_serve_at_the_slots_speed() -> None:
    """Through the whole loop: one static replica on an L4 node against one on an H100 node."""
    spec = SPEC.with_(max_replicas=1, service_time_ms=100.0, concurrency=4)
    lat = {k: float(np.nanmedian(_simulate(k, "static", 0.05, 0.5, spec, replicas=1).minute_latency))
           for k in ("H100-80GB", "L4")}
    assert lat["L4"] / lat["H100-80GB"] == pytest.approx(1.0 / L4, rel=0.05)


def test_sizing_on_a_slower_kind_buys_proportionally_more_replicas() -> None:
    """slotwise learns the service time from what it observes: confined to L4 nodes it holds about 1/speed (10x) the
    replicas it holds on H100 nodes for the same load, and meets the SLO on both."""
    spec = ModelSpec(name="m", slo_latency_ms=8000.0, service_time_ms=100.0, concurrency=4, cold_start_s=30.0,
                     max_replicas=200)
    runs = {k: _simulate(k, "slotwise", 120.0, 3.0, spec) for k in ("H100-80GB", "L4")}
    last = {k: float(r.minute_replicas[0, -60:].mean()) for k, r in runs.items()}
    assert last["L4"] / last["H100-80GB"] == pytest.approx(1.0 / L4, rel=0.25)
    for r in runs.values():
        tail = r.minute_within[0, -60:].sum() / r.minute_arrivals[0, -60:].sum()
        assert tail > 0.95


def test_a_bad_slot_speeds_annotation_names_it_and_leaves_the_other_models_alone(tmp_path: Path) -> None:
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  a:\n    slot-speeds: 'L4=0.4,A100=fast'\n  b:\n    slot-speeds: 'L4=0.4'\n")
    t = np.arange(0.0, 600.0, 5.0)
    log = RequestLog(t=t, model_index=(np.arange(len(t)) % 2).astype(np.int32), models=("a", "b"),
                     service_s=np.full(len(t), 0.1))
    specs = model_specs(log, str(models))
    bad, good = specs["a"], specs["b"]
    assert isinstance(bad, SpecError) and isinstance(good, ModelSpec)
    assert "slot-speeds" in str(bad) and "A100: speed 'fast'" in str(bad) and "L4=0.4" in str(bad)
    assert good.slot_speeds == (("L4", 0.4),)
    # In the simulator the bad model is served as a default model (the table's speeds), the good one at its own.
    nodes = nodes_from_spec("8xL4")
    c = SimCluster(nodes, ["a", "b"], specs, drain_s=np.zeros(2))
    gpu = CAT.get("L4")
    c.preplace("a", [Slot.whole(nodes[0].name, 0, gpu)])
    c.preplace("b", [Slot.whole(nodes[0].name, 1, gpu)])
    assert c.capacity.tolist() == [pytest.approx(table_speed(Slot.whole("n", 0, gpu))), 0.4]


def test_the_peak_sized_baseline_sizes_for_the_slots_speed() -> None:
    from autoscaler.sim.workload import expected_speeds, peak_replicas

    spec = ModelSpec(name="m", slo_latency_ms=8000.0, service_time_ms=100.0, concurrency=4, max_replicas=500)
    w = build_workload(RateSeries(rates=np.full((1, 60), 120.0), models=("m",), step_s=60.0), {"m": spec})
    assert expected_speeds(w, nodes_from_spec("8xH100-80GB:mig")) == {"m": 1.0}  # whole GPUs: the demo's case
    speeds = expected_speeds(w, nodes_from_spec("8xL4"))
    assert speeds == {"m": L4}
    h100, l4 = peak_replicas(w, 10.0)["m"], peak_replicas(w, 10.0, speeds=speeds)["m"]
    assert l4 / h100 == pytest.approx(1.0 / L4, rel=0.2)


def test_a_fractional_model_runs_as_declared_on_h100_slices_and_slower_on_an_l4_share() -> None:
    spec = SPEC.with_(gpu_memory_gib=8.0, gpu_compute_share=0.25)
    w = Workload.from_request_log(_light_log(), [spec])
    lat = {}
    for kind, slot in (("H100-80GB", "mig"), ("H100-80GB", "share"), ("L4", "share")):
        nodes = nodes_from_spec(f"8x{kind}" + (":mig" if slot == "mig" else ""))
        g = CAT.get(kind)
        s = Slot.mig(nodes[0].name, 0, g, "2g", 0) if slot == "mig" else Slot.share(nodes[0].name, 0, g, 8.0, 0.25)
        c = SimCluster(nodes, ["m"], {"m": spec}, drain_s=np.zeros(1))
        c.preplace("m", [s])
        lat[kind, slot] = _median_latency(_serve(DesEngine(w), c, 360))
    assert lat["H100-80GB", "mig"] == lat["H100-80GB", "share"] == pytest.approx(0.01)  # its share of an H100, or more
    assert lat["L4", "share"] == pytest.approx(0.01 / L4)  # a quarter of an L4: 0.0995 of a quarter of an H100
