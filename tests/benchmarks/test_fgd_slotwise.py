"""slotwise in the FGD protocol: the product packer (``CostAwarePacker``) through the replay adapter, with the target
workload it learns from the arrivals -- the gap plan, CPU-aware fragmentation and model scarcity at work on replayed
placements, and the synthetic mixes the benchmark adds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autoscaler.benchmarks.fgd.bench import make_policy
from autoscaler.benchmarks.fgd.sim import PodView, State, simulate
from autoscaler.benchmarks.fgd.workload import Arrival, Cluster, Pods, target_shapes

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
ALI = DATA / "alibaba_gpu_v2023"


def _pods(milli: list[int], cpu: int = 1000, spec: list[str] | None = None) -> Pods:
    n = len(milli)
    return Pods.from_columns([f"p{i:03d}" for i in range(n)], [cpu] * n, [1024] * n, [1] * n, milli,
                             spec if spec is not None else [""] * n)


def _place(pol, state: State, pod: PodView) -> tuple[int, list[int]]:
    """One pod through the policy as the replay does: arrival, choice, application."""
    pol.arrived(state, pod)
    node, gpus = pol.choose(state, pod, state.feasible(pod))
    state.apply(node, gpus, pod)
    pol.placed(state, node)
    return node, gpus.tolist()


def test_slotwise_and_shipped_are_the_same_code() -> None:
    pods = _pods([650, 470, 320, 1000, 250] * 8)
    cl = Cluster.from_columns([f"n{i}" for i in range(6)], [32000] * 6, [65536] * 6, [2, 4, 1, 2, 8, 1], ["G2"] * 6)
    arrival = Arrival(np.arange(len(pods)), np.arange(len(cl)), 0)
    shapes = target_shapes(pods, coverage=1.0)
    runs = [simulate(cl, pods, arrival, make_policy(name, shapes)) for name in ("slotwise", "shipped")]
    assert (runs[0].used_milli == runs[1].used_milli).all() and (runs[0].placed == runs[1].placed).all()


def test_a_share_goes_where_the_plan_pairs_it() -> None:
    # 650, 470 and 320 equally common: the plan pairs 320 with 650, and 470 with 470 -- a 320 beside a 470 leaves 210
    # that nothing planned fills, so the 320 takes a fresh GPU instead (best fit alone would put it beside the 470).
    pods = _pods([470, 320] + [650, 470, 320] * 20)
    cl = Cluster.from_columns(["a", "b"], [32000, 32000], [65536, 65536], [1, 1], ["G2", "G2"])
    state = State(cl, pods)
    pol = make_policy("slotwise", target_shapes(pods, coverage=1.0))
    pol.bind(state, np.random.default_rng(0))
    assert _place(pol, state, PodView(0, 1000, 1024, 1, 470, 0))[0] == 0
    assert _place(pol, state, PodView(1, 1000, 1024, 1, 320, 0))[0] == 1
    nofrag = make_policy("shipped-nofrag", target_shapes(pods, coverage=1.0))
    state = State(cl, pods)
    nofrag.bind(state, np.random.default_rng(0))
    _place(nofrag, state, PodView(0, 1000, 1024, 1, 470, 0))
    assert _place(nofrag, state, PodView(1, 1000, 1024, 1, 320, 0))[0] == 0  # best fit, without the plan


def test_a_share_avoids_stranding_gpus_for_lack_of_cpu() -> None:
    """Same gaps on both nodes; on node a the pod's CPU would leave its free GPUs without CPU."""
    pods = _pods([500] * 10, cpu=4000)
    cl = Cluster.from_columns(["a", "b"], [6000, 32000], [65536, 65536], [2, 2], ["G2", "G2"])
    state = State(cl, pods)
    pol = make_policy("slotwise", target_shapes(pods, coverage=1.0))
    pol.bind(state, np.random.default_rng(0))
    assert _place(pol, state, PodView(0, 4000, 1024, 1, 500, 0))[0] == 1


def test_an_unconstrained_pod_leaves_the_model_constrained_pods_need() -> None:
    """T4-only pods are part of the target workload: a whole-GPU pod that can go anywhere takes the G2 GPU."""
    pods = Pods.from_columns([f"p{i:03d}" for i in range(20)], [1000] * 20, [1024] * 20, [1] * 20, [1000] * 20,
                             ["T4"] * 10 + [""] * 10)
    cl = Cluster.from_columns(["t4", "g2"], [32000, 32000], [65536, 65536], [1, 1], ["T4", "G2"])
    state = State(cl, pods)
    pol = make_policy("slotwise", target_shapes(pods, coverage=1.0))
    pol.bind(state, np.random.default_rng(0))
    assert _place(pol, state, PodView(0, 1000, 1024, 1, 1000, pods.specs.index("")))[0] == 1
    rho = pol.packer.kind_scarcity(pol.inv)
    assert rho["fgd-T4"] > 0 and rho["fgd-G2"] == 0


def test_the_learned_workload_sees_every_arrival_placed_or_not() -> None:
    pods = _pods([1000] * 4)
    cl = Cluster.from_columns(["a"], [32000], [65536], [1], ["G2"])
    pol = make_policy("slotwise", target_shapes(pods, coverage=1.0))
    res = simulate(cl, pods, Arrival(np.arange(4), np.arange(1), 0), pol)
    assert res.placed.tolist() == [True, False, False, False]
    assert pol.work.seen[pol.work.index[(1, None, 1.0, 1000, ())]] > 3.9  # all four arrivals, decayed


needs_data = pytest.mark.skipif(not (DATA / "fgd_replay").exists(), reason="shared FGD data not present")


@needs_data
def test_slotwise_leaves_fewer_gpus_idle_than_fgd_on_default_seed_42():
    from autoscaler.benchmarks.fgd.bench import load_experiment, run_one

    exp = load_experiment(str(ALI / "openb_node_list_gpu_node.csv"), str(ALI / "openb_pod_list_default.csv"),
                          [42], str(DATA / "fgd_replay"))
    fgd, ours = run_one(exp, "fgd", 42), run_one(exp, "slotwise", 42)
    for k in ("100", "130"):
        assert ours["unallocated_gpus"][k] < 0.85 * fgd["unallocated_gpus"][k]


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
