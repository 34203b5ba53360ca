"""The ``shipped`` FGD policy: the product's CostAwarePacker through the adapter mirrors the replay exactly (every
pod the replay's filter admits gets a slot, the inventory's GPUs and host CPU/memory are the replay's state)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.benchmarks.fgd.bench import make_policy
from autoscaler.benchmarks.fgd.shipped import MIB_PER_GIB, ShippedPolicy, pod_request
from autoscaler.benchmarks.fgd.sim import PodView, simulate
from autoscaler.benchmarks.fgd.workload import MILLI, Arrival, Cluster, Pods, target_shapes

pod_rows = st.lists(
    st.tuples(st.integers(0, 24000), st.integers(0, 96000), st.sampled_from([0, 1, 1, 1, 2, 4]),
              st.sampled_from([100, 250, 500, 700, 1000]), st.sampled_from(["", "", "A", "B", "A|B"])),
    min_size=1, max_size=60,
)


def _run(rows: list[tuple[int, int, int, int, str]], host_aware: bool, seed: int = 0, learned: bool = False):
    n = 5
    cluster = Cluster.from_columns([f"n{i}" for i in range(n)], [32000, 8000, 64000, 16000, 96000],
                                   [65536, 32768, 262144, 65536, 131072], [2, 4, 8, 1, 8], ["A", "B", "A", "B", "A"])
    pods = Pods.from_columns([f"p{i}" for i in range(len(rows))], [r[0] for r in rows], [r[1] for r in rows],
                             [r[2] for r in rows], [r[3] if r[2] == 1 else MILLI for r in rows],
                             [r[4] for r in rows])
    order = np.random.default_rng(seed).permutation(n).astype(np.int64)
    policy = ShippedPolicy(host_aware=host_aware, shapes=target_shapes(pods) if learned else None, refresh_every=7)
    res = simulate(cluster, pods, Arrival(np.arange(len(rows), dtype=np.int64), order, seed), policy)
    return res, policy


@settings(max_examples=60, deadline=None)
@given(rows=pod_rows, host_aware=st.booleans(), seed=st.integers(0, 3), learned=st.booleans())
def test_the_adapter_mirrors_the_replay(rows, host_aware: bool, seed: int, learned: bool) -> None:
    res, policy = _run(rows, host_aware, seed, learned)
    assert policy.mismatches == 0
    state, inv = res.state, policy.inv
    assert state is not None
    for i, name in enumerate(policy.names):
        spec = inv.nodes[name]
        free_cpu, free_mem = inv.host_free(name)
        assert free_cpu == state.cpu_left[i]
        assert math.isclose(free_mem, state.mem_left[i] / MIB_PER_GIB, abs_tol=1e-6)
        for g in range(spec.gpu_count):
            assert math.isclose(inv.free_memory_of(inv.device(name, g)), state.gpu_left[i, g], abs_tol=1e-6)


def test_pod_requests_map_shares_whole_gpus_and_host() -> None:
    share = pod_request(PodView(3, 4000, 2048, 1, 250, 0), "A|B")
    assert (share.memory_gib, share.compute_fraction, share.kinds) == (250.0, 0.25, ("share",))
    assert share.gpu_models == ("fgd-A", "fgd-B") and (share.cpu_millis, share.host_memory_gib) == (4000, 2.0)
    whole = pod_request(PodView(4, 8000, 1024, 2, 1000, 0), "")
    assert whole.whole_only and whole.gpus == 2 and whole.gpu_models == ()


def test_registered_in_the_benchmark() -> None:
    shapes = target_shapes(Pods.from_columns(["p"], [1000], [1024], [1], [500], [""]))
    assert make_policy("shipped", shapes).name == "shipped"
    assert make_policy("shipped-nohost", shapes).name == "shipped-nohost"
