"""slotwise: the planned-packing prices, the loss they give, and the placements they cause."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import linprog

from autoscaler.benchmarks.fgd.sim import PodView, State
from autoscaler.benchmarks.fgd.slotwise import SlotwisePolicy, _best_config, knapsack, packing_prices
from autoscaler.benchmarks.fgd.workload import Cluster, Pods, target_shapes

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
ALI = DATA / "alibaba_gpu_v2023"


def _pods(milli: list[int], cpu: int = 1000) -> Pods:
    n = len(milli)
    return Pods.from_columns([f"p{i:03d}" for i in range(n)], [cpu] * n, [1024] * n, [1] * n, milli)


def _primal_bins(sizes: list[int], demand: list[float]) -> float:
    """The LP optimum by brute-force enumeration of every configuration (small cases only)."""
    configs: list[list[int]] = []

    def rec(i: int, left: int, cur: list[int]) -> None:
        if i == len(sizes):
            if any(cur):
                configs.append(cur.copy())
            return
        for k in range(left // sizes[i] + 1):
            cur[i] = k
            rec(i + 1, left - k * sizes[i], cur)
        cur[i] = 0

    rec(0, 1000, [0] * len(sizes))
    a = np.array(configs, dtype=np.float64)
    res = linprog(np.ones(len(a)), A_ub=-a.T, b_ub=-np.asarray(demand), bounds=[(0, None)] * len(a), method="highs")
    return float(res.fun)


@pytest.mark.parametrize("sizes,demand", [
    ([500], [10.0]),
    ([320, 470, 650], [5.0, 5.0, 5.0]),
    ([160, 230, 320, 470, 650, 810], [74.0, 140.0, 328.0, 750.0, 253.0, 1078.0]),
    ([220, 370, 460, 590], [3.0, 9.0, 2.0, 7.0]),
])
def test_prices_are_dual_optimal(sizes, demand):
    """Column generation ends with dual-feasible prices whose value equals the LP's bins (strong duality)."""
    y = packing_prices(sizes, demand)
    assert (y >= 0).all()
    assert knapsack(sizes, y)[-1] <= 1.0 + 1e-7  # no configuration is worth more than one GPU
    assert float(np.dot(y, demand)) == pytest.approx(_primal_bins(sizes, demand), rel=1e-6)


def test_best_config_walks_back_the_knapsack():
    value, counts = _best_config([320, 650], np.array([0.3, 0.75]), 1000)
    assert counts == [1, 1] and value == pytest.approx(1.05)  # beats 3 x 320 = 0.9


def test_planned_loss_is_zero_on_plan_and_positive_off_it():
    """With 650, 470 and 320 equally common the plan pairs 320 with 650 and 470 with 470."""
    pol = SlotwisePolicy(target_shapes(_pods([650, 470, 320] * 20), coverage=1.0))
    loss = pol.planned_loss(np.array([350, 530, 1000]), 320)
    assert loss[0] == pytest.approx(0.0, abs=1e-9)  # next to a 650: 30 left, as planned
    assert loss[1] > 0.1  # next to a 470: 210 left, which no planned pod fills
    assert (pol.planned_loss(np.arange(470, 1001, 10), 470) >= 0).all()


def test_shared_pod_goes_next_to_its_planned_partner():
    pods = _pods([650, 470, 320] * 20)
    pol = SlotwisePolicy(target_shapes(pods, coverage=1.0))
    cl = Cluster.from_columns(["a", "b"], [32000, 32000], [65536, 65536], [1, 1], ["G2", "G2"])
    state = State(cl, pods)
    state.gpu_left[:, 0] = [530, 350]  # node a holds a 470, node b a 650
    state.gpu_sum[:] = state.gpu_left.sum(1)
    state.gpu_max[:] = state.gpu_left.max(1)
    state.full_free[:] = 0
    pol.bind(state, np.random.default_rng(0))
    pod = PodView(0, 1000, 1024, 1, 320, 0)
    node, gpus = pol.choose(state, pod, state.feasible(pod))
    assert node == 1 and gpus.tolist() == [0]


def test_shared_pod_avoids_stranding_gpus_for_lack_of_cpu():
    """Same gaps on both nodes; on node a the pod's CPU would leave its free GPUs without CPU."""
    pods = _pods([500] * 10, cpu=4000)
    pol = SlotwisePolicy(target_shapes(pods, coverage=1.0))
    cl = Cluster.from_columns(["a", "b"], [6000, 32000], [65536, 65536], [2, 2], ["G2", "G2"])
    state = State(cl, pods)
    pol.bind(state, np.random.default_rng(0))
    pod = PodView(0, 4000, 1024, 1, 500, 0)
    node, _ = pol.choose(state, pod, state.feasible(pod))
    assert node == 1


needs_data = pytest.mark.skipif(not (DATA / "fgd_replay").exists(), reason="shared FGD data not present")


