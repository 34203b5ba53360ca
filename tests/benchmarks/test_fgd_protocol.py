"""FGD protocol: fragmentation bookkeeping, hard filters, policies, metric, replay against published numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.benchmarks.fgd import policies as P
from autoscaler.benchmarks.fgd.bench import load_experiment, parse_seeds, run_one
from autoscaler.benchmarks.fgd.metrics import alloc_curve
from autoscaler.benchmarks.fgd.sim import PodView, State, simulate
from autoscaler.benchmarks.fgd.workload import Arrival, Cluster, Pods, target_shapes, tune_rows

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
ALI = DATA / "alibaba_gpu_v2023"


def small_cluster() -> Cluster:
    return Cluster.from_columns(
        ["n0", "n1", "n2", "n3"], [8000, 16000, 32000, 4000], [65536, 65536, 131072, 8192], [2, 4, 8, 1],
        ["T4", "G2", "G2", "V100M16"],
    )


def small_pods() -> Pods:
    return Pods.from_columns(
        [f"p{i}" for i in range(8)],
        [1000, 2000, 4000, 500, 8000, 1000, 2000, 1000],
        [1024, 2048, 4096, 512, 8192, 1024, 2048, 1024],
        [1, 1, 0, 1, 2, 1, 8, 1],
        [500, 250, 0, 1000, 1000, 810, 1000, 470],
        ["", "", "", "", "", "T4", "", "G2|T4"],
    )


SHAPES_POLICIES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd", "slotwise")


def policy(name: str, pods: Pods):
    from autoscaler.benchmarks.fgd.bench import make_policy

    return make_policy(name, target_shapes(pods, coverage=1.0))


@settings(max_examples=40, deadline=None)
@given(
    free=st.lists(st.integers(0, 100).map(lambda x: x * 10), min_size=8, max_size=8),
    cpu=st.integers(0, 20000),
    g=st.sampled_from([50, 230, 470, 810, 1000]),
)
def test_frag_after_matches_a_recount(free, cpu, g):
    """The closed-form F after a candidate equals F recomputed from the changed state."""
    pods = small_pods()
    cl = Cluster.from_columns(["a"], [32000], [65536], [8], ["G2"])
    state = State(cl, pods)
    state.gpu_left[0] = np.array(free)
    state.gpu_sum[0] = sum(free)
    state.cpu_left[0] = cpu
    fm = P.FragModel(target_shapes(pods, coverage=1.0), cl.models)
    fm.bind(state)
    i = int(np.argmax(np.array(free) >= g))
    if free[i] < g:
        return
    predicted = fm.after(np.array([0]), np.array([free[i]]), g, 1, 300)[0]
    state.gpu_left[0, i] -= g
    state.gpu_sum[0] -= g
    state.cpu_left[0] -= 300
    fm.refresh(np.array([0]))
    assert predicted == pytest.approx(fm.F[0], abs=1e-6)


def test_feasibility_is_hard_on_cpu_memory_model_and_gpu():
    pods, cl = small_pods(), small_cluster()
    s = State(cl, pods)
    pv = PodView(0, 5000, 1024, 1, 500, 0)
    assert s.feasible(pv).tolist() == [0, 1, 2]  # n3 has 4 cores
    pv = PodView(0, 1000, 100000, 1, 500, 0)
    assert s.feasible(pv).tolist() == [2]  # memory
    spec_t4 = pods.specs.index("T4")
    assert s.feasible(PodView(0, 1000, 1024, 1, 810, spec_t4)).tolist() == [0]
    assert s.feasible(PodView(0, 1000, 1024, 8, 1000, 0)).tolist() == [2]
    assert s.feasible(PodView(0, 1000, 1024, 0, 0, 0)).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("name", SHAPES_POLICIES)
def test_every_policy_keeps_resources_non_negative(name):
    pods, cl = small_pods(), small_cluster()
    rng = np.random.default_rng(0)
    rows = rng.integers(0, len(pods), 200)
    res = simulate(cl, pods, Arrival(rows, np.arange(len(cl)), 1), policy(name, pods))
    st_ = res.state
    assert (st_.cpu_left >= 0).all() and (st_.mem_left >= 0).all() and (st_.gpu_left >= 0).all()
    assert res.used_milli[-1] == cl.total_gpus * 1000 - st_.gpu_sum.sum()
    assert np.all(np.diff(res.arrived_milli) >= 0) and np.all(res.used_milli <= res.arrived_milli)


def test_shared_pod_goes_to_the_fullest_fitting_gpu_for_bestfit():
    pods = small_pods()
    cl = Cluster.from_columns(["a"], [64000], [65536], [4], ["G2"])
    s = State(cl, pods)
    s.gpu_left[0] = [1000, 600, 480, 300]
    assert s.best_fit_gpu(0, 470) == 2
    assert s.lowest_free_gpus(0, 1).tolist() == [0]


def test_ties_go_to_the_first_node_in_tie_break_order():
    pods = small_pods()
    cl = Cluster.from_columns(["a", "b", "c"], [8000] * 3, [8192] * 3, [1] * 3, ["G2"] * 3)
    pol = P.DotProdPolicy()
    for order in ([2, 0, 1], [1, 2, 0]):
        res = simulate(cl, pods, Arrival(np.array([0]), np.array(order), 0), pol)
        # The first pod lands on the node that comes first in the order (index 0 after permuting).
        assert res.state.gpu_sum[0] == 500


def test_target_shapes_cover_95_percent_and_sum_to_one():
    pods = Pods.from_columns([f"p{i}" for i in range(100)], [1000] * 60 + [2000] * 38 + [3000, 4000],
                             [1] * 100, [1] * 100, [500] * 100)
    sh = target_shapes(pods)
    assert len(sh) == 2 and sh.coverage == pytest.approx(0.98) and sh.p.sum() == pytest.approx(1.0)


def test_tuning_reaches_the_target_from_below_and_above():
    pods = small_pods()
    rows = tune_rows(pods, total_gpus=10, seed=3)
    total = int(pods.gpu_request[rows].sum())
    assert total <= 1.3 * 10 * 1000 and total > 1.3 * 10 * 1000 - 8000
    rows = tune_rows(pods, total_gpus=2, seed=3)
    assert int(pods.gpu_request[rows].sum()) <= 2600


def test_parse_seeds():
    assert parse_seeds("42-45") == [42, 43, 44, 45]
    assert parse_seeds("42,50-51") == [42, 50, 51]
    with pytest.raises(ValueError):
        parse_seeds("")


def test_alloc_curve_bins_by_arrival_percent():
    from autoscaler.benchmarks.fgd.sim import RunResult

    arrived = np.array([0, 500, 1000, 1500, 2000])  # of 2 GPUs = 2000 milli
    used = np.array([0, 500, 1000, 1000, 1000])
    r = RunResult("x", 0, arrived, used, np.ones(5, bool), 2)
    c = alloc_curve(r, max_pct=100)
    assert c[25] == 25.0 and c[50] == 50.0 and c[100] == 50.0 and c[26] == 25.0


def test_slotwise_is_the_product_packer_with_fgd_inputs():
    from autoscaler.benchmarks.fgd.shipped import ShippedPolicy

    p = policy("slotwise", small_pods())
    assert isinstance(p, ShippedPolicy) and p.name == "slotwise" and p.shapes is not None


needs_data = pytest.mark.skipif(not (DATA / "fgd_replay").exists(), reason="shared FGD data not present")


@needs_data
@pytest.mark.parametrize("name,exp100,exp130", [("fgd", 95.14, 95.29), ("bestfit", 92.94, 93.13)])
def test_replay_reproduces_the_published_run(name, exp100, exp130):
    """default / seed 42: the original simulator's numbers (fgd_expected) at 100% and 130% arrival."""
    exp = load_experiment(str(ALI / "openb_node_list_gpu_node.csv"), str(ALI / "openb_pod_list_default.csv"),
                          [42], str(DATA / "fgd_replay"))
    out = run_one(exp, name, 42)
    assert exp.replayed and out["pods"] == 10866
    assert out["alloc_pct"]["100"] == pytest.approx(exp100, abs=0.02)
    assert out["alloc_pct"]["130"] == pytest.approx(exp130, abs=0.02)
    if name == "fgd":
        assert out["failed"] == 2532  # the original's log: 2,532 failed pods


def test_pack_bench_cli_writes_json(tmp_path):
    from autoscaler.cli.packbench import main

    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
        f"node-{i},32000,65536,{[1, 2, 4, 8][i % 4]},{['G2', 'T4'][i % 2]}\n" for i in range(12)))
    pods = tmp_path / "pods_x.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + "".join(
        f"pod-{i:03d},{1000 * (1 + i % 5)},{1024 * (1 + i % 3)},{[0, 1, 1, 1, 2][i % 5]},"
        f"{[0, 470, 810, 1000, 1000][i % 5]},{'T4' if i % 11 == 0 else ''}\n" for i in range(60)))
    out = tmp_path / "out.json"
    rc = main(["--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd,slotwise,bestfit", "--seeds", "1-2",
               "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert {r["policy"] for r in data["summary"]} == {"fgd", "slotwise", "bestfit"}
    assert all(not r["replayed"] for r in data["runs"]) and len(data["runs"]) == 6