@needs_data
def test_slotwise_leaves_fewer_gpus_idle_than_fgd_on_default_seed_42():
    from autoscaler.benchmarks.fgd.bench import load_experiment, run_one

    exp = load_experiment(str(ALI / "openb_node_list_gpu_node.csv"), str(ALI / "openb_pod_list_default.csv"),
                          [42], str(DATA / "fgd_replay"))
    fgd, ours = run_one(exp, "fgd", 42), run_one(exp, "slotwise", 42)
    for k in ("100", "130"):
        assert ours["unallocated_gpus"][k] < 0.85 * fgd["unallocated_gpus"][k]


def test_unconstrained_pod_leaves_the_model_constrained_pods_need():
    """T4-only pods are part of the target workload: a pod that can go anywhere takes the G2 GPU."""
    pods = Pods.from_columns([f"p{i:03d}" for i in range(20)], [1000] * 20, [1024] * 20, [1] * 20, [500] * 20,
                             ["T4"] * 10 + [""] * 10)
    pol = SlotwisePolicy(target_shapes(pods, coverage=1.0))
    cl = Cluster.from_columns(["t4", "g2"], [32000, 32000], [65536, 65536], [1, 1], ["T4", "G2"])
    state = State(cl, pods)
    pol.bind(state, np.random.default_rng(0))
    assert pol.node_rho[0] > 0 and pol.node_rho[1] == 0  # T4 is claimed by the T4-only pods
    pod = PodView(0, 1000, 1024, 1, 500, pods.specs.index(""))
    node, _ = pol.choose(state, pod, state.feasible(pod))
    assert node == 1


def test_synthetic_variants_change_the_mix_they_name():
    from autoscaler.benchmarks.fgd.synth import variants

    rows = [{"name": f"p{i}", "cpu_milli": "1000", "memory_mib": "1024", "num_gpu": n, "gpu_milli": g,
             "gpu_spec": ""} for i, (n, g) in enumerate([("1", "1000")] * 60 + [("1", "470")] * 20
                                                         + [("0", "0")] * 10 + [("8", "1000")] * 10)]
    out = variants(rows, ["T4", "P100"])
    assert sum(r["num_gpu"] == "0" for r in out["cpu200s"]) == 20
    gpu = [r for r in out["gpushare70s"] if r["num_gpu"] != "0"]
    assert sum(r["num_gpu"] == "1" and int(r["gpu_milli"]) < 1000 for r in gpu) / len(gpu) >= 0.6
    pinned = [r for r in out["gpuspec35s"] if r["gpu_spec"]]
    assert pinned and all(r["num_gpu"] != "0" and r["gpu_spec"] in ("T4", "P100") for r in pinned)
    req = [int(r["num_gpu"]) * int(r["gpu_milli"]) for r in out["multigpu45s"]]
    multi = [q for q, r in zip(req, out["multigpu45s"], strict=True) if int(r["num_gpu"]) > 1]
    assert sum(multi) >= 0.45 * sum(req)


def test_synthetic_cpu_memory_and_multigpu_mixes():
    from autoscaler.benchmarks.fgd.synth import variants

    rows = [{"name": f"p{i}", "cpu_milli": "1000", "memory_mib": "1024", "num_gpu": n, "gpu_milli": g,
             "gpu_spec": ""} for i, (n, g) in enumerate([("1", "1000")] * 60 + [("1", "470")] * 20
                                                         + [("0", "0")] * 10 + [("8", "1000")] * 10)]
    out = variants(rows, ["T4", "P100"])
    assert sum(r["num_gpu"] == "0" for r in out["cpu250s"]) == 25
    assert sum(r["num_gpu"] == "0" for r in out["cpu300s"]) == 30
    heavy = [r for r in out["mem250s"] if r["memory_mib"] != "1024"]
    assert heavy and all(r["memory_mib"] == "2560" for r in heavy)
    req = [int(r["num_gpu"]) * int(r["gpu_milli"]) for r in out["multigpu70s"]]
    multi = [q for q, r in zip(req, out["multigpu70s"], strict=True) if int(r["num_gpu"]) > 1]
    assert sum(multi) >= 0.70 * sum(req)


def _two_node_state() -> tuple[State, Pods]:
    # Node 0: 8 GPUs, 128 cores (the only node a 120-core 8-GPU pod fits); node 1: 8 GPUs, 96 cores.
    cl = Cluster.from_columns(["a", "b"], [128000, 96000], [10**6, 10**6], [8, 8], ["V100M32", "V100M32"])
    pods = Pods.from_columns(["p0", "p1", "p2"], [120000, 8000, 4000], [1000, 1000, 1000], [8, 1, 0],
                             [1000, 500, 0], ["", "", ""])
    return State(cl, pods), pods


def test_node_need_global_is_the_demand_weighted_ratio() -> None:
    from autoscaler.benchmarks.fgd.slotwise import node_need

    state, pods = _two_node_state()
    sh = target_shapes(pods, coverage=1.0)
    cpm, mpm = node_need(state, sh.cpu, np.zeros_like(sh.cpu), sh.num_gpu, sh.gpu_milli, sh.counts)
    assert np.allclose(cpm, (120000 + 8000) / (8000 + 500)) and np.allclose(mpm, 0.0)
